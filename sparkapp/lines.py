"""The fast path for JSON: ClickHouse parses the records itself (JSONEachRow), Python never touches a row.

The JVM turns each Kafka record whose value is a JSON object into one JSONEachRow line with the
table's metadata columns (`_topic`, `_partition`, `_offset`, `_timestamp`, `_key`) spliced in, and
the driver or executor hands contiguous slices of that Arrow string column to ClickHouse as INSERT
payloads, zero-copy. Windows and tokens are the same as on the decoding path, so the exactly-once
protocol does not change. A window that ClickHouse rejects (a record it cannot parse or fit) falls
back, deterministically, to the Python decoder, which names each bad record and dead-letters it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .decode import Message
from .schema import METADATA_COLUMNS, TableSchema
from .state_machine import OffsetRange


def line_sql(schema_columns: Sequence[str], max_bytes: int) -> str:
    """Spark SQL for one JSONEachRow line per record (NULL when the value is not a JSON object).

    Metadata goes first: topic names need no JSON escaping (Kafka allows [a-zA-Z0-9._-] only), the key
    is escaped by `to_json`, and a null key is left out so that the column takes its default (NULL, or
    '' when not Nullable, as the decoder does); the record's own fields follow. Needs
    spark.sql.session.timeZone=UTC. Kept cheap: it runs for every record.
    """
    v = "trim(BOTH ' \\t\\r\\n' FROM cast(value AS string))"
    obj = f"length(value) <= {int(max_bytes)} AND {v} LIKE '{{%}}'"
    parts = []  # each with its leading comma
    for c in METADATA_COLUMNS:
        if c not in schema_columns:
            continue
        if c == "_topic":
            parts.append("',\"_topic\":\"', topic, '\"'")
        elif c in ("_partition", "_offset"):
            parts.append(f"',\"{c}\":', {c[1:]}")
        elif c == "_timestamp":
            parts.append("',\"_timestamp\":\"', date_format(timestamp, \"yyyy-MM-dd'T'HH:mm:ss.SSS'Z'\"), '\"'")
        else:  # `{"_key":"..."}` -> `,"_key":"..."`
            parts.append("CASE WHEN key IS NULL THEN '' ELSE concat(',', substr(to_json(named_struct('_key', "
                         "cast(key AS string))), 2, length(to_json(named_struct('_key', cast(key AS string)))) - 2)) "
                         "END")
    if not parts:
        return f"CASE WHEN {obj} THEN concat({v}, '\\n') END"
    meta = f"concat({', '.join(parts)})"
    empty = f"{v} RLIKE '^\\\\{{\\\\s*\\\\}}$'"
    rest = f"CASE WHEN {empty} THEN '}}' ELSE concat(',', substr({v}, 2)) END"
    return (f"CASE WHEN NOT ({obj}) THEN NULL WHEN {meta} = '' THEN concat({v}, '\\n') "
            f"ELSE concat('{{', substr({meta}, 2), {rest}, '\\n') END")


def eligible(schema: TableSchema, fmt: str, routed: bool) -> bool:
    """JSON into one table per topic, without Nested-flattened (`a.b`) columns."""
    return fmt == "json" and not routed and not any("." in c for c in schema.names)


def payload(lines: Any) -> bytes:
    """The concatenated bytes of an Arrow string array slice (no nulls), copied once."""
    import numpy as np
    import pyarrow as pa

    if len(lines) == 0:
        return b""
    if lines.null_count:
        raise ValueError("payload of a slice holding non-object records")
    large = pa.types.is_large_string(lines.type) or pa.types.is_large_binary(lines.type)
    offs = np.frombuffer(lines.buffers()[1], dtype=np.int64 if large else np.int32)
    lo, hi = int(offs[lines.offset]), int(offs[lines.offset + len(lines)])
    return bytes(memoryview(lines.buffers()[2])[lo:hi])


def window_slices(offsets: Any, windows: Sequence[OffsetRange]) -> list[tuple[OffsetRange, int, int]]:
    """(window, i, j): the rows [i, j) of sorted `offsets` inside each window that holds any."""
    import numpy as np

    arr = np.asarray(offsets)
    out = []
    for w in windows:
        i, j = int(np.searchsorted(arr, w.min, "left")), int(np.searchsorted(arr, w.max, "right"))
        if j > i:
            out.append((w, i, j))
    return out


@dataclass
class LineBatch:
    """One partition's batch on the fast path: sorted offsets, their lines, and messages on demand.

    Values travel from the JVM only for records without a line (`odd`); `messages` may re-read the
    batch from Kafka when the decoding path needs all of them.
    """

    offsets: list[int]
    lines: Any  # pyarrow string array aligned with offsets; null where the value is not a JSON object
    messages: Callable[[], list[Message]]
    odd: Callable[[], list[Message]]  # the records without a line, values included

    @property
    def complete(self) -> bool:
        return int(self.lines.null_count) == 0

    def windows(self, rng: OffsetRange, block_offsets: int) -> list[tuple[OffsetRange, tuple[int, ...], Any]]:
        """(window, offsets, lines) of the range's windows that hold lines; records without one left out."""
        import numpy as np
        import pyarrow.compute as pc

        from .blocks import cut_windows

        out = []
        for w, i, j in window_slices(self.offsets, cut_windows(rng, block_offsets)):
            lines = self.lines.slice(i, j - i)
            offsets = self.offsets[i:j]
            if lines.null_count:
                keep = pc.is_valid(lines)
                lines = lines.filter(keep)
                offsets = list(np.asarray(offsets)[keep.to_numpy(zero_copy_only=False)])
            if len(lines):
                out.append((w, tuple(int(o) for o in offsets), lines))
        return out
