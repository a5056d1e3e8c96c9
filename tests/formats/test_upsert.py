"""Record keys into columns (`keyFormat`) and upserts of plain keyed topics (`envelope: upsert`): the key's
fields fill columns and win over the value's, a tombstone is its key's delete, what cannot be read is
dead-lettered naming the key; a ReplacingMergeTree (real chdb) ends holding what the compacted topic holds."""

from __future__ import annotations

import io
import json

import fastavro
import pytest

from sparkapp.config import FormatConfig
from sparkapp.core.blocks import build_blocks
from sparkapp.core.state_machine import OffsetRange
from sparkapp.edges.clickhouse import load_schema
from sparkapp.edges.insert import Inserter
from sparkapp.formats.record_key import KeyFormat
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from sparkapp.formats.rows import decode_batch
from tests.helpers import msg

TABLE = ("CREATE TABLE {name} (id UInt64, region LowCardinality(String), v String, _key Nullable(String), "
         "_offset UInt64, _op LowCardinality(String), _deleted UInt8) "
         "ENGINE = ReplacingMergeTree(_offset, _deleted) ORDER BY (region, id)")
KEY_SCHEMA = {"type": "record", "name": "K", "fields": [{"name": "id", "type": "long"},
                                                          {"name": "region", "type": "string"}]}


def avro(record: dict, schema: dict = KEY_SCHEMA) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return buf.getvalue()


def j(v: object) -> bytes:
    return json.dumps(v).encode()


def rows_of(client, db, table, spec, msgs):
    schema = load_schema(client, db, table)
    rows, dead = decode_batch(make_decoder(spec, schema), msgs)
    return schema, rows, {d.message.offset: d.reason for d in dead}


@pytest.mark.parametrize("key_format", [KeyFormat.JSON, KeyFormat.AVRO])
def test_the_keys_fields_fill_columns_and_win_over_the_values(ch_db, key_format):
    client, db = ch_db
    client.command(TABLE.format(name="t").replace("ReplacingMergeTree(_offset, _deleted)", "MergeTree"))
    key = (lambda k: avro(k)) if key_format is KeyFormat.AVRO else j
    spec = DecoderSpec(Format.JSON, key_format=key_format, key_avro_schema=json.dumps(KEY_SCHEMA))
    msgs = [msg({"v": "a"}, 0, key=key({"id": 1, "region": "eu"})),
            msg({"v": "b", "id": 9, "region": "us"}, 1, key=key({"id": 2, "region": "eu"})),  # the key wins
            msg({"v": "c", "id": 3, "region": "us"}, 2)]  # no key: the value's fields alone
    if key_format is KeyFormat.JSON:  # Kafka Connect's JSON converter wraps it
        msgs.append(msg({"v": "d"}, 3, key=j({"schema": {"type": "struct"}, "payload": {"id": 4, "region": "ap"}})))
    schema, rows, dead = rows_of(client, db, "t", spec, msgs)
    assert dead == {}
    at = {n: i for i, n in enumerate(schema.names)}
    assert [(r[at["id"]], r[at["region"]], r[at["v"]]) for _, r in rows] == \
        [(1, "eu", "a"), (2, "eu", "b"), (3, "us", "c"), (4, "ap", "d")][:len(msgs)]


@pytest.mark.parametrize(("spec", "key", "why"), [
    (DecoderSpec(key_format=KeyFormat.JSON), b'{"id": 1', "key: malformed JSON: Expecting ',' delimiter"),
    (DecoderSpec(key_format=KeyFormat.JSON), b"42", "key: JSON value is a number, expected an object"),
    (DecoderSpec(key_format=KeyFormat.JSON), j({"schema": {}, "payload": 7}), "key: the converter's `payload` is not"),
    (DecoderSpec(key_format=KeyFormat.JSON), j({"id": "x", "region": "eu"}), "column `id`: "),
    (DecoderSpec(key_format=KeyFormat.AVRO, key_avro_schema=json.dumps(KEY_SCHEMA)), b"\x02", "key: avro: truncated"),
    (DecoderSpec(envelope="upsert"), None, "upsert tombstone without a key: it names no row to delete"),
])
def test_a_key_that_cannot_be_read_dead_letters_its_record_with_the_reason(ch_db, spec, key, why):
    client, db = ch_db
    client.command(TABLE.format(name="t"))
    value = None if spec.envelope == "upsert" else j({"v": "a"})
    _, rows, dead = rows_of(client, db, "t", spec, [msg(value, 5, key=key)])
    assert rows == [] and why in dead[5] and "t/0@5" in dead[5]


