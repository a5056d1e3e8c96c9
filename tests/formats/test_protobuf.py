"""Protobuf values into ClickHouse: every type a field can have, compiled from a .proto by protoc as a user would,
stored through chsink and read back by ClickHouse's toString; Confluent's framing as Confluent's own client writes
it; bad values dead-lettered with their reason; config refused with the field named."""

from __future__ import annotations

import base64

import pytest
from confluent_kafka.schema_registry.common.serde import SchemaId
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkapp.config import ConfigError, parse_config
from sparkapp.formats.protobuf import ProtobufReader, unframe
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from sparkapp.formats.rows import DecodeError
from sparkapp.formats.schema import build_schema
from tests.helpers import compile_proto, load_rows, msg, proto_message

PROTO = """
syntax = "proto3";
package shop.v1;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";

enum Color { COLOR_UNSPECIFIED = 0; RED = 1; GREEN = 2; }

message Point { int32 x = 1; string y = 2; }

message Row {
  int32 i32 = 1; int64 i64 = 2; uint32 u32 = 3; uint64 u64 = 4; sint32 s32 = 5; sint64 s64 = 6;
  fixed32 f32x = 7; fixed64 f64x = 8; sfixed32 sf32 = 9; sfixed64 sf64 = 10;
  float fl = 11; double db = 12; bool ok = 13; string s = 14; bytes raw = 15; bytes fx = 16;
  Color color = 17; Color color_num = 18; Color color_text = 19;
  Point pt = 20; repeated int64 nums = 21; repeated Point pts = 22; map<string, int64> attrs = 23;
  google.protobuf.Timestamp ts = 24; google.protobuf.Int64Value maybe = 25; google.protobuf.StringValue absent = 26;
  optional int32 opt = 27; google.protobuf.Struct doc = 28; string empty = 29; int64 zero = 30;
  oneof choice { string as_text = 31; int64 as_number = 32; }
  Point no_point = 33;
}
"""

TABLE = (
    "CREATE TABLE pb (i32 Int32, i64 Int64, u32 UInt32, u64 UInt64, s32 Int32, s64 Int64, f32x UInt32, f64x UInt64, "
    "sf32 Int32, sf64 Int64, fl Float32, db Float64, ok Bool, s LowCardinality(String), raw String, "
    "fx FixedString(3), color Enum8('COLOR_UNSPECIFIED' = 0, 'RED' = 1, 'GREEN' = 2), color_num Int8, "
    "color_text String, pt Tuple(x Int32, y String), nums Array(Int64), pts Array(Tuple(x Int32, y String)), "
    "attrs Map(String, Int64), ts DateTime64(9, 'UTC'), maybe Nullable(Int64), absent Nullable(String), "
    "opt Int32 DEFAULT 42, doc JSON, empty String, zero Int64, as_text Nullable(String), as_number Nullable(Int64), "
    "no_point Nullable(String), _offset UInt64) ENGINE = MergeTree ORDER BY _offset"
)

ROW = {
    "i32": -2147483648, "i64": "-9223372036854775808", "u32": 4294967295, "u64": "18446744073709551615",
    "s32": -7, "s64": "-9000000000000000000", "f32x": 4000000000, "f64x": "18000000000000000000", "sf32": -1,
    "sf64": "-2", "fl": 1.5, "db": 0.1, "ok": True, "s": "héllo", "raw": base64.b64encode(b"\x00ab").decode(),
    "fx": base64.b64encode(b"xyz").decode(), "color": "GREEN", "color_num": "RED", "color_text": "GREEN",
    "pt": {"x": 3, "y": "q"}, "nums": ["1", "-2"], "pts": [{"x": 1, "y": "a"}, {"x": 2}],
    "attrs": {"b": "2", "a": "1"}, "ts": "2024-03-01T12:00:00.123456789Z", "maybe": "7",
    "doc": {"k": "v", "n": {"m": True}}, "asNumber": "5",
}
EXPECTED = {
    "i32": "-2147483648", "i64": "-9223372036854775808", "u32": "4294967295", "u64": "18446744073709551615",
    "s32": "-7", "s64": "-9000000000000000000", "f32x": "4000000000", "f64x": "18000000000000000000", "sf32": "-1",
    "sf64": "-2", "fl": "1.5", "db": "0.1", "ok": "true", "s": "héllo", "raw": "\x00ab", "fx": "xyz",
    "color": "GREEN", "color_num": "1", "color_text": "GREEN", "pt": "(3,'q')", "nums": "[1,-2]",
    "pts": "[(1,'a'),(2,'')]", "attrs": "{'a':1,'b':2}", "ts": "2024-03-01 12:00:00.123456789", "maybe": "7",
    "absent": None, "opt": "42", "doc": '{"k":"v","n":{"m":true}}', "empty": "", "zero": "0", "as_text": None,
    "as_number": "5", "no_point": None,
}


