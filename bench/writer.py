"""The embedded writer alone: the job's delivery of Spark-shaped Arrow batches into chdb with no Spark in the
process, its CPU per row, where that CPU goes, and whether chdb's insert holds Python's GIL.

It answers what the writer costs apart from Spark's source and the Arrow hand-over (which `python -m bench`
cannot separate, both running in one driver):
- `deliver_all`: the whole delivery of each batch (state transitions, lines, the guard's pass, inserts with
  tokens), exactly as the driver runs it, EmbeddedRocksDB state; the first batch warms up and is left out;
- `state_store`: of that, the state store's round trips per batch and their wall time, reads apart from writes;
- stages, each over the same batches' partition slices: `build_lines`, the guard's RE2 pass (`Guard.hits`),
  ClickHouse parsing and storing the lines (an insert with the fast path's settings into a copy of the
  table) and parsing them alone (the same insert into a `Null` copy);
- `gil`: a Python thread's loop rate while the main thread inserts one batch's lines, against its rate
  alone (near 1: the insert lets go of the GIL), and the batch's lines inserted in two halves on two threads
  against one after the other: what overlapping partitions on threads could give.

With `--dirty F` each batch is followed by the same events with a share F of bad records (those of `python -m
bench`) on a topic of their own, dead-lettered to a real Kafka broker: `deliver_all_dirty`, and the CPU per row
dirty data adds to the writer, batch by batch beside the clean one.

With `--key-shards N` the rows are routed by `user_id` over N shards, a chdb database each, as (k) runs: the
keys read from the lines, each window split into a sub-block per shard.

It runs with Arrow's allocator set as the job sets it (`sparkapp.spark.session.keep_arrow_memory`), unless the
environment sets it; the results give the setting (`arrow_allocator`).

`python -m bench.writer` prints one JSON object and writes bench/results/<date>-writer.json."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import os
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hack.testbed import Kafka, ZooKeeper
from hack.testbed.process import REPO
from sparkapp.spark.session import ARROW_ALLOCATOR_ENV, keep_arrow_memory

from . import entry, publish
from .data import TABLE, encoded


def spark_batch(values: list[bytes], partitions: int, first_offset: int, topic: str = "bench") -> Any:
    """A micro-batch as the job's `toArrow()` hands it over: the job's columns, each Kafka partition's rows
    together and offset-ordered. Partition p's offsets are `p * 1000` further on than the first's: real
    partitions' ranges differ, and the state store's writes then carry a value per partition."""
    import pyarrow as pa

    per = len(values) // partitions
    n = per * partitions
    return pa.table({
        "topic": pa.array([topic] * n), "partition": pa.array([p for p in range(partitions) for _ in range(per)],
                                                                  pa.int32()),
        "offset": pa.array([p * 1000 + first_offset + j for p in range(partitions) for j in range(per)], pa.int64()),
        "key": pa.array([None] * n, pa.binary()), "value": pa.array(values[:n], pa.binary()),
        "timestamp": pa.array([1_764_000_000_000_000] * n, pa.timestamp("us")),
        "timestampType": pa.array([0] * n, pa.int32())})


def _cpu(fn: Callable[[], Any]) -> float:
    """The process's CPU seconds (every thread: chdb's too) spent in fn."""
    c0 = time.process_time()
    fn()
    return time.process_time() - c0


class StateCalls:
    """The state store's ClickHouse client, timing its calls (the real client does the work); the tests count
    round trips with it too."""

    def __init__(self, client: Any) -> None:
        self.client, self.calls = client, []  # type: ignore[var-annotated]

    @property
    def round_trips(self) -> int:
        return len(self.calls)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if name not in ("query", "raw_query", "command", "insert"):
            return attr

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return attr(*a, **kw)
            finally:
                self.calls.append(("read" if name.endswith("query") else "write", time.perf_counter() - t0))
        return timed

    def per_batch(self, batches: list[list[tuple[str, float]]]) -> dict[str, float]:
        """Medians over the batches' calls: round trips, and ms spent reading and writing."""
        def ms(calls: list[tuple[str, float]], kind: str) -> float:
            return sum(t for k, t in calls if k == kind) * 1e3
        return {"round_trips": statistics.median(len(b) for b in batches),
                "read_ms": round(statistics.median(ms(b, "read") for b in batches), 1),
                "write_ms": round(statistics.median(ms(b, "write") for b in batches), 1)}


def _spin_rate(stop: threading.Event, out: list[float]) -> None:
    n, t0 = 0, time.perf_counter()
    while not stop.is_set():
        n += 1
    out.append(n / (time.perf_counter() - t0))


