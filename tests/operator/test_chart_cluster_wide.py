"""The chart installed cluster-wide for HA (examples/helm/ha-monitoring.yaml, applied for real): the operator
runs as the chart's ServiceAccount with the Deployment's environment, may hold its Lease and no other, and
serves a sink in a namespace the install never heard of, giving it the Spark driver's identity. Two replicas
electing one are tests/operator/test_leader.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from hack.testbed.process import REPO
from tests.packaging.test_chart import NS, can_i, template

from .conftest import kopf_runner
from .test_operator import wait_for

RELEASE = "ha"
SINK_NS = "wide-data"  # created after the install, as a user's team namespace would be
VALUES = REPO / "examples" / "helm" / "ha-monitoring.yaml"


@pytest.fixture(scope="module")
def wide_install(chsink_crds, ch_factory, tmp_path_factory):
    kube = chsink_crds
    kube.kubectl("create", "namespace", NS, check=False)
    docs = template(RELEASE, VALUES)
    kube.kubectl("apply", "--server-side", "-f", "-",
                 input=yaml.safe_dump_all([d for d in docs if d["kind"] == "CustomResourceDefinition"]))
    kube.api.wait_crd("clickhousesinks.chsink.io")
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(
        [d for d in docs if d["kind"] not in ("CustomResourceDefinition", "Deployment")
         and not d["apiVersion"].startswith("monitoring.coreos.com/")]))  # the Prometheus Operator's CRDs: not here
    [dep] = [d for d in docs if d["kind"] == "Deployment"]
    [container] = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("CHSINK_")}
    kube.lease = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--leader-election=")]
    sa = f"{RELEASE}-chsink"
    token = kube.kubectl("create", "token", sa, "-n", NS, "--duration=1h").stdout.strip()
    kubeconfig = tmp_path_factory.mktemp("wide") / "kubeconfig"
    kubeconfig.write_text(kube.api.kubeconfig_text(token, sa))
    kube.kubectl("create", "namespace", SINK_NS, check=False)
    ch_factory()
    with kopf_runner(kubeconfig, None, env=env) as runner:
        kube.runner = runner
        yield kube
    assert not re.search(r"(?<![,\d])403(?!\d)", runner.output) and "Forbidden" not in runner.output, \
        runner.output[-3000:]


def get(kube: Any, kind: str, name: str, namespace: str | None = SINK_NS) -> Any:
    res = kube.kubectl("get", kind, name, *(["-n", namespace] if namespace else []), "-o", "yaml", check=False)
    return yaml.safe_load(res.stdout) if res.returncode == 0 else None


def test_cluster_wide_peered_operator_serves_a_new_namespace_with_the_driver_identity(
        wide_install, kafka, topic, ch_dsn, ch_db):
    kube = wide_install
    _, db = ch_db
    cr = {"apiVersion": "chsink.io/v1alpha1", "kind": "ClickHouseSink",
          "metadata": {"name": "wide", "namespace": SINK_NS},
          "spec": {"kafka": {"bootstrapServers": kafka.bootstrap, "topics": [topic(1)]},
                   "clickhouse": {"shards": [{"endpoint": ch_dsn}], "database": db, "tables": {"*": "events"}},
                   "exactlyOnce": {"engine": "KeeperMap", "keeperPath": f"/wide_{db}"},
                   "checkpointLocation": "/tmp/chsink-wide-checkpoint", "deletionPolicy": "Retain"}}
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))
    app = wait_for("SparkApplication", lambda: get(kube, "sparkapplication", "chsink-wide"), timeout=90)
    # the driver's identity exists in the sink's namespace, and can do what a driver does there
    account = app["spec"]["driver"]["serviceAccount"]
    assert account == "chsink-spark"
    assert get(kube, "serviceaccount", account)
    role = f"{RELEASE}-chsink-{NS}-spark-driver"
    binding = get(kube, "rolebinding", role)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": SINK_NS}]
    as_driver = f"--as=system:serviceaccount:{SINK_NS}:{account}"
    for verb, res in [("create", "pods"), ("delete", "pods"), ("create", "services"), ("create", "configmaps")]:
        assert kube.kubectl("auth", "can-i", verb, res, "-n", SINK_NS, as_driver).stdout.strip() == "yes"
    assert kube.kubectl("auth", "can-i", "get", "secrets", "-n", SINK_NS, as_driver, check=False).stdout.strip() \
        == "no"
    events = kube.kubectl("get", "events", "-n", SINK_NS, "-o", "yaml").stdout
    assert "DriverIdentityCreated" in events and f"RoleBinding {SINK_NS}/{role} created" in events
    res = kube.kubectl("delete", "clickhousesink", "wide", "-n", SINK_NS, "--wait=true", "--timeout=120s",
                       check=False)
    assert res.returncode == 0, kube.runner.output[-4000:]
    assert get(kube, "serviceaccount", account), "the driver's identity is the namespace's, kept for other sinks"


def test_the_ha_install_may_hold_its_own_lease_and_no_other(wide_install):
    sa = f"{RELEASE}-chsink"
    assert wide_install.lease == [sa]
    assert can_i(wide_install, sa, "create", "leases.coordination.k8s.io", NS)
    for verb in ("get", "update"):
        assert can_i(wide_install, sa, verb, f"leases.coordination.k8s.io/{sa}", NS)
        assert not can_i(wide_install, sa, verb, "leases.coordination.k8s.io/kube-scheduler", NS)
    assert not can_i(wide_install, sa, "get", f"leases.coordination.k8s.io/{sa}", "kube-system")


def test_cluster_wide_operator_may_bind_only_the_driver_role(wide_install):
    sa = f"{RELEASE}-chsink"
    assert can_i(wide_install, sa, "create", "serviceaccounts", "anywhere")
    assert can_i(wide_install, sa, "create", "rolebindings.rbac.authorization.k8s.io", "anywhere")
    assert can_i(wide_install, sa, "bind", f"clusterroles.rbac.authorization.k8s.io/{RELEASE}-chsink-{NS}-spark-driver",
                 None)
    assert not can_i(wide_install, sa, "bind", "clusterroles.rbac.authorization.k8s.io/cluster-admin", None)
    assert not can_i(wide_install, sa, "delete", "serviceaccounts", "anywhere")
    assert not can_i(wide_install, sa, "patch", "rolebindings.rbac.authorization.k8s.io", "anywhere")
    assert not can_i(wide_install, sa, "create", "pods", "anywhere")
