"""Schema evolution through the real job (`format.addColumns`), SIGKILLed between the arrival of new fields:
the table gains a Nullable column per new field, every record lands once, and every value as produced."""

from __future__ import annotations

import json

from confluent_kafka import Producer

from .harness import SinkHarness, event


def record(i: int) -> dict:
    r = event(i)
    if i >= 1000:
        r["country"] = f"c{i % 7}"
    if i >= 2500:
        r["score"] = i / 4
    return r


def test_new_fields_become_columns_and_a_restart_keeps_every_value(tmp_path, kafka, topic):
    src, dlq = topic(2), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq, maxOffsetsPerTrigger=600, blockOffsets=200)
    sink.config["format"] = {"addColumns": True}
    sink.write_config()
    p = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})

    def produce(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            p.produce(src, json.dumps(record(i)).encode(), partition=i % 2)
        assert p.flush(30) == 0

    produce(0, 2000)
    sink.start("--quiet")
    assert sink.wait_for_batches(3)
    sink.kill()
    produce(2000, 3000)
    sink.drain()
    report = sink.verify()
    assert report["ok"] and report["totals"]["clickhouse"] == 3000, report["totals"]
    [cols] = sink.sql(f"SELECT name, type FROM system.columns WHERE database = '{sink.db}' AND table = 'events' "
                      "AND name IN ('country', 'score') ORDER BY position")
    assert cols == [["country", "Nullable(String)"], ["score", "Nullable(Float64)"]]
    [rows] = sink.sql(f"SELECT id, country, score FROM {sink.db}.events ORDER BY id")
    assert rows == [[i, record(i).get("country"), record(i).get("score")] for i in range(3000)]
