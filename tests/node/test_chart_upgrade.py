"""The chart as a user upgrades it, on the node: the previous release (0.1.0, packaged from the commit before the
operator's production path, its CRDs without `startingOffsets` or volumes) installed, then `helm upgrade` to this
chart with `crds.upgradeHook` on. Helm never upgrades `crds/`; the hook's Job (kubectl, built here) does. Then a
second release of the same name in another namespace, which must not collide with the first.

Runs before test_product.py (file order): its CRDs are the ones the old release installs. The CRDs are left at
this chart's version, as test_product's install would make them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from hack.testbed.node import Cluster
from hack.testbed.process import REPO

from .conftest import base_image, project_images

OLD_CHART = Path(__file__).parent / "charts" / "chsink-0.1.0.tgz"
SINKS_CRD = "clickhousesinks.chsink.io"
HOOK = "chsink-crd-upgrade"


def _crd_schema(node: Cluster, name: str) -> dict[str, Any]:
    crd = json.loads(node.kubectl("get", "crd", name, "-o", "json").stdout)
    return {v["name"]: v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"]}


def _file_schema(path: Path) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text())
    return {v["name"]: v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"]}


def _kafka_fields(schema: dict[str, Any]) -> set[str]:
    return set(schema["v1alpha1"]["properties"]["spec"]["properties"]["kafka"]["properties"])


def _sink(namespace: str) -> dict[str, Any]:
    """A sink using a field the previous CRD did not have (kafka.startingOffsets)."""
    return {"apiVersion": "chsink.io/v1alpha1", "kind": "ClickHouseSink",
            "metadata": {"name": "upgraded", "namespace": namespace},
            "spec": {"kafka": {"bootstrapServers": "kafka.invalid:9092", "topics": ["events"],
                               "startingOffsets": "latest"},
                     "clickhouse": {"shards": [{"endpoint": "http://clickhouse.invalid:8123"}], "database": "e2e",
                                    "tables": {"*": "events"}},
                     "checkpointLocation": "/tmp/chsink/upgraded", "deletionPolicy": "Retain"}}


def _available(node: Cluster, namespace: str) -> None:
    node.kubectl("-n", namespace, "rollout", "status", "deployment/chsink", "--timeout=150s")


def test_helm_upgrade_from_the_previous_chart_with_the_crd_hook_then_a_second_release_named_alike(
        node: Cluster) -> None:
    operator_image, spark_image = project_images()
    kubectl_image = base_image("kubectl")
    node.load([operator_image, kubectl_image])
    repo, tag = operator_image.rsplit(":", 1)
    image = ["--set", f"image.repository={repo}", "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never",
             "--set", f"spark.image={spark_image}"]
    for ns in ("chsink-a", "sinks-a", "chsink-b", "sinks-b"):
        node.kubectl("create", "namespace", ns)

    # the previous release, as a user installed it: its CRDs come with it
    t0 = time.monotonic()
    node.helm("install", "chsink", str(OLD_CHART), "-n", "chsink-a", "--wait", "--timeout=3m", *image,
              "--set", "watchNamespaces={sinks-a}")
    _available(node, "chsink-a")
    assert "startingOffsets" not in _kafka_fields(_crd_schema(node, SINKS_CRD)), "the previous CRD"
    old = node.kubectl("apply", "-f", "-", input=json.dumps(_sink("sinks-a")), check=False)
    kept = node.kubectl("-n", "sinks-a", "get", "chs", "upgraded", "-o", "jsonpath={.spec.kafka.startingOffsets}",
                        check=False)
    assert old.returncode != 0 or kept.stdout == "", (old.stderr, kept.stdout)  # refused or pruned
    node.kubectl("-n", "sinks-a", "delete", "chs", "upgraded", "--ignore-not-found", "--timeout=60s")

    # the upgrade: the hook's Job server-side-applies this chart's CRDs before the operator's new Deployment
    node.helm("upgrade", "chsink", str(REPO / "charts" / "chsink"), "-n", "chsink-a", "--wait", "--timeout=4m",
              *image, "--set", "watchNamespaces={sinks-a}", "--set", "crds.upgradeHook.enabled=true",
              "--set", f"crds.upgradeHook.image={kubectl_image}")
    upgraded_in = time.monotonic() - t0
    _available(node, "chsink-a")
    for path in sorted((REPO / "charts" / "chsink" / "crds").glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        assert _crd_schema(node, name) == _file_schema(path), f"{name} is not this chart's"
    # hook-succeeded removed the hook's objects, its cluster-scoped ones too
    left = node.kubectl("get", "clusterroles,clusterrolebindings", "-o", "name").stdout
    left += node.kubectl("-n", "chsink-a", "get", "jobs,configmaps,serviceaccounts", "-o", "name").stdout
    assert HOOK not in left, left
    assert "REVISION: 2" in node.helm("status", "chsink", "-n", "chsink-a")

    # the upgraded operator serves a sink that uses the new field: it is kept, and the operator writes a status
    node.kubectl("apply", "-f", "-", input=json.dumps(_sink("sinks-a")))
    kept = node.kubectl("-n", "sinks-a", "get", "chs", "upgraded", "-o", "jsonpath={.spec.kafka.startingOffsets}")
    assert kept.stdout == "latest", kept.stdout
    deadline = time.monotonic() + 120
    while not json.loads(node.kubectl("-n", "sinks-a", "get", "chs", "upgraded", "-o", "json").stdout
                         ).get("status", {}).get("conditions"):
        assert time.monotonic() < deadline, node.kubectl("-n", "chsink-a", "logs", "deploy/chsink", "--tail=60").stdout
        time.sleep(2)

    # a second release named alike in another namespace: nothing cluster-scoped collides, and both run
    node.helm("install", "chsink", str(REPO / "charts" / "chsink"), "-n", "chsink-b", "--wait", "--timeout=3m",
              *image, "--set", "watchNamespaces={sinks-b}")
    _available(node, "chsink-b")
    _available(node, "chsink-a")
    roles = node.kubectl("get", "clusterroles", "-o", "name").stdout.split()
    assert {"clusterrole.rbac.authorization.k8s.io/chsink-chsink-a-discovery",
            "clusterrole.rbac.authorization.k8s.io/chsink-chsink-b-discovery"} <= set(roles), roles
    print(f"\ninstalled 0.1.0 and upgraded with the hook in {upgraded_in:.0f}s")

    node.kubectl("-n", "sinks-a", "delete", "chs", "upgraded", "--timeout=120s")  # while its operator runs
    for ns in ("chsink-a", "chsink-b"):
        node.helm("uninstall", "chsink", "-n", ns, "--wait", "--timeout=2m")
    node.kubectl("delete", "namespace", "chsink-a", "sinks-a", "chsink-b", "sinks-b", "--wait=false")
