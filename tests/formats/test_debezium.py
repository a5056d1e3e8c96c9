"""Debezium change events: each one decoded as its row with `_op` and `_deleted`, tombstones skipped, and a
ReplacingMergeTree(_offset, _deleted) table (real chdb) ending with each key's last state."""

from __future__ import annotations

import json

import pytest

from sparkapp.config import FormatConfig
from sparkapp.core.blocks import build_blocks
from sparkapp.core.state_machine import OffsetRange
from sparkapp.edges.clickhouse import load_schema
from sparkapp.edges.insert import Inserter
from sparkapp.formats.debezium import change_row
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from sparkapp.formats.rows import DecodeError, decode_batch
from tests.helpers import msg


def event(op: str, before: dict | None, after: dict | None) -> dict:
    return {"op": op, "before": before, "after": after, "source": {"lsn": 1}, "ts_ms": 1}


@pytest.mark.parametrize(("ev", "row"), [
    (event("c", None, {"id": 1, "v": "a"}), {"id": 1, "v": "a", "_op": "c", "_deleted": 0}),
    (event("r", None, {"id": 1, "v": "a"}), {"id": 1, "v": "a", "_op": "r", "_deleted": 0}),
    (event("u", {"id": 1, "v": "a"}, {"id": 1, "v": "b"}), {"id": 1, "v": "b", "_op": "u", "_deleted": 0}),
    (event("d", {"id": 1, "v": "b"}, None), {"id": 1, "v": "b", "_op": "d", "_deleted": 1}),
    ({"schema": {"type": "struct"}, "payload": event("c", None, {"id": 2})}, {"id": 2, "_op": "c", "_deleted": 0}),
])
def test_a_change_is_the_row_it_leaves(ev, row):
    assert change_row(ev) == row


@pytest.mark.parametrize(("ev", "why"), [
    ({"op": "t", "before": None, "after": None}, "truncate event"),
    ({"op": "x", "after": {}}, "`op` is 'x'"),
    ({"id": 1}, "`op` is None"),
    (event("d", None, None), "delete event without a `before` object"),
    (event("u", {"id": 1}, None), "update event without a `after` object"),
    ({"schema": {}, "payload": [1]}, "`payload` is not an object"),
])
def test_what_is_not_one_rows_change_is_named(ev, why):
    with pytest.raises(DecodeError, match=why.replace("(", r"\(")):
        change_row(ev)


def test_a_string_format_cannot_carry_change_events():
    with pytest.raises(ValueError, match="envelope debezium needs a record format"):
        FormatConfig.model_validate({"type": "string", "envelope": "debezium"})


def test_changes_of_a_key_end_as_its_last_state_and_tombstones_hold_no_row(ch_db):
    client, db = ch_db
    client.command("CREATE TABLE cur (id UInt64, v String, _offset UInt64, _op LowCardinality(String), "
                   "_deleted UInt8) ENGINE = ReplacingMergeTree(_offset, _deleted) ORDER BY id")
    schema = load_schema(client, db, "cur")
    values = [event("c", None, {"id": 1, "v": "a"}), event("c", None, {"id": 2, "v": "x"}),
              event("u", {"id": 1, "v": "a"}, {"id": 1, "v": "b"}), event("d", {"id": 2, "v": "x"}, None), None,
              event("c", None, {"id": 3, "v": "y"}), b'{"op": "t"}']
    msgs = [msg(json.dumps(v).encode() if isinstance(v, dict) else v, offset=i) for i, v in enumerate(values)]
    rows, dead = decode_batch(make_decoder(DecoderSpec(Format.JSON, envelope="debezium"), schema), msgs)
    assert [o for o, _ in rows] == [0, 1, 2, 3, 5]  # the tombstone (4) holds no row and is no dead letter
    assert [d.message.offset for d in dead] == [6] and "truncate" in dead[0].reason
    for block in build_blocks(OffsetRange(0, 6), rows, schema.names, 100, lambda w: "t"):
        Inserter(client, schema).insert(block)
    final = client.query("SELECT id, v FROM cur FINAL ORDER BY id").result_rows
    assert [tuple(r) for r in final] == [(1, "b"), (3, "y")]
    latest = client.query("SELECT id, argMax(v, _offset), argMax(_deleted, _offset) FROM cur GROUP BY id "
                          "ORDER BY id").result_rows
    assert [tuple(r) for r in latest] == [(1, "b", 0), (2, "x", 1), (3, "y", 0)]
