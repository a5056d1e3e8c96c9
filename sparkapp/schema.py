"""The target table's schema, read from system.columns, with each column's converter and default."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .chtypes import CHType, Converter, converter, parse_type, zero_value

METADATA_COLUMNS = ("_topic", "_partition", "_offset", "_timestamp", "_key")


class SchemaError(RuntimeError):
    """The target table is missing or cannot be written by chsink."""


@dataclass(frozen=True)
class Column:
    name: str
    type: CHType
    default_kind: str = ""  # '', DEFAULT, MATERIALIZED, ALIAS, EPHEMERAL
    default: Any = None  # value used when a record lacks the field
    conv: Converter = field(default=lambda v: v, compare=False, repr=False)


@dataclass(frozen=True)
class TableSchema:
    database: str
    table: str
    columns: tuple[Column, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def fqn(self) -> str:
        return f"`{self.database}`.`{self.table}`"

    @property
    def has_offset_columns(self) -> bool:
        return {"_topic", "_partition", "_offset"} <= set(self.names)


def build_schema(database: str, table: str, rows: list[tuple[str, str, str, Any]]) -> TableSchema:
    """Builds the schema from (name, type, default_kind, constant default value) rows (pure)."""
    cols = []
    for name, type_text, kind, default in rows:
        if kind in ("MATERIALIZED", "ALIAS", "EPHEMERAL"):
            continue  # computed by ClickHouse, never inserted
        t = parse_type(type_text)
        conv = converter(t)
        value = zero_value(t) if kind == "" else conv(default) if default is not None else zero_value(t)
        cols.append(Column(name, t, kind, value, conv))
    if not cols:
        raise SchemaError(f"table `{database}`.`{table}` has no insertable columns")
    return TableSchema(database, table, tuple(cols))


def load_schema(client: Any, database: str, table: str) -> TableSchema:
    """Reads the table's columns; constant DEFAULT expressions are evaluated once by ClickHouse."""
    res = client.query(
        "SELECT name, type, default_kind, default_expression FROM system.columns "
        "WHERE database = {db:String} AND table = {t:String} ORDER BY position",
        parameters={"db": database, "t": table},
    )
    if not res.result_rows:
        raise SchemaError(
            f"target table `{database}`.`{table}` does not exist (or has no columns); "
            "create it before starting the sink"
        )
    rows = []
    for name, type_text, kind, expr in res.result_rows:
        default = None
        if kind == "DEFAULT" and expr:
            try:
                default = client.query(f"SELECT {expr}").result_rows[0][0]
            except Exception as e:  # references other columns: fall back to the type's zero value
                raise SchemaError(
                    f"column `{name}` of `{database}`.`{table}` has a DEFAULT that depends on other "
                    f"columns ({expr}); chsink needs constant defaults"
                ) from e
            default = _normalize_default(default)
        rows.append((name, type_text, kind, default))
    return build_schema(database, table, rows)


def _normalize_default(v: Any) -> Any:
    """Values read back from ClickHouse (datetime, date, Decimal...) pass through the converters as is."""
    return v
