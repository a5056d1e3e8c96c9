"""A cluster without the spark-operator: the sink says what is missing (a condition and an Event, never a
permanent failure), and installing the spark-operator's CRDs deploys it without touching the sink.

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


@pytest.fixture(scope="module")
def bare(empty_cluster, ch_factory) -> Iterator[Any]:
    with empty_cluster("bare") as api:
        for f in sorted((REPO / "crds").glob("*.yaml")):
            api.run_kubectl("apply", "--server-side", "-f", str(f))
        api.wait_crd("clickhousesinks.chsink.io")
        ch_factory()
        with kopf_runner(api.kubeconfig, "default"):
            yield api


def test_without_the_spark_operator_the_sink_says_so_and_installing_it_deploys(bare, kafka, topic, ch_dsn, ch_db):
    api = bare
    _, db = ch_db
    cr = {"apiVersion": "chsink.io/v1alpha1", "kind": "ClickHouseSink",
          "metadata": {"name": "nospark", "namespace": "default"},
          "spec": {"kafka": {"bootstrapServers": kafka.bootstrap, "topics": [topic(1)]},
                   "clickhouse": {"shards": [{"endpoint": ch_dsn}], "database": db, "tables": {"*": "events"}},
                   "exactlyOnce": {"engine": "KeeperMap", "keeperPath": f"/nospark_{db}"},
                   "checkpointLocation": "/tmp/chsink-nospark-checkpoint"}}
    api.run_kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))

    def status() -> dict[str, Any]:
        res = api.run_kubectl("get", "chs", "nospark", "-o", "json", check=False)
        return dict(json.loads(res.stdout).get("status") or {}) if res.returncode == 0 else {}

    def condition(kind: str) -> dict[str, Any]:
        return next((c for c in status().get("conditions", []) if c["type"] == kind), {})

    cond = wait_for("SparkOperatorMissing", lambda: (c := condition("Degraded")).get("reason") ==
                    "SparkOperatorMissing" and c)
    assert cond["status"] == "True" and "sparkoperator.k8s.io/v1beta2" in cond["message"] \
        and "install the spark-operator" in cond["message"], cond
    assert status()["state"] != "Invalid" and condition("Ready")["status"] == "False"
    events = api.run_kubectl("get", "events", "-o", "json", "--field-selector",
                             "involvedObject.name=nospark,type=Warning,reason=SparkOperatorMissing").stdout
    assert len(json.loads(events)["items"]) == 1
    show(api, "no spark-operator installed (before)")

    crds = cached(f"spark-operator-crds-{versions()['SPARK_OPERATOR_VERSION']}")
    for f in sorted(crds.glob("*.yaml")):
        api.run_kubectl("apply", "--server-side", "-f", str(f))
    wait_for("the SparkApplication once the CRDs exist",
             lambda: api.run_kubectl("get", "sparkapplication", "chsink-nospark", check=False).returncode == 0,
             timeout=45)
    wait_for("not degraded", lambda: condition("Degraded").get("status") == "False", timeout=30)
    show(api, "the spark-operator's CRDs installed (after)")
    # the finalizer itself may wait up to 60 s for the SparkApplication to go before deleting the state: a
    # shorter wait here failed under the other worker's load
    api.run_kubectl("delete", "chs", "nospark", "--wait=true", "--timeout=120s")


def show(api: KubeApiServer, title: str) -> None:
    """kubectl get and describe, for the closing note (KopfRunner swaps sys.stdout)."""
    desc = api.run_kubectl("describe", "chs", "nospark").stdout
    print(f"\n--- {title}\n{api.run_kubectl('get', 'chs', 'nospark').stdout}{desc[desc.find('Status:'):]}",
          file=sys.__stdout__)