@pytest.fixture(scope="module")
def descriptor_set(tmp_path_factory):
    return compile_proto(PROTO, tmp_path_factory.mktemp("proto"), "shop.proto")


def spec(descriptor_set: str, **kw) -> DecoderSpec:
    return DecoderSpec(Format.PROTOBUF, protobuf_descriptor_set=descriptor_set, protobuf_message="shop.v1.Row", **kw)


def test_every_field_type_is_stored_exactly(ch_db, descriptor_set):
    """Scalars at their limits, enums by name (and by number for an integer column), nested and repeated
    messages, maps (by key), the well-known types; proto3 fields the sender left out read as protobuf reads
    them (0, ''), fields with presence that are unset take the column's DEFAULT or NULL."""
    client, db = ch_db
    client.command(TABLE)
    value = proto_message(descriptor_set, "shop.v1.Row", ROW)
    assert load_rows(client, db, "pb", [msg(value, offset=1)], spec(descriptor_set)) == []
    names = list(EXPECTED)
    got = client.query(f"SELECT {', '.join(f'toString({c})' for c in names)} FROM pb").result_rows[0]
    assert dict(zip(names, got, strict=True)) == EXPECTED


def test_confluent_framing_as_confluents_client_writes_it_is_read_as_the_configured_message(descriptor_set):
    value = proto_message(descriptor_set, "shop.v1.Row", {"i32": 5, "s": "x"})
    reader = ProtobufReader(descriptor_set, "shop.v1.Row", None)
    for indexes in ([0], [3], [1, 0]):
        framed = SchemaId("PROTOBUF", 17, message_indexes=indexes).id_to_bytes() + value
        assert reader(framed) == reader(value)
        assert reader(framed)["i32"] == 5


@given(st.integers(0, 2**32 - 1), st.lists(st.integers(0, 10**6), min_size=1, max_size=5), st.binary(max_size=20))
def test_unframe_reads_what_confluents_client_frames(schema_id, indexes, payload):
    framed = SchemaId("PROTOBUF", schema_id, message_indexes=indexes).id_to_bytes() + payload
    assert unframe(framed) == (schema_id, indexes, payload)


@pytest.mark.parametrize(("value", "reason"), [
    (b"\x0a\x05ab", "protobuf: cannot parse shop.v1.Row"),  # a string field cut short
    (b"{broken", "protobuf: cannot parse shop.v1.Row"),
    (b"\x72\x02\xff\xfe", "protobuf: cannot parse shop.v1.Row"),  # field 14 (string) not UTF-8
    (b"\x00\x00\x00", "protobuf: truncated Confluent wire format"),
    (b"\x08" + b"\xff" * 10 + b"\x01", "protobuf: cannot parse shop.v1.Row"),  # an 11-byte varint
])
def test_a_bad_value_is_refused_with_its_reason(descriptor_set, value, reason):
    with pytest.raises(DecodeError, match=reason):
        ProtobufReader(descriptor_set, "shop.v1.Row", None)(value)


