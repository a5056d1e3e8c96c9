"""Records in Confluent's wire format, read with the writer's schema a Confluent-compatible registry holds.

Against a real registry (Apicurio's, through its Confluent API; the `schema_registry` fixture): Avro records
written by Confluent's own serializer under two versions of a schema, each read with its own, and a schema naming
types other subjects' schemas define; Protobuf records of every field type, registered as Confluent's Python
client registers them (a serialized descriptor, base64) and as its Java client does (.proto source), with the
files they import registered as references. A .proto source protoc refuses dead-letters its records.

A schema registry that does not answer is an outage: the partition waits for it (delivery/runtime.py stalls it
as on a shard outage), and no record is dead-lettered for it (before, every framed record became a dead letter
while the registry was down). One that answers that it has no such schema (404) makes the record a dead letter
with that reason: a port nobody listens on, and a real HTTP server (Python's own, over an empty folder)."""

from __future__ import annotations

import http.server
import json
import struct
import threading

import pytest

from hack.testbed.process import free_port
from sparkapp.edges.errors import worth_retrying
from sparkapp.formats.avro import AvroReader
from sparkapp.formats.protobuf import ProtobufReader
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from sparkapp.formats.rows import DecodeError, decode_batch
from sparkapp.formats.schema import build_schema
from sparkapp.formats.schema_registry import RegistryUnavailableError
from tests.formats.test_protobuf import EXPECTED, PROTO, ROW, TABLE
from tests.helpers import load_rows, msg, register_schema, registry_client, registry_protobuf_writer

FRAMED = {"avro": b"\x00" + struct.pack(">I", 7) + b"\x02", "protobuf": b"\x00" + struct.pack(">I", 7) + b"\x00\x08\x01"}


def reader(fmt: str, url: str):
    return AvroReader(None, url) if fmt == "avro" else ProtobufReader(None, None, url)


CURRENCY = {"type": "enum", "name": "Currency", "namespace": "acme", "symbols": ["EUR", "USD"]}


def register_avro(url: str, subject: str, schema: dict, *refs: tuple[str, str]) -> int:
    """Registers an Avro schema naming the types of `refs` ((type name, subject), version 1 of each); its id."""
    return register_schema(url, subject, json.dumps(schema), [{"name": n, "subject": s, "version": 1}
                                                              for n, s in refs], schema_type="AVRO")


def avro_framed(schema_id: int, schema: dict, record: dict, *referenced: dict) -> bytes:
    """A record in Confluent's wire format, written with `schema`, which names the types of `referenced` (each
    after those it names)."""
    import io

    import fastavro

    named: dict[str, object] = {}
    for r in referenced:
        fastavro.parse_schema(r, named_schemas=named)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema, named_schemas=named), record)
    return b"\0" + struct.pack(">I", schema_id) + buf.getvalue()


@pytest.fixture
def empty_http_server(tmp_path):
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("fmt", ["avro", "protobuf"])
def test_a_registry_that_does_not_answer_is_an_outage_not_a_dead_letter(fmt):
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    with pytest.raises(RegistryUnavailableError, match="did not answer") as e:
        reader(fmt, url)(FRAMED[fmt])
    assert worth_retrying(e.value), "the job waits for it as for any outage"
    schema = build_schema("d", "t", [("a", "Int64", "", None), ("_offset", "UInt64", "", None)])
    spec = DecoderSpec(Format(fmt), schema_registry_url=url)
    with pytest.raises(RegistryUnavailableError):  # not caught as the record's fault: the batch fails, and waits
        decode_batch(make_decoder(spec, schema), [msg(FRAMED[fmt])])


@pytest.mark.parametrize("fmt", ["avro", "protobuf"])
def test_a_registry_without_the_schema_dead_letters_the_record(fmt, empty_http_server):
    with pytest.raises(DecodeError, match=r"not found at http://127\.0\.0\.1:\d+/.*7.* \(404\)"):
        reader(fmt, empty_http_server)(FRAMED[fmt])


