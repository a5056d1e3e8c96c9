"""One partition's batch, end to end: plan, BEFORE, dead letters, identical blocks, insert, AFTER.

This is the only place where the pure core (state machine, blocks, tokens, routing) and the formats
meet the edges (state store, inserter, dead-letter sink, Kafka re-reads). Whoever writes a batch (the driver
with chdb, an executor task over HTTP) hands it its partitions together (write_lines_many), which then share
their state-store round trips. The at-least-once baseline the benchmark compares against is plain.py, outside
this protocol.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.blocks import Block, LineBlock, build_blocks, dedup_token, pick, split_block, whole
from ..core.records import DeadLetter, Message
from ..core.state_machine import MissingPolicy, OffsetRange, Phase, Plan, StoredState, plan_batch
from ..edges.errors import first_line
from ..edges.insert import InsertError
from ..edges.shards import ShardUnavailableError
from ..edges.store import Begin, DlqPhase, FencedError, PartitionKey, StateConflict, StateRow, StateStore
from ..formats.jsoneachrow import LineBatch, guard
from ..formats.keys import line_keys
from ..formats.rows import decode_batch
from ..formats.schema import Column
from .context import DataLossError, DeadLetterSink, PartitionResult, WriterContext, ordered, require_dlq
from .plain import write_plain, write_plain_lines
from .sift import Sifted, send_window, sift_range

log = logging.getLogger(__name__)

# Where the crash tests inject faults (WriterContext.fault), in protocol order. `after_commit` follows a range's
# AFTER, written or left waiting for the partition's next BEFORE (Waiting).
STEPS = ("before_begin", "after_begin", "after_dlq_mark", "after_dlq_send", "after_dlq", "after_block",
         "after_insert", "after_commit")


def _policy(ctx: WriterContext, refetch: bool = True) -> MissingPolicy:
    """What the plan does with a stored BEFORE range the batch lacks: re-read it, else dead-letter or refuse."""
    if refetch and ctx.refetch is not None:
        return MissingPolicy.REFETCH
    return MissingPolicy.DEAD_LETTER if ctx.dlq else MissingPolicy.ERROR


def _ranges(plan: Plan) -> list[tuple[OffsetRange, bool]]:
    """The ranges to deliver, in order: the stored BEFORE range re-sent identically, then the new one."""
    return [(r, retry) for r, retry in ((plan.retry, True), (plan.insert, False)) if r is not None]


def _skipped(plan: Plan, offsets: Sequence[int]) -> int:
    if not plan.skip:  # the common case: no pass over the batch's offsets
        return 0
    return sum(1 for o in offsets for r in plan.skip if o in r)


_REPLANS = 3  # a conflict means another writer moved the state; it cannot keep happening to one batch


def _replanning(write: Callable[[bool], PartitionResult], pk: PartitionKey) -> PartitionResult:
    """Runs a delivery, planning again from the stored state when a transition finds it moved (StateConflict).

    A re-plan treats a batch wholly below the state as a replay: only another attempt of this very batch (a
    retried task, a stale writer) can have moved the state past it, and that attempt delivered it."""
    for attempt in range(_REPLANS):
        try:
            return write(attempt > 0)
        except StateConflict as e:
            if attempt == _REPLANS - 1:
                raise
            log.warning("%s: planning again: %s", pk, e)
    raise AssertionError("unreachable")


def write_partition(ctx: WriterContext, pk: PartitionKey, messages: Sequence[Message]) -> PartitionResult:
    """Delivers one partition's batch exactly once. Raises FencedError when a newer run took over."""
    msgs = ordered(messages)
    if not ctx.exactly_once:
        return write_plain(ctx, pk, msgs)
    return _replanning(lambda replan: _write_decoded(ctx, pk, msgs, replan), pk)