def _beside(fn: Callable[[], Any]) -> tuple[float, float]:
    """A spinning Python thread's loops per second while fn runs on this thread, and the cores the process
    used meanwhile (below 2 with the spinner slowed: the GIL held it back, not a lack of CPU)."""
    stop, out = threading.Event(), []  # type: ignore[var-annotated]
    t = threading.Thread(target=_spin_rate, args=(stop, out))
    t0, c0 = time.perf_counter(), time.process_time()
    t.start()
    try:
        fn()
    finally:
        stop.set()
        t.join()
    return float(out[0]), (time.process_time() - c0) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    keep_arrow_memory()  # as the job's driver does, before pyarrow loads (the environment's own setting wins)
    ap = argparse.ArgumentParser(prog="python -m bench.writer")
    ap.add_argument("--events", type=int, default=400_000, help="records per batch")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batches", type=int, default=4, help="the first warms up and is left out")
    ap.add_argument("--dirty", type=float, default=0.0, help="also deliver each batch with this share of bad records")
    ap.add_argument("--after", choices=("waiting", "immediate"), default="waiting",
                    help="AFTER left to the next BEFORE, as the job does, or written at once, as it did before")
    ap.add_argument("--engine", choices=("EmbeddedRocksDB", "KeeperMap"), default="EmbeddedRocksDB",
                    help="the state table's engine; KeeperMap starts a ZooKeeper for it")
    ap.add_argument("--key-shards", type=int, default=0,
                    help="rows routed by `user_id` over this many shards (a chdb database each), as (k) runs")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    a = ap.parse_args(argv)
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="chsink-writer-"))
        kafka = stack.enter_context(Kafka(Path(tmp) / "kafka")) if a.dirty else None
        chdb_config = None
        if a.engine == "KeeperMap":
            zk = stack.enter_context(ZooKeeper(Path(tmp) / "zookeeper"))
            chdb_config = str(zk.clickhouse_config(Path(tmp) / "ch.xml"))
        return _run(a, tmp, kafka, chdb_config)


def _deliveries(deliver: list[tuple[float, float]], rows: int) -> dict[str, Any]:
    """rows/s and CPU of the steady batches' deliveries ((wall, CPU) seconds each; the first warms up)."""
    steady = deliver[1:] or deliver
    return {"rows_per_s": round(rows * len(steady) / sum(w for w, _ in steady)),
            "wall_s_per_batch": round(statistics.median(w for w, _ in steady), 3),
            "cpu_s_per_batch": round(statistics.median(c for _, c in steady), 3),
            "cpu_us_per_row": round(sum(c for _, c in steady) * 1e6 / (rows * len(steady)), 3)}