def test_upserts_end_as_the_compacted_topics_last_state(ch_db):
    """A value is its key's row (`_op` u), a tombstone its key's delete (`_deleted` 1); FINAL drops deleted keys.
    With keyFormat none the key's text alone (`_key`) names the row."""
    client, db = ch_db
    client.command(TABLE.format(name="cur"))
    spec = DecoderSpec(Format.JSON, envelope="upsert", key_format=KeyFormat.JSON)
    k1, k2, k3 = (j({"id": i, "region": "eu"}) for i in (1, 2, 3))
    log = [(k1, {"v": "a"}), (k2, {"v": "x"}), (k1, {"v": "b"}), (k2, None), (k3, {"v": "y"}), (k3, None),
           (k3, {"v": "z"}), (None, {"v": "keyless", "id": 7, "region": "us"})]
    schema, rows, dead = rows_of(client, db, "cur", spec, [msg(v, i, key=k) for i, (k, v) in enumerate(log)])
    assert dead == {}
    at = {n: i for i, n in enumerate(schema.names)}
    assert [(r[at["id"]], r[at["_op"]], r[at["_deleted"]]) for _, r in rows] == \
        [(1, "u", 0), (2, "u", 0), (1, "u", 0), (2, "d", 1), (3, "u", 0), (3, "d", 1), (3, "u", 0), (7, "u", 0)]
    for block in build_blocks(OffsetRange(0, len(log) - 1), rows, schema.names, 100, lambda w: "t"):
        Inserter(client, schema).insert(block)
    final = client.query("SELECT id, v FROM cur FINAL ORDER BY id").result_rows
    assert [tuple(r) for r in final] == [(1, "b"), (3, "z"), (7, "keyless")]

    client.command("CREATE TABLE bykey (_key String, v String, _offset UInt64, _deleted UInt8) "
                   "ENGINE = ReplacingMergeTree(_offset, _deleted) ORDER BY _key")
    schema, rows, dead = rows_of(client, db, "bykey", DecoderSpec(Format.JSON, envelope="upsert"),
                                 [msg({"v": "a"}, 0, key=b"a"), msg({"v": "b"}, 1, key=b"b"), msg(None, 2, key=b"a")])
    for block in build_blocks(OffsetRange(0, 2), rows, schema.names, 100, lambda w: "t2"):
        Inserter(client, schema).insert(block)
    assert client.query("SELECT _key, v FROM bykey FINAL").result_rows == [("b", "b")]


def test_an_upsert_table_must_say_what_is_deleted(ch_db):
    client, db = ch_db
    client.command("CREATE TABLE nodel (id UInt64) ENGINE = MergeTree ORDER BY id")
    with pytest.raises(ValueError, match="envelope upsert needs a `_deleted` column"):
        make_decoder(DecoderSpec(envelope="upsert"), load_schema(client, db, "nodel"))


@pytest.mark.parametrize(("fmt", "why"), [
    ({"keyFormat": "avro"}, "keyFormat avro needs `keyAvroSchema` or `schemaRegistryUrl`"),
    ({"keyFormat": "xml"}, "keyFormat"),
])
def test_key_format_config_is_checked(fmt, why):
    with pytest.raises(ValueError, match=why):
        FormatConfig.model_validate(fmt)


def test_only_plain_json_values_take_the_fast_path():
    assert FormatConfig.model_validate({}).clickhouse_parses
    for other in ({"keyFormat": "json"}, {"envelope": "upsert"}, {"envelope": "debezium"}, {"addColumns": True},
                  {"parser": "python"}):
        assert not FormatConfig.model_validate(other).clickhouse_parses, other