def _write_decoded(ctx: WriterContext, pk: PartitionKey, msgs: list[Message], replan: bool) -> PartitionResult:
    replay_below = ctx.replay_below or replan
    row = ctx.store.load(pk, ctx.epoch)
    stored = row.state if row else None
    plan = plan_batch(str(pk), stored, [m.offset for m in msgs], _policy(ctx), replay_below)
    if plan.refetch is not None and ctx.refetch is not None:
        assert row is not None
        _check_up(ctx, pk, row.state.layout, row.shard)  # a stalled partition waits without re-reading
        # up to the batch: a partition that stalled on its shard skipped the batches in between
        upto = OffsetRange(plan.refetch.min, max(plan.refetch.max, msgs[0].offset - 1) if msgs else plan.refetch.max)
        again = ctx.refetch(pk.topic, pk.partition, upto)
        log.info("%s: re-read stored BEFORE range %s from Kafka (%d messages)", pk, upto, len(again))
        msgs = ordered([*again, *msgs])
        # the re-read holds all Kafka still has of the range: re-send that in the recorded windows (the first
        # attempt may have landed, so nothing of it is dead-lettered), after checking what retention took
        plan = plan_batch(str(pk), stored, [m.offset for m in msgs], MissingPolicy.RESEND_PRESENT, replay_below)
        _check_gone(ctx, pk, row, [m.offset for m in msgs if m.offset in row.state.range])
    result = PartitionResult(pk, plan.case, skipped=_skipped(plan, [m.offset for m in msgs]))
    if not (plan.retry or plan.insert or plan.dead_letter):
        return result

    for rng in plan.dead_letter:  # a BEFORE range this batch holds only part of: cannot be re-sent identically
        note = "; ".join(plan.notes) or f"stored BEFORE range not reproducible ({rng})"
        unsure = [DeadLetter(m, note) for m in msgs if m.offset in rng]
        _dead_letter(ctx, pk, unsure)
        result.dead_lettered += len(unsure)
    decoded: tuple[list[tuple[int, list[Any]]], list[DeadLetter]] | None = None
    for rng, retry in _ranges(plan):
        place = _placement(ctx, pk, row, retry)
        stored = _begin(ctx, pk, rng, place, stored)
        # decoded once the range is BEFORE: a schema registry that does not answer then stalls it there, as an
        # unavailable shard does, and the next batch re-reads it. Decoded first, such a stall left the state
        # below the batch, and the next batch's range landed above the records it held.
        rows, dead = decoded = decoded or decode_batch(ctx.decode, msgs)
        _deliver_decoded(ctx, pk, rng, retry, rows, dead, result, place)
        stored = _commit(ctx, pk, rng, retry, result, place)
    return result


def write_lines(ctx: WriterContext, pk: PartitionKey, batch: LineBatch) -> PartitionResult:
    """The fast path of write_partition: same plan, windows and tokens, but ClickHouse parses the records.

    Records that are not JSON objects, and in each window the lines ClickHouse refuses or could alter,
    are decoded in Python alone (they come as dead letters with the decoder's reason; sift.py); a stored
    range to re-read, or a flagged record the decoder keeps, takes the decoding path. Every choice
    depends only on the records, and each window's block holds what the decoder accepts, so a retry on
    either path sends the same blocks.
    """
    if not batch.offsets:
        return write_partition(ctx, pk, [])
    known_dead = _odd_dead(ctx, batch)
    if known_dead is None:  # the decoder takes a record the fast path would not: decode the whole batch
        return write_partition(ctx, pk, batch.messages())
    if not ctx.exactly_once:
        return write_plain_lines(ctx, pk, batch, known_dead)
    try:
        return _write_lines(ctx, pk, batch, known_dead)
    except StateConflict as e:
        return _planned_again(ctx, pk, batch, e)


def _odd_dead(ctx: WriterContext, batch: LineBatch) -> list[DeadLetter] | None:
    """The dead letters among the records without a line; None when the decoder keeps any of them."""
    if batch.complete:
        return []
    rows_odd, known_dead = decode_batch(ctx.decode, batch.odd())
    return None if rows_odd else known_dead


def _planned_again(ctx: WriterContext, pk: PartitionKey, batch: LineBatch, e: StateConflict) -> PartitionResult:
    """Another writer moved the state: the decoding path plans again from it."""
    log.warning("%s: planning again: %s", pk, e)
    return _replanning(lambda replan: _write_decoded(ctx, pk, ordered(batch.messages()), True), pk)


