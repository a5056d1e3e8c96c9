"""Measurements run in their own processes (Spark alone, the raw insert), each printing one JSON line."""

from __future__ import annotations

import itertools
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def steady(batches: list[tuple[float, float, int]], warm_s: float = 0.0) -> list[tuple[float, float, int]]:
    """The batches a rate is taken over, each (start, end, rows), in order: all but the first, which also pays
    one-off costs (chdb's first insert, connections), and none that starts within `warm_s` seconds of the first
    one's start. A fresh JVM's JIT compilers keep compiling for tens of seconds, at a falling rate (in a run of the
    job: 1.3-1.6 s of CPU in each 4 s from the 8th to the 20th second), so a rate over the first seconds counts
    that work, which a job that runs for days does not pay. ValueError when no batch is left: the run was too short
    for its warm-up."""
    kept = [b for b in batches[1:] if b[0] >= batches[0][0] + warm_s] if len(batches) > 1 else list(batches)
    if not kept:
        raise ValueError(f"no batch starts {warm_s:g}s after the first of {len(batches)}: give the run more events")
    return kept


def rate(batches: Sequence[tuple[float, ...]]) -> float:
    """Rows per second over `batches`, each (start, end, rows, ...), in order: all their rows over the time from the
    first one's start to the last one's end, so that the gaps between batches count too."""
    return sum(b[2] for b in batches) / (batches[-1][1] - batches[0][0])


def after_warm_up(run: Callable[[], T], warm_s: float, clock: Callable[[], float] = time.monotonic) -> T:
    """`run` again and again in the same JVM until `warm_s` seconds have passed, then once more: that last
    result is the one measured (see `steady`). With no warm-up, `run` runs once."""
    until = clock() + warm_s
    while clock() < until:
        run()
    return run()


def as_batches(polls: list[tuple[float, int]]) -> list[tuple[float, float, int]]:
    """A row count polled over time, each (time, rows so far), as `steady`'s batches: each poll that found more
    rows than the one before is a batch from that poll to this one. A peer is timed so, as it has no batches of
    its own to report."""
    return [(t0, t1, c1 - c0) for (t0, c0), (t1, c1) in itertools.pairwise(polls) if c1 > c0]


def _session(jars: str, master: str) -> Any:
    """A session on the job's JVM options (its collector): the baselines' JVMs work as the job's do."""
    from pyspark.sql import SparkSession

    from sparkapp.config import with_jvm_defaults

    builder = SparkSession.builder.master(master).config("spark.jars", jars)
    for k, v in with_jvm_defaults({"spark.ui.showConsoleProgress": "false"}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _kafka(read: Any, bootstrap: str, topic: str) -> Any:
    """Spark's Kafka source (batch or streaming `read`) with the job's own source settings: a fair baseline."""
    from sparkapp.config import READ_COMMITTED, SOURCE_FETCH_DEFAULTS

    return (read.format("kafka").options(**SOURCE_FETCH_DEFAULTS)
            .options(**{f"kafka.{k}": v for k, v in READ_COMMITTED.items()})
            .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic))


def spark_source(bootstrap: str, topic: str, jars: str, warm_s: float = 0.0) -> dict[str, float]:
    """(a) Spark's Kafka source alone: read every record and touch its value (sum of lengths). With `warm_s`, the
    topic is read whole until that many seconds have passed first (see `steady`)."""
    spark = _session(jars, "local[2]")
    reader = _kafka(spark.read, bootstrap, topic)
    reader.load().limit(1000).selectExpr("sum(length(value))").collect()  # warm-up: JIT, metadata
    reads: list[float] = []  # each whole read's rows/s: the first is the cold JVM's

    def read() -> tuple[int, int]:
        t0 = time.monotonic()
        [[rows, size]] = reader.load().selectExpr("count(*)", "sum(length(value))").collect()
        reads.append(rows / (time.monotonic() - t0))
        return int(rows), int(size)

    rows, size = after_warm_up(read, warm_s)
    spark.stop()
    return {"rows": rows, "seconds": rows / reads[-1], "rows_per_s": reads[-1], "bytes": size,
            **({"first_read_rows_per_s": reads[0]} if len(reads) > 1 else {})}


