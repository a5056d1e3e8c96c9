"""One partition's batch, end to end: plan, BEFORE, dead letters, identical blocks, insert, AFTER.

This is the only place where the pure core (state machine, decoding, blocks, tokens) meets the
edges (state store, inserter, dead-letter sink, Kafka re-reads). The Spark job calls it once per
topic-partition per micro-batch, on an executor (HTTP) or on the driver (chdb).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .blocks import Block, LineBlock, build_blocks, dedup_token, split_block
from .decode import DeadLetter, Message, decode_batch
from .insert import Inserter, InsertError, is_transient
from .lines import LineBatch, payload
from .routing import Policy
from .shards import ShardSet, ShardUnavailableError
from .state_machine import Case, MissingPolicy, OffsetRange, Plan, plan_batch
from .store import DlqPhase, FencedError, PartitionKey, StateRow, StateStore

log = logging.getLogger(__name__)

STEPS = ("before_begin", "after_begin", "after_dlq_mark", "after_dlq_send", "after_dlq", "after_block",
         "after_insert", "after_commit")


class DeadLetterSink(Protocol):
    def send(self, sink: str, dead: Sequence[DeadLetter]) -> None:
        """Writes the dead letters durably (flushed) before returning."""

    def mark(self) -> str:
        """The sink's current end position, taken before producing."""

    def sent_since(self, mark: str, sink: str) -> set[tuple[str, int, int]]:
        """(topic, partition, offset) of the sink's dead letters that arrived after `mark`."""


class UndeliverableError(RuntimeError):
    """Records cannot be decoded and no dead-letter topic is configured: refuse rather than lose them."""


Refetch = Callable[[str, int, OffsetRange], list[Message]]


@dataclass
class WriterContext:
    sink: str
    store: StateStore
    inserter: Inserter
    decode: Callable[[Message], list[Any]]
    epoch: int
    block_offsets: int = 100_000
    dlq: DeadLetterSink | None = None
    refetch: Refetch | None = None
    layout: int = 0
    shard: int = 0
    replay_below: bool = False
    exactly_once: bool = True  # False: plain at-least-once inserts, no state and no tokens (a baseline)
    shards: ShardSet | None = None  # None: one shard, `inserter`, under `layout`/`shard`
    fault: Callable[[str], None] = field(default=lambda step: None)


@dataclass
class PartitionResult:
    pk: PartitionKey
    case: Case
    inserted_rows: int = 0
    inserts: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    retried: OffsetRange | None = None
    committed: OffsetRange | None = None


def _load(ctx: WriterContext, pk: PartitionKey) -> StateRow | None:
    row = ctx.store.get(pk)
    if row is not None and row.state.epoch > ctx.epoch:  # before planning: a stale run must not act
        raise FencedError(f"{pk}: writer epoch {ctx.epoch} is stale; partition owned by epoch {row.state.epoch}")
    return row


def _policy(ctx: WriterContext, refetch: bool = True) -> MissingPolicy:
    """What the plan does with a stored BEFORE range the batch lacks: re-read it, else dead-letter or refuse."""
    if refetch and ctx.refetch is not None:
        return MissingPolicy.REFETCH
    return MissingPolicy.DEAD_LETTER if ctx.dlq else MissingPolicy.ERROR


def _ranges(plan: Plan) -> list[tuple[OffsetRange, bool]]:
    """The ranges to deliver, in order: the stored BEFORE range re-sent identically, then the new one."""
    return [(r, retry) for r, retry in ((plan.retry, True), (plan.insert, False)) if r is not None]


def _skipped(plan: Plan, offsets: Sequence[int]) -> int:
    return sum(1 for o in offsets for r in plan.skip if o in r)