def _write_lines(ctx: WriterContext, pk: PartitionKey, batch: LineBatch,
                 known_dead: list[DeadLetter]) -> PartitionResult:
    row = ctx.store.load(pk, ctx.epoch)
    stored = row.state if row else None
    plan = plan_batch(str(pk), stored, batch.offsets, _policy(ctx), ctx.replay_below)
    if plan.refetch is not None or plan.dead_letter:
        return write_partition(ctx, pk, batch.messages())
    result = PartitionResult(pk, plan.case, skipped=_skipped(plan, batch.offsets))
    for rng, retry in _ranges(plan):
        place = _placement(ctx, pk, row, retry)
        stored = _begin(ctx, pk, rng, place, stored)
        sifted = _sift(ctx, batch, rng, place, known_dead)
        _dead_letter(ctx, pk, sifted[1])
        ctx.store.check_fence(pk, ctx.epoch)
        _lines_range(ctx, pk, batch, (rng, retry, place), sifted, result)
        stored = _commit(ctx, pk, rng, retry, result, place)
    return result


def _sift(ctx: WriterContext, batch: LineBatch, rng: OffsetRange, place: Placement,
          known_dead: list[DeadLetter]) -> tuple[list[Sifted], list[DeadLetter]]:
    """The range's windows with its bad records sifted out, and all its dead letters (sift.py)."""
    windows, dead = sift_range(batch.windows(rng, place.block_offsets), guard(ctx.inserter.schema),
                               decode=ctx.decode, take=batch.take)
    return windows, [d for d in known_dead if d.message.offset in rng] + dead


def _lines_range(ctx: WriterContext, pk: PartitionKey, batch: LineBatch,
                 where: tuple[OffsetRange, bool, Placement], sifted: tuple[list[Sifted], list[DeadLetter]],
                 result: PartitionResult) -> None:
    """One BEFORE range of the fast path (`where`: the range, whether a retry, its placement) whose dead letters
    were produced (`sifted`): its windows."""
    rng, retry, place = where
    windows, dead_in = sifted
    result.dead_lettered += len(dead_in)
    sent = {d.message.offset for d in dead_in}  # dead-lettered up front already
    messages = functools.cache(lambda: ordered(batch.messages()))  # read at most once, when a window needs it
    key = _key_column(ctx, place)
    for sw in windows:
        lines, keys = sw.lines, None
        if key is not None and not sw.decoder:  # read whole, then cut per shard: a window in pieces joined once
            lines = whole(sw.lines)
            keys = line_keys(lines, key)
        if sw.decoder or (key is not None and keys is None):  # a suspect record it keeps, or a key only it reads
            log.info("%s: window %s takes the decoder (a suspect record it keeps, or a key it reads)", pk, sw.window)
            _decode_window(ctx, pk, rng, sw.window, retry, messages(), sent, result, place)
        else:
            _lines_window(ctx, pk, batch, (rng, sw.window, retry, place), (sw.offsets, lines, keys), messages,
                          sent, result)


def _key_column(ctx: WriterContext, place: Placement) -> Column | None:
    """The column whose value routes each row when the range's layout routes rows by key."""
    if ctx.shards is None or not ctx.shards.layouts[place.layout].needs_key:
        return None
    schema = ctx.inserter.schema
    return schema.columns[schema.names.index(ctx.shards.layouts[place.layout].key)]


