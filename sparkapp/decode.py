"""Decoding Kafka messages into rows of the target table's schema (pure, but for the registry fetch).

A message that cannot be decoded becomes a DeadLetter carrying its coordinates and a precise
reason; it never disappears and never aborts the batch.
"""

from __future__ import annotations

import datetime as dt
import enum
import io
import json
import struct
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .chtypes import ConversionError
from .schema import METADATA_COLUMNS, TableSchema


@dataclass(frozen=True)
class Message:
    """One Kafka record, as the Spark source or a consumer gives it."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = None
    timestamp_ms: int = 0
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def where(self) -> str:
        return f"{self.topic}/{self.partition}@{self.offset}"


@dataclass(frozen=True)
class DeadLetter:
    """An undecodable or undeliverable record and why."""

    message: Message
    reason: str


class Format(enum.Enum):
    JSON = "json"
    AVRO = "avro"
    STRING = "string"


class DecodeError(ValueError):
    """A record's payload cannot be decoded or does not fit the table."""


@dataclass
class DecoderSpec:
    format: Format = Format.JSON
    unknown_fields: str = "ignore"  # or "reject"
    avro_schema: str | None = None  # inline writer schema (JSON text)
    schema_registry_url: str | None = None  # Confluent wire format
    max_message_bytes: int = 8 << 20
    _registry_cache: dict[int, Any] = field(default_factory=dict, repr=False)


def _nested_value(record: dict[str, Any], name: str) -> tuple[bool, Any]:
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
    return None if msg.key is None else msg.key.decode("utf-8", errors="replace")


def record_to_row(schema: TableSchema, record: dict[str, Any], msg: Message, unknown: str = "ignore") -> list[Any]:
    """Maps a decoded record onto the table's columns; a missing field takes the column default."""
    row = []
    known = set()
    for col in schema.columns:
        if col.name in METADATA_COLUMNS:
            v = _metadata(msg, col.name)
            row.append(None if v is None and col.type.name == "Nullable" else col.conv(v if v is not None else ""))
            continue
        found, v = _nested_value(record, col.name)
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


def _json_record(value: bytes) -> dict[str, Any]:
    try:
        rec = json.loads(value)
    except UnicodeDecodeError as e:
        raise DecodeError(f"malformed JSON: not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise DecodeError(f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(rec, dict):
        raise DecodeError(f"JSON value is a {type(rec).__name__}, expected an object")
    return rec


def _avro_reader(spec: DecoderSpec) -> Callable[[bytes], dict[str, Any]]:
    import fastavro

    inline = fastavro.parse_schema(json.loads(spec.avro_schema)) if spec.avro_schema else None

    def read(value: bytes) -> dict[str, Any]:
        schema, payload = inline, value
        if spec.schema_registry_url:
            if len(value) < 5 or value[0] != 0:
                raise DecodeError("avro: not in Confluent wire format (magic byte 0 + 4-byte schema id)")
            (schema_id,) = struct.unpack(">I", value[1:5])
            schema, payload = _registry_schema(spec, schema_id), value[5:]
        if schema is None:
            raise DecodeError("avro: no writer schema configured (inline schema or schema registry URL)")
        buf = io.BytesIO(payload)
        try:
            rec = fastavro.schemaless_reader(buf, schema, None)
        except (EOFError, StopIteration, struct.error, IndexError) as e:
            raise DecodeError(f"avro: truncated record ({type(e).__name__}: {e or 'end of data'})") from None
        except Exception as e:
            raise DecodeError(f"avro: cannot decode record ({type(e).__name__}: {e})") from None
        if buf.tell() != len(payload):
            raise DecodeError(f"avro: {len(payload) - buf.tell()} trailing bytes after the record")
        if not isinstance(rec, dict):
            raise DecodeError("avro: top-level schema must be a record")
        return rec

    return read


def _registry_schema(spec: DecoderSpec, schema_id: int) -> Any:
    import fastavro

    if schema_id not in spec._registry_cache:
        url = f"{spec.schema_registry_url.rstrip('/')}/schemas/ids/{schema_id}"  # type: ignore[union-attr]
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                text = json.load(r)["schema"]
        except Exception as e:
            raise DecodeError(f"avro: schema id {schema_id} not found at {url}: {e}") from None
        spec._registry_cache[schema_id] = fastavro.parse_schema(json.loads(text))
    return spec._registry_cache[schema_id]


def make_decoder(spec: DecoderSpec, schema: TableSchema) -> Callable[[Message], list[Any]]:
    """Returns a function message -> row that raises DecodeError with the reason."""
    if spec.format is Format.STRING:
        data_cols = [c for c in schema.columns if c.name not in METADATA_COLUMNS]
        if len(data_cols) != 1 or data_cols[0].type.name not in ("String", "LowCardinality", "Nullable"):
            raise ValueError(f"format 'string' needs exactly one String data column in {schema.fqn}")
        target = data_cols[0].name

        def from_string(msg: Message) -> dict[str, Any]:
            assert msg.value is not None
            return {target: msg.value.decode("utf-8", errors="surrogateescape")}

        parse: Callable[[Message], dict[str, Any]] = from_string
    elif spec.format is Format.AVRO:
        reader = _avro_reader(spec)
        parse = lambda msg: reader(msg.value)  # type: ignore[arg-type]  # noqa: E731
    else:
        parse = lambda msg: _json_record(msg.value)  # type: ignore[arg-type]  # noqa: E731

    def decode(msg: Message) -> list[Any]:
        if msg.value is None:
            raise DecodeError("tombstone: the record has a null value")
        if len(msg.value) > spec.max_message_bytes:
            raise DecodeError(f"oversized: {len(msg.value)} bytes exceeds max_message_bytes={spec.max_message_bytes}")
        return record_to_row(schema, parse(msg), msg, spec.unknown_fields)

    return decode


def decode_batch(
    decode: Callable[[Message], list[Any]], messages: Iterable[Message]
) -> tuple[list[tuple[int, list[Any]]], list[DeadLetter]]:
    """Decodes messages in order into (offset, row) pairs and dead letters."""
    rows: list[tuple[int, list[Any]]] = []
    dead: list[DeadLetter] = []
    for msg in messages:
        try:
            rows.append((msg.offset, decode(msg)))
        except DecodeError as e:
            dead.append(DeadLetter(msg, f"{e} (at {msg.where})"))
    return rows, dead


def offsets_of(messages: Sequence[Message]) -> list[int]:
    return [m.offset for m in messages]