def write_partition(ctx: WriterContext, pk: PartitionKey, messages: Sequence[Message]) -> PartitionResult:
    """Delivers one partition's batch exactly once. Raises FencedError when a newer run took over."""
    msgs = _ordered(messages)
    if not ctx.exactly_once:
        return _write_plain(ctx, pk, msgs)
    row = _load(ctx, pk)
    stored = row.state if row else None
    plan = plan_batch(str(pk), stored, [m.offset for m in msgs], _policy(ctx), ctx.replay_below)
    if plan.refetch is not None and ctx.refetch is not None:
        assert row is not None
        _check_up(ctx, pk, row.state.layout, row.shard)  # a stalled partition waits without re-reading
        # up to the batch: a partition that stalled on its shard skipped the batches in between
        upto = OffsetRange(plan.refetch.min, max(plan.refetch.max, msgs[0].offset - 1) if msgs else plan.refetch.max)
        again = ctx.refetch(pk.topic, pk.partition, upto)
        log.info("%s: re-read stored BEFORE range %s from Kafka (%d messages)", pk, upto, len(again))
        msgs = _ordered([*again, *msgs])
        plan = plan_batch(str(pk), stored, [m.offset for m in msgs], _policy(ctx, refetch=False), ctx.replay_below)
    result = PartitionResult(pk, plan.case, skipped=_skipped(plan, [m.offset for m in msgs]))
    if not (plan.retry or plan.insert or plan.dead_letter):
        return result

    rows, dead = decode_batch(ctx.decode, msgs)
    for rng in plan.dead_letter:  # seed 000 "contains" in BEFORE: cannot be re-sent identically
        note = "; ".join(plan.notes) or f"stored BEFORE range not reproducible ({rng})"
        unsure = [DeadLetter(m, note) for m in msgs if m.offset in rng]
        _dead_letter(ctx, pk, unsure)
        result.dead_lettered += len(unsure)
    for rng, retry in _ranges(plan):
        route = _route(ctx, pk, row, retry)
        _begin(ctx, pk, rng, route)
        _deliver_decoded(ctx, pk, rng, retry, rows, dead, result, route)
        _commit(ctx, pk, rng, retry, result, route)
    return result


def write_lines(ctx: WriterContext, pk: PartitionKey, batch: LineBatch) -> PartitionResult:
    """The fast path of write_partition: same plan, windows and tokens, but ClickHouse parses the records.

    Records that are not JSON objects are decoded in Python (they come as dead letters with the
    decoder's reason); anything else unusual (a stored range to re-read, a window ClickHouse rejects)
    takes the decoding path. Every choice depends only on the records, so a retry chooses alike.
    """
    if not batch.offsets:
        return write_partition(ctx, pk, [])
    known_dead: list[DeadLetter] = []
    if not batch.complete:
        rows_odd, known_dead = decode_batch(ctx.decode, batch.odd())
        if rows_odd:  # the decoder takes a record the fast path would not: decode the whole batch
            return write_partition(ctx, pk, batch.messages())
    if not ctx.exactly_once:
        return _write_plain(ctx, pk, None, batch, known_dead)
    row = _load(ctx, pk)
    plan = plan_batch(str(pk), row.state if row else None, batch.offsets, _policy(ctx), ctx.replay_below)
    if plan.refetch is not None or plan.dead_letter:
        return write_partition(ctx, pk, batch.messages())
    result = PartitionResult(pk, plan.case, skipped=_skipped(plan, batch.offsets))
    for rng, retry in _ranges(plan):
        route = _route(ctx, pk, row, retry)
        _begin(ctx, pk, rng, route)
        dead_in = [d for d in known_dead if d.message.offset in rng]
        _dead_letter(ctx, pk, dead_in)
        result.dead_lettered += len(dead_in)
        ctx.store.check_fence(pk, ctx.epoch)
        for w, offsets, lines in batch.windows(rng, ctx.block_offsets):
            block = LineBlock(w, _token(ctx, pk, w, route[1]), payload(lines), offsets, lines, route[1])
            try:
                _send(ctx, pk, [block], retry, result, route)
            except InsertError as e:
                if isinstance(e.__cause__, Exception) and is_transient(e.__cause__):
                    raise
                log.warning("%s: ClickHouse rejected window %s (%s); decoding from there on in Python",
                            pk, w, str(e.__cause__ or e).splitlines()[0][:300])
                sent = {d.message.offset for d in dead_in}  # dead-lettered up front already
                msgs = [m for m in _ordered(batch.messages()) if w.min <= m.offset <= rng.max and m.offset not in sent]
                rows, dead = decode_batch(ctx.decode, msgs)
                _deliver_decoded(ctx, pk, rng, retry, rows, dead, result, route, since=w.min)
                break
        _commit(ctx, pk, rng, retry, result, route)
    return result