@pytest.mark.parametrize("form", ["python-client", "proto-source"])
def test_protobuf_of_every_field_type_is_read_with_the_registrys_schema(ch_db, schema_registry, tmp_path, form):
    """The full type matrix of the descriptor-set test, its schema fetched from the registry whichever way the
    producer registered it, stores exactly what the descriptor set stores."""
    client, db = ch_db
    client.command(TABLE)
    subject = f"every-type-{form}"
    value = registry_protobuf_writer(schema_registry.url, subject, "shop.v1.Row", form, {"shop.proto": PROTO},
                                     tmp_path)(ROW)
    spec = DecoderSpec(Format.PROTOBUF, schema_registry_url=schema_registry.url)
    assert load_rows(client, db, "pb", [msg(value, offset=1)], spec) == []
    names = list(EXPECTED)
    got = client.query(f"SELECT {', '.join(f'toString({c})' for c in names)} FROM pb").result_rows[0]
    assert dict(zip(names, got, strict=True)) == EXPECTED


COMMON = """syntax = "proto3";
package common.v1;
message Money { string currency = 1; int64 units = 2; }
"""
ORDER = """syntax = "proto3";
package shop.v1;
import "common/money.proto";
import "google/protobuf/timestamp.proto";
message Note { string text = 1; }
message Order { int64 id = 1; common.v1.Money total = 2; google.protobuf.Timestamp at = 3; }
"""
SOURCES = {"common/money.proto": COMMON, "shop/order.proto": ORDER}


@pytest.mark.parametrize("form", ["python-client", "proto-source"])
def test_protobuf_imports_are_fetched_as_references(ch_db, schema_registry, tmp_path, form):
    """A schema that imports another file of the producer's names it as a reference; the reader fetches it too,
    and reads the second message of the file by its index."""
    client, db = ch_db
    client.command("CREATE TABLE orders (id Int64, total Tuple(currency String, units Int64), "
                   "at DateTime64(3, 'UTC'), _offset UInt64) ENGINE = MergeTree ORDER BY _offset")
    fields = {"id": 9, "total": {"currency": "EUR", "units": 12}, "at": "2024-05-01T10:00:00.250Z"}
    value = registry_protobuf_writer(schema_registry.url, f"orders-{form}", "shop.v1.Order", form, SOURCES,
                                     tmp_path)(fields)
    spec = DecoderSpec(Format.PROTOBUF, schema_registry_url=schema_registry.url)
    assert load_rows(client, db, "orders", [msg(value, offset=1)], spec) == []
    assert client.query("SELECT id, total, toString(at) FROM orders").result_rows == [
        (9, {"currency": "EUR", "units": 12}, "2024-05-01 10:00:00.250")]


def test_avro_records_are_each_read_with_the_schema_version_they_name(ch_db, schema_registry):
    """Confluent's Avro serializer registers each version of a subject's schema; a record names its own, and is
    read with it: the field a later version added is there in its records and left to its DEFAULT in the earlier."""
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client, db = ch_db
    client.command("CREATE TABLE av (a Int64, s String, b Nullable(Int32), _offset UInt64) "
                   "ENGINE = MergeTree ORDER BY _offset")
    registry = registry_client(schema_registry.url)
    v1 = '{"type": "record", "name": "E", "fields": [{"name": "a", "type": "long"}, {"name": "s", "type": "string"}]}'
    v2 = json.dumps({**json.loads(v1), "fields": [*json.loads(v1)["fields"],
                                                   {"name": "b", "type": ["null", "int"], "default": None}]})
    ctx = SerializationContext("avro-versions", MessageField.VALUE)
    first = AvroSerializer(registry, v1)({"a": 1, "s": "x"}, ctx)
    second = AvroSerializer(registry, v2)({"a": 2, "s": "y", "b": 5}, ctx)
    assert first[1:5] != second[1:5], "two schema ids"
    spec = DecoderSpec(Format.AVRO, schema_registry_url=schema_registry.url)
    assert load_rows(client, db, "av", [msg(first, offset=1), msg(second, offset=2)], spec) == []
    assert client.query("SELECT a, s, b FROM av ORDER BY _offset").result_rows == [(1, "x", None), (2, "y", 5)]


