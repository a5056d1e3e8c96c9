"""A micro-batch as Arrow: cut per Kafka partition, delivered, and reported as one outcome row each.

`deliver` runs wherever the batch is written: on the driver (chdb: one engine per process) or in an
executor task (mapInArrow, HTTP). Both report the same outcome row (PartitionOutcome).
"""

from __future__ import annotations

import logging
import time
import typing
from collections.abc import Callable, Iterator
from typing import Any

from ..config import SinkConfig
from ..core.records import Message
from ..delivery.context import PartitionOutcome, PartitionResult, WriterContext, outcome
from ..delivery.runtime import Runtime
from ..delivery.writer import Waiting, ranges_from_json, ranges_json
from ..edges.clickhouse import EndpointUnreachableError
from ..edges.shards import ShardUnavailableError
from ..edges.store import Begin, PartitionKey
from ..formats.jsoneachrow import LineBatch, build_lines
from .worker import task_setup

log = logging.getLogger("chsink.job")


def _outcome_fields() -> list[tuple[str, bool]]:
    """(name, is text) of PartitionOutcome's fields. Resolved type hints: the module's annotations are strings
    (`from __future__ import annotations`), so `__annotations__` alone would call every field a number."""
    return [(n, t is str) for n, t in typing.get_type_hints(PartitionOutcome).items()]


def outcome_ddl() -> str:
    """PartitionOutcome as Spark's DDL schema (mapInArrow's result)."""
    return ", ".join(f"{n} {'string' if text else 'long'}" for n, text in _outcome_fields())


def _outcome_arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema([(n, pa.string() if text else pa.int64()) for n, text in _outcome_fields()])


def partition_slices(tbl: Any) -> Iterator[tuple[str, int, Any]]:
    """Splits an Arrow batch of Kafka rows into per-topic-partition tables, offset-ordered (vectorized)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = tbl.num_rows
    if n == 0:
        return
    for attempt in range(2):
        # the topics compared in Arrow: as numpy they would be one Python string per row
        topic = tbl.column("topic")
        parts = tbl.column("partition").to_numpy(zero_copy_only=False)
        offsets = tbl.column("offset").to_numpy(zero_copy_only=False)
        moved = pc.not_equal(topic.slice(1), topic.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        cuts = np.flatnonzero(moved | (parts[1:] != parts[:-1])) + 1
        bounds = [0, *cuts.tolist(), n]
        topics = topic.take(pa.array(bounds[:-1], pa.int64())).to_pylist()
        rising = offsets[1:] > offsets[:-1]
        rising[cuts - 1] = True  # where a group starts, its first offset may be lower
        groups = set(zip(topics, parts[bounds[:-1]].tolist(), strict=True))
        if attempt or (len(groups) == len(bounds) - 1 and bool(rising.all())):
            break
        # Spark hands each Kafka partition over in offset order; sorting (a full copy) is the exception
        tbl = tbl.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])
    for t, a, b in zip(topics, bounds[:-1], bounds[1:], strict=True):
        yield str(t), int(parts[a]), tbl.slice(a, b - a)


def table_messages(tbl: Any) -> list[Message]:
    """One partition's Arrow rows as Messages (the decoding path needs them one by one)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ts = pc.cast(tbl.column("timestamp"), pa.int64()).to_pylist()
    cols = {n: tbl.column(n).to_pylist() for n in ("topic", "partition", "offset", "key", "value")}
    headers = tbl.column("headers").to_pylist() if "headers" in tbl.column_names else None
    kinds = tbl.column("timestampType").to_pylist() if "timestampType" in tbl.column_names else None
    return [
        Message(cols["topic"][j], cols["partition"][j], cols["offset"][j], cols["value"][j], cols["key"][j],
                (ts[j] or 0) // 1000,
                tuple((h["key"], h["value"] or b"") for h in (headers[j] or [])) if headers else (),
                (kinds[j] or 0) if kinds else 0)
        for j in range(tbl.num_rows)
    ]


def deliver(rt: Runtime, topic: str, part: int, sub: Any) -> PartitionOutcome:
    """One partition's slice, delivered; its outcome row."""
    return guarded(topic, part, sub.num_rows, _upto(sub), lambda: _deliver(rt, topic, part, sub))


def deliver_all(rt: Runtime, tbl: Any, handed: dict[PartitionKey, Begin] | None = None) -> list[PartitionOutcome]:
    """A micro-batch, or an executor task's part of one: the partitions on the fast path together, their state
    transitions shared (Runtime.process_lines_many), the others one by one. `handed` (a task's): the ranges the
    driver reports the last batch's tasks delivered; those of this task's partitions wait in its runtime, and
    so do the ranges it delivers (Waiting)."""
    outcomes: list[PartitionOutcome] = []
    together: list[tuple[WriterContext, str, int, Any, LineBatch]] = []
    slices = list(partition_slices(tbl))
    if handed is not None:
        here = {(topic, part) for topic, part, _ in slices}
        mine = {pk: b for pk, b in handed.items() if (pk.topic, pk.partition) in here}
        rt.waiting = Waiting(rt.store, rt.epoch, mine, handed=True)
    for topic, part, sub in slices:
        ctx = rt.fast_context(topic)
        if ctx is None or not rt.cfg.state.enabled:
            outcomes.append(deliver(rt, topic, part, sub))
        else:
            together.append((ctx, topic, part, sub, _line_batch(rt, ctx, sub)))
    results = rt.process_lines_many([(ctx, topic, part, batch) for ctx, topic, part, _, batch in together])
    for (_, topic, part, sub, _), res in zip(together, results, strict=True):
        if isinstance(res, ShardUnavailableError):
            outcomes.append(_stalled(topic, part, sub.num_rows, _upto(sub), res))
        else:
            outcomes.append(outcome(topic, part, sub.num_rows, _upto(sub), [res]))
    return outcomes


