"""A Debezium change stream and an upsert stream through the real job, SIGKILLed mid-stream: every change
lands once (deletes as rows marked `_deleted`), a Debezium tombstone holds no row (the verifier counts it
instead of calling it a gap) while an upsert tombstone is its key's delete, and each key's last state is
the source's."""

from __future__ import annotations

import json
import random

from confluent_kafka import Producer

from .harness import SinkHarness

KEYS = 300
CHANGES = 3000

CHANGELOG = ("CREATE TABLE IF NOT EXISTS {db}.changes (id UInt64, v String, _op LowCardinality(String), _deleted UInt8, "
             "_topic LowCardinality(String), _partition UInt16, _offset UInt64) ENGINE = MergeTree "
             "ORDER BY (_topic, _partition, _offset) SETTINGS non_replicated_deduplication_window = 10000")


def test_change_stream_lands_once_with_deletes_and_tombstones(tmp_path, kafka, topic):
    src, dlq = topic(3), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq, maxOffsetsPerTrigger=500, blockOffsets=200)
    sink.config["clickhouse"]["tables"] = {src: "changes"}
    sink.config["format"] = {"envelope": "debezium"}
    sink.write_config()
    sink.sql(CHANGELOG.format(db=sink.db))
    rnd = random.Random(3)
    state: dict[int, str] = {}  # the source table, as the changes leave it
    p = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    tombstones = 0
    for i in range(CHANGES):
        k = rnd.randrange(KEYS)
        key = json.dumps({"id": k}).encode()
        if k in state and rnd.random() < 0.2:  # a delete, then its tombstone
            p.produce(src, json.dumps({"op": "d", "before": {"id": k, "v": state.pop(k)}, "after": None}).encode(),
                      key=key, partition=k % 3)
            p.produce(src, None, key=key, partition=k % 3)
            tombstones += 1
            continue
        op, v = ("u" if k in state else "c"), f"v{i}"
        event = {"op": op, "before": {"id": k, "v": state[k]} if k in state else None, "after": {"id": k, "v": v}}
        state[k] = v
        p.produce(src, json.dumps({"schema": {}, "payload": event} if i % 4 == 0 else event).encode(), key=key,
                  partition=k % 3)
    assert p.flush(30) == 0
    totals = killed_and_verified(sink)
    assert (totals["clickhouse"], totals["tombstones"], totals["dead_lettered"]) == \
        (totals["kafka"] - tombstones, tombstones, 0)
    assert last_states(sink) == state


def test_upsert_stream_lands_once_and_ends_as_the_compacted_topic(tmp_path, kafka, topic):
    """Keys are JSON objects holding the row's id, values the rest; a tombstone deletes its key, and one without
    a key is dead-lettered."""
    src, dlq = topic(3), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq, maxOffsetsPerTrigger=500, blockOffsets=200)
    sink.config["clickhouse"]["tables"] = {src: "changes"}
    sink.config["format"] = {"envelope": "upsert", "keyFormat": "json"}
    sink.write_config()
    sink.sql(CHANGELOG.format(db=sink.db))
    rnd = random.Random(4)
    state: dict[int, str] = {}  # what the compacted topic ends holding
    p = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for i in range(CHANGES):
        k = rnd.randrange(KEYS)
        key = json.dumps({"id": k}).encode()
        if k in state and rnd.random() < 0.2:
            del state[k]
            p.produce(src, None, key=key, partition=k % 3)
        else:
            state[k] = f"v{i}"
            p.produce(src, json.dumps({"v": state[k]}).encode(), key=key, partition=k % 3)
    p.produce(src, None, partition=0)  # deletes nothing it could name
    assert p.flush(30) == 0
    totals = killed_and_verified(sink)
    assert (totals["clickhouse"], totals["tombstones"], totals["dead_lettered"]) == (CHANGES, 0, 1)
    assert last_states(sink) == state


def killed_and_verified(sink: SinkHarness) -> dict:
    sink.start("--quiet")
    assert sink.wait_for_batches(2)
    sink.kill()  # somewhere inside the stream
    sink.drain()
    report = sink.verify()
    assert report["ok"], report["totals"]
    return report["totals"]


def last_states(sink: SinkHarness) -> dict[int, str]:
    [latest] = sink.sql(f"SELECT id, argMax(v, _offset), argMax(_deleted, _offset) FROM {sink.db}.changes "
                        "GROUP BY id HAVING argMax(_deleted, _offset) = 0 ORDER BY id")
    return {r[0]: r[1] for r in latest}