def _write_plain(ctx: WriterContext, pk: PartitionKey, msgs: list[Message] | None,
                 batch: LineBatch | None = None, known_dead: Sequence[DeadLetter] = ()) -> PartitionResult:
    """At-least-once, for comparison only: no state transitions, no tokens, no recovery."""
    result = PartitionResult(pk, Case.NEW)
    if batch is not None:
        _send_plain_dead(ctx, pk, list(known_dead))
        result.dead_lettered = len(known_dead)
        rng = OffsetRange(batch.offsets[0], batch.offsets[-1])
        for w, offsets, lines in batch.windows(rng, ctx.block_offsets):
            try:
                ctx.inserter.insert(LineBlock(w, "", payload(lines), offsets, lines))
                result.inserted_rows += len(offsets)
            except InsertError:
                sent = {d.message.offset for d in known_dead}
                rest = [m for m in _ordered(batch.messages()) if m.offset >= w.min and m.offset not in sent]
                done = _write_plain(ctx, pk, rest)
                result.inserted_rows += done.inserted_rows
                result.dead_lettered += done.dead_lettered
                break
        return result
    assert msgs is not None
    if not msgs:
        return result
    rows, dead = decode_batch(ctx.decode, msgs)
    _send_plain_dead(ctx, pk, list(dead))
    result.dead_lettered = len(dead)
    rng = OffsetRange(msgs[0].offset, msgs[-1].offset)
    for block in build_blocks(rng, rows, ctx.inserter.schema.names, ctx.block_offsets, lambda w: ""):
        ctx.inserter.insert(block)
        result.inserted_rows += block.rows
    return result


def _send_plain_dead(ctx: WriterContext, pk: PartitionKey, dead: list[DeadLetter]) -> None:
    if dead:
        _require_dlq(ctx, pk, dead).send(pk.sink, dead)


def _require_dlq(ctx: WriterContext, pk: PartitionKey, dead: list[DeadLetter]) -> DeadLetterSink:
    """The dead-letter sink, or UndeliverableError: records are refused rather than lost."""
    if ctx.dlq is None:
        first = "; ".join(d.reason for d in dead[:3])
        raise UndeliverableError(
            f"{pk}: {len(dead)} record(s) cannot be delivered and no dead-letter topic is configured "
            f"(set dlq.topic to divert them): {first}"
        )
    return ctx.dlq


def _token(ctx: WriterContext, pk: PartitionKey, w: OffsetRange, shard: int) -> str:
    return dedup_token(pk.sink, pk.topic, pk.partition, w, pk.table, shard)


Route = tuple[int, int]  # (layout version, shard): what a range's state row records


def _route(ctx: WriterContext, pk: PartitionKey, row: StateRow | None, retry: bool) -> Route:
    """A re-sent BEFORE range keeps the layout and shard its row recorded, so it reaches the shard its first
    attempt reached; a new range takes the current layout (and, under policy partition, its shard)."""
    if ctx.shards is None:
        return ctx.layout, ctx.shard
    if retry:
        assert row is not None
        ctx.shards.layout(row.state.layout, str(pk))
        return row.state.layout, row.shard
    lay = ctx.shards.layouts[ctx.shards.current]
    return lay.version, lay.partition_shard(pk.topic, pk.partition) if lay.policy is Policy.PARTITION else 0


def _check_up(ctx: WriterContext, pk: PartitionKey, layout: int, shard: int) -> None:
    """Raises ShardUnavailableError, before any work, when a shard the range needs is known to be down."""
    if ctx.shards is not None:
        ctx.shards.layout(layout, str(pk))
        for s in ctx.shards.shards_of(layout, shard):
            ctx.shards.health.check(ctx.shards.name(layout, s))


def _begin(ctx: WriterContext, pk: PartitionKey, rng: OffsetRange, route: Route) -> None:
    ctx.fault("before_begin")
    ctx.store.begin(pk, rng, ctx.epoch, *route)
    ctx.fault("after_begin")


def _commit(ctx: WriterContext, pk: PartitionKey, rng: OffsetRange, retry: bool, result: PartitionResult,
            route: Route) -> None:
    ctx.fault("after_insert")
    ctx.store.commit(pk, rng, ctx.epoch, *route)
    ctx.fault("after_commit")
    result.committed = rng
    if retry:
        result.retried = rng