def _run(a: argparse.Namespace, tmp: str, kafka: Kafka | None, chdb_config: str | None) -> int:
    from sparkapp.config import SinkConfig
    from sparkapp.core.blocks import payload
    from sparkapp.delivery.runtime import Runtime
    from sparkapp.edges.clickhouse import clickhouse_client
    from sparkapp.edges.dlq import KafkaDeadLetterSink
    from sparkapp.edges.store import state_store
    from sparkapp.formats.jsoneachrow import build_lines, guard
    from sparkapp.spark.batches import deliver_all, partition_slices

    per_batch = a.events // a.partitions * a.partitions

    def events(dirty: float, topic: str) -> list[Any]:
        rnd = random.Random(7)  # the events `python -m bench` produces
        return [spark_batch([encoded(rnd, b * per_batch + i, dirty) for i in range(per_batch)], a.partitions,
                            b * (per_batch // a.partitions), topic) for b in range(a.batches)]

    batches = events(0.0, "bench")
    dirty = events(a.dirty, "bench-dirty") if kafka is not None else []
    dbs = [f"bench_s{i}" for i in range(a.key_shards)] or ["bench"]  # where the deliveries go
    cfg = SinkConfig.model_validate({
        "name": "bench-writer", "kafka": {"bootstrapServers": "127.0.0.1:9", "topics": ["bench", "bench-dirty"]},
        "clickhouse": {"endpoints": [f"chdb://{tmp}/chdb"] * len(dbs), "database": dbs[0],
                       "tables": {"bench": "events", "bench-dirty": "dirty"},
                       **({"shardDatabases": dbs} if a.key_shards else {}),
                       **({"chdbConfigFile": chdb_config} if chdb_config else {})},
        **({"sharding": {"policy": "key", "key": "user_id"}} if a.key_shards else {}),
        "state": {"engine": a.engine, "enabled": True, "keeperPath": "/bench_writer"},
        "batching": {"maxOffsetsPerTrigger": per_batch}, "checkpointLocation": f"{tmp}/checkpoint"})
    client = clickhouse_client(cfg.clickhouse)
    for db in dict.fromkeys(["bench", *dbs]):
        client.command(f"CREATE DATABASE IF NOT EXISTS {db}")
        for table in ("events", "dirty", *(["stages"] if db == "bench" else [])):  # only bench.stages is timed
            client.command(TABLE.format(db=db, table=table))
    client.command("CREATE TABLE bench.parse AS bench.events ENGINE = Null")
    store = state_store(cfg, client)
    store.ensure_schema()
    dlq = None
    if kafka is not None:
        kafka.create_topic("bench-dlq", 1)
        dlq = KafkaDeadLetterSink("bench-dlq", {"bootstrap.servers": kafka.bootstrap})
    rt = Runtime(cfg, store.acquire_epoch(cfg.name, owner="bench-writer"), client, store, dlq)
    if a.after == "waiting":
        rt.defer_after()
    state_calls = StateCalls(client)
    store.client = state_calls  # type: ignore[assignment]
    state_batches: list[list[tuple[str, float]]] = []

    deliver: dict[str, list[tuple[float, float]]] = {"clean": [], "dirty": []}  # (wall, CPU) s per batch
    dead = 0
    for clean_batch, dirty_batch in itertools.zip_longest(batches, dirty):
        for kind, tbl in (("clean", clean_batch), ("dirty", dirty_batch)):
            if tbl is None:
                continue
            state_calls.calls = []
            t0, c0 = time.perf_counter(), time.process_time()
            outcomes = deliver_all(rt, tbl)
            deliver[kind].append((time.perf_counter() - t0, time.process_time() - c0))
            if kind == "clean":
                state_batches.append(state_calls.calls)
            assert sum(o["rows"] for o in outcomes) == tbl.num_rows, outcomes
            dead += sum(o["dead"] for o in outcomes)
    for table, kind in (("events", "clean"), ("dirty", "dirty")):
        stored = sum(int(str(client.command(f"SELECT count() FROM {db}.{table}"))) for db in dbs)
        want = per_batch * len(deliver[kind]) - (dead if kind == "dirty" else 0)
        assert stored == want, f"{stored} rows stored in {table} of {want}"

    ctx = rt.fast_context("bench")
    assert ctx is not None, "the bench table takes the fast path"
    names, check = ctx.inserter.schema.names, guard(ctx.inserter.schema)

    def lines_of(tbl: Any) -> Any:
        return build_lines(tbl, names, cfg.format.max_message_bytes)

    def insert(table: str, body: Any) -> None:
        """With the fast path's JSON settings (no token: the copies keep every row)."""
        client.raw_insert(f"bench.{table}", None, body, settings=ctx.inserter.line_settings, fmt="JSONEachRow")

    stages = {k: 0.0 for k in ("build_lines", "guard", "insert", "parse_null")}
    for tbl in batches[1:]:
        for _, _, sub in partition_slices(tbl):
            c0 = time.process_time()
            lines = lines_of(sub)
            stages["build_lines"] += time.process_time() - c0
            stages["guard"] += _cpu(lambda: check.hits(lines))  # noqa: B023 (called at once)
            body = payload(lines)
            stages["insert"] += _cpu(lambda: insert("stages", body))  # noqa: B023
            stages["parse_null"] += _cpu(lambda: insert("parse", body))  # noqa: B023

    last = [payload(lines_of(sub)) for _, _, sub in partition_slices(batches[-1])]
    alone, _ = _beside(lambda: time.sleep(0.5))
    during, cores = _beside(lambda: insert("parse", b"".join(bytes(b) for b in last)))
    halves = [b"".join(bytes(b) for b in last[i::2]) for i in range(2)]
    t0 = time.perf_counter()
    for half in halves:
        insert("parse", half)
    serial = time.perf_counter() - t0
    t0 = time.perf_counter()
    pair = [threading.Thread(target=insert, args=("parse", half)) for half in halves]
    for t in pair:
        t.start()
    for t in pair:
        t.join()
    threaded = time.perf_counter() - t0
    rt.close()

    us = 1e6 / (per_batch * (len(batches) - 1 or 1))
    results: dict[str, Any] = {
        "date": dt.date.today().isoformat(), "events_per_batch": per_batch, "partitions": a.partitions,
        "batches": a.batches, "after": a.after, "engine": a.engine, "key_shards": a.key_shards,
        "arrow_allocator": {k: os.environ[k] for k in ARROW_ALLOCATOR_ENV},
        "deliver_all": _deliveries(deliver["clean"], per_batch),
        "state_store": state_calls.per_batch(state_batches[1:] or state_batches),
        "stages_cpu_us_per_row": {k: round(v * us, 3) for k, v in stages.items()},
        "gil": {"spin_alone_per_s": round(alone), "spin_during_insert_per_s": round(during),
                "ratio_during_alone": round(during / alone, 3), "process_cores_during_insert": round(cores, 2),
                # the batch's lines in two halves, one after the other, against on two threads at once
                "two_inserts_serial_s": round(serial, 3), "two_inserts_threaded_s": round(threaded, 3),
                "speedup_threaded": round(serial / threaded, 3)},
    }
    if dirty:
        d = results["deliver_all_dirty"] = {**_deliveries(deliver["dirty"], per_batch), "dirty_share": a.dirty,
                                            "dead_lettered": dead}
        results["dirty_extra_cpu_us_per_row"] = round(d["cpu_us_per_row"] - results["deliver_all"]["cpu_us_per_row"], 3)
    return publish(results, a.out, "writer")


if __name__ == "__main__":
    entry(main)
