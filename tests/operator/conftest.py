"""Our CRDs installed on the real API server, and the operator running in-process (KopfRunner)."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.testbed.process import REPO, free_port
from sparkapp.config import Engine
from sparkapp.edges.store import StateStore

_seq = itertools.count()
# The API servers here have the spark-operator's CRDs but run no spark-operator (the tests play its part where they
# need a state), so no application would ever be picked up: SparkOperatorNotWatching is tested on its own.
NO_SPARK_OPERATOR = {"CHSINK_SPARK_PICKUP_SECONDS": "86400"}


@pytest.fixture(scope="session")
def chsink_crds(kube):
    for f in sorted((REPO / "crds").glob("*.yaml")):
        kube.kubectl("apply", "--server-side", "-f", str(f))
    kube.api.wait_crd("clickhousesinks.chsink.io")
    kube.api.wait_crd("sinkstatuses.chsink.io")
    return kube


@contextlib.contextmanager
def kopf_runner(kubeconfig: Path, namespace: str | None, env: dict[str, str] | None = None) -> Iterator[Any]:
    """The operator in-process (KopfRunner) against a kubeconfig, scoped to one namespace (None: the whole
    cluster), with the install's environment (one replica: the Lease election is test_leader.py's)."""
    from kopf.testing import KopfRunner

    extra = {"KUBECONFIG": str(kubeconfig), "CHSINK_STATUS_INTERVAL": "2", **NO_SPARK_OPERATOR, **(env or {})}
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    scope = [f"--namespace={namespace}"] if namespace else ["--all-namespaces"]
    try:
        with KopfRunner(["run", "--standalone", *scope,
                         "-m", "sinkoperator.handlers"], timeout=120) as runner:
            yield runner
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert runner.exception is None or isinstance(runner.exception, SystemExit), runner.output[-3000:]


class OperatorProcess:
    """`python -m sinkoperator` as the chart's container runs it: a real process, its output in `log`."""

    def __init__(self, kubeconfig: Path, log: Path, *args: str, identity: str = "") -> None:
        self.identity, self.port, self.log = identity, free_port(), log
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_NAME": identity, "CHSINK_STATUS_INTERVAL": "2",
               "CHSINK_RETRY_DELAY": "2", "PYTHONWARNINGS": "ignore", **NO_SPARK_OPERATOR}
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sinkoperator", f"--liveness=http://127.0.0.1:{self.port}/healthz", *args],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)

    def output(self, since: int = 0) -> str:
        return self.log.read_text(errors="replace")[since:]

    def probe(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5) as r:
            return int(r.status)

    def stop(self) -> None:
        """SIGTERM, as the kubelet stops a pod (a stopped one is woken first); SIGKILL after 30 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="module")
def operator(chsink_crds, ch_factory):
    ch_factory()  # the session's chdb engine (with the ZooKeeper config) exists before the operator uses it
    with kopf_runner(chsink_crds.kubeconfig, "default"):
        yield chsink_crds


@pytest.fixture
def sink(operator, kafka, topic, ch_dsn, ch_db, tmp_path):
    client, db = ch_db
    client.command(f"CREATE TABLE `{db}`.events (id UInt64, _topic String, _partition UInt16, _offset UInt64) "
                   "ENGINE = MergeTree ORDER BY _offset")
    src = topic(2)
    name = f"s{next(_seq)}"

    checkpoint = tmp_path / "checkpoint"

    def apply(topics: list[str] | None = None, **spec: Any) -> dict[str, Any]:
        cr = {"apiVersion": "chsink.io/v1alpha1", "kind": "ClickHouseSink",
              "metadata": {"name": name, "namespace": "default"},
              "spec": {"kafka": {"bootstrapServers": kafka.bootstrap, "topics": topics or [src]},
                       "clickhouse": {"shards": [{"endpoint": ch_dsn}], "database": db, "tables": {"*": "events"}},
                       "exactlyOnce": {"engine": "KeeperMap", "keeperPath": f"/op_{db}"},
                       "checkpointLocation": str(checkpoint), **spec}}
        operator.kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))
        return cr

    store = StateStore(client, "chsink_state", Engine.KEEPER_MAP, keeper_path=f"/op_{db}", database=db)
    yield {"name": name, "topic": src, "apply": apply, "store": store, "db": db, "kube": operator, "dsn": ch_dsn,
           "checkpoint": checkpoint, "new_topic": lambda: topic(1)}
    operator.kubectl("delete", "clickhousesink", name, "--ignore-not-found", "--wait=true", "--timeout=60s",
                     check=False)