@dataclass
class Waiting:
    """Delivered ranges whose AFTER has not been written yet.

    A range's AFTER only tells a later run not to send it again. The partition's next BEFORE tells it as well:
    a range above the row's means everything below was delivered. So a delivered range waits here, and its
    partition's next BEFORE, conditioned on that exact BEFORE row of this epoch, takes its place: one state write
    per batch in the steady case instead of two. A crash leaves the row BEFORE, as a crash between insert and
    AFTER always could: the next run re-sends the range identically.

    A range may wait only where it is known delivered: on the driver, which wrote it; in an executor task, when
    the driver hands over what the last batch's tasks reported (`handed`), since Spark runs a batch only after
    every task of the one before succeeded. A task attempt may then find a row another attempt of it already
    moved past the range (a retried or zombie attempt): that range needs no AFTER, and is let go.

    On the driver, the only writer of its epoch, the rows the last batch's BEFORE read back are its partitions'
    state until it writes them again (`rows`): the next batch plans from them with no read of its own. They are
    only ever what the store read back; one another writer moved since fails the conditional write, and one a
    newer run took, or a sink it took over, fails the read back, before anything is sent."""

    store: StateStore
    epoch: int
    ranges: dict[PartitionKey, Begin] = field(default_factory=dict)
    handed: bool = False
    rows: dict[PartitionKey, StateRow] = field(default_factory=dict)

    def known(self, pks: Sequence[PartitionKey]) -> dict[PartitionKey, StateRow] | None:
        """The rows of `pks` as the last BEFORE read them back, when it read them all (never on an executor, where
        other tasks write the partitions between batches)."""
        if self.handed or not pks or any(pk not in self.rows for pk in pks):
            return None
        return {pk: self.rows[pk] for pk in pks}

    def confirmed(self, pk: PartitionKey, row: StateRow | None) -> StoredState | None:
        """The state to plan from: a row still BEFORE over a range waiting here is AFTER; any other row as stored
        (a row that moved is told by the write that expected it)."""
        w = self.ranges.get(pk)
        if row is not None and w is not None and row.state == StoredState(w.rng, Phase.BEFORE, self.epoch, w.layout):
            return dataclasses.replace(row.state, phase=Phase.AFTER)
        if w is not None and self.handed:
            del self.ranges[pk]  # another attempt moved the row on
        return row.state if row else None

    def flush(self, pks: Sequence[PartitionKey] | None = None) -> None:
        """Writes the AFTER of the ranges waiting (of `pks` only, when given): one write for them all."""
        items = [b for pk, b in self.ranges.items() if pks is None or pk in pks]
        for b in items:
            self.rows.pop(b.pk, None)  # AFTER now: read again when next needed
        if items:
            self.store.commit_many(items, self.epoch, {} if self.handed else None)
        for b in items:
            del self.ranges[b.pk]


def ranges_json(ranges: Iterable[Begin]) -> str:
    """Waiting ranges as the driver hands them to the next batch's tasks ("" for none)."""
    rows = [[b.pk.sink, b.pk.topic, b.pk.partition, b.pk.table, b.rng.min, b.rng.max, b.layout, b.shard,
             b.block_offsets, b.dlq_mark] for b in ranges]
    return json.dumps(rows) if rows else ""


def ranges_from_json(text: str) -> dict[PartitionKey, Begin]:
    """ranges_json's ranges, by partition."""
    out: dict[PartitionKey, Begin] = {}
    for sink, topic, part, table, lo, hi, layout, shard, block_offsets, mark in json.loads(text) if text else []:
        pk = PartitionKey(sink, topic, part, table)
        out[pk] = Begin(pk, OffsetRange(lo, hi), None, layout, shard, block_offsets, mark)
    return out


