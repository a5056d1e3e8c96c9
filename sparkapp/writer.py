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

from .blocks import build_blocks, dedup_token
from .decode import DeadLetter, Message, decode_batch
from .insert import Inserter
from .state_machine import Case, MissingPolicy, OffsetRange, plan_batch
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
    fault: Callable[[str], None] = field(default=lambda step: None)


@dataclass
class PartitionResult:
    pk: PartitionKey
    case: Case
    inserted_rows: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    retried: OffsetRange | None = None
    committed: OffsetRange | None = None


def write_partition(ctx: WriterContext, pk: PartitionKey, messages: Sequence[Message]) -> PartitionResult:
    """Delivers one partition's batch exactly once. Raises FencedError when a newer run took over."""
    msgs = _ordered(messages)
    row = ctx.store.get(pk)
    if row is not None and row.state.epoch > ctx.epoch:  # before planning: a stale run must not act
        raise FencedError(f"{pk}: writer epoch {ctx.epoch} is stale; partition owned by epoch {row.state.epoch}")
    stored = row.state if row else None
    final_policy = MissingPolicy.DEAD_LETTER if ctx.dlq else MissingPolicy.ERROR
    plan = plan_batch(str(pk), stored, [m.offset for m in msgs],
                      MissingPolicy.REFETCH if ctx.refetch else final_policy, ctx.replay_below)
    if plan.refetch is not None and ctx.refetch is not None:
        again = ctx.refetch(pk.topic, pk.partition, plan.refetch)
        log.info("%s: re-read stored BEFORE range %s from Kafka (%d messages)", pk, plan.refetch, len(again))
        msgs = _ordered([*again, *msgs])
        plan = plan_batch(str(pk), stored, [m.offset for m in msgs], final_policy, ctx.replay_below)
    result = PartitionResult(pk, plan.case, skipped=sum(1 for m in msgs for r in plan.skip if m.offset in r))
    if not (plan.retry or plan.insert or plan.dead_letter):
        return result

    rows, dead = decode_batch(ctx.decode, msgs)
    for rng in plan.dead_letter:  # seed 000 "contains" in BEFORE: cannot be re-sent identically
        note = "; ".join(plan.notes) or f"stored BEFORE range not reproducible ({rng})"
        unsure = [DeadLetter(m, note) for m in msgs if m.offset in rng]
        _dead_letter(ctx, pk, unsure, row, trust_done=False)  # DONE may cover only the range's bad records
        result.dead_lettered += len(unsure)
    for maybe, retry in ((plan.retry, True), (plan.insert, False)):
        if maybe is None:
            continue
        rng = maybe
        ctx.fault("before_begin")
        ctx.store.begin(pk, rng, ctx.epoch, ctx.layout, ctx.shard)
        ctx.fault("after_begin")
        dead_in = [d for d in dead if d.message.offset in rng]
        _dead_letter(ctx, pk, dead_in, row if retry else None, trust_done=True)
        result.dead_lettered += len(dead_in)
        blocks = build_blocks(
            rng, [r for r in rows if r[0] in rng], ctx.inserter.schema.names, ctx.block_offsets,
            lambda w: dedup_token(pk.sink, pk.topic, pk.partition, w, pk.table, ctx.shard), ctx.shard,
        )
        ctx.store.check_fence(pk, ctx.epoch)
        for block in blocks:
            if retry:
                ctx.inserter.retry(block, pk.topic, pk.partition)
            else:
                ctx.inserter.insert(block)
            result.inserted_rows += block.rows
            ctx.fault("after_block")
        ctx.fault("after_insert")
        ctx.store.commit(pk, rng, ctx.epoch, ctx.layout, ctx.shard)
        ctx.fault("after_commit")
        result.committed = rng
        if retry:
            result.retried = rng
    return result


def _ordered(messages: Sequence[Message]) -> list[Message]:
    """Offset order, one message per offset (a re-read may repeat offsets the batch already holds)."""
    by_offset = {m.offset: m for m in messages}
    return [by_offset[o] for o in sorted(by_offset)]


def _dead_letter(ctx: WriterContext, pk: PartitionKey, dead: list[DeadLetter], row: StateRow | None,
                 trust_done: bool) -> None:
    """Produces dead letters exactly once per range: marked SENDING first, read back on a retry, then DONE.

    `row` is the stored row of this same range (None for a fresh range, which `begin` reset to NONE).
    """
    if not dead:
        return
    if ctx.dlq is None:
        first = "; ".join(d.reason for d in dead[:3])
        raise UndeliverableError(
            f"{pk}: {len(dead)} record(s) cannot be delivered and no dead-letter topic is configured "
            f"(set dlq.topic to divert them): {first}"
        )
    phase = row.dlq if row is not None else DlqPhase.NONE
    if phase is DlqPhase.DONE and trust_done:
        return
    if phase is DlqPhase.NONE:
        ctx.store.mark_dlq_sending(pk, ctx.epoch, ctx.dlq.mark())
        ctx.fault("after_dlq_mark")
    else:  # an earlier attempt may have produced some or all of them: send only what is not there
        assert row is not None
        there = ctx.dlq.sent_since(row.dlq_mark, pk.sink)
        dead = [d for d in dead if (d.message.topic, d.message.partition, d.message.offset) not in there]
        log.info("%s: %d dead letter(s) of this range still to produce after reading back the DLQ", pk, len(dead))
    if dead:
        ctx.store.check_fence(pk, ctx.epoch)
        ctx.dlq.send(pk.sink, dead)
    ctx.fault("after_dlq_send")
    ctx.store.mark_dlq_done(pk, ctx.epoch)
    ctx.fault("after_dlq")
