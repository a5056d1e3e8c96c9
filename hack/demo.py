"""`make demo`: the main job on the embedded default, abused on purpose, then proven exactly-once.

A local Kafka broker (the test bed's), embedded ClickHouse (chdb) with EmbeddedRocksDB state (no
ZooKeeper), ~1M realistic events over 8 partitions with a few malformed ones, the job SIGKILLed
twice mid-stream (once also losing its checkpoint), restarted, and finally checked by the verifier.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from hack.testbed import Kafka, scratch_env
from hack.testbed.process import REPO
from hack.testbed.servers import ClickHouseServer

TABLE = """CREATE TABLE IF NOT EXISTS demo.events (
    event_id UInt64, user_id UInt64, event_type LowCardinality(String), country LowCardinality(String),
    amount Nullable(Decimal(12, 2)), ts DateTime64(3, 'UTC'), tags Array(String), props Map(String, String),
    referrer Nullable(String), _topic LowCardinality(String), _partition UInt16, _offset UInt64
) ENGINE = MergeTree ORDER BY (_partition, _offset) SETTINGS non_replicated_deduplication_window = 1000"""
TYPES = ["view", "click", "add_to_cart", "purchase", "search"]
COUNTRIES = ["DE", "FR", "US", "BR", "JP", "IN", "NG", "AU"]


def say(msg: str) -> None:
    print(f"\033[1m[demo]\033[0m {msg}", flush=True)


def produce(kafka: Kafka, topic: str, n: int, partitions: int) -> int:
    from confluent_kafka import Producer

    rnd = random.Random(42)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 50, "batch.num.messages": 10000,
                  "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000})
    bad = 0
    t0 = 1_767_225_600_000
    for i in range(n):
        if i % 50_000 == 17:
            value = b'{"event_id": ' + str(i).encode() + b', "ts": '  # truncated
            bad += 1
        elif i % 50_000 == 33:
            value = json.dumps({"event_id": i, "user_id": -5, "event_type": "view", "ts": t0}).encode()  # UInt64 < 0
            bad += 1
        else:
            kind = TYPES[rnd.randrange(5)]
            value = json.dumps({
                "event_id": i, "user_id": rnd.randrange(1, 200_000), "event_type": kind,
                "country": COUNTRIES[rnd.randrange(8)],
                "amount": f"{rnd.randrange(100, 99_999) / 100:.2f}" if kind == "purchase" else None,
                "ts": "2026-01-01T00:00:00.000Z" if i == 0 else (t0 + i * 7) / 1000,
                "tags": [f"tag{rnd.randrange(20)}" for _ in range(rnd.randrange(4))],
                "props": {"page": f"/p/{rnd.randrange(500)}", "ab": rnd.choice("AB")},
                "referrer": None if rnd.random() < 0.6 else f"https://ref{rnd.randrange(30)}.example",
            }).encode()
        while True:
            try:
                p.produce(topic, value, key=str(i % 10_000).encode(), partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10_000 == 0:
            p.poll(0)
    assert p.flush(120) == 0
    return bad


_BATCH = re.compile(r"chsink\.job: batch (\d+): (\d+) records from (\d+) partitions in ([\d.]+)s")


class Job:
    """The job as a user runs it (`python -m sparkapp run`), with each run's batches shown as they happen."""

    def __init__(self, config: Path, work: Path) -> None:
        self.config, self.work = config, work
        self.proc: subprocess.Popen[str] | None = None
        self.runs = 0
        self.batches = 0
        self.rows = 0
        self.started = time.monotonic()

    def start(self, *extra: str) -> None:
        env = {**os.environ, **scratch_env(self.work / "scratch"), "PYTHONUNBUFFERED": "1"}
        self.runs += 1
        self.batches = self.rows = 0
        self.started = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "sparkapp", "run", "--config", str(self.config), *extra],
                                     cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.work / "job.log", "a") as log:
            for line in self.proc.stdout:
                log.write(line)
                m = _BATCH.search(line)
                if m:
                    self.batches += 1
                    self.rows += int(m[2])
                    rate = self.rows / max(time.monotonic() - self.started, 1e-3)
                    print(f"   run {self.runs}, batch {self.batches}: {int(m[2]):,} records from {m[3]} partitions in "
                          f"{float(m[4]):.2f}s; this run {self.rows:,} records, {rate:,.0f} rows/s", flush=True)
                elif "done:" in line or "ERROR" in line or "configuration error" in line:
                    print("   " + line.rstrip(), flush=True)

    def delivered(self) -> str:
        return f"run {self.runs} had delivered {self.batches} batch(es), {self.rows:,} records"

    def wait_batches(self, n: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while self.batches < n and time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise SystemExit(f"job exited early ({self.proc.returncode}); see {self.work / 'job.log'}")
            time.sleep(0.2)

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def wait(self) -> int:
        assert self.proc is not None
        return self.proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batch", type=int, default=80_000, help="offsets per micro-batch (maxOffsetsPerTrigger)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--clickhouse", choices=("embedded", "server"), default="embedded",
                    help="embedded chdb written by the driver (default, quickest to start), or a real ClickHouse "
                         "server process over HTTP written by executors (production's path)")
    a = ap.parse_args()
    t_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="chsink-demo-"))
    say(f"work directory {work}")
    with Kafka(work / "kafka") as kafka, contextlib.ExitStack() as stack:
        assert isinstance(kafka, Kafka)
        server: ClickHouseServer | None = None
        if a.clickhouse == "server":
            started = stack.enter_context(ClickHouseServer(work / "clickhouse"))
            assert isinstance(started, ClickHouseServer)
            server = started
            say(f"ClickHouse server {server.dsn} up (HTTP; the job writes from its executors)")
        kafka.create_topic("events", a.partitions)
        kafka.create_topic("events-dlq", 1)
        say(f"Kafka {kafka.bootstrap} up; producing {a.events:,} events over {a.partitions} partitions...")
        t0 = time.monotonic()
        bad = produce(kafka, "events", a.events, a.partitions)
        say(f"produced {a.events:,} events ({bad} malformed on purpose) in {time.monotonic() - t0:.1f}s")

        chdb = work / "chdb"
        if server is None:
            subprocess.run([sys.executable, "-m", "hack.chsql", str(chdb), "CREATE DATABASE IF NOT EXISTS demo",
                            TABLE], cwd=REPO, check=True)
        else:
            import clickhouse_connect

            client = clickhouse_connect.get_client(dsn=server.dsn)
            client.command("CREATE DATABASE IF NOT EXISTS demo")
            client.command(TABLE)
        config = work / "sink.yaml"
        config.write_text(yaml.safe_dump({
            "name": "demo", "kafka": {"bootstrapServers": kafka.bootstrap, "topics": ["events"]},
            "clickhouse": {"endpoints": [server.dsn if server else f"chdb://{chdb}"], "database": "demo",
                           "tables": {"events": "events"}},
            "state": {"engine": "EmbeddedRocksDB"}, "dlq": {"topic": "events-dlq"},
            "batching": {"maxOffsetsPerTrigger": a.batch, "blockOffsets": 100_000, "triggerInterval": "1 second"},
            "checkpointLocation": str(work / "checkpoint"),
        }))
        job = Job(config, work)
        t_job = time.monotonic()
        say(f"starting the job ({'embedded ClickHouse' if server is None else 'ClickHouse over HTTP'}"
            " + EmbeddedRocksDB state)")
        job.start()
        job.wait_batches(3)
        say(f"SIGKILL #1 mid-stream ({job.delivered()})")
        job.kill()
        job.start()
        job.wait_batches(2)
        say(f"SIGKILL #2 mid-stream ({job.delivered()}), and the Spark checkpoint is deleted")
        job.kill()
        shutil.rmtree(work / "checkpoint")
        say("restarting: starting offsets now come from the state store")
        job.start("--until-idle", "4")
        code = job.wait()
        job_s = time.monotonic() - t_job
        if code != 0:
            raise SystemExit(f"job failed ({code}); see {work / 'job.log'}")
        say("running the verifier")
        res = subprocess.run([sys.executable, "-m", "sparkapp", "verify", "--config", str(config)], cwd=REPO,
                             capture_output=True, text=True)
        print(res.stdout)
        report = json.loads(subprocess.run(
            [sys.executable, "-m", "sparkapp", "verify", "--config", str(config), "--json"], cwd=REPO,
            capture_output=True, text=True).stdout)
    t = report["totals"]
    summary = {
        "rows in Kafka": t["kafka"], "rows in ClickHouse": t["clickhouse"], "dead-lettered": t["dead_lettered"],
        "duplicates": t["duplicates"], "gaps": t["gaps"], "job time incl. 3 Spark start-ups (s)": round(job_s, 1),
        "rows/s over job time": round(t["kafka"] / job_s), "elapsed (s)": round(time.monotonic() - t_start, 1),
    }
    say("summary")
    for k, v in summary.items():
        print(f"   {k:<40} {v:>12,}" if isinstance(v, int) else f"   {k:<40} {v:>12}")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    ok = report["ok"] and t["duplicates"] == 0 and t["gaps"] == 0 and t["pending"] == 0
    say("exactly once: OK" if ok else "ANOMALIES FOUND")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