def test_a_proto_source_that_does_not_compile_dead_letters_its_records_with_the_reason(tmp_path, empty_http_server):
    """A registry that serves a schema only as .proto source, and a source protoc refuses (a missing `;`)."""
    (tmp_path / "schemas" / "ids").mkdir(parents=True)
    (tmp_path / "schemas" / "ids" / "7").write_text(json.dumps(
        {"schema": 'syntax = "proto3";\nmessage X { int32 a = 1 }\n', "schemaType": "PROTOBUF"}))
    with pytest.raises(DecodeError, match=r"schemas/ids/7 is \.proto source that protoc cannot compile \(exit 1\)"):
        reader("protobuf", empty_http_server)(FRAMED["protobuf"])


def test_avro_types_another_subject_defines_are_fetched_as_references(ch_db, schema_registry):
    """A schema that names a record type of another subject's schema (a reference, which names another in turn)
    is read with both."""
    client, db = ch_db
    client.command("CREATE TABLE refs (id Int64, total Tuple(currency String, units Int64), _offset UInt64) "
                   "ENGINE = MergeTree ORDER BY _offset")
    money = {"type": "record", "name": "Money", "namespace": "acme",
             "fields": [{"name": "currency", "type": "acme.Currency"}, {"name": "units", "type": "long"}]}
    order = {"type": "record", "name": "Order", "namespace": "acme",
             "fields": [{"name": "id", "type": "long"}, {"name": "total", "type": "acme.Money"}]}
    url = schema_registry.url
    register_avro(url, "acme-currency", CURRENCY)
    register_avro(url, "acme-money", money, ("acme.Currency", "acme-currency"))
    schema_id = register_avro(url, "acme-order-value", order, ("acme.Money", "acme-money"))
    value = avro_framed(schema_id, order, {"id": 3, "total": {"currency": "USD", "units": 250}}, CURRENCY, money)
    spec = DecoderSpec(Format.AVRO, schema_registry_url=url)
    assert load_rows(client, db, "refs", [msg(value, offset=1)], spec) == []
    assert client.query("SELECT id, total FROM refs").result_rows == [(3, {"currency": "USD", "units": 250})]


def test_an_avro_key_whose_schema_references_another_subject_fills_its_columns(ch_db, schema_registry):
    """`keyFormat: avro` with a registry: the key's schema names an enum another subject's schema defines; the key
    is read with both, and its fields fill their columns beside the JSON value's."""
    from sparkapp.formats.record_key import KeyFormat

    client, db = ch_db
    client.command("CREATE TABLE keyed (currency String, user Int64, amount Int64, _offset UInt64) "
                   "ENGINE = MergeTree ORDER BY _offset")
    key = {"type": "record", "name": "Key", "namespace": "acme",
           "fields": [{"name": "currency", "type": "acme.Currency"}, {"name": "user", "type": "long"}]}
    url = schema_registry.url
    register_avro(url, "key-currency", CURRENCY)
    key_id = register_avro(url, "keyed-key", key, ("acme.Currency", "key-currency"))
    framed_key = avro_framed(key_id, key, {"currency": "USD", "user": 42}, CURRENCY)
    spec = DecoderSpec(Format.JSON, key_format=KeyFormat.AVRO, schema_registry_url=url)
    assert load_rows(client, db, "keyed", [msg({"amount": 7}, offset=1, key=framed_key)], spec) == []
    assert client.query("SELECT currency, user, amount FROM keyed").result_rows == [("USD", 42, 7)]
