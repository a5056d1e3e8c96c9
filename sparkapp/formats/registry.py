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
from .rows import DecodeError, Decoder, record_to_row
from .schema import TableSchema
from .string import string_reader


class Format(enum.Enum):
    JSON = "json"
    AVRO = "avro"
    STRING = "string"


@dataclass(frozen=True)
class DecoderSpec:
    format: Format = Format.JSON
    unknown_fields: str = "ignore"  # or "reject"
    avro_schema: str | None = None  # inline writer schema (JSON text)
    schema_registry_url: str | None = None  # Confluent wire format
    max_message_bytes: int = 8 << 20
    envelope: str = "none"  # or "debezium": each value is a change event (debezium.py)


Reader = Callable[[bytes], dict[str, Any]]
_READERS: dict[Format, Callable[[DecoderSpec, TableSchema], Reader]] = {
    Format.JSON: lambda spec, schema: read_json,
    Format.AVRO: lambda spec, schema: avro_reader(spec.avro_schema, spec.schema_registry_url),
    Format.STRING: lambda spec, schema: string_reader(schema),
}
NAMES = tuple(f.value for f in Format)


def record_reader(spec: DecoderSpec, schema: TableSchema) -> Reader:
    """value bytes -> the record's fields (a change event's row under envelope debezium); DecodeError."""
    read = _READERS[spec.format](spec, schema)
    return (lambda value: change_row(read(value))) if spec.envelope == "debezium" else read


def make_decoder(spec: DecoderSpec, schema: TableSchema) -> Decoder:
    """Returns a function message -> row that raises DecodeError with the reason."""
    parse = record_reader(spec, schema)
    changes = spec.envelope == "debezium"

    def decode(msg: Message) -> list[Any]:
        if msg.value is None:
            if changes:
                raise Skip("tombstone")
            raise DecodeError("tombstone: the record has a null value")
        if len(msg.value) > spec.max_message_bytes:
            raise DecodeError(f"oversized: {len(msg.value)} bytes exceeds max_message_bytes={spec.max_message_bytes}")
        return record_to_row(schema, parse(msg.value), msg, spec.unknown_fields)

    return decode