def write_lines_many(items: Sequence[tuple[WriterContext, PartitionKey, LineBatch]], waiting: Waiting | None = None,
                     ) -> list[PartitionResult | ShardUnavailableError]:
    """write_lines of the partitions of one micro-batch, with their state transitions shared: the partitions
    whose plan is a new range (the steady case) are read in one round trip, go BEFORE in one conditional
    write and AFTER in another (each read back), whatever their number; on the driver (`waiting`), the rows the
    last BEFORE read back stand in for the read. Any other plan (a stored range to
    re-send, re-read or dead-letter), a state that moved meanwhile, and the at-least-once baseline take
    write_lines alone, after them. Windows, tokens and fencing are write_lines'; a crash between the BEFORE
    and the AFTER leaves every partition BEFORE, re-sent identically by the next run.

    With `waiting`, the AFTER write is left out: the delivered ranges wait there for their
    partitions' next BEFORE (Waiting). Waiting ranges of partitions that take no shared BEFORE in this batch
    are confirmed before the partitions that go alone plan, so none of them plans from its own delivered range.

    Results are in the order of `items`; a partition whose shard is unavailable gets its ShardUnavailableError
    (it stalls BEFORE, the others go on). Any other failure, FencedError included, is raised."""
    out: list[PartitionResult | ShardUnavailableError | None] = [None] * len(items)
    alone: list[int] = []
    fast: list[tuple[int, list[DeadLetter]]] = []
    for i, (ctx, _, batch) in enumerate(items):
        known = _odd_dead(ctx, batch) if ctx.exactly_once and batch.offsets else None
        if known is None:
            alone.append(i)
        else:
            fast.append((i, known))
    done = _shared_transitions(items, fast, out, alone, waiting) if fast else []
    if waiting is not None:
        waiting.flush()  # what this batch's BEFOREs did not take over
    if done:
        ctx = items[done[0][0]][0]
        held = waiting if waiting is not None else Waiting(ctx.store, ctx.epoch)
        held.ranges.update((b.pk, b) for _, b, _ in done)
        if waiting is None:
            held.flush()  # AFTER at once, in one write
        for i, _, _ in done:
            items[i][0].fault("after_commit")
    if waiting is not None:
        for i in alone:  # write_lines reads and writes its row itself
            waiting.rows.pop(items[i][1], None)
    for i in sorted(alone):
        ctx, pk, batch = items[i]
        try:
            out[i] = write_lines(ctx, pk, batch)
        except ShardUnavailableError as e:
            out[i] = e
    assert all(r is not None for r in out)
    return [r for r in out if r is not None]


def _shared_transitions(items: Sequence[tuple[WriterContext, PartitionKey, LineBatch]],
                        fast: list[tuple[int, list[DeadLetter]]],
                        out: list[PartitionResult | ShardUnavailableError | None], alone: list[int],
                        waiting: Waiting | None) -> list[tuple[int, Begin, PartitionResult]]:
    """write_lines_many's shared part: plan from one read (a range `waiting` holds counts as confirmed); sift every
    range; BEFORE in one write, which also records the dead-letter topic's mark for the ranges with dead letters;
    those produced in one send; the windows. Returns the ranges delivered, whose AFTER is the caller's."""
    store, epoch = items[fast[0][0]][0].store, items[fast[0][0]][0].epoch
    assert all(items[i][0].store is store and items[i][0].epoch == epoch for i, _ in fast), "one store, one epoch"
    pks = [items[i][1] for i, _ in fast]
    read_back = waiting.known(pks) if waiting is not None and waiting.epoch == epoch else None
    rows = read_back if read_back is not None else store.load_many(pks, epoch)
    if waiting is not None:
        waiting.rows = {}  # the rows this batch reads back take their place (any it does not move are read again)
    planned: list[tuple[int, OffsetRange, Placement, tuple[list[Sifted], list[DeadLetter]], PartitionResult]] = []
    for i, known in fast:
        ctx, pk, batch = items[i]
        row = rows.get(pk)
        stored = waiting.confirmed(pk, row) if waiting is not None else row.state if row else None
        plan = plan_batch(str(pk), stored, batch.offsets, _policy(ctx), ctx.replay_below)
        if plan.insert is None or plan.retry or plan.refetch or plan.dead_letter:
            alone.append(i)  # nothing new (write_lines tells what it skips), or a stored range to deal with
            continue
        place = _placement(ctx, pk, row, False)
        planned.append((i, plan.insert, place, _sift(ctx, batch, plan.insert, place, known),
                        PartitionResult(pk, plan.case, skipped=_skipped(plan, batch.offsets))))
    dlq = _shared_dlq([(items[i][0], items[i][1], sifted[1]) for i, _, _, sifted, _ in planned])
    mark = dlq.mark() if dlq is not None else None
    begins = {i: Begin(items[i][1], rng, rows[items[i][1]].state if items[i][1] in rows else None, place.layout,
                       place.shard, place.block_offsets, mark if sifted[1] else None)
              for i, rng, place, sifted, _ in planned}
    for i in begins:
        if waiting is not None:  # its BEFORE, conditioned on the waiting row, takes the AFTER's place
            waiting.ranges.pop(items[i][1], None)
        items[i][0].fault("before_begin")
    seen: dict[PartitionKey, StateRow] = {}
    conflicts = store.begin_many(list(begins.values()), epoch, loaded=rows, seen=seen)
    begun = [p for p in planned if items[p[0]][1] not in conflicts]
    for i, *_ in begun:
        items[i][0].fault("after_begin")
    dead = [d for _, _, _, sifted, _ in begun for d in sifted[1]]
    if dead:
        assert dlq is not None
        items[begun[0][0]][0].fault("after_dlq_mark")
        dlq.send(items[begun[0][0]][1].sink, dead)
        for step in ("after_dlq_send", "after_dlq"):
            items[begun[0][0]][0].fault(step)
    done: list[tuple[int, Begin, PartitionResult]] = []
    for i, *_ in planned:
        ctx, pk, batch = items[i]
        try:
            if pk in conflicts:
                out[i] = _planned_again(ctx, pk, batch, conflicts[pk])
        except ShardUnavailableError as e:
            out[i] = e
    for i, rng, place, sifted, result in begun:
        ctx, pk, batch = items[i]
        try:
            _lines_range(ctx, pk, batch, (rng, False, place), sifted, result)
        except ShardUnavailableError as e:  # it stays BEFORE; the next batch re-sends it (write_lines)
            out[i] = e
            continue
        ctx.fault("after_insert")
        done.append((i, begins[i], result))
        result.committed = begins[i].rng
        out[i] = result
        if waiting is not None:
            waiting.rows[pk] = seen[pk]
    return done


