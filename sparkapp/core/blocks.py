"""Deterministic blocks and their deduplication tokens (pure).

A range is cut into offset windows of `block_offsets` offsets counted from the range start, so the
same range always yields the same windows, whatever messages compaction left in it. Each window is
one INSERT with its own `insert_deduplication_token`; a retry re-sends the identical windows.

Token format (version 1), documented in docs/exactly-once.md and pinned by tests:

    chsink1|<sink>|<topic>|<partition>|<table>|<shard>|<first>-<last>

where `<first>-<last>` are the window's bounds (not the offsets present), `<table>` is the target
table (multi-table topics keep one state per table) and `<shard>` the shard index the window is
sent to (0 when unsharded). `|` in a sink, topic or table name is escaped as `%7C`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .state_machine import OffsetRange

TOKEN_VERSION = "chsink1"


def _esc(part: str) -> str:
    return part.replace("%", "%25").replace("|", "%7C")


def dedup_token(sink: str, topic: str, partition: int, window: OffsetRange, table: str = "", shard: int = 0) -> str:
    """The insert_deduplication_token of one window. Stable across versions of chsink 1.x."""
    return "|".join(
        (TOKEN_VERSION, _esc(sink), _esc(topic), str(partition), _esc(table), str(shard), f"{window.min}-{window.max}")
    )


def cut_windows(rng: OffsetRange, block_offsets: int) -> list[OffsetRange]:
    """Cuts a range into windows of `block_offsets` offsets, counted from the range start."""
    if block_offsets <= 0:
        raise ValueError("block_offsets must be positive")
    return [
        OffsetRange(start, min(start + block_offsets - 1, rng.max))
        for start in range(rng.min, rng.max + 1, block_offsets)
    ]


@dataclass(frozen=True)
class Block:
    """One INSERT: rows of one window, column-oriented, in offset order."""

    window: OffsetRange
    token: str
    columns: tuple[str, ...]
    data: tuple[list[Any], ...]
    offsets: tuple[int, ...]
    shard: int = 0

    @property
    def rows(self) -> int:
        return len(self.offsets)


@dataclass(frozen=True)
class LineBlock:
    """One INSERT on the fast path: a window's JSONEachRow lines, parsed by ClickHouse itself."""

    window: OffsetRange
    token: str
    offsets: tuple[int, ...]
    lines: Any  # an Arrow string array, or a ChunkedArray of pieces of one (a window without its bad lines)
    shard: int = 0
    # each row's routing key, as the decoder reads it (policy key): a numpy array, or any sequence; derived from
    # the lines, so not compared
    keys: Any = field(default=None, compare=False)

    @property
    def rows(self) -> int:
        return len(self.offsets)

    @property
    def payload(self) -> tuple[memoryview, ...]:
        """The insert's body: views of the lines' own bytes, never copied, one per piece."""
        return pieces(self.lines)


def build_blocks(
    rng: OffsetRange,
    rows: Sequence[tuple[int, Sequence[Any]]],
    columns: Sequence[str],
    block_offsets: int,
    token_of: Callable[[OffsetRange], str],
    shard: int = 0,
) -> list[Block]:
    """Groups decoded rows (offset, values) of `rng` into deterministic blocks.

    `rows` must be in offset order and lie within `rng`; windows with no rows produce no block,
    and a retry of the same range produces byte-identical blocks with identical tokens.
    """
    blocks: list[Block] = []
    it = iter(rows)
    pending = next(it, None)
    for window in cut_windows(rng, block_offsets):
        offs: list[int] = []
        cols: list[list[Any]] = [[] for _ in columns]
        while pending is not None and pending[0] <= window.max:
            off, values = pending
            if off < window.min:
                raise ValueError(f"row at offset {off} is outside range {rng} or out of order")
            offs.append(off)
            for col, v in zip(cols, values, strict=True):
                col.append(v)
            pending = next(it, None)
        if offs:
            blocks.append(Block(window, token_of(window), tuple(columns), tuple(cols), tuple(offs), shard))
    if pending is not None:
        raise ValueError(f"row at offset {pending[0]} is outside range {rng}")
    return blocks


def split_block(block: Block | LineBlock, shards: Sequence[int],
                token_of: Callable[[int], str]) -> list[tuple[int, Block | LineBlock]]:
    """Cuts one window's block into a sub-block per shard (`shards`: each row's shard), rows in order.

    Each sub-block carries its shard's token, so a retry re-sends the same sub-block to the same shard
    under the same token; a block wholly on one shard is not copied.
    """
    import numpy as np

    of = np.asarray(shards, dtype=np.int64)
    present = np.unique(of).tolist()
    if len(present) == 1:
        (s,) = present
        return [(s, replace(block, token=token_of(s), shard=s))]
    every = np.asarray(block.offsets, dtype=np.int64)
    out: list[tuple[int, Block | LineBlock]] = []
    for s in present:  # in shard order, each shard's rows in row order (one vectorized pick per shard)
        picked = np.flatnonzero(of == s)
        offsets = tuple(every[picked].tolist())
        if isinstance(block, LineBlock):
            lines = block.lines.take(picked)
            keys = None if block.keys is None else pick(block.keys, picked)
            out.append((s, replace(block, token=token_of(s), offsets=offsets, lines=lines, shard=s, keys=keys)))
        else:
            idx: list[int] = picked.tolist()
            data = tuple([col[i] for i in idx] for col in block.data)
            out.append((s, replace(block, token=token_of(s), data=data, offsets=offsets, shard=s)))
    return out


def pick(values: Any, at: Any) -> Any:
    """The values at the indexes `at` (a numpy array): one vectorized pick of a numpy array, else a tuple."""
    import numpy as np

    return values[at] if isinstance(values, np.ndarray) else tuple(values[i] for i in at.tolist())


def pieces(lines: Any) -> tuple[memoryview, ...]:
    """The bytes of Arrow string lines (no nulls) as views, without copying them: one for an array's slice, one per
    non-empty piece of a ChunkedArray."""
    import pyarrow as pa

    chunks = lines.chunks if isinstance(lines, pa.ChunkedArray) else [lines]
    return tuple(v for v in map(payload, chunks) if len(v))


def whole(lines: Any) -> Any:
    """The lines as one Arrow array, for what reads them as one buffer: pieces are joined (a copy)."""
    import pyarrow as pa

    return lines.combine_chunks() if isinstance(lines, pa.ChunkedArray) else lines


def payload(lines: Any) -> memoryview:
    """The concatenated bytes of an Arrow string array slice (no nulls), without copying them."""
    if len(lines) == 0:
        return memoryview(b"")
    if lines.null_count:
        raise ValueError("payload of a slice holding non-object records")
    offs = _offsets(lines)
    lo, hi = int(offs[lines.offset]), int(offs[lines.offset + len(lines)])
    return memoryview(lines.buffers()[2])[lo:hi]


def line_bounds(lines: Any) -> Any:
    """Where each line of an Arrow string array slice begins in its payload, and where the last ends (numpy,
    len(lines) + 1 values)."""
    offs = _offsets(lines)[lines.offset:lines.offset + len(lines) + 1]
    return offs - offs[0]


def _offsets(lines: Any) -> Any:
    import numpy as np
    import pyarrow as pa

    large = pa.types.is_large_string(lines.type) or pa.types.is_large_binary(lines.type)
    return np.frombuffer(lines.buffers()[1], dtype=np.int64 if large else np.int32)
