"""A cluster without the spark-operator, or with one that cannot serve the sink: the sink says what is missing (a
condition and an Event, never a permanent failure), and fixing it deploys the sink without touching it.

It runs on an empty cluster (a second API server), since the shared one has the spark-operator's CRDs
from the start."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from hack.testbed.process import REPO, cached, versions
from hack.testbed.servers import KubeApiServer

from .conftest import kopf_runner
from .test_operator import wait_for

NS = "data"  # the quick start's namespace, which the spark-operator's chart does not watch by default


@pytest.fixture(scope="module")
def bare(empty_cluster, ch_factory) -> Iterator[Any]:
    with empty_cluster("bare") as api:
        for f in sorted((REPO / "crds").glob("*.yaml")):
            api.run_kubectl("apply", "--server-side", "-f", str(f))
        api.run_kubectl("create", "namespace", NS)
        api.run_kubectl("create", "serviceaccount", "default", "-n", NS)  # no controller manager makes it here
        api.wait_crd("clickhousesinks.chsink.io")
        ch_factory()
        # the CRD re-read every second, a job not picked up after 8: the checks' one-minute defaults, shortened
        with kopf_runner(api.kubeconfig, NS, env={"CHSINK_CRD_CHECK_SECONDS": "1",
                                                  "CHSINK_SPARK_PICKUP_SECONDS": "8"}):
            yield api


def apply_crds(api: KubeApiServer, version_key: str) -> None:
    for f in sorted(cached(f"spark-operator-crds-{versions()[version_key]}").glob("*.yaml")):
        api.run_kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f))


def test_each_missing_spark_operator_part_says_so_and_clears_once_fixed(bare, kafka, topic, ch_dsn, ch_db):
    """No CRDs, then a spark-operator too old for spec.suspend, then one that does not watch the namespace, then
    a driver pod its webhook did not mutate: each its own Degraded reason and one Warning, none blocking the
    rollout, each gone once fixed. The test plays the spark-operator's part (its status, its driver pod)."""
    api = bare
    _, db = ch_db
    cr = {"apiVersion": "chsink.io/v1alpha1", "kind": "ClickHouseSink",
          "metadata": {"name": "nospark", "namespace": NS},
          "spec": {"kafka": {"bootstrapServers": kafka.bootstrap, "topics": [topic(1)]},
                   "clickhouse": {"shards": [{"endpoint": ch_dsn}], "database": db, "tables": {"*": "events"}},
                   "exactlyOnce": {"engine": "KeeperMap", "keeperPath": f"/nospark_{db}"},
                   "checkpointLocation": "/tmp/chsink-nospark-checkpoint"}}
    api.run_kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))

    def kubectl(*args: str, **kw: Any) -> Any:
        return api.run_kubectl(*args, "-n", NS, **kw)

    def status() -> dict[str, Any]:
        res = kubectl("get", "chs", "nospark", "-o", "json", check=False)
        return dict(json.loads(res.stdout).get("status") or {}) if res.returncode == 0 else {}

    def condition(kind: str) -> dict[str, Any]:
        return next((c for c in status().get("conditions", []) if c["type"] == kind), {})

    def degraded(reason: str, timeout: float = 45) -> dict[str, Any]:
        cond: dict[str, Any] = wait_for(reason, lambda: (c := condition("Degraded")).get("reason") == reason and c,
                                        timeout=timeout)
        assert cond["status"] == "True" and status()["state"] != "Invalid", cond
        assert condition("Ready")["status"] == "False"
        events = kubectl("get", "events", "-o", "json", "--field-selector",
                         f"involvedObject.name=nospark,type=Warning,reason={reason}").stdout
        assert len(json.loads(events)["items"]) == 1, events
        return cond

    def app_exists() -> bool:
        return bool(kubectl("get", "sparkapplication", "chsink-nospark", check=False).returncode == 0)

    cond = degraded("SparkOperatorMissing")
    assert "sparkoperator.k8s.io/v1beta2" in cond["message"] and "install the spark-operator" in cond["message"]
    show(api, "no spark-operator installed")

    apply_crds(api, "SPARK_OPERATOR_OLD_VERSION")  # the real v2.3.0 CRD: no spec.suspend
    wait_for("the SparkApplication once the CRDs exist", app_exists, timeout=45)  # not blocked by what follows
    cond = degraded("SparkOperatorTooOld")
    assert "spec.suspend" in cond["message"] and "v2.4.0 or newer" in cond["message"] \
        and "helm upgrade spark-operator" in cond["message"], cond
    show(api, "a spark-operator too old for spec.suspend")

    apply_crds(api, "SPARK_OPERATOR_VERSION")  # upgraded; still nothing gives the application a state
    cond = degraded("SparkOperatorNotWatching")
    assert "chsink-nospark" in cond["message"] and \
        "--set 'spark.jobNamespaces={default,data}'" in cond["message"], cond
    show(api, "a spark-operator that does not watch the namespace")

    # the spark-operator's part once it watches `data`: it takes the application up
    kubectl("patch", "sparkapplication", "chsink-nospark", "--subresource=status", "--type=merge", "-p",
            json.dumps({"status": {"driverInfo": {}, "applicationState": {"state": "SUBMITTED"}}}))
    wait_for("not degraded", lambda: condition("Degraded").get("status") == "False", timeout=30)

    def driver(volumes: list[dict[str, Any]]) -> str:
        return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "chsink-nospark-driver", "namespace": NS,
            "labels": {"sparkoperator.k8s.io/app-name": "chsink-nospark", "spark-role": "driver"}},
            "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "chsink.local/spark"}],
                     "volumes": volumes}})

    # the driver as spark-submit creates it, not mutated: no webhook
    kubectl("apply", "-f", "-", input=driver([]))
    cond = degraded("SparkOperatorWebhookMissing")
    assert "chsink-nospark-driver" in cond["message"] and "webhook" in cond["message"], cond
    show(api, "a driver the spark-operator's webhook did not mutate")
    kubectl("delete", "pod", "chsink-nospark-driver", "--grace-period=0", "--force")
    # as the webhook mounts it
    kubectl("apply", "-f", "-", input=driver([{"name": "chsink-nospark-vol",
                                               "configMap": {"name": "chsink-nospark"}}]))
    wait_for("not degraded", lambda: condition("Degraded").get("status") == "False", timeout=30)
    recovered = kubectl("get", "events", "-o", "json", "--field-selector",
                        "involvedObject.name=nospark,reason=Recovered").stdout
    assert len(json.loads(recovered)["items"]) >= 2, recovered
    show(api, "all fixed")
    restored = kubectl("get", "events", "-o", "json", "--field-selector",
                       "involvedObject.name=nospark,reason=LayoutRestored").stdout
    assert json.loads(restored)["items"] == [], "the first apply failed: nothing was lost, so nothing is restored"
    kubectl("delete", "pod", "chsink-nospark-driver", "--grace-period=0", "--force")
    # the finalizer itself may wait up to 60 s for the SparkApplication to go before deleting the state: a
    # shorter wait here failed under the other worker's load
    kubectl("delete", "chs", "nospark", "--wait=true", "--timeout=120s")


def show(api: KubeApiServer, title: str) -> None:
    """kubectl get and describe, for the closing note (KopfRunner swaps sys.stdout)."""
    desc = api.run_kubectl("describe", "chs", "nospark", "-n", NS).stdout
    print(f"\n--- {title}\n{api.run_kubectl('get', 'chs', 'nospark', '-n', NS).stdout}{desc[desc.find('Status:'):]}",
          file=sys.__stdout__)