def stream_source(bootstrap: str, topic: str, jars: str, events: int, max_offsets: int,
                  master: str = "local[2]", warm_s: float = 0.0) -> dict[str, float]:
    """(a_stream) Spark's Kafka source as the job runs it: a streaming query with the job's source options and
    `maxOffsetsPerTrigger`, each record's value touched (its length) and nothing written (Spark's `noop` sink).
    Rows/s over the steady batches, the first left out, as the job's runs are measured. With `warm_s`, queries
    read the topic whole until that many seconds have passed first, in the same JVM (see `steady`)."""
    import datetime as dt
    import tempfile

    spark = _session(jars, master)
    reader = (_kafka(spark.readStream, bootstrap, topic)
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(max_offsets)))

    def drain() -> list[Any]:
        with tempfile.TemporaryDirectory(prefix="chsink-bench-source-") as ckpt:
            query = (reader.load().selectExpr("partition", "offset", "length(value) AS n").writeStream
                     .format("noop").option("checkpointLocation", ckpt).trigger(processingTime="0 seconds").start())
            query.processAllAvailable()  # no polling meanwhile: each py4j call costs the JVM a class look-up
            progress = [p for p in query.recentProgress if p["numInputRows"]]
            query.stop()
        return progress

    progress = after_warm_up(drain, warm_s)
    spark.stop()
    batches = []
    for p in progress:
        start = dt.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        batches.append((start, start + p["durationMs"]["triggerExecution"] / 1000, int(p["numInputRows"])))
    rows = sum(b[2] for b in batches)
    if rows != events:
        raise RuntimeError(f"the streaming source read {rows} records, expected {events}")
    kept = steady(batches)
    return {"rows": rows, "seconds": kept[-1][1] - kept[0][0], "rows_per_s": rate(kept), "batches": len(batches),
            "max_offsets_per_trigger": max_offsets, "steady_from": kept[0][0], "steady_to": kept[-1][1]}


def raw_insert(path: str, n: int, block: int) -> dict[str, float]:
    """(b) The same rows, already decoded (Arrow), inserted straight into chdb with clickhouse-connect."""
    import datetime as dt
    import decimal

    import clickhouse_connect
    import pyarrow as pa

    from .data import TABLE, event

    client = clickhouse_connect.get_client(dsn=f"chdb://{path}")
    client.command("CREATE DATABASE IF NOT EXISTS bench")
    client.command(TABLE.format(db="bench", table="raw"))
    rnd = random.Random(7)
    schema = pa.schema([("id", pa.uint64()), ("ts", pa.timestamp("ms", "UTC")), ("user_id", pa.uint64()),
                        ("event", pa.string()), ("country", pa.string()), ("amount", pa.decimal128(18, 4)),
                        ("score", pa.float64()), ("session", pa.string()), ("tags", pa.list_(pa.string())),
                        ("attrs", pa.map_(pa.string(), pa.string())), ("referrer", pa.string()),
                        ("_offset", pa.uint64()), ("_topic", pa.string()), ("_partition", pa.uint16())])
    records = []
    for i in range(n):  # decoding is not part of (b)
        e = event(rnd, i)
        e["ts"] = dt.datetime.fromisoformat(e["ts"]).replace(tzinfo=dt.UTC)
        e["amount"] = decimal.Decimal(e["amount"])
        e["attrs"] = list(e["attrs"].items())
        records.append({**e, "_offset": i, "_topic": "bench", "_partition": i % 8})
    tbl = pa.Table.from_pylist(records, schema=schema)
    client.insert_arrow("bench.raw", tbl.slice(0, min(block, n)))  # warm-up
    client.command("TRUNCATE TABLE bench.raw")
    t0 = time.monotonic()
    for start in range(0, n, block):
        client.insert_arrow("bench.raw", tbl.slice(start, block))
    secs = time.monotonic() - t0
    got = int(client.query("SELECT count() FROM bench.raw").result_rows[0][0])
    return {"rows": got, "seconds": secs, "rows_per_s": n / secs}


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "source":
        out = spark_source(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
    elif what == "stream-source":
        out = stream_source(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]),
                            warm_s=float(sys.argv[7]))
    else:
        out = raw_insert(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    print("RESULT " + json.dumps(out), flush=True)
