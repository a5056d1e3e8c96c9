"""The one registry of record formats: the names config and CRD accept, and each one's reader.

A new format is a module with a reader (bytes -> record dict, DecodeError on bad input) plus one
entry in `_READERS`; config, the CRD enum (checked by a test) and the decoder follow from here.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.records import Message
from .avro import avro_reader
from .debezium import Skip, change_row
from .json import read_json
from .protobuf import numeric_columns, protobuf_reader
from .record_key import KeyFormat, key_reader
from .rows import DecodeError, Decoder, record_to_row
from .schema import TableSchema
from .string import string_reader


class Format(enum.Enum):
    JSON = "json"
    AVRO = "avro"
    STRING = "string"
    PROTOBUF = "protobuf"


@dataclass(frozen=True)
class DecoderSpec:
    format: Format = Format.JSON
    unknown_fields: str = "ignore"  # or "reject"
    avro_schema: str | None = None  # inline writer schema (JSON text)
    schema_registry_url: str | None = None  # Confluent wire format
    max_message_bytes: int = 8 << 20
    envelope: str = "none"  # "debezium": each value is a change event (debezium.py); "upsert": see below
    key_format: KeyFormat = KeyFormat.NONE  # the key's fields fill columns (record_key.py)
    key_avro_schema: str | None = None
    protobuf_descriptor_set: str | None = None  # base64 FileDescriptorSet
    protobuf_message: str | None = None  # the message type every plain value is (full name)

    @property
    def tombstones_hold_no_row(self) -> bool:
        """A change stream's tombstone only lets Kafka compact the deleted key away: no row, no dead letter."""
        return self.envelope == "debezium"


ValueReader = Callable[[bytes], dict[str, Any]]
Reader = Callable[[Message], dict[str, Any]]  # message -> the record's fields; DecodeError, or NoRow
_READERS: dict[Format, Callable[[DecoderSpec, TableSchema], ValueReader]] = {
    Format.JSON: lambda spec, schema: read_json,
    Format.AVRO: lambda spec, schema: avro_reader(spec.avro_schema, spec.schema_registry_url),
    Format.STRING: lambda spec, schema: string_reader(schema),
    Format.PROTOBUF: lambda spec, schema: protobuf_reader(
        spec.protobuf_descriptor_set, spec.protobuf_message, spec.schema_registry_url,
        numeric_columns({c.name: str(c.type) for c in schema.columns})),
}
NAMES = tuple(f.value for f in Format)


def _value_reader(spec: DecoderSpec, schema: TableSchema) -> ValueReader:
    read = _READERS[spec.format](spec, schema)
    return (lambda value: change_row(read(value))) if spec.envelope == "debezium" else read


def record_reader(spec: DecoderSpec, schema: TableSchema) -> Reader:
    """message -> the record's fields: its value decoded (a change event's row under envelope debezium), with
    the key's fields over them (key_format). Under envelope upsert a value is the key's new row (`_deleted` 0)
    and a tombstone its delete: the key's fields alone with `_deleted` 1, so a ReplacingMergeTree(version,
    _deleted) table keeps each key's last state as the compacted topic does. DecodeError names what is wrong;
    NoRow (a change stream's tombstone) holds no row."""
    read = _value_reader(spec, schema)
    key = key_reader(spec.key_format, spec.key_avro_schema, spec.schema_registry_url)
    upsert = spec.envelope == "upsert"
    if upsert and "_deleted" not in schema.names:
        raise ValueError(f"envelope upsert needs a `_deleted` column in {schema.fqn}: a tombstone's row must say "
                         "that it deletes")

    def fields(msg: Message) -> dict[str, Any]:
        if msg.value is None:
            if spec.tombstones_hold_no_row:
                raise Skip("tombstone")
            if not upsert:
                raise DecodeError("tombstone: the record has a null value")
            if msg.key is None:
                raise DecodeError("upsert tombstone without a key: it names no row to delete")
            rec: dict[str, Any] = {"_op": "d", "_deleted": 1}
        else:
            if len(msg.value) > spec.max_message_bytes:
                raise DecodeError(f"oversized: {len(msg.value)} bytes exceeds max_message_bytes="
                                  f"{spec.max_message_bytes}")
            rec = read(msg.value)
            if upsert:
                rec = {**rec, "_op": "u", "_deleted": 0}
        return {**rec, **key(msg.key)} if key is not None else rec

    return fields


def make_decoder(spec: DecoderSpec, schema: TableSchema, read: Reader | None = None) -> Decoder:
    """Returns a function message -> row that raises DecodeError with the reason (NoRow: none to store); `read`:
    the table's record_reader when the caller keeps it too."""
    fields = read or record_reader(spec, schema)
    return lambda msg: record_to_row(schema, fields(msg), msg, spec.unknown_fields)
