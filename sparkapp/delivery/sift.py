"""A range of JSON lines on the fast path, its bad records sifted out one by one.

A window's block holds exactly the rows the decoder accepts, on every path, so that a retry on any path
sends the same block under the same token. On a clean window ClickHouse's parser and the decoder agree
(the fast path's invariant, tested differentially). The lines the Guard flags, in all of a range's windows,
are decoded alone before anything is sent (`sift_range`), so the range's dead letters go out in one send:
the ones the decoder dead-letters leave their blocks and their neighbours stay on the fast path; a suspect
line it keeps (a false alarm, a disagreement) sends its window through the decoder. A line ClickHouse
refuses all the same is found after the refusal (`send_window`). Dirty data then costs the decoder its bad
records, not a Python decode of every record.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.records import DeadLetter, Message
from ..core.state_machine import OffsetRange
from ..edges.errors import first_line
from ..edges.insert import InsertError
from ..formats.jsoneachrow import Guard, null_indexes
from ..formats.rows import Decoder, decode_batch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sifted:
    """One window after sifting: the lines left to send, or `decoder`: the whole window takes the decoder."""

    window: OffsetRange
    offsets: tuple[int, ...]
    lines: Any
    decoder: bool = False


def sift_range(windows: Sequence[tuple[OffsetRange, tuple[int, ...], Any]], guard: Guard, *, decode: Decoder,
               take: Callable[[Sequence[int]], list[Message]]) -> tuple[list[Sifted], list[DeadLetter]]:
    """The range's windows without their records that have no line (null: dead-lettered up front) and without
    the lines the decoder dead-letters among those the Guard flags (suspect or likely refused), and those dead
    letters: one decode of every flagged line of the range, before anything is sent. A window whose suspect
    line the decoder keeps takes the decoder whole. A window loses all of them at once, its lines not copied."""
    hits = [guard.hits(lines) for _, _, lines in windows]
    picked = [offsets[i] for (_, offsets, _), (suspect, refusing) in zip(windows, hits, strict=True)
              for i in (*suspect, *refusing)]
    rows, dead = decode_batch(decode, take(picked)) if picked else ([], [])
    kept, gone = {r[0] for r in rows}, {d.message.offset for d in dead}
    out = []
    for (w, offsets, lines), (suspect, refusing) in zip(windows, hits, strict=True):
        if any(offsets[i] in kept for i in suspect):
            out.append(Sifted(w, offsets, lines, decoder=True))
            continue
        drop = [*null_indexes(lines), *(i for i in (*suspect, *refusing) if offsets[i] in gone)]
        if drop:
            offsets, lines = without(offsets, lines, drop)
        if offsets:
            out.append(Sifted(w, offsets, lines))
    return out, list(dead)


def without(offsets: tuple[int, ...], lines: Any, drop: Sequence[int]) -> tuple[tuple[int, ...], Any]:
    """A window's offsets and lines without those at the indexes `drop`, in their order. The lines kept are not
    copied: a piece of the window's lines per run between dropped ones (a ChunkedArray of slices), sent one after
    the other. A copy cost 0.2-0.3 µs per row of such a window, most of it in writing fresh memory. (One mask: a set
    difference of index arrays would sort them, and converting the offsets to an array and back costs more than
    the rest on a window of clean lines.)"""
    import numpy as np
    import pyarrow as pa

    keep = np.ones(len(offsets), dtype=np.bool_)
    keep[np.asarray(drop, dtype=np.int64)] = False
    # where runs of kept lines start and stop, in turn
    edges = np.flatnonzero(np.diff(keep.astype(np.int8), prepend=np.int8(0), append=np.int8(0))).tolist()
    kept: list[Any] = []
    for a, b in zip(edges[::2], edges[1::2], strict=True):
        piece = lines.slice(a, b - a)
        kept.extend(piece.chunks if isinstance(piece, pa.ChunkedArray) else [piece])
    return tuple(itertools.compress(offsets, keep.tolist())), pa.chunked_array(kept, lines.type)


def send_window(offsets: tuple[int, ...], lines: Any, *, decode: Decoder,
                take: Callable[[Sequence[int]], list[Message]], refused: Callable[[Any], list[int]],
                send: Callable[[tuple[int, ...], Any], None],
                dead_letter: Callable[[list[DeadLetter]], None]) -> bool:
    """Sends a sifted window's lines; when ClickHouse refuses it, the lines it refuses go to `dead_letter` and
    the rest is sent. False when the whole window must take the decoder instead (nothing of it was sent,
    though some may have been dead-lettered). A transient failure of `send` is raised: the window is tried
    again as it is."""
    flagged: list[int] = []
    for attempt in range(2):
        if flagged:
            picked = [offsets[i] for i in flagged]
            rows, dead = decode_batch(decode, take(picked))
            if rows or len(dead) != len(picked):
                return False
            dead_letter(dead)
            offsets, lines = without(offsets, lines, flagged)
        if not offsets:
            return True
        try:
            send(offsets, lines)
            return True
        except InsertError as e:
            if e.transient:
                raise
            log.info("ClickHouse refused a window (%s); finding its bad lines", first_line(e.__cause__ or e))
            flagged = refused(lines) if attempt == 0 else []
            if not flagged:
                return False
    return False