def test_a_value_that_does_not_fit_its_column_is_dead_lettered_naming_column_and_offset(ch_db, descriptor_set):
    client, db = ch_db
    client.command("CREATE TABLE narrow (i32 Int8, s String, _offset UInt64) ENGINE = MergeTree ORDER BY _offset")
    good = proto_message(descriptor_set, "shop.v1.Row", {"i32": 7, "s": "fine"})
    wide = proto_message(descriptor_set, "shop.v1.Row", {"i32": 300})
    dead = load_rows(client, db, "narrow", [msg(good, offset=1), msg(wide, offset=2), msg(b"{x", offset=3)],
                     spec(descriptor_set))
    assert [d.reason for d in dead] == [
        "column `i32`: value 300 out of range for Int8 [-128, 127] (at t/0@2)",
        dead[1].reason,
    ]
    assert dead[1].reason.startswith("protobuf: cannot parse shop.v1.Row") and dead[1].reason.endswith("(at t/0@3)")
    assert client.query("SELECT i32, s, _offset FROM narrow").result_rows == [(7, "fine", 1)]


def test_proto2_required_fields_are_checked(tmp_path):
    ds = compile_proto('syntax = "proto2"; package p; message M { required int32 a = 1; optional string b = 2; }',
                       tmp_path, "p2.proto")
    read = ProtobufReader(ds, "p.M", None)
    assert read(b"\x08\x05") == {"a": 5}
    with pytest.raises(DecodeError, match=r"p\.M lacks required field\(s\) a"):
        read(b"\x12\x01z")


def test_an_enum_number_the_schema_does_not_know_is_kept_as_the_number(descriptor_set):
    assert ProtobufReader(descriptor_set, "shop.v1.Row", None)(b"\x88\x01\x09")["color"] == 9  # field 17 = 9


def test_decoders_of_one_config_agree_whichever_process_builds_them(descriptor_set):
    """Retries run on other executors: two readers built apart give the same record, maps in one order."""
    schema = build_schema("d", "t", [("attrs", "Map(String, Int64)", "", None), ("_offset", "UInt64", "", None)])
    value = msg(proto_message(descriptor_set, "shop.v1.Row", {"attrs": {str(i): str(i) for i in range(50)}}))
    a, b = (make_decoder(spec(descriptor_set), schema) for _ in range(2))
    assert a(value) == b(value)
    assert list(a(value)[0]) == sorted(str(i) for i in range(50))


@pytest.mark.parametrize(("fmt", "needle"), [
    ({"type": "protobuf"}, "format protobuf needs `protobufDescriptorSet` with `protobufMessage`, or "
                           "`schemaRegistryUrl`"),
    ({"type": "protobuf", "protobufMessage": "shop.v1.Row", "schemaRegistryUrl": "http://r"},
     "`protobufDescriptorSet` and `protobufMessage` go together"),
    ({"type": "protobuf", "protobufDescriptorSet": "not base64!", "protobufMessage": "shop.v1.Row"},
     "protobufDescriptorSet is not a base64 FileDescriptorSet"),
    ({"type": "protobuf", "protobufDescriptorSet": "DESCRIPTOR_SET", "protobufMessage": "shop.v1.Nope"},
     "protobufMessage 'shop.v1.Nope' is not a message of the descriptor set"),
    ({"type": "json", "protobufDescriptorSet": "DESCRIPTOR_SET", "protobufMessage": "shop.v1.Row"},
     "`protobufDescriptorSet` and `protobufMessage` are for format protobuf"),
])
def test_config_names_what_is_wrong(descriptor_set, fmt, needle):
    fmt = {k: descriptor_set if v == "DESCRIPTOR_SET" else v for k, v in fmt.items()}
    base = {"name": "s", "kafka": {"bootstrapServers": "k:9092", "topics": ["t"]},
            "clickhouse": {"endpoints": ["chdb:///tmp/x"], "database": "d", "tables": {"t": "t"}},
            "checkpointLocation": "/tmp/c"}
    with pytest.raises(ConfigError) as e:
        parse_config({**base, "format": fmt})
    assert "format" in str(e.value) and needle in str(e.value), str(e.value)


