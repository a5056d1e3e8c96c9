"""Measurements run in their own processes (Spark alone, the raw insert), each printing one JSON line."""

from __future__ import annotations

import json
import random
import sys
import time


def spark_source(bootstrap: str, topic: str, jars: str) -> dict[str, float]:
    """(a) Spark's Kafka source alone: read every record and touch its value (sum of lengths)."""
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").config("spark.jars", jars)
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    from sparkapp.config import READ_COMMITTED, SOURCE_FETCH_DEFAULTS  # the job's own source settings: fair

    reader = (spark.read.format("kafka").options(**SOURCE_FETCH_DEFAULTS)
              .options(**{f"kafka.{k}": v for k, v in READ_COMMITTED.items()})
              .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic))
    reader.load().limit(1000).selectExpr("sum(length(value))").collect()  # warm-up: JIT, metadata
    t0 = time.monotonic()
    [[rows, size]] = reader.load().selectExpr("count(*)", "sum(length(value))").collect()
    secs = time.monotonic() - t0
    spark.stop()
    return {"rows": rows, "seconds": secs, "rows_per_s": rows / secs, "bytes": size}


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
        out = spark_source(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        out = raw_insert(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    print("RESULT " + json.dumps(out), flush=True)
