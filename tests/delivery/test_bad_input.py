"""Bad records become dead letters with precise reasons on the real DLQ topic; valid rows still land."""

from __future__ import annotations

import json

import pytest

from sparkapp.config import Engine
from sparkapp.delivery.context import UndeliverableError, WriterContext
from sparkapp.delivery.writer import write_partition
from sparkapp.edges.clickhouse import load_schema
from sparkapp.edges.dlq import (
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_REASON,
    HEADER_SINK,
    HEADER_TOPIC,
    KafkaDeadLetterSink,
)
from sparkapp.edges.insert import Inserter
from sparkapp.edges.store import PartitionKey, StateStore
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from tests.formats.test_types import AVRO_RECORD, AVRO_SCHEMA, AVRO_TABLE, avro_bytes
from tests.helpers import msg, read_dlq

TABLE = (
    "CREATE TABLE ev (id UInt32, small Int8, price Decimal(5, 2), name String, kind Enum8('a' = 1, 'b' = 2), "
    "_topic String, _partition UInt32, _offset UInt64) ENGINE = MergeTree ORDER BY (_partition, _offset) "
    "SETTINGS non_replicated_deduplication_window = 1000"
)
GOOD = {"id": 1, "small": 1, "price": "1.00", "name": "n", "kind": "a"}

BAD = [
    (b'{"id": 2, "small": ', "malformed JSON: Expecting value at line 1 column 20"),
    (json.dumps({**GOOD, "id": "two"}).encode(), "column `id`: expected UInt32, got string \"two\""),
    (json.dumps({**GOOD, "small": 300}).encode(), "column `small`: value 300 out of range for Int8 [-128, 127]"),
    (json.dumps({**GOOD, "price": "12345.67"}).encode(), "column `price`: value 12345.67 out of range for Decimal(5, 2)"),
    (json.dumps({**GOOD, "name": None}).encode(), "column `name`: null for non-Nullable String"),
    (json.dumps({**GOOD, "kind": "zzz"}).encode(), "column `kind`: unknown Enum8 value \"zzz\"; allowed: 'a', 'b'"),
    (None, "tombstone: the record has a null value"),
]


def make_ctx(client, db, table, spec, dlq=None, sink="s1"):
    store = StateStore(client, f"state_{db}", Engine.KEEPER_MAP, keeper_path=f"/bad_{db}")
    store.ensure_schema()
    schema = load_schema(client, db, table)
    return WriterContext(sink, store, Inserter(client, schema), make_decoder(spec, schema),
                         store.acquire_epoch(sink), block_offsets=4, dlq=dlq)


def test_bad_json_records_are_dead_lettered_with_reasons(ch_db, kafka, topic):
    client, db = ch_db
    client.command(TABLE)
    dlq_topic = topic(1)
    ctx = make_ctx(client, db, "ev", DecoderSpec(Format.JSON),
                   KafkaDeadLetterSink(dlq_topic, {"bootstrap.servers": kafka.bootstrap}))
    messages = [msg({**GOOD, "id": 100}, offset=0, topic="src", partition=2)]
    messages += [msg(raw, offset=i + 1, topic="src", partition=2) for i, (raw, _) in enumerate(BAD)]
    messages += [msg({**GOOD, "id": 101}, offset=len(BAD) + 1, topic="src", partition=2)]
    res = write_partition(ctx, PartitionKey("s1", "src", 2), messages)
    assert (res.inserted_rows, res.dead_lettered) == (2, len(BAD))
    assert client.query("SELECT id, _offset FROM ev ORDER BY _offset").result_rows == [(100, 0), (101, len(BAD) + 1)]

    dead = read_dlq(kafka.bootstrap, dlq_topic, len(BAD))
    by_offset = {int(dict(m.headers())[HEADER_OFFSET]): m for m in dead}
    for i, (raw, reason) in enumerate(BAD):
        m = by_offset[i + 1]
        h = dict(m.headers())
        assert h[HEADER_REASON].decode().startswith(reason), h[HEADER_REASON]
        assert h[HEADER_REASON].decode().endswith(f"(at src/2@{i + 1})")
        assert (h[HEADER_TOPIC], h[HEADER_PARTITION], h[HEADER_SINK]) == (b"src", b"2", b"s1")
        assert m.value() == raw  # the original payload, untouched


def test_truncated_avro_is_dead_lettered(ch_db, kafka, topic):
    client, db = ch_db
    client.command(AVRO_TABLE)
    dlq_topic = topic(1)
    ctx = make_ctx(client, db, "av", DecoderSpec(Format.AVRO, avro_schema=json.dumps(AVRO_SCHEMA)),
                   KafkaDeadLetterSink(dlq_topic, {"bootstrap.servers": kafka.bootstrap}))
    good = avro_bytes(AVRO_RECORD)
    res = write_partition(ctx, PartitionKey("s1", "t", 0), [msg(good, 0), msg(good[:-7], 1), msg(good, 2)])
    assert (res.inserted_rows, res.dead_lettered) == (2, 1)
    [m] = read_dlq(kafka.bootstrap, dlq_topic, 1)
    assert dict(m.headers())[HEADER_REASON].decode().startswith("avro: truncated record")


def test_without_dlq_bad_records_stop_the_partition_and_nothing_moves(ch_db):
    client, db = ch_db
    client.command(TABLE)
    ctx = make_ctx(client, db, "ev", DecoderSpec(Format.JSON), dlq=None)
    pk = PartitionKey("s1", "src", 0)
    with pytest.raises(UndeliverableError, match=r"1 record\(s\) cannot be delivered.*out of range for Int8"):
        write_partition(ctx, pk, [msg(GOOD, 0), msg({**GOOD, "small": 999}, 1)])
    assert client.query("SELECT count() FROM ev").result_rows == [(0,)]
    assert ctx.store.get(pk).state.phase.value == "BEFORE"  # retried identically once fixed or diverted


def test_unknown_fields_rejected_when_configured(ch_db):
    client, db = ch_db
    client.command(TABLE)
    schema = load_schema(client, db, "ev")
    decode = make_decoder(DecoderSpec(Format.JSON, unknown_fields="reject"), schema)
    with pytest.raises(ValueError, match=r"unknown field.*extra"):
        decode(msg({**GOOD, "extra": 1}))


def test_a_record_whose_text_reads_like_a_network_error_is_dead_lettered_not_retried(ch_db, kafka, topic):
    """ClickHouse quotes a rejected record in its error; whether to retry is decided by the error's code,
    so a record saying "connection reset ... timeout" is bad data, not an outage that stalls its partition."""
    from sparkapp.delivery.writer import write_lines
    from tests.helpers import line_batch

    client, db = ch_db
    client.command(TABLE)
    dlq_topic = topic(1)
    ctx = make_ctx(client, db, "ev", DecoderSpec(Format.JSON),
                   KafkaDeadLetterSink(dlq_topic, {"bootstrap.servers": kafka.bootstrap}))
    ctx.inserter.retries = 1
    poison = {**GOOD, "id": "upstream connection timeout: Connection reset by peer (network)"}
    messages = [msg({**GOOD, "id": 10 + i} if i != 3 else poison, offset=i, topic="src") for i in range(8)]
    res = write_lines(ctx, PartitionKey("s1", "src", 0), line_batch(messages, ctx.inserter.schema.names))
    assert (res.inserted_rows, res.dead_lettered) == (7, 1)
    [dead] = read_dlq(kafka.bootstrap, dlq_topic, 1)
    assert dict(dead.headers())[HEADER_REASON].decode().startswith("column `id`: expected UInt32")
