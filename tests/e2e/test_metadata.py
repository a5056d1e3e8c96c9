"""Kafka metadata through the real job: what Spark's source hands over (headers, the timestamp and its type
on a LogAppendTime topic) lands as a re-read from Kafka (the decoding path's retry) reads it."""

from __future__ import annotations

import json

from confluent_kafka import Producer

from sparkapp.config import KafkaConfig
from sparkapp.core.state_machine import OffsetRange
from sparkapp.edges.kafka import read_range
from sparkapp.formats.rows import header_map

from .harness import SinkHarness, event

N = 200


def test_headers_timestamp_and_its_type_land_as_kafka_has_them(tmp_path, kafka, topic):
    src, dlq = topic(2, {"message.timestamp.type": "LogAppendTime"}), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq)
    sink.sql("ALTER TABLE e2e.events ADD COLUMN _timestamp DateTime64(3, 'UTC')")
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(N):
        headers = [("trace", b"t%d" % i), ("trace", b"last"), ("bin", b"\xff")] if i % 2 else None
        p.produce(src, json.dumps(event(i)).encode(), key=b"k%d" % i, partition=i % 2, headers=headers,
                  timestamp=1_600_000_000_000 + i)  # a producer's time, which the broker replaces
    assert p.flush(30) == 0
    sink.drain()
    [rows] = sink.sql("SELECT _partition, _offset, toString(_timestamp_type), toUnixTimestamp64Milli(_timestamp), "
                      "_headers FROM e2e.events ORDER BY _partition, _offset")
    cfg = KafkaConfig.model_validate({"bootstrapServers": kafka.bootstrap, "topics": [src]})
    again = [m for part in (0, 1) for m in read_range(cfg, src, part, OffsetRange(0, N // 2 - 1))]
    assert len(rows) == len(again) == N
    assert {m.timestamp_type for m in again} == {1} and all(m.timestamp_ms > 1_700_000_000_000 for m in again)
    assert rows == [[m.partition, m.offset, "LogAppendTime", m.timestamp_ms, header_map(m.headers)] for m in again]
    assert rows[N // 2][4] == {"trace": "last", "bin": "\ufffd"}  # partition 1 holds the odd records
