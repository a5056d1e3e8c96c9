"""String records: the whole value, as text, into the table's one String data column."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .schema import METADATA_COLUMNS, TableSchema


def string_reader(schema: TableSchema) -> Callable[[bytes], dict[str, Any]]:
    data_cols = [c for c in schema.columns if c.name not in METADATA_COLUMNS]
    if len(data_cols) != 1 or data_cols[0].type.name not in ("String", "LowCardinality", "Nullable"):
        raise ValueError(f"format 'string' needs exactly one String data column in {schema.fqn}")
    target = data_cols[0].name
    return lambda value: {target: value.decode("utf-8", errors="surrogateescape")}