def _shared_dlq(ranges: list[tuple[WriterContext, PartitionKey, list[DeadLetter]]]) -> DeadLetterSink | None:
    """The one dead-letter sink of the ranges that have dead letters (None: they have none); UndeliverableError
    before anything is written when there is none to take them."""
    sinks = {id(s): s for s in (require_dlq(ctx, pk, dead) for ctx, pk, dead in ranges if dead)}
    assert len(sinks) <= 1, "one dead-letter topic per sink"
    return next(iter(sinks.values()), None)


def _lines_window(ctx: WriterContext, pk: PartitionKey, batch: LineBatch,
                  where: tuple[OffsetRange, OffsetRange, bool, Placement],
                  what: tuple[tuple[int, ...], Any, Any], messages: Callable[[], list[Message]],
                  sent: set[int], result: PartitionResult) -> None:
    """One sifted window of the fast path (`where`: its range, the window, whether a retry, its placement; `what`:
    its offsets, lines and routing keys, None when not routed by key): sent, the lines ClickHouse refuses all the
    same sifted out, or the whole window through the decoder."""
    rng, w, retry, place = where
    offsets, lines, keys = what

    def send(offs: tuple[int, ...], ls: Any) -> None:
        block = LineBlock(w, _token(pk, w, place.shard), offs, ls, place.shard, _keys_of(keys, offsets, offs))
        _send(ctx, pk, [block], retry, result, place)

    def dead_letter(dead: list[DeadLetter]) -> None:
        _dead_letter(ctx, pk, dead)
        result.dead_lettered += len(dead)
        sent.update(d.message.offset for d in dead)

    if not send_window(offsets, lines, decode=ctx.decode, take=batch.take, refused=ctx.inserter.refused,
                       send=send, dead_letter=dead_letter):
        log.info("%s: window %s takes the decoder", pk, w)
        _decode_window(ctx, pk, rng, w, retry, messages(), sent, result, place)


def _keys_of(keys: Any, offsets: tuple[int, ...], offs: tuple[int, ...]) -> Any:
    """The routing keys of `offs`, the window's sorted `offsets` or what is left of them once ClickHouse refused
    some lines."""
    if keys is None or len(offs) == len(offsets):
        return keys
    import numpy as np

    return pick(keys, np.searchsorted(np.asarray(offsets), np.asarray(offs)))


def _decode_window(ctx: WriterContext, pk: PartitionKey, rng: OffsetRange, w: OffsetRange, retry: bool,
                   msgs: Sequence[Message], sent: set[int], result: PartitionResult, place: Placement) -> None:
    """One window of the fast path through the decoder, under the same token: what ClickHouse would reject
    or could alter is decided by the decoder alone, window by window, so the outcome is the decoding path's."""
    rows, dead = decode_batch(ctx.decode, [m for m in msgs if m.offset in w and m.offset not in sent])
    _deliver_decoded(ctx, pk, rng, retry, rows, dead, result, place, since=w.min, until=w.max)