def _deliver_decoded(ctx: WriterContext, pk: PartitionKey, rng: OffsetRange, retry: bool,
                     rows: Sequence[tuple[int, Sequence[Any]]], dead: Sequence[DeadLetter], result: PartitionResult,
                     route: Route, since: int | None = None) -> None:
    """Dead letters, then decoded blocks, of `rng` (from offset `since` on, when the windows below are sent)."""
    lo = rng.min if since is None else since
    dead_in = [d for d in dead if lo <= d.message.offset <= rng.max]
    _dead_letter(ctx, pk, dead_in)
    result.dead_lettered += len(dead_in)
    blocks = build_blocks(rng, [r for r in rows if lo <= r[0] <= rng.max], ctx.inserter.schema.names,
                          ctx.block_offsets, lambda w: _token(ctx, pk, w, route[1]), route[1])
    ctx.store.check_fence(pk, ctx.epoch)
    _send(ctx, pk, blocks, retry, result, route)


def _split(ctx: WriterContext, pk: PartitionKey, block: Block | LineBlock,
           route: Route) -> list[tuple[int, Block | LineBlock]]:
    """The sub-blocks of one window, one per shard, each under its shard's token (seed 004)."""
    if ctx.shards is None or ctx.shards.layouts[route[0]].policy is Policy.PARTITION:
        return [(route[1], block)]
    lay = ctx.shards.layouts[route[0]]
    keys = None
    if lay.policy is Policy.KEY:
        assert isinstance(block, Block), "policy key takes the decoding path"
        keys = block.data[block.columns.index(lay.key)]
    return split_block(block, lay.row_shards(block.offsets, keys),
                       lambda s: _token(ctx, pk, block.window, s))


def _send(ctx: WriterContext, pk: PartitionKey, blocks: Sequence[Block | LineBlock], retry: bool,
          result: PartitionResult, route: Route) -> None:
    """Sends each window's sub-blocks to their shards; a shard failing past its retries stalls the range."""
    for block in blocks:
        for shard, sub in _split(ctx, pk, block, route):
            inserter = ctx.inserter if ctx.shards is None else ctx.shards.inserter(route[0], shard)
            label = "" if ctx.shards is None else ctx.shards.name(route[0], shard)
            if ctx.shards is not None:
                ctx.shards.health.check(label)
            try:
                if retry:
                    inserter.retry(sub, pk.topic, pk.partition)
                else:
                    inserter.insert(sub)
            except InsertError as e:
                if ctx.shards is None or not (isinstance(e.__cause__, Exception) and is_transient(e.__cause__)):
                    raise
                ctx.shards.health.failed(label, str(e.__cause__).splitlines()[0][:300])
                raise ShardUnavailableError(label, str(e.__cause__).splitlines()[0][:300]) from e
            if ctx.shards is not None:
                ctx.shards.health.ok(label)
            result.inserted_rows += sub.rows
            result.inserts += 1
            ctx.fault("after_block")


def _ordered(messages: Sequence[Message]) -> list[Message]:
    """Offset order, one message per offset (a re-read may repeat offsets the batch already holds)."""
    by_offset = {m.offset: m for m in messages}
    return [by_offset[o] for o in sorted(by_offset)]


def _dead_letter(ctx: WriterContext, pk: PartitionKey, dead: list[DeadLetter]) -> None:
    """Produces dead letters exactly once per range, however many sends the range takes.

    The first send of a range records the DLQ's end offsets (SENDING) before producing; any later
    send of the same range, in this attempt or a retry, reads back from that first mark and produces
    only what is not there yet; DONE follows each send.
    """
    if not dead:
        return
    dlq = _require_dlq(ctx, pk, dead)
    row = ctx.store.check_fence(pk, ctx.epoch)
    if row is None:
        raise FencedError(f"{pk}: state row vanished before dead-lettering (topic removed from the sink?)")
    if row.dlq is DlqPhase.NONE:
        ctx.store.mark_dlq_sending(pk, ctx.epoch, dlq.mark())
        ctx.fault("after_dlq_mark")
    else:  # something of this range went out already: send only what is not there
        if row.dlq is DlqPhase.DONE:
            ctx.store.mark_dlq_sending(pk, ctx.epoch, None)
        there = dlq.sent_since(row.dlq_mark, pk.sink)
        dead = [d for d in dead if (d.message.topic, d.message.partition, d.message.offset) not in there]
        log.info("%s: %d dead letter(s) of this range still to produce after reading back the DLQ", pk, len(dead))
    if dead:
        dlq.send(pk.sink, dead)
    ctx.fault("after_dlq_send")
    ctx.store.mark_dlq_done(pk, ctx.epoch)
    ctx.fault("after_dlq")
