"""Mapping a decoded record onto the target table's columns (pure).

A record that cannot be mapped raises DecodeError with a precise reason; decode_batch turns it into a
DeadLetter carrying the record's coordinates, so it never disappears and never aborts the batch.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from typing import Any

from ..core.records import DeadLetter, Message
from .chtypes import ConversionError
from .schema import METADATA_COLUMNS, TIMESTAMP_TYPES, TableSchema

Decoder = Callable[[Message], list[Any]]  # message -> row in the table's column order, or DecodeError


class DecodeError(ValueError):
    """A record's payload cannot be decoded or does not fit the table."""


class NoRow(Exception):
    """A record that holds no row and is no mistake: nothing is stored, nothing dead-lettered."""


def nested_value(record: dict[str, Any], name: str) -> tuple[bool, Any]:
    """Finds `a.b` either as a flat key or as field b of each object in the array at `a` (Nested)."""
    if name in record:
        return True, record[name]
    head, _, tail = name.partition(".")
    if tail and isinstance(record.get(head), list):
        items = record[head]
        if all(isinstance(x, dict) for x in items):
            return True, [x.get(tail) for x in items]
    return False, None


def _metadata(msg: Message, name: str) -> Any:
    if name == "_topic":
        return msg.topic
    if name == "_partition":
        return msg.partition
    if name == "_offset":
        return msg.offset
    if name == "_timestamp":
        return dt.datetime.fromtimestamp(msg.timestamp_ms / 1000, tz=dt.UTC)
    if name == "_timestamp_type":
        return TIMESTAMP_TYPES[msg.timestamp_type == 1]
    if name == "_headers":
        return header_map(msg.headers)
    return None if msg.key is None else msg.key.decode("utf-8", errors="replace")


def header_map(headers: Iterable[tuple[str, bytes | None]]) -> dict[str, str]:
    """A record's headers as the `_headers` map: a name given more than once keeps its last value (as Kafka's
    `Headers.lastHeader` reads it), values as UTF-8 text (bytes that are not UTF-8 replaced by U+FFFD, as
    `_key`'s are), a null value as ''. Both paths build the map here."""
    return {k: (v or b"").decode("utf-8", errors="replace") for k, v in headers}


def record_to_row(schema: TableSchema, record: dict[str, Any], msg: Message, unknown: str = "ignore") -> list[Any]:
    """Maps a decoded record onto the table's columns; a missing field takes the column default."""
    row = []
    known = set()
    for col in schema.columns:
        if col.name in METADATA_COLUMNS:
            v = _metadata(msg, col.name)
            row.append(None if v is None and col.type.name == "Nullable" else col.conv(v if v is not None else ""))
            continue
        found, v = nested_value(record, col.name)
        if not found:
            row.append(col.default)
            continue
        known.add(col.name.partition(".")[0])
        known.add(col.name)
        try:
            row.append(col.conv(v))
        except ConversionError as e:
            raise DecodeError(f"column `{col.name}`: {e}") from None
    if unknown == "reject":
        extra = sorted(k for k in record if k not in known)
        if extra:
            raise DecodeError(f"unknown field(s) {', '.join(extra)} not in table {schema.fqn}")
    return row


def decode_batch(decode: Decoder, messages: Iterable[Message]) -> tuple[list[tuple[int, list[Any]]], list[DeadLetter]]:
    """Decodes messages in order into (offset, row) pairs and dead letters; a record that holds no row and is
    no mistake (NoRow: a change stream's tombstone) is in neither."""
    rows: list[tuple[int, list[Any]]] = []
    dead: list[DeadLetter] = []
    for msg in messages:
        try:
            rows.append((msg.offset, decode(msg)))
        except DecodeError as e:
            dead.append(DeadLetter(msg, f"{e} (at {msg.where})"))
        except NoRow:
            pass
    return rows, dead
