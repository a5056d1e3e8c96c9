"""Kafka record keys decoded into columns (pure): a JSON or Avro key's fields fill the table's columns.

The key is the record's identity in Kafka (log compaction and upserts go by it), so where the key and the
value both give a field, the key's wins: an upsert's delete then lands on exactly the row its values did.
Kafka Connect's JSON converter wraps a key as `{"schema": ..., "payload": ...}`: the payload is the key.
A key that is no object (a bare number or string) has no fields to name: that is `_key`'s job.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from .avro import avro_reader
from .json import read_json
from .rows import DecodeError


class KeyFormat(enum.Enum):
    NONE = "none"  # the key fills no column but `_key` (as text)
    JSON = "json"
    AVRO = "avro"


KeyReader = Callable[[bytes | None], dict[str, Any]]


def key_reader(fmt: KeyFormat, avro_schema: str | None, registry_url: str | None) -> KeyReader | None:
    """key bytes -> the key's fields ({} for a record without a key); DecodeError naming the key as the culprit.
    None when keys fill no column."""
    if fmt is KeyFormat.NONE:
        return None
    read = read_json if fmt is KeyFormat.JSON else avro_reader(avro_schema, registry_url)

    def fields(key: bytes | None) -> dict[str, Any]:
        if key is None:
            return {}
        try:
            rec = read(key)
        except DecodeError as e:
            raise DecodeError(f"key: {e}") from None
        if "payload" in rec and "schema" in rec:
            rec = rec["payload"]
            if not isinstance(rec, dict):
                raise DecodeError("key: the converter's `payload` is not an object (use `_key` for a plain key)")
        return rec

    return fields
