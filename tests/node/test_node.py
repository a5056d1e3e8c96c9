"""The node itself: a pod runs an image built here, resolves Services through CoreDNS and reaches the API
server through the `kubernetes` Service with its ServiceAccount token, as Spark's driver does."""

from __future__ import annotations

from hack.testbed.node import Cluster
from hack.testbed.process import versions

from .conftest import base_image

PROBE = """
import json, socket, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
ip = socket.gethostbyname("kubernetes.default.svc.cluster.local")
ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
req = urllib.request.Request("https://kubernetes.default.svc/version",
                             headers={"Authorization": "Bearer " + open(f"{sa}/token").read()})
v = json.load(urllib.request.urlopen(req, context=ctx))
print(json.dumps({"ip": ip, "version": v["gitVersion"]}))
"""


def test_a_pod_resolves_services_and_reaches_the_api_server_with_its_token(node: Cluster) -> None:
    image = base_image("python")
    node.load([image])
    phase, out = node.run_pod("probe", image, "python3", "-c", PROBE)
    assert phase == "Succeeded", out
    assert '"ip": "10.96.0.1"' in out, out
    # the release stamped into the build: charts compare .Capabilities.KubeVersion (v0.0.0-master fails them)
    assert f'"version": "{versions()["K8S_VERSION"]}"' in out, out
