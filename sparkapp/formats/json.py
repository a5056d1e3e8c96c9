"""JSON records: one object per Kafka value (ClickHouse's JSONEachRow path is jsoneachrow.py)."""

from __future__ import annotations

import json
from typing import Any

from .rows import DecodeError

# JSON's own names for what a value is, as a user reads them in a dead letter's reason
_JSON_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
               float: "a number", type(None): "null"}


def read_json(value: bytes) -> dict[str, Any]:
    """The record as a dict, or DecodeError naming what is wrong with it."""
    try:
        rec = json.loads(value)
    except UnicodeDecodeError as e:
        raise DecodeError(f"malformed JSON: not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise DecodeError(f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(rec, dict):
        raise DecodeError(f"JSON value is {_JSON_KINDS.get(type(rec), type(rec).__name__)}, expected an object")
    return rec
