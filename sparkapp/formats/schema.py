"""The target table's schema, with each column's converter and default (pure; edges/clickhouse.py reads it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .chtypes import CHType, Converter, converter, localize, parse_type, zero_value

METADATA_COLUMNS = ("_topic", "_partition", "_offset", "_timestamp", "_key", "_headers", "_timestamp_type")
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")  # a record's timestamp type, by Spark's number for it

# The types a metadata column whose value is not a plain scalar may have, and what else it could be given
_HEADER_TYPES = {"Map(String, String)", "Map(LowCardinality(String), String)"}


class SchemaError(RuntimeError):
    """The target table is missing or cannot be written by chsink."""


@dataclass(frozen=True)
class AtInsert:
    """A DEFAULT ClickHouse computes anew at each insert (now(), rand(), generateUUIDv4(), ...): what the row of a
    record without the field holds until its block is inserted, where ClickHouse computes the value (edges/insert),
    as it does for a JSON line without the field. Computed once when the sink read the table, it stamped every
    row of a run with one value."""

    expr: str


@dataclass(frozen=True)
class Column:
    name: str
    type: CHType
    default_kind: str = ""  # '', DEFAULT, MATERIALIZED, ALIAS, EPHEMERAL
    default: Any = None  # value used when a record lacks the field (AtInsert: computed by ClickHouse at insert)
    conv: Converter = field(default=lambda v: v, compare=False, repr=False)
    type_text: str = ""  # the type as ClickHouse spells it (what a client sends with an insert)


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


def build_schema(database: str, table: str, rows: list[tuple[str, str, str, Any]], zone: str = "UTC") -> TableSchema:
    """Builds the schema from (name, type, default_kind, constant default value or AtInsert) rows (pure); `zone`
    is the one ClickHouse reads naive date-times in where a column names none."""
    cols = []
    for name, type_text, kind, default in rows:
        if kind in ("MATERIALIZED", "ALIAS", "EPHEMERAL"):
            continue  # computed by ClickHouse, never inserted
        t = localize(parse_type(type_text), zone)
        _check_metadata(database, table, name, t)
        if t.name != "Dynamic" and _holds_dynamic(t):  # the insert sends a Dynamic column as a Variant: only whole
            raise SchemaError(f"column `{name}` of `{database}`.`{table}`: a Dynamic inside {t.name} cannot be "
                              "written with each value's type; make the column itself Dynamic, or a Variant")
        try:
            conv = converter(t)
        except ValueError as e:  # a type chsink cannot yet store exactly (the geo types, Time, ...)
            raise SchemaError(f"column `{name}` of `{database}`.`{table}`: {e}") from None
        value = zero_value(t) if kind == "" or default is None else \
            default if isinstance(default, AtInsert) else conv(default)
        cols.append(Column(name, t, kind, value, conv, type_text))
    if not cols:
        raise SchemaError(f"table `{database}`.`{table}` has no insertable columns")
    return TableSchema(database, table, tuple(cols))


def _holds_dynamic(t: CHType) -> bool:
    return t.name == "Dynamic" or any(_holds_dynamic(a) for a in t.args if isinstance(a, CHType))


def _check_metadata(database: str, table: str, name: str, t: CHType) -> None:
    """A metadata column whose type cannot hold what chsink puts in it is refused before anything is written
    (a record could not be stored, and it is no record's fault)."""
    where = f"column `{name}` of `{database}`.`{table}`"
    if name == "_headers" and str(t) not in _HEADER_TYPES:
        raise SchemaError(f"{where} holds the record's Kafka headers: its type must be Map(String, String), not {t}")
    if name == "_timestamp_type":
        base = t.args[0] if t.name == "LowCardinality" and isinstance(t.args[0], CHType) else t
        if base.name == "String":
            return
        names = {a[0] for a in base.args if isinstance(a, tuple)} if base.name in ("Enum8", "Enum16") else set()
        if not set(TIMESTAMP_TYPES) <= names:
            raise SchemaError(f"{where} holds the record's timestamp type: its type must be String or an Enum with "
                              f"{' and '.join(map(repr, TIMESTAMP_TYPES))}, not {t}")
