"""Every supported ClickHouse type, JSON and Avro to ClickHouse and back, checked by ClickHouse's toString."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import itertools
import json
import uuid

import fastavro
import pytest

from sparkapp.formats.registry import DecoderSpec, Format
from tests.helpers import load_rows, msg

# (ClickHouse type, JSON value, toString() of what ClickHouse stored)
JSON_CASES = [
    ("Int8", -128, "-128"),
    ("Int16", 32767, "32767"),
    ("Int32", -2147483648, "-2147483648"),
    ("Int64", "9223372036854775807", "9223372036854775807"),
    ("Int128", -(2**127), str(-(2**127))),
    ("Int256", 2**255 - 1, str(2**255 - 1)),
    ("UInt8", 255, "255"),
    ("UInt16", 65535, "65535"),
    ("UInt32", 4294967295, "4294967295"),
    ("UInt64", 18446744073709551615, "18446744073709551615"),
    ("UInt128", 2**128 - 1, str(2**128 - 1)),
    ("UInt256", str(2**256 - 1), str(2**256 - 1)),
    ("Float32", 1.5, "1.5"),
    ("Float64", 0.1, "0.1"),
    ("Decimal(9, 2)", "1234567.89", "1234567.89"),
    ("Decimal(18, 4)", 12.5, "12.5"),
    ("Decimal(38, 10)", "-1234567890123456789012345678.0123456789", "-1234567890123456789012345678.0123456789"),
    ("Decimal(76, 20)", "12345678901234567890123456789012345678901234567890.5", "12345678901234567890123456789012345678901234567890.5"),
    ("Bool", True, "true"),
    ("String", "héllo \"wörld\"", "héllo \"wörld\""),
    ("FixedString(4)", "ab", "61620000"),  # compared as hex
    ("UUID", "123e4567-e89b-12d3-a456-426614174000", "123e4567-e89b-12d3-a456-426614174000"),
    ("Date", "2024-02-29", "2024-02-29"),
    ("Date32", "1900-01-01", "1900-01-01"),
    ("DateTime", "2024-01-01 12:34:56", "2024-01-01 12:34:56"),
    ("DateTime('Asia/Tokyo')", "2024-01-01T00:00:00Z", "2024-01-01 09:00:00"),
    ("DateTime('Asia/Tokyo')", "2024-01-01 09:00:00", "2024-01-01 09:00:00"),
    ("DateTime64(3)", 1704067200, "2024-01-01 00:00:00.000"),
    ("DateTime64(3, 'Europe/Berlin')", "2024-07-01T00:00:00.123+00:00", "2024-07-01 02:00:00.123"),
    ("DateTime64(6, 'UTC')", "2024-01-01T00:00:00.123456Z", "2024-01-01 00:00:00.123456"),
    ("DateTime64(9)", "2024-01-01T00:00:00.123456789Z", "2024-01-01 00:00:00.123456789"),
    ("IPv4", "10.1.2.3", "10.1.2.3"),
    ("IPv6", "2001:db8::1", "2001:db8::1"),
    ("Enum8('a' = 1, 'b' = -2)", "b", "b"),
    ("Enum16('x' = 1000, 'y' = 2000)", 2000, "y"),
    ("LowCardinality(String)", "lc", "lc"),
    ("LowCardinality(Nullable(String))", None, None),
    ("Nullable(Int32)", None, None),
    ("Nullable(Int32)", 7, "7"),
    ("Array(Nullable(Int8))", [1, None, 3], "[1,NULL,3]"),
    ("Array(Array(String))", [["a"], [], ["b", "c"]], "[['a'],[],['b','c']]"),
    ("Map(String, UInt16)", {"a": 1, "b": 2}, "{'a':1,'b':2}"),
    ("Map(UInt8, Array(String))", {"1": ["x"]}, "{1:['x']}"),
    ("Map(LowCardinality(String), Nullable(Decimal(10, 2)))", {"k": "1.25", "n": None}, "{'k':1.25,'n':NULL}"),
    ("Tuple(UInt8, String)", [1, "a"], "(1,'a')"),
    ("Tuple(a UInt8, b Nullable(String))", {"a": 1, "b": None}, "(1,NULL)"),
    ("Tuple(a UInt8, b Tuple(c String, d Array(UInt8)))", {"a": 1, "b": {"c": "x", "d": [1, 2]}}, "(1,('x',[1,2]))"),
]

_seq = itertools.count()


def _one_column(client, db, type_text):
    name = f"c{next(_seq)}"
    client.command(f"CREATE TABLE `{name}` (v {type_text}) ENGINE = MergeTree ORDER BY tuple()")
    return name


@pytest.mark.parametrize(("type_text", "value", "expected"), JSON_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(JSON_CASES)])
def test_json_roundtrip(ch_db, type_text, value, expected):
    client, db = ch_db
    table = _one_column(client, db, type_text)
    assert load_rows(client, db, table, [msg({"v": value})]) == []
    shown = "hex(v)" if type_text.startswith("FixedString") else "toString(v)"
    assert client.query(f"SELECT {shown} FROM `{table}`").result_rows == [(expected,)]


def test_json_nested_and_metadata_columns(ch_db):
    client, db = ch_db
    client.command(
        "CREATE TABLE n (id UInt32, n Nested(a UInt8, b String), _topic LowCardinality(String), _partition UInt16, "
        "_offset UInt64, _timestamp DateTime64(3, 'UTC'), _key Nullable(String), d UInt8 DEFAULT 42, "
        "m UInt16 MATERIALIZED id * 2) ENGINE = MergeTree ORDER BY id"
    )
    dead = load_rows(client, db, "n", [msg({"id": 1, "n": [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]}, offset=5,
                                           topic="orders", partition=3, key=b"k1"),
                                       msg({"id": 2, "n.a": [9], "n.b": ["z"], "d": 7}, offset=6, topic="orders",
                                           partition=3)])
    assert dead == []
    rows = client.query("SELECT id, toString(n.a), toString(n.b), _topic, _partition, _offset, toString(_timestamp), "
                        "_key, d, m FROM n ORDER BY id").result_rows
    assert rows == [
        (1, "[1,2]", "['x','y']", "orders", 3, 5, "2023-11-14 22:13:20.005", "k1", 42, 2),
        (2, "[9]", "['z']", "orders", 3, 6, "2023-11-14 22:13:20.006", None, 7, 4),
    ]


def test_json_type_column(ch_db):
    client, db = ch_db
    table = _one_column(client, db, "JSON")
    assert load_rows(client, db, table, [msg({"v": {"a": 1, "b": {"c": "x"}}})]) == []
    got = json.loads(client.query(f"SELECT toJSONString(v) FROM `{table}`").result_rows[0][0])
    assert got["b"] == {"c": "x"} and int(got["a"]) == 1


def test_string_format_stores_a_value_that_is_not_utf8_as_its_bytes(ch_db):
    """A String column holds bytes: a record that is not UTF-8 text is stored as it is (it stopped the sink: no
    insert could encode the text it was decoded to)."""
    client, db = ch_db
    client.command("CREATE TABLE raw (line String, _offset UInt64) ENGINE = MergeTree ORDER BY _offset")
    values = [b"\x80\xffbinary", "ünïcode".encode(), b"\xed\xa0\x80"]
    assert load_rows(client, db, "raw", [msg(v, offset=i) for i, v in enumerate(values)], DecoderSpec(Format.STRING)) == []
    assert client.query("SELECT hex(line) FROM raw ORDER BY _offset").result_rows == [(v.hex().upper(),) for v in values]


def test_string_format_single_column(ch_db):
    client, db = ch_db
    client.command("CREATE TABLE raw (line String, _offset UInt64) ENGINE = MergeTree ORDER BY _offset")
    dead = load_rows(client, db, "raw", [msg(b"not json at all", offset=1), msg(b"{\"a\":1}", offset=2)],
                     DecoderSpec(Format.STRING))
    assert dead == []
    assert client.query("SELECT line, _offset FROM raw ORDER BY _offset").result_rows == [
        ("not json at all", 1), ('{"a":1}', 2)]


AVRO_SCHEMA = {
    "type": "record", "name": "Row", "fields": [
        {"name": "i8", "type": "int"},
        {"name": "i64", "type": "long"},
        {"name": "f32", "type": "float"},
        {"name": "f64", "type": "double"},
        {"name": "ok", "type": "boolean"},
        {"name": "s", "type": "string"},
        {"name": "fx", "type": {"type": "fixed", "name": "F4", "size": 4}},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 3}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tsu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["red", "green"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "maybe", "type": ["null", "int"]},
        {"name": "pt", "type": {"type": "record", "name": "Pt", "fields": [{"name": "x", "type": "int"},
                                                                           {"name": "y", "type": "string"}]}},
    ],
}
AVRO_TABLE = (
    "CREATE TABLE av (i8 Int8, i64 Int64, f32 Float32, f64 Float64, ok Bool, s LowCardinality(String), "
    "fx FixedString(4), dec Decimal(10, 3), id UUID, day Date32, ts DateTime64(3, 'UTC'), tsu DateTime64(6, 'UTC'), "
    "color Enum8('red' = 1, 'green' = 2), tags Array(String), attrs Map(String, Int64), maybe Nullable(Int32), "
    "pt Tuple(x Int32, y String), _offset UInt64) ENGINE = MergeTree ORDER BY _offset"
)
AVRO_RECORD = {
    "i8": -5, "i64": 2**62, "f32": 2.5, "f64": 1e-9, "ok": True, "s": "avro", "fx": b"abcd",
    "dec": decimal.Decimal("1234.567"), "id": str(uuid.UUID(int=42)), "day": dt.date(1960, 5, 6),
    "ts": dt.datetime(2024, 3, 1, 12, 0, 0, 250000, tzinfo=dt.UTC),
    "tsu": dt.datetime(2024, 3, 1, 12, 0, 0, 123456, tzinfo=dt.UTC), "color": "green", "tags": ["a", "b"],
    "attrs": {"k": 9}, "maybe": None, "pt": {"x": 3, "y": "q"},
}
AVRO_EXPECTED = (
    "-5", str(2**62), "2.5", "1e-9", "true", "avro", "abcd", "1234.567", str(uuid.UUID(int=42)), "1960-05-06",
    "2024-03-01 12:00:00.250", "2024-03-01 12:00:00.123456", "green", "['a','b']", "{'k':9}", None, "(3,'q')",
)


def avro_bytes(record, schema=AVRO_SCHEMA):
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return buf.getvalue()


def test_avro_roundtrip_every_type(ch_db):
    client, db = ch_db
    client.command(AVRO_TABLE)
    spec = DecoderSpec(Format.AVRO, avro_schema=json.dumps(AVRO_SCHEMA))
    assert load_rows(client, db, "av", [msg(avro_bytes(AVRO_RECORD), offset=1)], spec) == []
    names = list(AVRO_RECORD)
    got = client.query(f"SELECT {', '.join(f'toString({c})' for c in names)} FROM av").result_rows[0]
    assert dict(zip(names, got, strict=True)) == dict(zip(names, AVRO_EXPECTED, strict=True))


VARIANT = "Variant(String, Int64, UInt64, Float64, Bool, Array(Int64), Map(String, Int64), Date, UUID)"


@pytest.mark.parametrize(("value", "member", "text"), [
    ("text", "String", "text"), ("2024-01-01", "String", "2024-01-01"),  # a string stays a String when one can
    (-5, "Int64", "-5"), (2**63, "UInt64", str(2**63)), (1.5, "Float64", "1.5"), (True, "Bool", "true"),
    ([1, 2], "Array(Int64)", "[1,2]"), ({"a": 1}, "Map(String, Int64)", "{'a':1}"), (None, "None", ""),
])
def test_a_variant_column_takes_each_value_in_the_member_of_its_kind(ch_db, value, member, text):
    client, db = ch_db
    table = _one_column(client, db, VARIANT)
    assert load_rows(client, db, table, [msg({"v": value})]) == []
    assert client.query(f"SELECT variantType(v), toString(v) FROM `{table}`").result_rows == [(member, text)]


def test_a_variant_without_the_values_kind_falls_to_the_next_member_or_dead_letters(ch_db):
    client, db = ch_db
    table = "vt"
    client.command("CREATE TABLE vt (v Variant(Int8, UUID, Date), _offset UInt64) ENGINE = MergeTree ORDER BY _offset")
    dead = load_rows(client, db, table, [msg({"v": 7}, offset=1), msg({"v": "2024-02-29"}, offset=2),
                                         msg({"v": str(uuid.UUID(int=5))}, offset=3), msg({"v": 300}, offset=4),
                                         msg({"v": "nope"}, offset=5)])
    assert [d.reason for d in dead] == [
        "column `v`: no member of Variant(Date, Int8, UUID) takes 300 (at t/0@4)",
        "column `v`: no member of Variant(Date, Int8, UUID) takes \"nope\" (at t/0@5)"]
    assert client.query(f"SELECT variantType(v), toString(v) FROM `{table}` ORDER BY _offset").result_rows == [
        ("Int8", "7"), ("Date", "2024-02-29"), ("UUID", str(uuid.UUID(int=5)))]


@pytest.mark.parametrize("type_text", [VARIANT, "Dynamic"])
def test_variant_and_dynamic_columns_over_http_hold_what_the_embedded_engine_holds(ch_db, clickhouse_server,
                                                                                   type_text):
    """Production's path writes the same Native Variant (a Dynamic column's too) over HTTP to a server."""
    import clickhouse_connect

    client, db = ch_db
    server = clickhouse_connect.get_client(dsn=clickhouse_server.dsn)
    server.command("CREATE DATABASE IF NOT EXISTS variants")
    server.command("DROP TABLE IF EXISTS variants.vt SYNC")
    values = ["a", -1, 2**63, 0.25, False, [3], {"k": 2}, None]
    read = "dynamicType(v)" if type_text == "Dynamic" else "variantType(v)"
    held = []
    for c, d in ((client, db), (server, "variants")):
        c.command(f"CREATE TABLE {d}.vt (v {type_text}, _offset UInt64) ENGINE = MergeTree ORDER BY _offset")
        assert load_rows(c, d, "vt", [msg({"v": v}, offset=i) for i, v in enumerate(values)]) == []
        held.append(c.query(f"SELECT {read}, toString(v) FROM {d}.vt ORDER BY _offset").result_rows)
    assert held[0] == held[1] and len(held[0]) == len(values)


@pytest.mark.parametrize(("value", "kind", "text"), [
    ("text", "String", "text"), ("2024-01-01", "String", "2024-01-01"), ("5", "String", "5"),
    (-5, "Int64", "-5"), (2**63, "UInt64", str(2**63)), (2**64, "Int128", str(2**64)), (1.5, "Float64", "1.5"),
    (True, "Bool", "true"), ([1, 2], "Array(Int64)", "[1,2]"), ([1, 2.5], "Array(Float64)", "[1,2.5]"),
    ([1, None], "Array(Nullable(Int64))", "[1,NULL]"), ([["a"], []], "Array(Array(String))", "[['a'],[]]"),
    ({"a": 1, "b": {"c": "x"}}, "JSON", '{"a":1,"b":{"c":"x"}}'), (None, "None", ""),
])
def test_a_dynamic_column_takes_each_value_with_the_type_of_its_kind(ch_db, value, kind, text):
    """A value's type in a Dynamic column comes from what the value is, never from its text ("5" stays String)."""
    client, db = ch_db
    table = _one_column(client, db, "Dynamic")
    assert load_rows(client, db, table, [msg({"v": value})]) == []
    assert client.query(f"SELECT dynamicType(v), toString(v) FROM `{table}`").result_rows == [(kind, text)]


