"""How long a record takes from Kafka to ClickHouse while a producer keeps writing: the exactly-once job on the
embedded path (c) and on the HTTP path (e), each with variants of its `sourceOptions` or `sparkConf` (as in
bench.variants), alternated; and with `--paths` naming them, the peers `make bench` runs ((g), (h), (i) of
bench.peers, as configured there, each on a server of its own), beside them in every rep.

    python -m bench.latency [--rate 20000] [--seconds 60] [--warmup 25] [--paths c,e,g,h,i] [--reps 2] \\
        ['{"default": {}, "wait500": {"sourceOptions": {"kafka.fetch.max.wait.ms": "500"}}}']

Each run produces `--rate` events per second for `--seconds` into a topic of its own, each event's `ts` the
time it was produced (ms), while the job runs. The events table has one more column, `ingested DateTime64(3)
DEFAULT now64(3)`, which ClickHouse computes when a row's block is inserted (on every path: the job and the
peers never send it). A row's latency is `ingested - ts`; rows produced in the first `--warmup` seconds (the job's
start-up) are left out. `now64` is taken when the insert starts, so a block's own insert time is not counted.
Writes results/<date>-<name>.json with the quantiles per run and their medians per path and variant (a probe:
no test asserts a figure)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hack.testbed import Kafka
from hack.testbed.process import REPO
from hack.testbed.servers import ClickHouseServer, ZooKeeper

from . import entry, peers, probe_options, publish
from .__main__ import PEERS, own_server, run_job, run_peer
from .data import TABLE, event
from .variants import normalized

LATENCY_TABLE = TABLE.replace("_partition UInt16\n",
                              "_partition UInt16, ingested DateTime64(3, 'UTC') DEFAULT now64(3)\n")
QUANTILES = (0.5, 0.9, 0.99, 1.0)
MINE = ("c", "e")  # chsink's paths: embedded chdb written by the driver, a server over HTTP written by executors
SQL = ("SELECT count(), quantilesExact({q})(dateDiff('millisecond', ts, ingested)) FROM {db}.events "
       "WHERE ts >= fromUnixTimestamp64Milli({since})")


def produce_live(bootstrap: str, topic: str, rate: int, seconds: int, partitions: int,
                 stop: threading.Event | None = None) -> int:
    """`rate` events per second for `seconds`, in 10 ms ticks, each event's ts the time it was produced; `stop`
    set, it stops early (its run was abandoned: the harness is exiting)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 0})
    rnd, i, per_tick = random.Random(7), 0, max(1, rate // 100)
    start = time.time()
    for tick in range(seconds * 100):
        if stop is not None and stop.is_set():
            break
        while time.time() < start + tick / 100:
            time.sleep(0.001)
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        for _ in range(per_tick):
            p.produce(topic, json.dumps({**event(rnd, i), "ts": now}, separators=(",", ":")).encode(),
                      partition=i % partitions)
            i += 1
        p.poll(0)
    if p.flush(60):
        raise RuntimeError("latency: the producer did not flush")
    return i


def live(work: Path, kafka: Kafka, a: argparse.Namespace,
         sink: Callable[[str, int], dict[str, Any]]) -> tuple[dict[str, Any], int]:
    """`sink(topic, n)` run on a topic of its own while the producer writes the n events to it: what it returned,
    and the time (ms) from which rows count."""
    topic = work.name.replace("_", "-")
    kafka.create_topic(topic, a.partitions)
    n = a.seconds * 100 * max(1, a.rate // 100)
    since = int((time.time() + a.warmup) * 1000)
    stop = threading.Event()
    producer = threading.Thread(target=produce_live,
                                args=(kafka.bootstrap, topic, a.rate, a.seconds, a.partitions, stop))
    producer.start()
    try:
        return sink(topic, n), since
    finally:
        # a sink that returned saw all n events, so the producer is done; one that failed, or a harness exiting,
        # would have the rest produced for nothing
        stop.set()
        producer.join()


def one(work: Path, kafka: Kafka, server: ClickHouseServer | None, a: argparse.Namespace,
        variant: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One live run of the job; its rows' latency quantiles in ms."""
    r, since = live(work, kafka, a, lambda topic, n: run_job(
        work, kafka, topic, n, a.batch, True, a.block, server=server, spark_conf=variant["sparkConf"],
        source_options=variant["sourceOptions"] or None, table=LATENCY_TABLE))
    return {"rows": r["rows"], **quantiles(f"bench_{work.name}", since, work, server), "batch_p50_s": r["batch_p50_s"],
            "cpu_cores_used": r["cpu_cores_used"]}


def one_peer(key: str, work: Path, kafka: Kafka, zookeeper: ZooKeeper | None, a: argparse.Namespace) -> dict[str, Any]:
    """One live run of peer `key` on a server of its own; its rows' latency quantiles in ms, or why it was not
    measured."""
    try:
        peers.require(key)
        with own_server(work, zookeeper) as server:
            r, since = live(work, kafka, a, lambda topic, n: run_peer(key, work, kafka, topic, n, server,
                                                                      table=LATENCY_TABLE))
            return {"rows": r["rows"], "duplicates": r["duplicates"],
                    **quantiles(peers.database(work), since, work, server), "cpu_cores_used": r["cpu_cores_used"]}
    except peers.NOT_MEASURED as e:
        return {"unavailable": str(e)[:2000]}


def quantiles(db: str, since: int, work: Path, server: ClickHouseServer | None) -> dict[str, Any]:
    """The latency quantiles (ms) of the rows in `db`'s events table produced from `since` on: on the server, or
    in the chdb under `work`."""
    sql = SQL.format(q=", ".join(map(str, QUANTILES)), db=db, since=since)
    if server is None:
        out = subprocess.run([sys.executable, "-m", "hack.chsql", str(work / "chdb"), sql], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout
        [[rows, qs]] = json.loads(out.splitlines()[-1])
    else:
        import clickhouse_connect

        [[rows, qs]] = clickhouse_connect.get_client(dsn=server.dsn).query(sql).result_rows
    return {"measured_rows": int(rows), "latency_ms": dict(zip(map(str, QUANTILES), qs, strict=True))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="?", default='{"default": {}}', help="as bench.variants takes them")
    ap.add_argument("--rate", type=int, default=20_000, help="events per second")
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=25, help="seconds of production left out (the job's start)")
    ap.add_argument("--paths", default="c,e", help="c: embedded chdb, driver; e: HTTP, executors; g, h, i: the peers"
                                                   " (" + "; ".join(f"{k}: {v}" for k, v in PEERS.items()) + ")")
    probe_options(ap, "latency", 2)
    a = ap.parse_args(argv)
    if a.warmup >= a.seconds:
        ap.error("--warmup must be shorter than --seconds")
    variants = {name: normalized(v) for name, v in json.loads(a.variants).items()}
    paths = a.paths.split(",")
    unknown = [p for p in paths if p not in (*MINE, *PEERS)]
    if unknown:
        ap.error(f"--paths: unknown {', '.join(unknown)}")
    mine, theirs = [p for p in paths if p in MINE], [p for p in paths if p in PEERS]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="chsink-latency-") as tmp, contextlib.ExitStack() as stack:
        kafka = stack.enter_context(Kafka(Path(tmp) / "kafka"))
        zookeeper = stack.enter_context(ZooKeeper(Path(tmp) / "zookeeper")) if "g" in theirs else None
        for rep in range(a.reps):
            turn = [(name, path) for name in (list(variants) if rep % 2 == 0 else list(reversed(variants)))
                    for path in mine] + [("", key) for key in theirs]
            for name, path in (turn if rep % 2 == 0 else list(reversed(turn))):
                work = Path(tmp) / f"{path}_{name}_{rep}"
                if path in PEERS:
                    res = {"path": path, "rep": rep, "peer": PEERS[path], **one_peer(path, work, kafka, zookeeper, a)}
                else:
                    with own_server(work) if path == "e" else contextlib.nullcontext() as server:
                        res = {"variant": name, "path": path, "rep": rep, **one(work, kafka, server, a, variants[name])}
                print(json.dumps(res), file=sys.stderr, flush=True)
                runs.append(res)
    keys = [(f"{path}/{name}", path, name) for path in mine for name in variants] + [(k, k, None) for k in theirs]
    def measured(path: str, name: str | None) -> list[dict[str, Any]]:
        return [r for r in runs if r["path"] == path and r.get("variant") == name and "latency_ms" in r]

    medians = {label: {q: statistics.median(r["latency_ms"][q] for r in measured(path, name))
                       for q in map(str, QUANTILES)} for label, path, name in keys if measured(path, name)}
    return publish({"date": dt.date.today().isoformat(), "rate": a.rate, "seconds": a.seconds, "warmup": a.warmup,
                    "partitions": a.partitions, "max_offsets_per_trigger": a.batch, "block_offsets": a.block,
                    "variants": variants, "medians_latency_ms": medians, "runs": runs}, a.out, a.name)


if __name__ == "__main__":
    entry(main)