def _token(pk: PartitionKey, w: OffsetRange, shard: int) -> str:
    return dedup_token(pk.sink, pk.topic, pk.partition, w, pk.table, shard)


@dataclass(frozen=True)
class Placement:
    """Where a range goes and how it is cut: the shard layout, shard and window size its state row records."""

    layout: int
    shard: int
    block_offsets: int


def _placement(ctx: WriterContext, pk: PartitionKey, row: StateRow | None, retry: bool) -> Placement:
    """A re-sent BEFORE range keeps the layout, shard and window size its row recorded, so it is cut into the
    same windows and reaches the shard its first attempt reached, whatever the config says now; a new range
    takes the current layout (and the shard that layout gives the partition) and window size."""
    if retry:
        assert row is not None
        if ctx.shards is not None:
            ctx.shards.layout(row.state.layout, str(pk))  # LayoutError when the config no longer describes it
        return Placement(row.state.layout, row.shard, row.block_offsets or ctx.block_offsets)
    if ctx.shards is None:
        return Placement(ctx.layout, ctx.shard, ctx.block_offsets)
    lay = ctx.shards.layouts[ctx.shards.current]
    return Placement(lay.version, lay.range_shard(pk.topic, pk.partition), ctx.block_offsets)


def _check_gone(ctx: WriterContext, pk: PartitionKey, row: StateRow, present: Sequence[int]) -> None:
    """Whether records of a BEFORE range that Kafka deleted (retention) had landed. The range's first offset
    held a record when the range was recorded; when it is gone from Kafka and no row of the span before the
    first record still there is in the table, that span never landed: it is lost, and the run stops
    (`sourceOptions.failOnDataLoss: "false"` goes on, as Spark's source would)."""
    rng = row.state.range
    first = present[0] if present else rng.max + 1
    if first == rng.min:
        return
    gone = OffsetRange(rng.min, first - 1)
    landed = _landed(ctx, pk, row, gone)
    if landed is None:
        log.warning("%s: offsets %s of BEFORE range %s are no longer in Kafka; the table has no offset columns, so "
                    "whether they landed cannot be told (run `python -m sparkapp verify`)", pk, gone, rng)
    elif landed == 0:
        why = (f"{pk}: offsets {gone} of the unconfirmed range {rng} are neither in ClickHouse nor in Kafka any more "
               "(retention deleted them before they could be re-sent): they are lost")
        if ctx.fail_on_data_loss:
            raise DataLossError(why + '; set kafka.sourceOptions.failOnDataLoss: "false" to go on without them')
        log.error("%s; going on (failOnDataLoss is false)", why)
    else:
        log.info("%s: offsets %s of BEFORE range %s are gone from Kafka, but %d of their rows had landed", pk,
                 gone, rng, landed)


def _landed(ctx: WriterContext, pk: PartitionKey, row: StateRow, rng: OffsetRange) -> int | None:
    """Rows of the partition with offsets in rng in the table (on every shard the row's range went to); None
    when the table has no offset columns."""
    if ctx.shards is None:
        return ctx.inserter.landed(pk.topic, pk.partition, rng)
    counts = [ctx.shards.inserter(row.state.layout, s).landed(pk.topic, pk.partition, rng)
              for s in ctx.shards.shards_of(row.state.layout, row.shard)]
    return None if None in counts else sum(c or 0 for c in counts)


def _check_up(ctx: WriterContext, pk: PartitionKey, layout: int, shard: int) -> None:
    """Raises ShardUnavailableError, before any work, when a shard the range needs is known to be down."""
    if ctx.shards is not None:
        ctx.shards.layout(layout, str(pk))
        for s in ctx.shards.shards_of(layout, shard):
            ctx.shards.health.check(ctx.shards.name(layout, s))


