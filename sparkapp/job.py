"""The Spark Structured Streaming job: Kafka source -> foreachBatch -> one writer call per topic-partition.

Each micro-batch keeps the Kafka source's partitioning (one Spark partition per Kafka
topic-partition, never split, no shuffle). With HTTP endpoints every partition is written by its
executor task (mapInArrow); with a chdb endpoint (one engine per process) the batch is brought to
the driver as Arrow and written there. The state store, not the checkpoint, decides where a
partition resumes: without a checkpoint the starting offsets are read from it.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import metrics
from .config import ConfigError, SinkConfig
from .decode import Message
from .dlq import KafkaDeadLetterSink
from .kafka_io import topic_partitions
from .lines import LineBatch, build_lines
from .runtime import Runtime, starting_offsets, state_store
from .schema import load_schema
from .shards import ShardUnavailableError
from .store import FencedError, resume_positions

log = logging.getLogger("chsink.job")
STOP_MARKER = "chsink: stop requested"
_RESULT_SCHEMA = ("topic string, partition int, rows long, inserted long, dead long, inserts long, retried long, "
                  "cases string, stalled string, upto long")
_EXECUTOR_RUNTIMES: dict[tuple[str, int], Runtime] = {}


def build_session(cfg: SinkConfig) -> Any:
    from pyspark.sql import SparkSession

    conf = dict(cfg.spark_conf)
    if conf.get("spark.speculation", "false").lower() != "false":
        log.warning("spark.speculation=true ignored: a speculative task would write a partition twice")
    conf["spark.speculation"] = "false"
    conf.setdefault("spark.sql.session.timeZone", "UTC")
    conf.setdefault("spark.ui.showConsoleProgress", "false")
    builder = SparkSession.builder.appName(f"chsink-{cfg.name}")
    if not os.environ.get("SPARK_ENV_LOADED") and "spark.master" not in conf:
        builder = builder.master(os.environ.get("CHSINK_SPARK_MASTER", "local[2]"))
    jars = os.environ.get("CHSINK_SPARK_JARS")
    if jars and "spark.jars" not in conf:
        conf["spark.jars"] = jars
    for k, v in conf.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


_SPARK_CHECKPOINT_ENTRIES = {"offsets", "commits", "metadata", "sources", "state", "metadata.crc"}


def fresh_checkpoint(spark: Any, location: str, epoch: int) -> str:
    """A new checkpoint directory for this run (`<location>/run-<epoch>`); older runs' are deleted.

    On the pipelined driver path Spark commits a batch before chsink has written it, so a checkpoint
    may be ahead of the data: every run starts from the state store instead, in a fresh directory.
    """
    jvm = spark._jvm
    base = jvm.org.apache.hadoop.fs.Path(location.rstrip("/"))
    fs = base.getFileSystem(spark._jsc.hadoopConfiguration())
    if fs.exists(base):
        for st in fs.listStatus(base):  # older runs', or a checkpoint of a non-pipelined run; nothing else
            name = st.getPath().getName()
            if name.startswith("run-") or name.lstrip(".") in _SPARK_CHECKPOINT_ENTRIES:
                fs.delete(st.getPath(), True)
    return f"{location.rstrip('/')}/run-{epoch}"


def checkpoint_exists(spark: Any, location: str) -> bool:
    """True when the checkpoint has committed offsets (any Hadoop filesystem: local, s3a, hdfs...)."""
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(location.rstrip("/") + "/offsets")
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    return bool(fs.exists(path)) and len(fs.listStatus(path)) > 0


def partition_slices(tbl: Any) -> Iterator[tuple[str, int, Any]]:
    """Splits an Arrow batch of Kafka rows into per-topic-partition tables, offset-ordered (vectorized)."""
    import numpy as np

    if tbl.num_rows == 0:
        return
    for attempt in range(2):
        topics = tbl.column("topic").to_numpy(zero_copy_only=False)
        parts = tbl.column("partition").to_numpy(zero_copy_only=False)
        offsets = tbl.column("offset").to_numpy(zero_copy_only=False)
        cuts = np.flatnonzero((topics[1:] != topics[:-1]) | (parts[1:] != parts[:-1])) + 1
        bounds = [0, *cuts.tolist(), tbl.num_rows]
        rising = offsets[1:] > offsets[:-1]
        rising[cuts - 1] = True  # where a group starts, its first offset may be lower
        groups = {(topics[i], parts[i]) for i in bounds[:-1]}
        if attempt or (len(groups) == len(bounds) - 1 and bool(rising.all())):
            break
        # Spark hands each Kafka partition over in offset order; sorting (a full copy) is the exception
        tbl = tbl.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])
    for a, b in itertools.pairwise(bounds):
        yield str(topics[a]), int(parts[a]), tbl.slice(a, b - a)


def table_messages(tbl: Any) -> list[Message]:
    """One partition's Arrow rows as Messages (the decoding path needs them one by one)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ts = pc.cast(tbl.column("timestamp"), pa.int64()).to_pylist()
    cols = {n: tbl.column(n).to_pylist() for n in ("topic", "partition", "offset", "key", "value")}
    headers = tbl.column("headers").to_pylist() if "headers" in tbl.column_names else None
    return [
        Message(cols["topic"][j], cols["partition"][j], cols["offset"][j], cols["value"][j], cols["key"][j],
                (ts[j] or 0) // 1000,
                tuple((h["key"], h["value"] or b"") for h in (headers[j] or [])) if headers else ())
        for j in range(tbl.num_rows)
    ]


