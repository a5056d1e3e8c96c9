"""Kafka metadata as columns: headers (`_headers`, and one header through a MATERIALIZED column) and the
timestamp type (`_timestamp_type`), stored alike by the decoding path and the fast path (real chdb)."""

from __future__ import annotations

import pytest

from sparkapp.core.blocks import LineBlock, build_blocks
from sparkapp.core.state_machine import OffsetRange
from sparkapp.edges.clickhouse import load_schema
from sparkapp.edges.insert import Inserter
from sparkapp.formats.jsoneachrow import build_lines, eligible
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from sparkapp.formats.rows import decode_batch
from sparkapp.formats.schema import SchemaError
from tests.helpers import messages_table, msg

TABLE = ("CREATE TABLE {t} (id UInt64, _key Nullable(String), _timestamp DateTime64(3, 'UTC'), "
         "_headers Map(String, String), _timestamp_type Enum8('CreateTime' = 0, 'LogAppendTime' = 1), "
         "trace String MATERIALIZED _headers['trace']) ENGINE = MergeTree ORDER BY id")

HEADERS = [
    (),
    (("trace", b"abc-1"),),
    (("trace", b"first"), ("trace", b"last"), ("x", b"")),  # a name twice: its last value (Kafka's lastHeader)
    (('q"u\\o\u00fc\u2028', b'v"\\\n\x01\xc3\xa9'),),  # names and values JSON must escape
    (("bin", b"\xff\xfe-not-utf8"),),  # not UTF-8: U+FFFD, as `_key`
]
EXPECTED = [{}, {"trace": "abc-1"}, {"trace": "last", "x": ""}, {'q"u\\o\u00fc\u2028': 'v"\\\n\x01\u00e9'},
            {"bin": "\ufffd\ufffd-not-utf8"}]


def test_headers_and_timestamp_type_are_stored_alike_on_both_paths(ch_db):
    client, db = ch_db
    for t in ("decoded", "lines"):
        client.command(TABLE.format(t=t))
    msgs = [msg({"id": i}, offset=i, key=b"k%d" % i if i % 2 else None, headers=h, timestamp_type=i % 2)
            for i, h in enumerate(HEADERS)]
    schema = load_schema(client, db, "decoded")
    assert eligible(schema), "metadata columns keep the table on the fast path"
    rows, dead = decode_batch(make_decoder(DecoderSpec(Format.JSON), schema), msgs)
    assert not dead
    rng = OffsetRange(0, len(msgs) - 1)
    for block in build_blocks(rng, rows, schema.names, 100, lambda w: "decoded"):
        Inserter(client, schema).insert(block)
    lines = build_lines(messages_table(msgs), load_schema(client, db, "lines").names, 8 << 20)
    assert lines.null_count == 0
    Inserter(client, load_schema(client, db, "lines")).insert(
        LineBlock(rng, "lines", tuple(m.offset for m in msgs), lines))
    query = "SELECT id, _key, toString(_timestamp), _headers, _timestamp_type, trace FROM {t} ORDER BY id"
    decoded = client.query(query.format(t="decoded")).result_rows
    assert client.query(query.format(t="lines")).result_rows == decoded
    assert [r[3] for r in decoded] == EXPECTED
    assert [r[4] for r in decoded] == ["CreateTime", "LogAppendTime"] * 2 + ["CreateTime"]
    assert [r[5] for r in decoded] == ["", "abc-1", "last", "", ""]


@pytest.mark.parametrize(("column", "why"), [
    ("_headers String", "Map(String, String), not String"),
    ("_headers Map(String, UInt8)", "Map(String, String), not Map(String, UInt8)"),
    ("_timestamp_type Enum8('CreateTime' = 0)", "an Enum with 'CreateTime' and 'LogAppendTime'"),
    ("_timestamp_type UInt8", "String or an Enum"),
])
def test_a_metadata_column_of_a_type_that_cannot_hold_it_is_refused_up_front(ch_db, column, why):
    client, db = ch_db
    client.command(f"CREATE TABLE bad (id UInt64, {column}) ENGINE = MergeTree ORDER BY id")
    with pytest.raises(SchemaError, match=rf"column `{column.split()[0]}` of `{db}`.`bad`.*{why}".replace("(", r"\(")
                       .replace(")", r"\)")):
        load_schema(client, db, "bad")
