"""JSON records: one object per Kafka value (ClickHouse's JSONEachRow path is jsoneachrow.py)."""

from __future__ import annotations

import json
import re
from typing import Any

from .chtypes import JsonNumber
from .rows import DecodeError

# JSON's own names for what a value is, as a user reads them in a dead letter's reason
_JSON_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
               float: "a number", type(None): "null"}  # bool before int: a bool is an int
_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(v: Any) -> str | None:
    """The first string (value or field name) holding half of a surrogate pair: `\\ud800` alone names no
    character, ClickHouse refuses it, and no insert could encode it."""
    if isinstance(v, str):
        return v if _SURROGATE.search(v) else None
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, x in items:
        found = _lone_surrogate(k) if isinstance(k, str) else None
        if found is None:
            found = _lone_surrogate(x)
        if found is not None:
            return found
    return None


def read_json(value: bytes) -> dict[str, Any]:
    """The record as a dict, or DecodeError naming what is wrong with it."""
    try:
        rec = json.loads(value, parse_float=JsonNumber)  # numbers keep their digits for Decimal columns
    except UnicodeDecodeError as e:
        raise DecodeError(f"malformed JSON: not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise DecodeError(f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if b"\\u" in value:  # only an escape can make a lone surrogate (UTF-8 cannot hold one)
        bad = _lone_surrogate(rec)
        if bad is not None:
            text = bad.encode("utf-8", "backslashreplace").decode()[:40]
            raise DecodeError(f"malformed JSON: a lone surrogate escape in {text!r} names no character")
    if not isinstance(rec, dict):
        kind = next((k for t, k in _JSON_KINDS.items() if isinstance(rec, t)), type(rec).__name__)
        raise DecodeError(f"JSON value is {kind}, expected an object")
    return rec