def test_protobuf_takes_the_decoding_path(descriptor_set):
    base = {"name": "s", "kafka": {"bootstrapServers": "k:9092", "topics": ["t"]},
            "clickhouse": {"endpoints": ["chdb:///tmp/x"], "database": "d", "tables": {"t": "t"}},
            "checkpointLocation": "/tmp/c",
            "format": {"type": "protobuf", "protobufDescriptorSet": descriptor_set, "protobufMessage": "shop.v1.Row"}}
    assert not parse_config(base).format.clickhouse_parses


DIFF_PROTO = """
syntax = "proto3";
package diff;
enum E { E0 = 0; E1 = 1; E2 = 2; }
message Inner { int64 a = 1; string b = 2; }
message M {
  int32 i32 = 1; int64 i64 = 2; uint32 u32 = 3; uint64 u64 = 4; sint64 s64 = 5; fixed64 f64x = 6;
  sfixed32 sf32 = 7; double db = 8; bool ok = 9; string s = 10; bytes raw = 11; E e = 12;
  repeated int64 nums = 13; repeated string words = 14; Inner inner = 15; map<string, int64> attrs = 16;
  repeated Inner inners = 17; float fl = 18;
}
"""
DIFF_COLUMNS = (
    "i32 Int32, i64 Int64, u32 UInt32, u64 UInt64, s64 Int64, f64x UInt64, sf32 Int32, db Float64, ok Bool, "
    "s String, raw String, e Enum8('E0' = 0, 'E1' = 1, 'E2' = 2), nums Array(Int64), words Array(String), "
    "inner Tuple(a Int64, b String), attrs Map(String, Int64), inners Array(Tuple(a Int64, b String)), fl Float32"
)
_i64 = st.integers(-(2**63), 2**63 - 1)
_text = st.text(max_size=8)
# one field always set: an empty message is zero bytes, which ClickHouse reads as no row at all
DIFF_VALUES = st.fixed_dictionaries({"s": st.text(min_size=1, max_size=8)}, optional={
    "i32": st.integers(-(2**31), 2**31 - 1), "i64": _i64.map(str), "u32": st.integers(0, 2**32 - 1),
    "u64": st.integers(0, 2**64 - 1).map(str), "s64": _i64.map(str), "f64x": st.integers(0, 2**64 - 1).map(str),
    "sf32": st.integers(-(2**31), 2**31 - 1), "db": st.floats(allow_nan=False, allow_infinity=False),
    "ok": st.booleans(), "raw": st.binary(max_size=8).map(lambda b: base64.b64encode(b).decode()),
    "e": st.sampled_from(["E0", "E1", "E2"]), "nums": st.lists(_i64.map(str), max_size=3),
    "words": st.lists(_text, max_size=3), "inner": st.fixed_dictionaries({"a": _i64.map(str), "b": _text}),
    "attrs": st.dictionaries(_text, _i64.map(str), max_size=3),
    "inners": st.lists(st.fixed_dictionaries({"a": _i64.map(str), "b": _text}), max_size=2),
    "fl": st.floats(width=32, allow_nan=False, allow_infinity=False),
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(DIFF_VALUES)
def test_the_decoder_stores_what_clickhouses_own_protobuf_reader_stores(ch_db, tmp_path, fields):
    """The same message read by ClickHouse itself (ProtobufSingle with the .proto) and by chsink's decoder,
    into tables of the same columns: the same values, scalars at every width, enums, nested and repeated
    messages, and maps (whose entries protobuf leaves unordered: compared sorted by key)."""
    client, db = ch_db
    (tmp_path / "diff.proto").write_text(DIFF_PROTO)
    ds = compile_proto(DIFF_PROTO, tmp_path, "diff.proto")
    value = proto_message(ds, "diff.M", fields)
    for t in ("by_ch", "by_chsink"):
        client.command(f"CREATE TABLE IF NOT EXISTS {t} ({DIFF_COLUMNS}, _offset UInt64) ENGINE = MergeTree "
                       "ORDER BY _offset")
        client.command(f"TRUNCATE TABLE {t}")
    (tmp_path / "v.bin").write_bytes(value)
    structure = DIFF_COLUMNS.replace("'", "\\'")
    client.command(f"INSERT INTO by_ch SELECT *, 0 FROM file('{tmp_path}/v.bin', 'ProtobufSingle', "
                   f"'{structure}') SETTINGS format_schema = '{tmp_path}/diff.proto:M'")
    spec = DecoderSpec(Format.PROTOBUF, protobuf_descriptor_set=ds, protobuf_message="diff.M")
    assert load_rows(client, db, "by_chsink", [msg(value, offset=0)], spec) == []
    cols = [c.split()[0] for c in DIFF_COLUMNS.split(", ") if " " in c and not c.startswith(("a ", "b "))]
    text = ", ".join(f"toString({'mapSort(attrs)' if c == 'attrs' else c})" for c in cols)
    [ours] = client.query(f"SELECT {text} FROM by_chsink").result_rows
    [theirs] = client.query(f"SELECT {text} FROM by_ch").result_rows
    assert dict(zip(cols, ours, strict=True)) == dict(zip(cols, theirs, strict=True))


def test_the_example_sink_reads_its_message():
    """examples/protobuf.yaml carries a real descriptor set (its comment says how to make one) naming its message."""
    import yaml

    from hack.testbed.process import REPO

    fmt = yaml.safe_load((REPO / "examples" / "protobuf.yaml").read_text())["spec"]["format"]
    reader = ProtobufReader(fmt["protobufDescriptorSet"], fmt["protobufMessage"], None)
    assert reader(b"\x08\x07\x12\x03ann\x2a\x01x") == {"id": 7, "customer": "ann", "amount_cents": 0, "tags": ["x"]}


def test_a_set_made_without_its_imports_takes_the_well_known_types_from_protobuf(tmp_path):
    ds = compile_proto(PROTO, tmp_path, "shop.proto", include_imports=False)
    value = proto_message(compile_proto(PROTO, tmp_path, "shop.proto"), "shop.v1.Row",
                          {"ts": "2024-01-01T00:00:00Z", "maybe": "3"})
    assert ProtobufReader(ds, "shop.v1.Row", None)(value)["ts"] == "2024-01-01T00:00:00Z"


def test_schema_evolution_adds_the_fields_a_newer_message_brings(tmp_path):
    """addColumns reads Protobuf records as it reads JSON and Avro ones: the scalar fields of the message as
    configured (a newer descriptor set, or the writer's schema from a registry) that no column takes become
    Nullable columns; bytes and messages are left for the user to give a column."""
    from sparkapp.formats.evolution import new_columns

    ds = compile_proto('syntax = "proto3"; message V2 { uint64 id = 1; string country = 2; double score = 3; '
                       'bool flag = 4; bytes blob = 5; V2 child = 6; repeated int32 xs = 7; }', tmp_path, "v2.proto")
    schema = build_schema("d", "t", [("id", "UInt64", "", None), ("_offset", "UInt64", "", None)])
    read = ProtobufReader(ds, "V2", None)
    records = [read(proto_message(ds, "V2", {"id": "1", "country": "nl", "blob": "AA=="})), read(b"\x08\x02")]
    assert new_columns(schema, records) == {"country": "Nullable(String)", "score": "Nullable(Float64)",
                                            "flag": "Nullable(Bool)"}


def test_two_versions_of_one_message_are_each_read_with_their_own_fields(tmp_path):
    """A registry hands out several versions of a message under one name: each record is read with its writer's
    fields (one reader converts both, as the registry path does)."""
    from sparkapp.formats.protobuf import _Converter, load_descriptor_set, message_class

    v1 = compile_proto('syntax = "proto3"; package p; message M { int64 a = 1; }', tmp_path, "v1.proto")
    (tmp_path / "v2").mkdir()
    v2 = compile_proto('syntax = "proto3"; package p; message M { int64 a = 1; string b = 2; }', tmp_path / "v2",
                       "v1.proto")
    convert = _Converter(frozenset())
    m1 = message_class(load_descriptor_set(v1), "p.M").FromString(b"\x08\x01")
    m2 = message_class(load_descriptor_set(v2), "p.M").FromString(b"\x08\x02\x12\x01x")
    assert (convert.record(m1), convert.record(m2)) == ({"a": 1}, {"a": 2, "b": "x"})
