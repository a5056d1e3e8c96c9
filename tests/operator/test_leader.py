"""Several operator replicas, as the chart runs them, against the real API server: real `python -m sinkoperator`
processes electing one active replica through a Lease. One acts, the others wait; a killed holder is replaced
within the bound, and a paused one (a stale writer) stops when it wakes instead of acting next to the new one."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sinkoperator.leader import Timing

from .conftest import OperatorProcess
from .test_operator import wait_for

NS = "ha-lease"
LEASE = "chsink"
# a standby takes a dead holder's Lease within Timing().takeover_bound (17 s); kopf then starts, lists the sinks
# and resumes them: docs/operator.md gives 30 s from the holder's death to a pending change applied
TAKEOVER_DOCUMENTED = 30.0


def handled(text: str) -> list[str]:
    """The lines where kopf reports a handler of ours run (succeeded, failed or retried)."""
    return [line for line in text.splitlines() if "Handler '" in line or "Timer '" in line]


class Replicas:
    """The module's operator processes; they outlive a test, as replicas of one Deployment would."""

    def __init__(self, kube: Any, logs: Path) -> None:
        self.kube, self.logs, self.started = kube, logs, []  # type: list[OperatorProcess]

    def start(self, identity: str) -> OperatorProcess:
        self.started.append(OperatorProcess(self.kube.kubeconfig, self.logs / f"{identity}.log", f"--namespace={NS}",
                                            f"--leader-election={LEASE}", f"--lease-namespace={NS}",
                                            identity=identity))
        return self.started[-1]

    def alive(self) -> list[OperatorProcess]:
        return [r for r in self.started if r.proc.poll() is None]

    def holder(self) -> OperatorProcess:
        [r] = [r for r in self.alive() if r.identity == lease(self.kube).get("holderIdentity")]
        return r


@pytest.fixture(scope="module")
def replicas(chsink_crds, tmp_path_factory) -> Iterator[Replicas]:
    chsink_crds.kubectl("create", "namespace", NS, check=False)
    group = Replicas(chsink_crds, tmp_path_factory.mktemp("replicas"))
    yield group
    for r in group.started:
        r.stop()


def lease(kube: Any) -> dict[str, Any]:
    res = kube.kubectl("get", "lease", LEASE, "-n", NS, "-o", "json", check=False)
    return dict(json.loads(res.stdout)["spec"]) if res.returncode == 0 else {}


def sink_cr(name: str, kafka: Any, src: str, server: Any, db: str, tmp: Path, **spark: Any) -> str:
    return yaml.safe_dump({
        "apiVersion": "chsink.io/v1alpha1", "kind": "ClickHouseSink", "metadata": {"name": name, "namespace": NS},
        "spec": {"kafka": {"bootstrapServers": kafka.bootstrap, "topics": [src]},
                 "clickhouse": {"shards": [{"endpoint": server.dsn}], "database": db, "tables": {"*": "events"}},
                 "exactlyOnce": {"engine": "KeeperMap", "keeperPath": f"/{db}"},
                 "checkpointLocation": str(tmp / "ckpt"), "deletionPolicy": "Retain", "spark": spark}})


def target(server: Any, db: str) -> None:
    """The sink's database and table on the real ClickHouse server."""
    import clickhouse_connect

    client = clickhouse_connect.get_client(dsn=server.dsn)
    client.command(f"CREATE DATABASE IF NOT EXISTS {db}")
    client.command(f"CREATE TABLE IF NOT EXISTS {db}.events (id UInt64) ENGINE = MergeTree ORDER BY id")


def app_conf(kube: Any, name: str) -> dict[str, str]:
    res = kube.kubectl("get", "sparkapplication", f"chsink-{name}", "-n", NS, "-o", "json", check=False)
    return dict(json.loads(res.stdout)["spec"].get("sparkConf") or {}) if res.returncode == 0 else {}