def _upto(sub: Any) -> int:
    return int(sub.column("offset")[-1].as_py()) if sub.num_rows else -1


def guarded(topic: str, part: int, n: int, upto: int, fn: Callable[[], list[PartitionResult]]) -> PartitionOutcome:
    """The outcome of one partition's delivery. A partition whose shard is unavailable stalls: its state
    stays BEFORE (the next batch re-reads from there), and the other partitions go on."""
    try:
        return outcome(topic, part, n, upto, fn())
    except ShardUnavailableError as e:
        return _stalled(topic, part, n, upto, e)


def _stalled(topic: str, part: int, n: int, upto: int, e: ShardUnavailableError) -> PartitionOutcome:
    log.warning("%s/%d stalls: %s", topic, part, e)
    return outcome(topic, part, n, upto, [], stalled=e.label)


def _line_batch(rt: Runtime, ctx: WriterContext, sub: Any) -> LineBatch:
    """One partition's slice as JSON lines for ClickHouse to parse, its records as Messages on demand."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lines = build_lines(sub, ctx.inserter.schema.names, rt.cfg.format.max_message_bytes)
    return LineBatch(sub.column("offset").to_pylist(), lines, lambda: table_messages(sub), lambda at: table_messages(
        sub.filter(pc.is_in(sub.column("offset"), value_set=pa.array(at, pa.int64())))))


def _deliver(rt: Runtime, topic: str, part: int, sub: Any) -> list[PartitionResult]:
    """Through the fast path (ClickHouse parses JSON lines) or the decoding path."""
    ctx = rt.fast_context(topic)
    if ctx is not None:
        return rt.process_lines(ctx, topic, part, _line_batch(rt, ctx, sub))
    return rt.process(topic, part, table_messages(sub))


_EXECUTOR_RUNTIMES: dict[tuple[str, int], Runtime] = {}
OPEN_PATIENCE_S = 60.0


def _executor_runtime(cfg_json: str, epoch: int) -> Runtime:
    """This worker's Runtime. An endpoint that does not answer (a restart, a network blip) is waited for a while:
    failing at once would spend Spark's few task attempts within a second and fail the batch."""
    key = (cfg_json, epoch)
    delay, deadline = 0.5, time.monotonic() + OPEN_PATIENCE_S
    while key not in _EXECUTOR_RUNTIMES:
        try:
            _EXECUTOR_RUNTIMES[key] = Runtime.open(SinkConfig.model_validate_json(cfg_json), epoch)
        except EndpointUnreachableError as e:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("%s; trying again in %.1fs", e, delay)
            time.sleep(delay)
            delay = min(delay * 2, 8.0)
    return _EXECUTOR_RUNTIMES[key]


def _task_setup() -> None:
    """See spark/worker.py: Spark's archives read once, and what the worker keeps frozen once its Runtime is open.
    A function of this module, so that `run` (pickled by value, its globals copied) reads this worker's runtimes."""
    task_setup(runtime_open=bool(_EXECUTOR_RUNTIMES))


def executor_fn(cfg_json: str, epoch: int, handed: str = "") -> Callable[[Iterator[Any]], Iterator[Any]]:
    """mapInArrow body: runs in an executor's Python worker over the whole Kafka partitions its task was given
    (the batch is coalesced to one task per slot), written as the driver writes a batch: the fast-path
    partitions' state transitions shared, one round trip for all of them. `handed` (ranges_json): the ranges
    the last batch's tasks delivered, whose AFTER the next BEFORE writes; each outcome row reports the ranges
    this task delivered, for the driver to hand to the next batch (ExecutorWriter)."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        _task_setup()
        got = list(batches)
        if not got:
            return
        rt = _executor_runtime(cfg_json, epoch)
        try:
            outcomes = deliver_all(rt, pa.Table.from_batches(got), ranges_from_json(handed))
            assert rt.waiting is not None
            delivered = list(rt.waiting.ranges.values())
        finally:
            rt.waiting = None  # the worker's runtime serves the next task, with its own hand-over
        by_partition: dict[tuple[str, int], list[Begin]] = {}
        for b in delivered:
            by_partition.setdefault((b.pk.topic, b.pk.partition), []).append(b)
        for o in outcomes:
            o["waiting"] = ranges_json(by_partition.get((o["topic"], o["partition"]), []))
        yield pa.RecordBatch.from_pylist([dict(o) for o in outcomes], schema=_outcome_arrow_schema())

    return run