def deliver(rt: Runtime, topic: str, part: int, sub: Any) -> dict[str, Any]:
    """One partition's slice, delivered; its result row. A partition whose shard is unavailable stalls: its
    state stays BEFORE (the next batch re-reads from there), and the other partitions go on."""
    upto = int(sub.column("offset")[-1].as_py()) if sub.num_rows else -1
    return _guarded(topic, part, sub.num_rows, upto, lambda: _deliver(rt, topic, part, sub))


def _guarded(topic: str, part: int, n: int, upto: int, fn: Callable[[], list[Any]]) -> dict[str, Any]:
    """The result row of one partition's delivery; a shard that is down makes it a stalled one."""
    try:
        return {**_result_row(topic, part, n, fn()), "upto": upto}
    except ShardUnavailableError as e:
        log.warning("%s/%d stalls: %s", topic, part, e)
        return {**_result_row(topic, part, n, []), "stalled": e.label, "upto": upto}


def _deliver(rt: Runtime, topic: str, part: int, sub: Any) -> list[Any]:
    """Through the fast path (ClickHouse parses JSON lines) or the decoding path."""
    ctx = rt.fast_context(topic)
    if ctx is not None:
        import pyarrow.compute as pc

        lines = build_lines(sub, ctx.inserter.schema.names, rt.cfg.format.max_message_bytes)
        offsets = sub.column("offset").to_pylist()
        batch = LineBatch(offsets, lines, lambda: table_messages(sub),
                          lambda: table_messages(sub.filter(pc.is_null(lines))))
        return rt.process_lines(ctx, topic, part, batch)
    return rt.process(topic, part, table_messages(sub))


