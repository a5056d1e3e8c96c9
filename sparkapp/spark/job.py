"""The Spark Structured Streaming job: Kafka source -> foreachBatch -> one writer call per topic-partition.

Each micro-batch keeps the Kafka source's partitioning (one Spark partition per Kafka
topic-partition, never split, no shuffle). Where partitions are written is the job's one choice of
mode (BatchWriter): with HTTP endpoints each partition is written by its executor task (mapInArrow);
with a chdb endpoint (one engine per process) the batch is brought to the driver as Arrow and
written there, pipelined. The state store, not the checkpoint, decides where a partition resumes.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import metrics
from ..config import ConfigError, SinkConfig
from ..delivery.context import PartitionOutcome
from ..delivery.first_start import first_start
from ..delivery.runtime import Runtime, check_routing, starting_offsets
from ..delivery.writer import Waiting, ranges_from_json, ranges_json
from ..edges.clickhouse import clickhouse_client, load_schema, unsafe_target
from ..edges.dlq import KafkaDeadLetterSink
from ..edges.errors import first_line, worth_retrying
from ..edges.kafka import all_watermarks, commit_group_offsets, topic_partitions
from ..edges.store import Begin, FencedError, PartitionKey, state_store
from ..formats.registry import make_decoder
from .batches import deliver_all, executor_fn, guarded, outcome_ddl
from .session import build_session, checkpoint_exists, fresh_checkpoint, mark_checkpoint, session_conf

log = logging.getLogger("chsink.job")
STOP_MARKER = "chsink: stop requested"
# After this long without a batch written, the ranges waiting for their partitions' next BEFORE get their AFTER:
# with no new records Spark starts no batch, and a BEFORE left standing reads as a stall to the operator.
CONFIRM_IDLE_S = 1.0
# how often kafka.consumerGroup is told where the sink is delivered to (monitoring only: lag tools poll it)
GROUP_COMMIT_S = 5.0


@dataclass
class Progress:
    batches: int = 0
    rows: int = 0
    inserted: int = 0
    dead: int = 0
    started: float = field(default_factory=time.monotonic)
    last_batch_s: float = 0.0
    last_data: float = field(default_factory=time.monotonic)
    last_written: float = field(default_factory=time.monotonic)  # when the last batch was written
    lag: int | None = None


class BatchWriter:
    """Where partitions are written. `write` delivers one micro-batch and hands its outcomes to `account`;
    `run_aside` runs other work (the catch-up of stalled partitions) in step with the batches."""

    pipelined = False  # True: Spark commits batches before they are written; runs resume from the state store
    where = ""

    def write(self, df: Any, batch_id: int, t0: float) -> None:
        raise NotImplementedError

    def run_aside(self, fn: Callable[[], None]) -> bool:
        """Whether fn was run (or queued to run)."""
        raise NotImplementedError

    def runtime(self) -> Runtime:
        """The runtime the aside work uses."""
        raise NotImplementedError

    def failed(self) -> bool:
        """Whether work in the background failed (drain() then raises it)."""
        return False

    def drain(self) -> None:
        """Waits for work in the background; its failure fails the job."""

    def confirm_idle(self) -> None:
        """Writes the AFTERs still waiting for a next batch (Runtime.confirm), when nothing is being written."""

    def confirm(self) -> None:
        """Waits for the batch being written, then writes the AFTERs it left waiting (a graceful stop)."""
        self.drain()

    def _confirm(self) -> None:
        """A state store that does not answer now leaves the ranges BEFORE: the next tick tries again, and a run that
        ends before re-sends them identically. Fencing is no transient: it stops the run."""
        try:
            self.runtime().confirm()
        except Exception as e:
            if not worth_retrying(e):
                raise
            log.warning("the last ranges delivered stay unconfirmed (BEFORE) for now: %s", first_line(e))

    def close(self) -> None:
        """Releases the runtimes this writer opened on the driver."""


class DriverWriter(BatchWriter):
    """chdb (one engine per process): the driver writes. Spark reads batch N+1 while a background thread
    delivers batch N, which is why Spark commits batches not yet written."""

    pipelined = True
    where = "driver (chdb)"

    def __init__(self, job: SinkJob, runtime: Runtime) -> None:
        self.job, self.rt = job, runtime
        runtime.defer_after()  # this one process writes every batch of the run: the next BEFORE confirms a range
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="chsink-writer")
        self.pending: concurrent.futures.Future[None] | None = None

    def runtime(self) -> Runtime:
        return self.rt

    def write(self, df: Any, batch_id: int, t0: float) -> None:
        tbl = df.toArrow()
        t1 = time.monotonic()
        self.drain()
        self.pending = self.pool.submit(self._write_arrow, tbl, batch_id, t0, t1 - t0, time.monotonic() - t1)

    def _write_arrow(self, tbl: Any, batch_id: int, t0: float, read_s: float, wait_s: float) -> None:
        t1 = time.monotonic()
        try:
            rows = deliver_all(self.rt, tbl)
        except FencedError:
            metrics.FENCED.labels(self.job.cfg.name).inc()
            raise
        self.job.account(rows, batch_id, t0, f" (Spark {read_s:.2f}s, waited {wait_s:.2f}s, wrote "
                                             f"{time.monotonic() - t1:.2f}s)")

    def run_aside(self, fn: Callable[[], None]) -> bool:
        """Behind the batch being written, on the same thread; skipped while one is being written."""
        if self.pending is None or self.pending.done():
            self.drain()
            self.pending = self.pool.submit(fn)
            return True
        return False

    def failed(self) -> bool:
        return self.pending is not None and self.pending.done() and self.pending.exception() is not None

    def drain(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def confirm_idle(self) -> None:
        if self.rt.waiting is not None and self.rt.waiting.ranges:
            self.run_aside(self._confirm)

    def confirm(self) -> None:
        self.drain()
        self.pool.submit(self._confirm).result()

    def close(self) -> None:
        self.pool.shutdown()
        self.rt.close()


class ExecutorWriter(BatchWriter):
    """HTTP endpoints: each executor task writes its own partitions; the driver collects their outcomes, and hands
    the ranges they delivered to the next batch's tasks, whose BEFOREs confirm them (Waiting)."""

    where = "executors"

    def __init__(self, job: SinkJob, runtime: Runtime | None = None) -> None:
        self.job = job
        self._runtime = runtime  # None: opened when the driver first needs one
        self.waiting: dict[PartitionKey, Begin] = {}  # what the last batch's tasks delivered, still BEFORE

    def runtime(self) -> Runtime:
        """The driver's runtime, for the catch-up and the AFTERs the driver writes."""
        if self._runtime is None:
            self._runtime = Runtime.open(self.job.cfg, self.job.epoch)
        if self._runtime.waiting is None:
            self._runtime.waiting = Waiting(self._runtime.store, self.job.epoch, self.waiting, handed=True)
        return self._runtime

    def write(self, df: Any, batch_id: int, t0: float) -> None:
        cfg_json = self.job.cfg.model_dump_json(by_alias=True)
        fn = executor_fn(cfg_json, self.job.epoch, ranges_json(self.waiting.values()))
        # One task per slot, each over whole Kafka partitions (the source never splits one: minPartitions and
        # maxRecordsPerPartition are refused, and coalescing only groups partitions): a task makes one state
        # round trip for all its partitions, not one per partition.
        slots = df.sparkSession.sparkContext.defaultParallelism
        rows: list[PartitionOutcome] = [r.asDict() for r in df.coalesce(slots).mapInArrow(fn, outcome_ddl()).collect()]
        seen = [(r["topic"], r["partition"]) for r in rows]
        if len(seen) != len(set(seen)):
            raise RuntimeError(f"a Kafka partition was split across tasks in batch {batch_id}; check the Kafka "
                               "source options")
        self.tasks_done(rows)
        self.job.account(rows, batch_id, t0)

    def tasks_done(self, rows: list[PartitionOutcome]) -> None:
        """After every task of a batch succeeded: what they delivered waits for the next batch's BEFOREs. The ranges
        handed to them are theirs to confirm; those of partitions without records in the batch are confirmed here,
        since no BEFORE of theirs may follow soon."""
        seen = {(r["topic"], r["partition"]) for r in rows}
        for pk in [pk for pk in self.waiting if (pk.topic, pk.partition) in seen]:
            del self.waiting[pk]
        self.confirm()
        for r in rows:
            self.waiting.update(ranges_from_json(r["waiting"]))

    def run_aside(self, fn: Callable[[], None]) -> bool:
        with self.job.in_batch:
            fn()
        return True

    def confirm_idle(self) -> None:
        self.confirm()

    def confirm(self) -> None:
        if self.waiting:
            self._confirm()

    def close(self) -> None:
        if self._runtime is not None:
            self._runtime.close()


KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")  # the source's order


def kafka_rows(batch_df: Any, with_headers: bool) -> Any:
    """The micro-batch's Kafka rows as the writer reads them (by column name). The source's own rows when they
    are just those columns, as they are unless Spark's source changes: a select, even one that only reorders
    them, puts a projection in the plan that copies every row, its value included, before the Arrow writer
    copies it again."""
    want = [*KAFKA_COLUMNS, *(["headers"] if with_headers else [])]
    return batch_df if sorted(batch_df.columns) == sorted(want) else batch_df.select(*want)


def run_owner() -> str:
    """Who holds the epoch: the epoch's compare-and-set is won by whoever reads its own owner back, so the
    name must be this run's alone; a pod restarted under the same name often has the same pid."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"


class SinkJob:
    """One run of the sink: a new epoch, a streaming query, graceful stop on SIGTERM."""

    def __init__(self, cfg: SinkConfig, progress_every: float = 5.0, quiet: bool = False) -> None:
        self.cfg = cfg
        self.progress = Progress()
        self.progress_every = progress_every
        self.quiet = quiet
        self.stopping = threading.Event()
        self.in_batch = threading.Lock()
        self.writer: BatchWriter = BatchWriter()
        self.epoch = 0
        self.starting: dict[str, dict[str, int]] = {}
        self.stalled: dict[tuple[str, int], int] = {}  # partition -> highest offset Spark handed over
        self.catch_up_every = 5.0
        # whether Spark's source reads the records' headers (it costs it some): for routing by header, or for a
        # table with a `_headers` column (a routed sink's tables are not known up front)
        self.with_headers = cfg.clickhouse.routed

    def preflight(self) -> dict[str, int]:
        """Checks everything a user can get wrong before Spark starts; raises ConfigError."""
        k = self.cfg.kafka
        parts = topic_partitions(k)
        ch = self.cfg.clickhouse
        client = clickhouse_client(ch)
        for topic in parts:
            table = ch.table_for(topic)
            if table is None and not ch.routed:
                raise ConfigError(f"clickhouse.tables: no table for topic {topic!r} (add it or a '*' entry)")
            if table is not None:
                try:
                    schema = load_schema(client, ch.shard_database(0), table)
                    make_decoder(self.cfg.format.decoder_spec(), schema)  # the format fits the table (upsert's
                    self.with_headers |= "_headers" in schema.names       # `_deleted`, string's one column)
                    unsafe = unsafe_target(client, schema, self.cfg.state.enabled)
                except Exception as e:
                    raise ConfigError(f"clickhouse.tables[{topic!r}]: {e}") from None
                if unsafe is not None:
                    raise ConfigError(f"clickhouse.tables[{topic!r}]: {unsafe}")
        store = state_store(self.cfg, client)
        store.ensure_schema()
        self.epoch = store.acquire_epoch(self.cfg.name, owner=run_owner())
        check_routing(store, self.cfg.name, ch, parts)
        marks = all_watermarks(k, parts)
        first_start(self.cfg, store, parts, marks, self.epoch)
        self.starting = starting_offsets(store, self.cfg.name, parts, marks, k.fail_on_data_loss)
        if ch.embedded:
            dlq = KafkaDeadLetterSink(self.cfg.dlq.topic, k.client_options()) if self.cfg.dlq.topic else None
            self.writer = DriverWriter(self, Runtime(self.cfg, self.epoch, client, store, dlq))
        else:
            self.writer = ExecutorWriter(self)
        return parts

    def handle_batch(self, batch_df: Any, batch_id: int) -> None:
        if self.stopping.is_set():
            raise RuntimeError(STOP_MARKER)  # fails this batch before any write: the checkpoint stays put
        with self.in_batch:
            t0 = time.monotonic()
            self.writer.write(kafka_rows(batch_df, self.with_headers), batch_id, t0)

    def _track_stalled(self, rows: list[PartitionOutcome]) -> None:
        for r in rows:
            tp = (r["topic"], r["partition"])
            if r["stalled"]:
                self.stalled[tp] = max(self.stalled.get(tp, -1), r["upto"])
            elif r["upto"] >= self.stalled.get(tp, 0):
                self.stalled.pop(tp, None)

    def catch_up(self) -> None:
        """Re-drives stalled partitions without waiting for new records: each re-reads from its BEFORE range up
        to what Spark handed over. Runs where batches are written, one at a time with them. A ClickHouse that
        does not answer now (the state store's, or a shard's) leaves them stalled for the next try."""
        try:
            rt = self.writer.runtime()
            starts = rt.store.sink_state(self.cfg.name).resume()  # one read for all stalled partitions
        except Exception as e:
            if not worth_retrying(e):
                raise
            log.warning("catch-up of %d stalled partition(s) waits: %s", len(self.stalled), first_line(e))
            return

        def one(t: str, p: int, upto: int) -> PartitionOutcome:
            return guarded(t, p, 0, upto, lambda: rt.catch_up(t, p, starts.get((t, p)), upto))

        rows = [one(t, p, upto) for (t, p), upto in sorted(self.stalled.items())]
        self._track_stalled(rows)
        metrics.batch_done(self.cfg.name, rows, 0.0)
        done = [f"{r['topic']}/{r['partition']}" for r in rows if not r["stalled"]]
        if done:
            log.info("caught up stalled partition(s) %s (%d rows)", ", ".join(done), sum(r["inserted"] for r in rows))

    def commit_group(self) -> None:
        """Tells kafka.consumerGroup where each partition is delivered to (what the state store says), for the
        tools that read lag there. Never read back; a Kafka that does not take it now is told at the next tick."""
        group = self.cfg.kafka.consumer_group
        assert group is not None
        try:
            positions = self.writer.runtime().store.sink_state(self.cfg.name).resume()
            commit_group_offsets(self.cfg.kafka, group, positions)
        except FencedError:
            raise
        except Exception as e:
            log.warning("consumer group %s not told the delivered offsets now: %s", group, first_line(e))

    def _record_read_through(self, rows: list[PartitionOutcome]) -> None:
        """After a batch, each of its partitions is read through its last offset: Spark hands a partition's
        records over in batches that follow each other, each table's writer returned for every one of them
        (AFTER, or BEFORE where it stalled), and the run started where everything below was so. The store
        keeps it (never lowering it), so that a restart does not go back to the last range of a table that got
        no records; routed sinks only, since one table per partition is its own read-through."""
        if not (self.cfg.clickhouse.routed and self.cfg.state.enabled):
            return
        positions = {(r["topic"], r["partition"]): r["upto"] + 1 for r in rows if r["upto"] >= 0}
        try:
            self.writer.runtime().store.record_read_through(self.cfg.name, positions, self.epoch)
        except Exception as e:  # a fenced run is no transient: it stops
            if not worth_retrying(e):
                raise
            log.warning("read-through positions not recorded (the next batch's are): %s", first_line(e))

    def account(self, rows: list[PartitionOutcome], batch_id: int, t0: float, detail: str = "") -> None:
        self._record_read_through(rows)
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
        p.last_written = time.monotonic()
        metrics.batch_done(self.cfg.name, rows, p.last_batch_s)
        if n:
            p.last_data = time.monotonic()
        stalled = sorted(f"{r['topic']}/{r['partition']}" for r in rows if r["stalled"])
        log.info("batch %d: %d records from %d partitions in %.2fs%s%s", batch_id, n, len(rows), p.last_batch_s,
                 detail, f"; stalled (shard unavailable): {', '.join(stalled)}" if stalled else "")

    def _reader(self, spark: Any, parts: dict[str, int]) -> tuple[Any, str, bool]:
        """Spark's Kafka source, its checkpoint location and whether a checkpoint decides where to start."""
        k = self.cfg.kafka
        reader = spark.readStream.format("kafka").options(**k.spark_options())
        reader = reader.option("subscribePattern", k.topic_pattern) if k.topic_pattern else \
            reader.option("subscribe", ",".join(parts))
        if self.with_headers:
            reader = reader.option("includeHeaders", "true")
        if self.cfg.batching.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(self.cfg.batching.max_offsets_per_trigger))
        checkpoint = self.cfg.checkpoint_location
        mark_checkpoint(spark, checkpoint, self.cfg.name)
        if self.writer.pipelined:  # the state store alone says where to resume
            checkpoint, has_ckpt = fresh_checkpoint(spark, checkpoint, self.epoch), False
        else:
            has_ckpt = checkpoint_exists(spark, checkpoint)
        if not has_ckpt:
            reader = reader.option("startingOffsets", json.dumps(self.starting))
        return reader, checkpoint, has_ckpt

    def run(self, until_idle: float | None = None, max_seconds: float | None = None) -> int:
        conf = session_conf(self.cfg)  # before anything else: a missing connector is a setup error, not a fencing
        parts = self.preflight()
        try:
            return self._run(conf, parts, until_idle, max_seconds)
        finally:
            self.writer.close()

    def _run(self, conf: dict[str, str], parts: dict[str, int], until_idle: float | None,
             max_seconds: float | None) -> int:
        spark = build_session(self.cfg, conf)
        reader, checkpoint, has_ckpt = self._reader(spark, parts)
        log.info("sink %s epoch %d: %s; writer on %s", self.cfg.name, self.epoch,
                 "resuming from checkpoint" if has_ckpt else f"starting offsets from the state store {self.starting}",
                 self.writer.where)
        query = (reader.load().writeStream.foreachBatch(self.handle_batch)
                 .option("checkpointLocation", checkpoint)
                 .trigger(processingTime=self.cfg.batching.trigger_interval).queryName(self.cfg.name).start())
        previous = signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        started = time.monotonic()
        last_print = 0.0
        lag_seen = -1
        last_catch_up = last_group = time.monotonic()
        try:
            while query.isActive:
                query.awaitTermination(1)
                now = time.monotonic()
                if self.progress.batches != lag_seen:  # a py4j round trip: once per batch
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
                if self.writer.failed():
                    self.stopping.set()  # the background writer failed: stop, and drain() raises it
                if self.stalled and now - last_catch_up > self.catch_up_every and not self.stopping.is_set():
                    last_catch_up = now
                    self.writer.run_aside(self.catch_up)
                if self.cfg.kafka.consumer_group and now - last_group > GROUP_COMMIT_S \
                        and not self.stopping.is_set() and self.writer.run_aside(self.commit_group):
                    last_group = now
                if now - self.progress.last_written > CONFIRM_IDLE_S and not self.stopping.is_set() \
                        and self.in_batch.acquire(blocking=False):  # held: a batch is in hand, it confirms them
                    try:  # no batch follows soon: the ranges waiting for one are confirmed now
                        self.writer.confirm_idle()
                    finally:
                        self.in_batch.release()
                if self.stopping.is_set():
                    with self.in_batch:  # the current batch finishes first
                        query.stop()
            query.awaitTermination()
        except Exception as e:
            if STOP_MARKER not in str(e):
                raise
        finally:
            signal.signal(signal.SIGTERM, previous)
        self.writer.confirm()  # the batch still being written in the background, then the AFTERs it left waiting
        if self.cfg.kafka.consumer_group:
            self.commit_group()  # where this run ends
        if not self.quiet:
            self.print_progress(final=True)
        return 0

    def _update_lag(self, query: Any) -> None:
        # the progress as JSON text, one py4j call: PySpark's `lastProgress` walks its Java maps, and each walk
        # ends in an exception that PySpark classifies with a dozen class look-ups the JVM makes by scanning every
        # jar (measured: 8% of the driver JVM's CPU at 200,000 offsets per batch)
        jprog = query._jsq.lastProgress()
        prog = json.loads(jprog.json()) if jprog is not None else None
        if not prog or not prog.get("sources"):
            return
        src = prog["sources"][0]
        latest, end = src.get("latestOffset"), src.get("endOffset")  # objects in the progress's JSON text
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
