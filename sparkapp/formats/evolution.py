"""Schema evolution, pure: the columns a batch's records need that the table lacks, and their types.

A new top-level field becomes a Nullable column (rows written before it read NULL), typed by its values
in the batch that first brings it: booleans Bool, integers Int64, numbers with a fraction (or integers
beside them) Float64, text String. A value of another kind later is the decoder's to judge, as for any
column: it is dead-lettered with the column's reason, never coerced. A field that is only null so far waits
for a value; an object or array is not added (its shape is not known from one value): give it a column
yourself. A field whose name a table cannot hold as a plain column (a dot: Nested) is left alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .schema import METADATA_COLUMNS, TableSchema

_INT64 = (-(2**63), 2**63 - 1)


def _kind(v: Any) -> str | None:
    """The type a value asks for; None when it asks for none (null, object, array, out of Int64 range)."""
    if isinstance(v, bool):
        return "Bool"
    if isinstance(v, int):
        return "Int64" if _INT64[0] <= v <= _INT64[1] else None
    if isinstance(v, float):
        return "Float64"
    if isinstance(v, str):
        return "String"
    return None


def _widened(a: str | None, b: str | None) -> str | None:
    if a is None or a == b:
        return b if a is None else a
    if {a, b} == {"Int64", "Float64"}:
        return "Float64"
    return a  # the first kind stays; the decoder dead-letters what does not fit it


def new_columns(schema: TableSchema, records: Iterable[dict[str, Any]], known: Iterable[str] = ()) -> dict[str, str]:
    """field -> `Nullable(type)` for each field of the records that no column takes (nor `known`: columns the
    schema leaves out, such as MATERIALIZED ones, and fields tried already), in the order they first appear."""
    taken = {*schema.names, *(n.partition(".")[0] for n in schema.names), *METADATA_COLUMNS, *known}
    kinds: dict[str, str | None] = {}
    for rec in records:
        for name, v in rec.items():
            if name in taken or "." in name or not name:
                continue
            kinds[name] = _widened(kinds.get(name), _kind(v))
    return {name: f"Nullable({kind})" for name, kind in kinds.items() if kind is not None}
