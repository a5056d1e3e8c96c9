"""A Protobuf topic through the real job on production's path (a ClickHouse server over HTTP, executors
decoding and writing), SIGKILLed mid-stream and its checkpoint lost: every message lands once with every value
as sent (plain and in Confluent's wire format, a Timestamp to the nanosecond, wrappers as NULL when unset, a
google.protobuf.Value of every kind in a Dynamic column with its type),
and each bad value is dead-lettered once."""

from __future__ import annotations

import base64
import random

from confluent_kafka import Producer

from tests.helpers import compile_proto, proto_message

from .harness import SinkHarness

PROTO = """
syntax = "proto3";
package shop.v1;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
message Order {
  uint64 id = 1; string name = 2; int64 cents = 3; google.protobuf.Timestamp ts = 4; repeated string tags = 5;
  map<string, string> attrs = 6; google.protobuf.StringValue note = 7; Status status = 8;
  enum Status { NEW = 0; PAID = 1; SHIPPED = 2; }
  google.protobuf.Value extra = 9;
}
"""
TABLE = ("CREATE TABLE IF NOT EXISTS {db}.orders (id UInt64, name LowCardinality(String), cents Int64, "
         "ts DateTime64(9, 'UTC'), tags Array(String), attrs Map(String, String), note Nullable(String), "
         "status Enum8('NEW' = 0, 'PAID' = 1, 'SHIPPED' = 2), extra Dynamic, _topic LowCardinality(String), _partition UInt16, "
         "_offset UInt64) ENGINE = MergeTree ORDER BY (_topic, _partition, _offset) "
         "SETTINGS non_replicated_deduplication_window = 10000")
FRAME = b"\x00\x00\x00\x00\x2a\x00"  # Confluent's wire format: magic byte, schema id 42, message indexes [0]
N = 3000


def order(i: int) -> dict:
    return {"id": str(i), "name": f"user{i % 13}", "cents": str(-i * 1001), "ts": f"2026-11-25T10:00:{i % 60:02d}."
            f"{i:09d}Z", "tags": [f"t{j}" for j in range(i % 3)], "attrs": {"k": str(i % 5)} if i % 2 else {},
            **({"note": f"n{i}"} if i % 4 else {}), "status": ["NEW", "PAID", "SHIPPED"][i % 3],
            "extra": [i, f"x{i}", [i, i + 1], {"k": i}, True][i % 5]}


# what the Dynamic column holds of each kind of google.protobuf.Value (numbers are doubles in a Value)
EXTRA = [("Float64", "{i}"), ("String", "x{i}"), ("Array(Float64)", "[{i},{j}]"), ("JSON", '{{"k":{i}}}'),
         ("Bool", "true")]


def test_protobuf_topic_lands_once_with_every_value_on_the_http_executor_path(tmp_path, kafka, topic,
                                                                              clickhouse_server):
    src, dlq = topic(3), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq, engine="KeeperMap", server=clickhouse_server,
                       maxOffsetsPerTrigger=400, blockOffsets=150)
    descriptor_set = compile_proto(PROTO, tmp_path, "order.proto")
    sink.config["clickhouse"]["tables"] = {src: "orders"}
    sink.config["format"] = {"type": "protobuf", "protobufDescriptorSet": descriptor_set,
                             "protobufMessage": "shop.v1.Order"}
    sink.write_config()
    sink.sql(TABLE.format(db=sink.db))
    rnd = random.Random(11)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    bad = 0
    for i in range(N):
        value = proto_message(descriptor_set, "shop.v1.Order", order(i))
        if i % 5 == 0:
            value = FRAME + value
        if i % 331 == 7:  # cut short: a field's length runs past the end
            value, bad = value + b"\x12\x05ab", bad + 1
        p.produce(src, value, partition=rnd.randrange(3))
    assert p.flush(30) == 0
    sink.start("--quiet")
    assert sink.wait_for_batches(2, timeout=240)
    sink.kill()
    sink.delete_checkpoint()
    sink.drain()
    assert "; writer on executors" in sink.logs[0].read_text(errors="replace")
    report = sink.verify()
    assert report["ok"], report
    assert (report["totals"]["clickhouse"], report["totals"]["dead_lettered"]) == (N - bad, bad)
    [rows] = sink.sql(f"SELECT id, name, cents, toString(ts), tags, attrs, note, status, dynamicType(extra), "
                      f"toString(extra) FROM {sink.db}.orders ORDER BY id")
    expected = []
    for i in range(N):
        if i % 331 == 7:
            continue
        o = order(i)
        kind, text = EXTRA[i % 5]
        expected.append([i, o["name"], -i * 1001, o["ts"].replace("T", " ").rstrip("Z"), o["tags"], o["attrs"],
                         o.get("note"), o["status"], kind, text.format(i=i, j=i + 1)])
    assert rows == expected
    assert base64.b64decode(descriptor_set)  # the config carried the set as base64 text