def test_a_dynamic_list_mixing_kinds_is_dead_lettered_with_the_reason(ch_db):
    client, db = ch_db
    client.command("CREATE TABLE dt (v Dynamic, _offset UInt64) ENGINE = MergeTree ORDER BY _offset")
    dead = load_rows(client, db, "dt", [msg({"v": [1, "a"]}, offset=1), msg({"v": 3}, offset=2)])
    assert [d.reason for d in dead] == ["column `v`: a list mixing Int64, String has no one type in a Dynamic column; "
                                        "give the column a type (at t/0@1)"]
    assert client.query("SELECT dynamicType(v), _offset FROM dt").result_rows == [("Int64", 2)]


@pytest.mark.parametrize("type_text", ["Array(Dynamic)", "Map(String, Dynamic)", "Tuple(a Dynamic)"])
def test_a_dynamic_inside_another_type_is_refused_naming_the_column(type_text):
    from sparkapp.formats.schema import SchemaError, build_schema

    with pytest.raises(SchemaError, match=r"column `v` of `d`.`t`: a Dynamic inside"):
        build_schema("d", "t", [("v", type_text, "", None)])


def test_avro_and_protobuf_kinds_in_a_dynamic_column_keep_their_types(ch_db):
    """What Avro and Protobuf readers hand over beyond JSON's kinds: decimals, instants, dates, UUIDs, bytes."""
    from sparkapp.core.blocks import build_blocks
    from sparkapp.core.state_machine import OffsetRange
    from sparkapp.edges.clickhouse import load_schema
    from sparkapp.edges.insert import Inserter

    client, db = ch_db
    client.command("CREATE TABLE dk (v Dynamic, _offset UInt64) ENGINE = MergeTree ORDER BY _offset")
    schema = load_schema(client, db, "dk")
    values = [decimal.Decimal("1.25"), dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC), dt.date(1960, 5, 6),
              uuid.UUID(int=9), b"\xff\x00raw", [dt.date(2024, 1, 1)]]
    rows = [(i, [schema.columns[0].conv(v), i]) for i, v in enumerate(values)]
    for block in build_blocks(OffsetRange(0, len(values) - 1), rows, schema.names, 100, lambda w: "dk"):
        Inserter(client, schema).insert(block)
    assert client.query("SELECT dynamicType(v), hex(toString(v)) FROM dk ORDER BY _offset").result_rows == [
        ("Decimal(76, 2)", b"1.25".hex().upper()), ("DateTime64(6, 'UTC')", b"2024-01-02 03:04:05.123456".hex().upper()),
        ("Date32", b"1960-05-06".hex().upper()), ("UUID", str(uuid.UUID(int=9)).encode().hex().upper()),
        ("String", "FF00726177"), ("Array(Date32)", b"['2024-01-01']".hex().upper())]
