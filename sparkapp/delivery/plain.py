"""At-least-once delivery, the benchmark's baseline: the same decoding and blocks as writer.py, but no
state transitions, no tokens and no recovery. It exists to measure what exactly-once costs; a config
selects it with `state.enabled: false`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.blocks import LineBlock, build_blocks
from ..core.records import DeadLetter, Message
from ..core.state_machine import Case, OffsetRange
from ..edges.insert import InsertError
from ..edges.store import PartitionKey
from ..formats.jsoneachrow import LineBatch, guard
from ..formats.rows import decode_batch
from .context import PartitionResult, WriterContext, ordered, require_dlq
from .sift import Sifted, send_window, sift_range


def _send_dead(ctx: WriterContext, pk: PartitionKey, dead: list[DeadLetter]) -> None:
    if dead:
        require_dlq(ctx, pk, dead).send(pk.sink, dead)


def write_plain(ctx: WriterContext, pk: PartitionKey, msgs: list[Message]) -> PartitionResult:
    """Decoded records, inserted without tokens; dead letters sent as they come."""
    result = PartitionResult(pk, Case.NEW)
    if not msgs:
        return result
    rows, dead = decode_batch(ctx.decode, msgs)
    _send_dead(ctx, pk, list(dead))
    result.dead_lettered = len(dead)
    rng = OffsetRange(msgs[0].offset, msgs[-1].offset)
    for block in build_blocks(rng, rows, ctx.inserter.schema.names, ctx.block_offsets, lambda w: ""):
        ctx.inserter.insert(block)
        result.inserted_rows += block.rows
    return result


def write_plain_lines(ctx: WriterContext, pk: PartitionKey, batch: LineBatch,
                      known_dead: Sequence[DeadLetter] = ()) -> PartitionResult:
    """JSON lines parsed by ClickHouse, the bad records sifted out as exactly-once does (its baseline does the
    same work); a window that needs the decoder is decoded in Python."""
    result = PartitionResult(pk, Case.NEW)
    rng = OffsetRange(batch.offsets[0], batch.offsets[-1])
    windows, dead = sift_range(batch.windows(rng, ctx.block_offsets), guard(ctx.inserter.schema),
                               decode=ctx.decode, take=batch.take)
    _send_dead(ctx, pk, [*known_dead, *dead])
    result.dead_lettered = len(known_dead) + len(dead)
    sent = {d.message.offset for d in (*known_dead, *dead)}
    for sw in windows:
        if sw.decoder or not _lines_window(ctx, pk, batch, sw, sent, result):
            window = [m for m in ordered(batch.messages()) if m.offset in sw.window and m.offset not in sent]
            rest = write_plain(ctx, pk, window)
            result.inserted_rows += rest.inserted_rows
            result.dead_lettered += rest.dead_lettered
    return result


def _lines_window(ctx: WriterContext, pk: PartitionKey, batch: LineBatch, sw: Sifted, sent: set[int],
                  result: PartitionResult) -> bool:
    """One sifted window: sent, the lines ClickHouse refuses all the same sifted out; False: decode it."""
    def send(offs: tuple[int, ...], ls: Any) -> None:
        ctx.inserter.insert(LineBlock(sw.window, "", offs, ls))
        result.inserted_rows += len(offs)

    def dead_letter(dead: list[DeadLetter]) -> None:
        _send_dead(ctx, pk, dead)
        result.dead_lettered += len(dead)
        sent.update(d.message.offset for d in dead)

    try:
        return send_window(sw.offsets, sw.lines, decode=ctx.decode, take=batch.take,
                           refused=ctx.inserter.refused, send=send, dead_letter=dead_letter)
    except InsertError:
        return False
