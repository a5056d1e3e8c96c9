"""Differential property test: ClickHouse's JSONEachRow parser (the fast path) against the Python decoder.

The fast path is taken only for tables whose every column type is in the strict set (`eligible`); a window
ClickHouse rejects goes through the decoder. So a record's fate is the same on both paths exactly when,
for every such type, whatever ClickHouse accepts the decoder accepts too and stores identically. Each
example is one record `{"v": <raw JSON text>}`, sent through the real Inserter both ways into one chdb
table, read back as text.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sparkapp.core.blocks import LineBlock, build_blocks
from sparkapp.core.records import Message
from sparkapp.core.state_machine import OffsetRange
from sparkapp.edges.clickhouse import load_schema
from sparkapp.edges.insert import Inserter, InsertError
from sparkapp.formats.jsoneachrow import eligible, guard
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from sparkapp.formats.rows import decode_batch

TYPES = [
    "Int64", "UInt64", "Int128", "UInt128", "Int256", "UInt256", "Float64", "Bool", "String", "FixedString(4)",
    "UUID", "DateTime64(3, 'UTC')", "IPv4", "IPv6", "Enum8('a' = 1, 'b' = 2)", "Decimal(9, 2)", "Decimal(38, 10)",
    "Decimal(76, 20)", "Nullable(Int64)", "Nullable(String)", "LowCardinality(String)", "Array(Int64)",
    "Map(String, UInt64)", "Tuple(a Int64, b String)",
]

_edges = [0, 1, -1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 2**127, 2**128, 2**255, 2**256,
          -(2**127) - 1, -(2**255) - 1, 10**38, 10**76]
ints = st.one_of(st.sampled_from(_edges), st.integers(-(2**260), 2**260), st.integers(-1000, 1000)).map(str)
floats = st.one_of(st.floats(allow_nan=False, allow_infinity=False).map(repr),
                   st.sampled_from(["1e3", "1E-2", "-0.0", "1e400", "0.1", "123456789012345678901234567890.5",
                                    "-48209386309284.3501", "12.345678901234567890123", "1.0"]))
strings = st.one_of(
    st.text(max_size=6),
    st.sampled_from(["12", " 12 ", "12.3.4", "1e3", "true", "nan", "inf", "2026-01-02 03:04:05.678",
                     "2026-01-02T03:04:05Z", "1.2.3.4", "::1", "256.1.1.1", "a", "b", "c", "abcd", "abcde",
                     "0x10", "+5", "00012", "61f0c404-5cb3-11e7-907b-a6006ad3dba0", "1970-01-01", "-1",
                     "18446744073709551616", "9223372036854775808", "1.005", "12,5", "", "2026-01-02 03:04:05",
                     "2026-01-02 03:04:05.1234567891", "2026-01-02T03:04:05.5+02:00", "2026-13-02 03:04:05",
                     "2026-01-02 03:04", "1700000000", " 2026-01-02 03:04:05"]),
).map(lambda s: json.dumps(s, ensure_ascii=False))
# escapes as a producer's JSON text may hold them: a surrogate pair (an escaped emoji) and lone halves of one
escapes = st.sampled_from(['"\\ud83d\\ude00"', '"\\udc80"', '"x\\uDFFF"', '"\\ud800"', '"\\udc80\\ud800"',
                           '"\\\\udc80"', '"\\u00e9\\u0000"'])
scalars = st.one_of(ints, floats, strings, escapes, st.sampled_from(["true", "false", "null"]))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]"),
        st.dictionaries(st.sampled_from(["a", "b", "k", "1"]), inner, max_size=2).map(
            lambda d: "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in d.items()) + "}"),
    ),
    max_leaves=4,
)

_seq = itertools.count()


@pytest.fixture(scope="module")
def tables(ch_factory):
    db = "differential"
    client = ch_factory(db)
    made = {}
    for i, t in enumerate(TYPES):
        name = f"d{i}"
        client.command(f"CREATE TABLE IF NOT EXISTS `{db}`.{name} (n UInt64, v {t}) ENGINE = MergeTree ORDER BY n")
        schema = load_schema(client, db, name)
        assert eligible(schema), t
        made[t] = (schema, Inserter(client, schema, retries=0), make_decoder(DecoderSpec(Format.JSON), schema))
    yield client, made
    client.command(f"DROP DATABASE `{db}` SYNC")


def stored(client: Any, schema: Any, n: int) -> list[str]:
    return [r[0] for r in client.query(f"SELECT toString(v) FROM {schema.fqn} WHERE n = {n}").result_rows]


@pytest.mark.parametrize("type_text", TYPES)
@settings(max_examples=70, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=values)
@example(text='"\\udc80"').via("a lone low surrogate: ClickHouse stores it as bytes that are no UTF-8")
@example(text='{"k":"\\ud83d\\ude00","a":"x\\uDFFF"}').via("a pair, then a lone half in a container")
def test_what_clickhouse_accepts_the_decoder_accepts_and_stores_alike(tables, type_text, text):
    client, made = tables
    schema, inserter, decode = made[type_text]
    fast_n, slow_n = next(_seq) * 2 + 1, next(_seq) * 2
    line = f'{{"n":{fast_n},"v":{text}}}\n'
    lines = pa.array([line], pa.string())
    suspect, ask_first = guard(schema).hits(lines)
    if suspect:
        return  # the writer sends this window through the decoder: its verdict is the only one
    value = f'{{"n":{slow_n},"v":{text}}}'.encode()
    if ask_first and decode_batch(decode, [Message("t", 0, slow_n, value)])[1]:
        return  # the writer asks the decoder first, and the decoder's refusal dead-letters the record
    w = OffsetRange(fast_n, fast_n)
    try:
        inserter.insert(LineBlock(w, f"f{fast_n}", (fast_n,), lines))
        accepted = True
    except InsertError:
        accepted = False
    if not accepted:
        return  # the window takes the decoder: its verdict is the only one
    rows, dead = decode_batch(decode, [Message("t", 0, slow_n, value)])
    assert not dead, f"{type_text}: ClickHouse stored {text} as {stored(client, schema, fast_n)}, the decoder " \
                     f"dead-letters it: {dead[0].reason}"
    ws = OffsetRange(slow_n, slow_n)
    for block in build_blocks(ws, rows, schema.names, 1, lambda _: f"s{slow_n}"):
        inserter.insert(block)
    assert stored(client, schema, fast_n) == stored(client, schema, slow_n), f"{type_text}: {text}"


def test_clean_records_stay_on_the_fast_path():
    """The guard must not send ordinary records to the decoder: the benchmark's events (nulls in Nullable
    columns, Decimal and DateTime64 text, arrays and maps) pass it untouched."""
    import random

    from bench.data import TABLE, encoded
    from sparkapp.formats.jsoneachrow import build_lines
    from sparkapp.formats.schema import build_schema
    from tests.helpers import messages_table

    body, depth, cols, cur = TABLE.split("(", 1)[1].rsplit(") ENGINE", 1)[0], 0, [], ""
    for ch in body:  # the column list, split at top-level commas
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            cols.append(cur.strip().split(" ", 1))
            cur = ""
        else:
            cur += ch
    cols.append(cur.strip().split(" ", 1))
    schema = build_schema("d", "t", [(n, t.strip(), "", None) for n, t in cols])
    rnd = random.Random(3)
    msgs = [Message("t", 0, i, encoded(rnd, i)) for i in range(2000)]
    lines = build_lines(messages_table(msgs), schema.names, 1 << 20)
    assert lines.null_count == 0
    assert not guard(schema).suspect(lines)
    bad = build_lines(messages_table([Message("t", 0, 0, b'{"id": 18446744073709551616}')]), schema.names, 1 << 20)
    assert guard(schema).suspect(bad)
