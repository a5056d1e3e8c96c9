"""Transactional producers through the real job: only committed records are ever inserted.

Spark's Kafka consumer reads `read_uncommitted` unless told otherwise, so aborted records (and records of a
transaction still open) would be delivered as rows; chsink reads `read_committed` everywhere.
"""

from __future__ import annotations

import json

from confluent_kafka import Producer

from .harness import SinkHarness, event


def _ids(sink: SinkHarness) -> list[int]:
    [rows] = sink.sql(f"SELECT id FROM {sink.db}.events ORDER BY id")
    return [int(r[0]) for r in rows]


def test_aborted_and_open_transactions_are_not_inserted_and_the_open_one_lands_once_committed(tmp_path, kafka, topic, ch_path):
    src, dlq = topic(2), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq, server=ch_path, maxOffsetsPerTrigger=70)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"tx-{src}", "linger.ms": 5})
    p.init_transactions(30)

    def transaction(ids: range, commit: bool | None) -> None:
        p.begin_transaction()
        for i in ids:
            p.produce(src, json.dumps(event(i)).encode(), key=str(i).encode(), partition=i % 2)
        assert p.flush(30) == 0  # on the broker, inside the transaction
        if commit is True:
            p.commit_transaction(30)
        elif commit is False:
            p.abort_transaction(30)

    transaction(range(0, 100), True)
    transaction(range(100, 200), False)
    transaction(range(200, 300), True)
    transaction(range(300, 400), None)  # still open while the job runs
    sink.drain()
    assert _ids(sink) == [*range(0, 100), *range(200, 300)]

    p.commit_transaction(30)
    transaction(range(400, 450), False)
    transaction(range(450, 500), True)
    sink.drain()
    assert _ids(sink) == [*range(0, 100), *range(200, 400), *range(450, 500)]
    report = sink.verify()
    t = report["totals"]
    assert report["ok"] and (t["duplicates"], t["gaps"], t["pending"], t["dead_lettered"]) == (0, 0, 0, 0), report
    assert t["clickhouse"] == 350
