"""JSON records: one object per Kafka value (ClickHouse's JSONEachRow path is jsoneachrow.py)."""

from __future__ import annotations

import json
from typing import Any

from .chtypes import JsonNumber
from .rows import DecodeError

# JSON's own names for what a value is, as a user reads them in a dead letter's reason
_JSON_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
               float: "a number", type(None): "null"}  # bool before int: a bool is an int


def read_json(value: bytes) -> dict[str, Any]:
    """The record as a dict, or DecodeError naming what is wrong with it."""
    try:
        rec = json.loads(value, parse_float=JsonNumber)  # numbers keep their digits for Decimal columns
    except UnicodeDecodeError as e:
        raise DecodeError(f"malformed JSON: not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise DecodeError(f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(rec, dict):
        kind = next((k for t, k in _JSON_KINDS.items() if isinstance(rec, t)), type(rec).__name__)
        raise DecodeError(f"JSON value is {kind}, expected an object")
    return rec
