"""Fault injection on the real job: SIGKILLs at random moments while a producer keeps writing, lost
checkpoints, a ZooKeeper restart and a Kafka broker restart. Every produced offset must end up in
ClickHouse exactly once or in the dead-letter topic exactly once.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from .harness import HEADERS_WRONG, BackgroundProducer, SinkHarness

KILLS = int(os.environ.get("CHSINK_FAULT_KILLS", "10"))


def check_exactly_once(sink: SinkHarness, produced: int, bad: int) -> dict:
    report = sink.verify()
    totals = report["totals"]
    assert report["ok"], f"verifier found anomalies: {totals}"
    assert totals["duplicates"] == 0 and totals["gaps"] == 0 and totals["pending"] == 0
    assert (totals["clickhouse"], totals["dead_lettered"]) == (produced - bad, bad)
    [[count, unique]] = sink.sql(f"SELECT count(), uniqExact(_topic, _partition, _offset) FROM {sink.db}.events")[0]
    assert count == unique == produced - bad
    [[wrong]] = sink.sql(f"SELECT count() FROM {sink.db}.events WHERE {HEADERS_WRONG}")[0]
    assert wrong == 0, "a row's Kafka headers or timestamp type not stored as produced"
    return report


def run_with_faults(sink: SinkHarness, producer: BackgroundProducer, kills: int, rnd: random.Random,
                    zookeeper=None, kafka=None) -> list[str]:
    faults: list[str] = []
    for i in range(kills):
        sink.start("--quiet")
        if not sink.wait_for_batches(rnd.randint(1, 3)):
            faults.append(f"run {i}: exited by itself ({sink.proc.returncode})")
            continue
        time.sleep(rnd.uniform(0.0, 2.5))  # somewhere inside a batch, or between two
        if zookeeper is not None and i == 3:
            zookeeper.restart()
            faults.append("zookeeper restart")
            time.sleep(2)
        if kafka is not None and i == 5:
            kafka.restart()
            faults.append("kafka restart")
            time.sleep(2)
        sink.kill()
        faults.append("sigkill")
        if i % 3 == 2:
            sink.delete_checkpoint()
            faults.append("checkpoint deleted")
    producer.finish()
    return faults


def test_sigkill_storm_with_lost_checkpoints_and_server_restarts(tmp_path, kafka, zookeeper, topic):
    src, dlq = topic(4), topic(1)
    config = zookeeper.clickhouse_config(tmp_path / "ch.xml")
    sink = SinkHarness(tmp_path, kafka, src, dlq, engine="KeeperMap", chdb_config=config)
    producer = BackgroundProducer(kafka, src, total=10**9, per_second=400)
    producer.start()
    faults = run_with_faults(sink, producer, KILLS, random.Random(11), zookeeper=zookeeper, kafka=kafka)
    sink.drain()
    report = check_exactly_once(sink, producer.sent, producer.bad)
    print(f"survived {faults.count('sigkill')} SIGKILLs and {faults}; totals {report['totals']}")
    assert faults.count("sigkill") >= 10 or KILLS < 10


def test_redeploy_with_changed_batch_size_and_no_checkpoint(tmp_path, kafka, topic, ch_path):
    src, dlq = topic(4), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq, server=ch_path, maxOffsetsPerTrigger=1000)
    producer = BackgroundProducer(kafka, src, total=12_000, per_second=4000)
    producer.start()
    sink.start("--quiet")
    assert sink.wait_for_batches(3)
    sink.kill()
    sink.delete_checkpoint()
    sink.config["batching"]["maxOffsetsPerTrigger"] = 7777
    sink.write_config()
    producer.finish()
    sink.drain()
    check_exactly_once(sink, producer.sent, producer.bad)


@pytest.mark.slow
def test_long_sigkill_storm(tmp_path, kafka, topic):
    src, dlq = topic(4), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq)
    producer = BackgroundProducer(kafka, src, total=10**9, per_second=1500)
    producer.start()
    run_with_faults(sink, producer, 40, random.Random(5))
    sink.drain()
    check_exactly_once(sink, producer.sent, producer.bad)
