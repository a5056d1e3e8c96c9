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

_META_SQL = {
    "_topic": "topic",
    "_partition": "partition",
    "_offset": "offset",
    "_timestamp": "date_format(timestamp, \"yyyy-MM-dd'T'HH:mm:ss.SSS'Z'\")",
    "_key": "cast(key AS string)",
}


def line_sql(schema_columns: Sequence[str], max_bytes: int) -> str:
    """Spark SQL for one JSONEachRow line per record (NULL when the value is not a JSON object).

    Metadata goes first, as JSON built by `to_json` (escaped; a null key is omitted, so the column
    takes its default); the record's own fields follow. Needs spark.sql.session.timeZone=UTC.
    """
    meta = [c for c in METADATA_COLUMNS if c in schema_columns]
    v = "trim(BOTH ' \\t\\r\\n' FROM cast(value AS string))"
    obj = f"length(value) <= {int(max_bytes)} AND {v} LIKE '{{%}}'"
    if not meta:
        return f"CASE WHEN {obj} THEN concat({v}, '\\n') END"
    struct = ", ".join(f"'{c}', {_META_SQL[c]}" for c in meta)
    head = f"substr(to_json(named_struct({struct})), 1, length(to_json(named_struct({struct}))) - 1)"
    empty = f"{v} RLIKE '^\\\\{{\\\\s*\\\\}}$'"
    return (f"CASE WHEN {obj} THEN concat({head}, CASE WHEN {empty} THEN '}}' "
            f"ELSE concat(',', substr({v}, 2)) END, '\\n') END")


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
    """One partition's batch on the fast path: sorted offsets, their lines, and the messages on demand."""

    offsets: list[int]
    lines: Any  # pyarrow string array aligned with offsets; null where the value is not a JSON object
    messages: Callable[[], list[Message]]

    @property
    def complete(self) -> bool:
        return int(self.lines.null_count) == 0
