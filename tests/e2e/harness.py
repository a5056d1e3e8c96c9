"""Runs the real job (`python -m sparkapp run`) as a subprocess against the test bed, and inspects results.

The job's embedded ClickHouse (chdb) lives at a path of its own; only one process may open it, so
SQL checks and the verifier run as subprocesses too, while the job is stopped.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Producer

from hack.testbed import Kafka
from hack.testbed.process import REPO
from hack.testbed.servers import ClickHouseServer

EVENTS_TABLE = (
    "CREATE TABLE IF NOT EXISTS {db}.events (id UInt64, name LowCardinality(String), amount Decimal(12, 2), "
    "ts DateTime64(3, 'UTC'), tags Array(String), attrs Map(String, String), note Nullable(String), "
    "_topic LowCardinality(String), _partition UInt16, _offset UInt64, _headers Map(String, String), "
    "_timestamp_type Enum8('CreateTime' = 0, 'LogAppendTime' = 1)) "
    "ENGINE = MergeTree ORDER BY (_topic, _partition, _offset) SETTINGS non_replicated_deduplication_window = 10000"
)


# the rows whose `_headers` or `_timestamp_type` are not what BackgroundProducer gave their records
HEADERS_WRONG = ("length(mapKeys(_headers)) != id % 2 OR _headers['trace'] != if(id % 2 = 1, concat('t', toString(id)), '') "
                 "OR _timestamp_type != 'CreateTime'")


def event(i: int) -> dict[str, Any]:
    return {"id": i, "name": f"user{i % 97}", "amount": f"{i % 1000}.{i % 100:02d}", "ts": 1_700_000_000 + i,
            "tags": [f"t{i % 5}"], "attrs": {"k": str(i % 7)}, "note": None if i % 3 else f"n{i}"}


class SinkHarness:
    def __init__(self, workdir: Path, kafka: Kafka, topic: str, dlq_topic: str, engine: str = "EmbeddedRocksDB",
                 chdb_config: Path | None = None, server: ClickHouseServer | None = None, **batching: Any) -> None:
        """`server`: a real ClickHouse server process, reached over HTTP, each partition written by an executor
        task (production's path); without it, the embedded chdb written by the driver."""
        self.workdir = workdir
        self.server = server
        # a server outlives the test: each test gets a database of its own there
        self.db = "e2e" if server is None else "e2e_" + re.sub(r"\W", "_", topic)[:50]
        self.kafka = kafka
        self.topic = topic
        self.chdb = workdir / "chdb"
        self.chdb_config = chdb_config
        self.checkpoint = workdir / "checkpoint"
        self.config_path = workdir / "sink.yaml"
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self.logs: list[Path] = []
        self.extra_env: dict[str, str] = {}
        cfg: dict[str, Any] = {
            "name": f"sink-{topic}"[:60].lower().rstrip("_-."),
            "kafka": {"bootstrapServers": kafka.bootstrap, "topics": [topic]},
            "clickhouse": {"endpoints": [server.dsn if server else f"chdb://{self.chdb}"], "database": self.db,
                           "tables": {topic: "events"}},
            "state": {"engine": engine, "keeperPath": f"/e2e_{topic}"},
            "dlq": {"topic": dlq_topic},
            "batching": {"maxOffsetsPerTrigger": 3000, "blockOffsets": 1000, "triggerInterval": "1 second", **batching},
            "checkpointLocation": str(self.checkpoint),
        }
        if chdb_config and not server:
            cfg["clickhouse"]["chdbConfigFile"] = str(chdb_config)
        self.config = cfg
        self.write_config()
        if server is not None:
            self.sql(f"DROP DATABASE IF EXISTS {self.db} SYNC")
        self.sql(f"CREATE DATABASE IF NOT EXISTS {self.db}", EVENTS_TABLE.format(db=self.db))

    def write_config(self) -> None:
        self.config_path.write_text(yaml.safe_dump(self.config))

    def env(self) -> dict[str, str]:
        # the job finds the Kafka connector where `make setup` put it
        return dict(os.environ, PYTHONUNBUFFERED="1", **self.extra_env)

    def sql(self, *statements: str) -> list[Any]:
        if self.server is not None:  # a server: any process may talk to it, the job running or not
            import clickhouse_connect

            client = clickhouse_connect.get_client(dsn=self.server.dsn)
            out = []
            for stmt in statements:
                if stmt.lstrip().upper().startswith(("SELECT", "WITH", "SHOW", "DESCRIBE")):
                    out.append(json.loads(json.dumps([list(r) for r in client.query(stmt).result_rows], default=str)))
                else:
                    client.command(stmt)
            return out
        cmd = [sys.executable, "-m", "hack.chsql", str(self.chdb)]
        if self.chdb_config:
            cmd += ["--config", str(self.chdb_config)]
        res = subprocess.run([*cmd, *statements], cwd=REPO, capture_output=True, text=True, timeout=180)
        assert res.returncode == 0, res.stderr[-2000:]
        return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]

    def start(self, *extra: str) -> None:
        assert self.proc is None or self.proc.poll() is not None
        self.runs += 1
        log = self.workdir / f"job-{self.runs}.log"
        self.logs.append(log)
        with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sparkapp", "run", "--config", str(self.config_path), *extra],
                cwd=REPO, env=self.env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def log_text(self) -> str:
        return self.logs[-1].read_text(errors="replace") if self.logs else ""

    def wait_for_batches(self, n: int, timeout: float = 120) -> bool:
        """Waits until the current run logged n batches (True) or exited (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log_text().count("INFO chsink.job: batch ") >= n:
                return True
            if self.proc is not None and self.proc.poll() is not None:
                return False
            time.sleep(0.3)
        raise AssertionError(f"job made no progress in {timeout}s:\n{self.log_text()[-3000:]}\n{self.stacks()}")

    def stacks(self) -> str:
        """Python stacks of the running job (py-spy), to show where it is stuck."""
        if self.proc is None or self.proc.poll() is not None:
            return ""
        res = subprocess.run([str(Path(sys.executable).parent / "py-spy"), "dump", "--pid", str(self.proc.pid)],
                             capture_output=True, text=True, timeout=60)
        return res.stdout[-6000:] + res.stderr[-500:]

    def kill(self) -> None:
        """SIGKILL the whole process group (driver JVM included)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def wait(self, timeout: float = 300) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"job did not finish in {timeout}s:\n{self.log_text()[-3000:]}") from None

    def drain(self, idle: float = 6.0) -> None:
        """Runs the job until it has been idle for `idle` seconds; it must exit 0."""
        self.start("--until-idle", str(idle), "--quiet")
        code = self.wait()
        assert code == 0, f"draining run failed ({code}):\n{self.log_text()[-4000:]}"

    def verify(self) -> dict[str, Any]:
        res = subprocess.run([sys.executable, "-m", "sparkapp", "verify", "--config", str(self.config_path), "--json"],
                             cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=300)
        assert res.returncode in (0, 1), res.stderr[-3000:]
        report: dict[str, Any] = json.loads(res.stdout)
        report["exit"] = res.returncode
        return report

    def delete_checkpoint(self) -> None:
        subprocess.run(["rm", "-rf", str(self.checkpoint)], check=True)