def _executor_fn(cfg_json: str, epoch: int) -> Any:
    """mapInArrow body: runs in an executor's Python worker, one Kafka partition per task."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        got = list(batches)
        if not got:
            return
        tbl = pa.Table.from_batches(got)
        key = (cfg_json, epoch)
        if key not in _EXECUTOR_RUNTIMES:
            _EXECUTOR_RUNTIMES[key] = Runtime.open(SinkConfig.model_validate_json(cfg_json), epoch)
        rt = _EXECUTOR_RUNTIMES[key]
        groups = list(partition_slices(tbl))
        if len(groups) > 1:
            raise RuntimeError(f"a task received {len(groups)} Kafka partitions; chsink needs one per task")
        for topic, part, sub in groups:
            yield pa.RecordBatch.from_pylist([deliver(rt, topic, part, sub)],
                                             schema=pa.schema([("topic", pa.string()), ("partition", pa.int32()),
                                                               ("rows", pa.int64()), ("inserted", pa.int64()),
                                                               ("dead", pa.int64()), ("inserts", pa.int64()),
                                                               ("retried", pa.int64()), ("cases", pa.string()),
                                                               ("stalled", pa.string()), ("upto", pa.int64())]))

    return run


def _result_row(topic: str, part: int, rows: int, results: list[Any]) -> dict[str, Any]:
    return {"topic": topic, "partition": part, "rows": rows, "inserted": sum(r.inserted_rows for r in results),
            "dead": sum(r.dead_lettered for r in results), "inserts": sum(r.inserts for r in results),
            "retried": sum(1 for r in results if r.retried), "cases": ",".join(r.case.value for r in results),
            "stalled": ""}


@dataclass
class Progress:
    batches: int = 0
    rows: int = 0
    inserted: int = 0
    dead: int = 0
    started: float = field(default_factory=time.monotonic)
    last_batch_s: float = 0.0
    last_data: float = field(default_factory=time.monotonic)
    lag: int | None = None


class SinkJob:
    """One run of the sink: a new epoch, a streaming query, graceful stop on SIGTERM."""

    def __init__(self, cfg: SinkConfig, progress_every: float = 5.0, quiet: bool = False) -> None:
        self.cfg = cfg
        self.progress = Progress()
        self.progress_every = progress_every
        self.quiet = quiet
        self.stopping = threading.Event()
        self.in_batch = threading.Lock()
        self.runtime: Runtime | None = None
        self.writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="chsink-writer")
        self.pending: concurrent.futures.Future[None] | None = None
        self.epoch = 0
        self.stalled: dict[tuple[str, int], int] = {}  # partition -> highest offset Spark handed over
        self.catch_up_every = 5.0
        self.catch_up_runtime: Runtime | None = None

    def preflight(self) -> dict[str, int]:
        """Checks everything a user can get wrong before Spark starts; raises ConfigError."""
        k = self.cfg.kafka
        parts = topic_partitions(k)
        ch = self.cfg.clickhouse
        from .clients import clickhouse_client

        client = clickhouse_client(ch)
        for topic in parts:
            table = ch.table_for(topic)
            if table is None and not ch.routed:
                raise ConfigError(f"clickhouse.tables: no table for topic {topic!r} (add it or a '*' entry)")
            if table is not None:
                try:
                    load_schema(client, ch.shard_database(0), table)
                except Exception as e:
                    raise ConfigError(f"clickhouse.tables[{topic!r}]: {e}") from None
        store = state_store(self.cfg, client)
        store.ensure_schema()
        self.epoch = store.acquire_epoch(self.cfg.name, owner=f"{socket.gethostname()}:{os.getpid()}")
        self.starting = starting_offsets(store, self.cfg.name, parts)
        if ch.embedded:
            dlq = KafkaDeadLetterSink(self.cfg.dlq.topic, k.client_options()) if self.cfg.dlq.topic else None
            self.runtime = Runtime(self.cfg, self.epoch, client, store, dlq)
        return parts

    def drain(self) -> None:
        """Waits for the batch being written in the background; its failure fails the job."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def _write_arrow(self, tbl: Any, batch_id: int, t0: float, read_s: float, wait_s: float) -> None:
        assert self.runtime is not None
        t1 = time.monotonic()
        try:
            rows = [deliver(self.runtime, topic, part, sub) for topic, part, sub in partition_slices(tbl)]
        except FencedError:
            metrics.FENCED.labels(self.cfg.name).inc()
            raise
        self._account(rows, batch_id, t0, f" (Spark {read_s:.2f}s, waited {wait_s:.2f}s, wrote "
                                          f"{time.monotonic() - t1:.2f}s)")

    def _write_on_executors(self, df: Any, batch_id: int) -> list[dict[str, Any]]:
        fn = _executor_fn(self.cfg.model_dump_json(by_alias=True), self.epoch)
        rows = [r.asDict() for r in df.mapInArrow(fn, _RESULT_SCHEMA).collect()]
        seen = [(r["topic"], r["partition"]) for r in rows]
        if len(seen) != len(set(seen)):
            raise RuntimeError(f"a Kafka partition was split across tasks in batch {batch_id}; check the Kafka "
                               "source options")
        return rows

    def handle_batch(self, batch_df: Any, batch_id: int) -> None:
        if self.stopping.is_set():
            raise RuntimeError(STOP_MARKER)  # fails this batch before any write: the checkpoint stays put
        with self.in_batch:
            t0 = time.monotonic()
            cols = ["topic", "partition", "offset", "key", "value", "timestamp"]
            if self.cfg.clickhouse.table_header:
                cols.append("headers")
            df = batch_df.selectExpr(*cols)
            if self.runtime is None:  # HTTP: each executor task writes its own partition
                self._account(self._write_on_executors(df, batch_id), batch_id, t0)
                return
            # chdb (driver): Spark reads batch N+1 while the background writer delivers batch N. Spark
            # then commits batches not yet written, which is why such runs resume from the state store.
            tbl = df.toArrow()
            t1 = time.monotonic()
            self.drain()
            self.pending = self.writer.submit(self._write_arrow, tbl, batch_id, t0, t1 - t0, time.monotonic() - t1)

    def _track_stalled(self, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            tp = (r["topic"], r["partition"])
            if r.get("stalled"):
                self.stalled[tp] = max(self.stalled.get(tp, -1), r.get("upto", -1))
            elif r.get("upto", -1) >= self.stalled.get(tp, 0):
                self.stalled.pop(tp, None)

    def catch_up(self) -> None:
        """Re-drives stalled partitions without waiting for new records: each re-reads from its BEFORE range up
        to what Spark handed over. Runs where batches are written, one at a time with them."""
        if self.runtime is None and self.catch_up_runtime is None:  # executors write batches; this runs here
            self.catch_up_runtime = Runtime.open(self.cfg, self.epoch)
        rt = self.runtime or self.catch_up_runtime
        assert rt is not None
        starts = resume_positions(rt.store.list_sink(self.cfg.name))  # one read for all stalled partitions
        rows = [_guarded(t, p, 0, upto, lambda t=t, p=p, upto=upto: rt.catch_up(t, p, starts.get((t, p)), upto))  # type: ignore[misc]
                for (t, p), upto in sorted(self.stalled.items())]
        self._track_stalled(rows)
        metrics.batch_done(self.cfg.name, rows, 0.0)
        done = [f"{r['topic']}/{r['partition']}" for r in rows if not r["stalled"]]
        if done:
            log.info("caught up stalled partition(s) %s (%d rows)", ", ".join(done), sum(r["inserted"] for r in rows))

    def _account(self, rows: list[dict[str, Any]], batch_id: int, t0: float, detail: str = "") -> None:
        self._track_stalled(rows)
        p = self.progress
        if p.batches == 0:
            p.started = t0  # rates count from the first batch, not from Spark's start-up
        n = sum(r["rows"] for r in rows)
        p.batches += 1
        p.rows += n
        p.inserted += sum(r["inserted"] for r in rows)
        p.dead += sum(r["dead"] for r in rows)
        p.last_batch_s = time.monotonic() - t0
        metrics.batch_done(self.cfg.name, rows, p.last_batch_s)
        if n:
            p.last_data = time.monotonic()
        stalled = sorted(f"{r['topic']}/{r['partition']}" for r in rows if r.get("stalled"))
        log.info("batch %d: %d records from %d partitions in %.2fs%s%s", batch_id, n, len(rows), p.last_batch_s,
                 detail, f"; stalled (shard unavailable): {', '.join(stalled)}" if stalled else "")

    def run(self, until_idle: float | None = None, max_seconds: float | None = None) -> int:
        parts = self.preflight()
        spark = build_session(self.cfg)
        k = self.cfg.kafka
        reader = spark.readStream.format("kafka").options(**k.spark_options())
        reader = reader.option("subscribePattern", k.topic_pattern) if k.topic_pattern else \
            reader.option("subscribe", ",".join(parts))
        if self.cfg.clickhouse.table_header:
            reader = reader.option("includeHeaders", "true")
        if self.cfg.batching.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(self.cfg.batching.max_offsets_per_trigger))
        checkpoint = self.cfg.checkpoint_location
        if self.runtime is not None:  # pipelined: the state store alone says where to resume
            checkpoint, has_ckpt = fresh_checkpoint(spark, checkpoint, self.epoch), False
        else:
            has_ckpt = checkpoint_exists(spark, checkpoint)
        if not has_ckpt:
            reader = reader.option("startingOffsets", json.dumps(self.starting))
        log.info("sink %s epoch %d: %s; %s", self.cfg.name, self.epoch,
                 "resuming from checkpoint" if has_ckpt else f"starting offsets from the state store {self.starting}",
                 f"writer on {'driver (chdb)' if self.runtime else 'executors'}")
        query = (reader.load().writeStream.foreachBatch(self.handle_batch)
                 .option("checkpointLocation", checkpoint)
                 .trigger(processingTime=self.cfg.batching.trigger_interval).queryName(self.cfg.name).start())
        previous = signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        started = time.monotonic()
        last_print = 0.0
        lag_seen = -1
        last_catch_up = time.monotonic()
        try:
            while query.isActive:
                query.awaitTermination(1)
                now = time.monotonic()
                if self.progress.batches != lag_seen:  # lastProgress is costly (py4j): once per batch
                    lag_seen = self.progress.batches
                    self._update_lag(query)
                if not self.quiet and now - last_print >= self.progress_every:
                    self.print_progress()
                    last_print = now
                if until_idle is not None and now - max(self.progress.last_data, started) > until_idle \
                        and not self.stalled:  # idle, and nothing waits for a shard
                    status = query.status
                    if not status.get("isDataAvailable") and not status.get("isTriggerActive"):
                        self.stopping.set()
                if max_seconds is not None and now - started > max_seconds:
                    self.stopping.set()
                if self.pending is not None and self.pending.done() and self.pending.exception() is not None:
                    self.stopping.set()  # the background writer failed: stop, and drain() raises it
                if self.stalled and now - last_catch_up > self.catch_up_every and not self.stopping.is_set():
                    last_catch_up = now
                    if self.runtime is not None:  # behind the batch being written, on the same thread
                        if self.pending is None or self.pending.done():
                            self.drain()
                            self.pending = self.writer.submit(self.catch_up)
                    else:
                        with self.in_batch:
                            self.catch_up()
                if self.stopping.is_set():
                    with self.in_batch:  # the current batch finishes first
                        query.stop()
            query.awaitTermination()
        except Exception as e:
            if STOP_MARKER not in str(e):
                raise
        finally:
            signal.signal(signal.SIGTERM, previous)
        self.drain()  # the batch still being written in the background
        if not self.quiet:
            self.print_progress(final=True)
        return 0

    def _update_lag(self, query: Any) -> None:
        prog = query.lastProgress
        if not prog or not prog.get("sources"):
            return
        src = prog["sources"][0]
        try:
            latest, end = json.loads(src.get("latestOffset") or "null"), json.loads(src.get("endOffset") or "null")
        except (TypeError, ValueError):
            return
        if isinstance(latest, dict) and isinstance(end, dict):
            per = {(t, int(p)): max(0, int(off) - int(end.get(t, {}).get(p, off)))
                   for t, ps in latest.items() for p, off in ps.items()}
            self.progress.lag = sum(per.values())
            metrics.lag(self.cfg.name, per)

    def print_progress(self, final: bool = False) -> None:
        p = self.progress
        elapsed = time.monotonic() - p.started
        rate = p.rows / elapsed if elapsed > 0 else 0.0
        lag = p.lag if p.lag is not None else "?"
        print(f"[chsink {self.cfg.name}] {'done: ' if final else ''}{p.rows} records in {p.batches} batches, "
              f"{p.inserted} inserted, {p.dead} dead-lettered, {rate:,.0f} rows/s, lag {lag}, "
              f"last batch {p.last_batch_s:.2f}s", flush=True)