def _begin(ctx: WriterContext, pk: PartitionKey, rng: OffsetRange, place: Placement,
           planned_from: StoredState | None) -> StoredState:
    """BEFORE over the range, only if the state is still the one the plan was made from."""
    ctx.fault("before_begin")
    ctx.store.begin(pk, rng, ctx.epoch, place.layout, place.shard, place.block_offsets, expected=planned_from)
    ctx.fault("after_begin")
    return StoredState(rng, Phase.BEFORE, ctx.epoch, place.layout)


def _commit(ctx: WriterContext, pk: PartitionKey, rng: OffsetRange, retry: bool, result: PartitionResult,
            place: Placement) -> StoredState:
    ctx.fault("after_insert")
    ctx.store.commit(pk, rng, ctx.epoch, place.layout, place.shard)
    ctx.fault("after_commit")
    result.committed = rng
    if retry:
        result.retried = rng
    return StoredState(rng, Phase.AFTER, ctx.epoch, place.layout)


def _deliver_decoded(ctx: WriterContext, pk: PartitionKey, rng: OffsetRange, retry: bool,
                     rows: Sequence[tuple[int, Sequence[Any]]], dead: Sequence[DeadLetter], result: PartitionResult,
                     place: Placement, since: int | None = None, until: int | None = None) -> None:
    """Dead letters, then decoded blocks, of `rng` (or of its offsets from `since` to `until`: whole windows)."""
    lo = rng.min if since is None else since
    hi = rng.max if until is None else until
    dead_in = [d for d in dead if lo <= d.message.offset <= hi]
    _dead_letter(ctx, pk, dead_in)
    result.dead_lettered += len(dead_in)
    blocks = build_blocks(rng, [r for r in rows if lo <= r[0] <= hi], ctx.inserter.schema.names,
                          place.block_offsets, lambda w: _token(pk, w, place.shard), place.shard)
    ctx.store.check_fence(pk, ctx.epoch)
    _send(ctx, pk, blocks, retry, result, place)


def _split(ctx: WriterContext, pk: PartitionKey, block: Block | LineBlock,
           place: Placement) -> list[tuple[int, Block | LineBlock]]:
    """The sub-blocks of one window, one per shard, each under its shard's token: one state transition
    covers them all, and a retry rebuilds the same sub-blocks from the layout the row recorded."""
    if ctx.shards is None or not ctx.shards.layouts[place.layout].per_row:
        return [(place.shard, block)]
    lay = ctx.shards.layouts[place.layout]
    keys = None
    if lay.needs_key:
        keys = block.data[block.columns.index(lay.key)] if isinstance(block, Block) else block.keys
        assert keys is not None, "a line block routed by key carries its keys"
    return split_block(block, lay.row_shards(block.offsets, keys), lambda s: _token(pk, block.window, s))


def _send(ctx: WriterContext, pk: PartitionKey, blocks: Sequence[Block | LineBlock], retry: bool,
          result: PartitionResult, place: Placement) -> None:
    """Sends each window's sub-blocks to their shards; a shard failing past its retries stalls the range."""
    for block in blocks:
        for shard, sub in _split(ctx, pk, block, place):
            inserter = ctx.inserter if ctx.shards is None else ctx.shards.inserter(place.layout, shard)
            label = "" if ctx.shards is None else ctx.shards.name(place.layout, shard)
            if ctx.shards is not None:
                ctx.shards.health.check(label)
            try:
                if retry:
                    sent = inserter.retry(sub, pk.topic, pk.partition)
                else:
                    sent = inserter.insert(sub, (pk.topic, pk.partition))
            except InsertError as e:
                if ctx.shards is None or not e.transient:
                    raise
                raise ctx.shards.health.failed(label, first_line(e.__cause__ or e)) from e
            if ctx.shards is not None:
                ctx.shards.health.ok(label)
            result.inserted_rows += sent
            result.inserts += 1
            ctx.fault("after_block")


def _dead_letter(ctx: WriterContext, pk: PartitionKey, dead: list[DeadLetter]) -> None:
    """Produces dead letters exactly once per range, however many sends the range takes.

    The first send of a range records the DLQ's end offsets (SENDING) before producing; any later
    send of the same range, in this attempt or a retry, reads back from that first mark and produces
    only what is not there yet; DONE follows each send.
    """
    if not dead:
        return
    dlq = require_dlq(ctx, pk, dead)
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