def produce_events(kafka: Kafka, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(n):
        p.produce(topic, json.dumps(event(i)).encode())
    assert p.flush(30) == 0


def drained_sink(workdir: Path, kafka: Kafka, topic: str, dlq: str, n: int) -> SinkHarness:
    """A sink over n fresh events, run until idle."""
    sink = SinkHarness(workdir, kafka, topic, dlq)
    produce_events(kafka, topic, n)
    sink.drain()
    return sink


class BackgroundProducer(threading.Thread):
    """Keeps producing events (a few malformed) at a steady pace until `total` are sent or stop() is called."""

    def __init__(self, kafka: Kafka, topic: str, total: int, per_second: int = 3000, bad_every: int = 997,
                 partitions: int = 4) -> None:
        super().__init__(daemon=True)
        self.stopped = threading.Event()
        self.kafka, self.topic, self.total, self.per_second = kafka, topic, total, per_second
        self.bad_every, self.partitions = bad_every, partitions
        self.sent = 0
        self.bad = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            p = Producer({"bootstrap.servers": self.kafka.bootstrap, "enable.idempotence": True,
                          "message.timeout.ms": 120000, "linger.ms": 20})
            rnd = random.Random(7)
            t0 = time.monotonic()
            while self.sent < self.total and not self.stopped.is_set():
                i = self.sent
                if i % self.bad_every == 5:
                    value = b'{"id": ' + str(i).encode()  # truncated JSON
                    self.bad += 1
                else:
                    value = json.dumps(event(i)).encode()
                p.produce(self.topic, value, key=str(i).encode(), partition=rnd.randrange(self.partitions),
                          headers=[("trace", b"t%d" % i)] if i % 2 else None)  # see HEADERS_WRONG
                self.sent += 1
                if self.sent % 500 == 0:
                    p.poll(0)
                    ahead = self.sent / self.per_second - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
            assert p.flush(180) == 0
        except BaseException as e:  # surfaced by the test
            self.error = e

    def finish(self, timeout: float = 300) -> None:
        self.stopped.set()
        self.join(timeout)
        assert self.error is None, self.error