def test_one_replica_acts_and_a_standby_takes_over_a_killed_holder_within_the_bound(
        replicas, kafka, topic, clickhouse_server, tmp_path):
    kube = replicas.kube
    db = f"lease_{os.getpid()}"
    target(clickhouse_server, db)
    a = replicas.start("replica-a")
    wait_for("replica-a holds the Lease", lambda: lease(kube).get("holderIdentity") == "replica-a", timeout=60)
    b = replicas.start("replica-b")
    wait_for("replica-b's standby probe", lambda: b.probe() == 200, timeout=30)
    assert "standby: the Lease" in wait_for("b on standby", lambda: "standby" in b.output() and b.output())
    name, src = "ha1", topic(1)
    kube.kubectl("apply", "-f", "-", input=sink_cr(name, kafka, src, clickhouse_server, db, tmp_path,
                                                   sparkConf={"spark.chsink.test.step": "1"}))
    wait_for("the holder deploys the sink", lambda: app_conf(kube, name).get("spark.chsink.test.step") == "1")
    wait_for("the holder's refresh timer", lambda: len(handled(a.output())) >= 3)
    assert handled(b.output()) == [], b.output()[-3000:]  # the standby acted on nothing

    a.proc.kill()  # SIGKILL: no release, the standby must wait the Lease out
    died = time.monotonic()
    kube.kubectl("apply", "-f", "-", input=sink_cr(name, kafka, src, clickhouse_server, db, tmp_path,
                                                   sparkConf={"spark.chsink.test.step": "2"}))
    wait_for("the pending change applied by replica-b",
             lambda: app_conf(kube, name).get("spark.chsink.test.step") == "2", timeout=TAKEOVER_DOCUMENTED + 30)
    took = time.monotonic() - died
    print(f"\ntake-over: the change was applied {took:.1f} s after the holder's SIGKILL", file=sys.__stdout__)
    assert took <= TAKEOVER_DOCUMENTED, took
    held = lease(kube)
    assert held["holderIdentity"] == "replica-b" and held["leaseTransitions"] == 1, held
    out = wait_for("b's handler lines", lambda: handled(b.output()) and b.output())
    assert out.index("acquired the Lease") < out.index(handled(out)[0]), out[-3000:]  # it acted only once leader
    kube.kubectl("delete", "clickhousesink", name, "-n", NS, "--wait=true", "--timeout=60s")


def test_a_paused_holder_stops_when_it_wakes_instead_of_acting_next_to_the_new_one(
        replicas, kafka, topic, clickhouse_server, tmp_path):
    """A stale writer: the holder is stopped (SIGSTOP) past the Lease's duration, a standby takes over and acts,
    then the old holder resumes with its watches and timers due. It must exit without running a handler."""
    kube = replicas.kube
    db = f"lease2_{os.getpid()}"
    target(clickhouse_server, db)
    for identity in ("replica-c", "replica-d")[:max(0, 2 - len(replicas.alive()))]:  # a holder and a standby
        replicas.start(identity)
    stale = wait_for("a live holder", replicas.holder, timeout=60)
    holder = stale.identity
    name, src = "ha2", topic(1)
    kube.kubectl("apply", "-f", "-", input=sink_cr(name, kafka, src, clickhouse_server, db, tmp_path,
                                                   sparkConf={"spark.chsink.test.step": "1"}))
    wait_for("deployed", lambda: app_conf(kube, name).get("spark.chsink.test.step") == "1")
    stale.proc.send_signal(signal.SIGSTOP)
    wait_for("a standby takes the paused holder's Lease",
             lambda: lease(kube).get("holderIdentity") not in ("", holder), timeout=Timing().takeover_bound + 15)
    kube.kubectl("apply", "-f", "-", input=sink_cr(name, kafka, src, clickhouse_server, db, tmp_path,
                                                   sparkConf={"spark.chsink.test.step": "2"}))
    wait_for("the new holder applies the change", lambda: app_conf(kube, name).get("spark.chsink.test.step") == "2",
             timeout=40)
    mark = len(stale.output())
    stale.proc.send_signal(signal.SIGCONT)
    assert stale.proc.wait(20) == 1
    woke = stale.output(mark)
    assert "stopping" in woke and handled(woke) == [], woke
    assert app_conf(kube, name).get("spark.chsink.test.step") == "2"
    kube.kubectl("delete", "clickhousesink", name, "-n", NS, "--wait=true", "--timeout=60s")

