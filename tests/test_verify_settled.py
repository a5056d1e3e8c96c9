"""The scheduled verifier on real Kafka and chdb: it checks each settled offset once, finds a deletion beside a
duplicate, keeps reporting it, and changes nothing."""

from __future__ import annotations

import json
import time
from typing import Any

from confluent_kafka import Producer

from sparkapp.config import SinkConfig
from sparkapp.core.state_machine import OffsetRange
from sparkapp.edges.dlq import HEADER_OFFSET, HEADER_PARTITION, HEADER_SINK, HEADER_TOPIC
from sparkapp.edges.kafka import read_range
from sparkapp.edges.store import PartitionKey, state_store
from sparkapp.edges.verified import VerifiedStore
from sparkapp.verify_settled import SUMMARY_LIMIT, Finding, SettledReport, verify_settled

from .test_verify import deliver_all_but, produce_ids, sink


def deliver_more(client: Any, cfg: SinkConfig, src: str, start: int) -> None:
    """Stores partition 0's records from `start` and moves its state row over them."""
    msgs = read_range(cfg.kafka, src, 0, OffsetRange(start, 1 << 40))
    client.insert("ev", [[m.offset, src, 0, m.offset] for m in msgs], column_names=["id", "_topic", "_partition",
                                                                                     "_offset"])
    store = state_store(cfg, client)
    epoch = store.acquire_epoch(cfg.name)
    pk, rng = PartitionKey(cfg.name, src, 0), OffsetRange(start, msgs[-1].offset)
    store.begin(pk, rng, epoch)
    store.commit(pk, rng, epoch)


def rows(client: Any) -> list[tuple[int, int]]:
    return [tuple(r) for r in client.query("SELECT _offset, count() FROM ev GROUP BY _offset ORDER BY _offset")
            .result_rows]


def delivered(ch_db: Any, ch_dsn: str, chdb_config: Any, kafka: Any, topic: Any, n: int,
              lost: set[int]) -> tuple[Any, SinkConfig, str]:
    """n records on partition 0 of a new topic, claimed delivered, stored but for `lost`."""
    client, db = ch_db
    src = topic(1)
    produce_ids(kafka, src, n)
    cfg = sink(client, db, ch_dsn, chdb_config, kafka, src)
    deliver_all_but(client, cfg, src, lost)
    return client, cfg, src


def test_each_settled_offset_is_checked_once_and_what_is_newer_than_the_window_waits(ch_db, ch_dsn, chdb_config,
                                                                                     kafka, topic):
    client, cfg, src = delivered(ch_db, ch_dsn, chdb_config, kafka, topic, 300, set())
    young = verify_settled(cfg, window_s=3600, now_s=time.time())
    assert (young.ok, young.checked, young.offsets) == (True, 0, 0), "written less than the window ago: not settled"
    first = verify_settled(cfg, window_s=0, now_s=time.time() + 1)
    assert (first.ok, first.checked, first.offsets) == (True, 300, 300)
    again = verify_settled(cfg, window_s=0, now_s=time.time() + 1)
    assert (again.checked, again.offsets) == (0, 300), "an offset already checked is not read again"
    produce_ids(kafka, src, 200)
    deliver_more(client, cfg, src, 300)
    third = verify_settled(cfg, window_s=0, now_s=time.time() + 1)
    assert (third.ok, third.checked, third.offsets) == (True, 200, 500)
    assert json.loads(third.summary()) == {"result": "OK", "checked": 200, "offsets": 500, "findings": [],
                                           "notes": []}


def test_a_deleted_row_beside_a_duplicate_is_found_reported_again_and_nothing_is_changed(ch_db, ch_dsn, chdb_config,
                                                                                        kafka, topic):
    """One row gone and another stored twice leave the row count right: the distinct count still tells."""
    client, cfg, src = delivered(ch_db, ch_dsn, chdb_config, kafka, topic, 400, {101})
    client.insert("ev", [[103, src, 0, 103]], column_names=["id", "_topic", "_partition", "_offset"])
    before = rows(client)
    assert sum(c for _, c in before) == 400, "the row count alone would pass"
    report = verify_settled(cfg, window_s=0, now_s=time.time() + 1)
    assert [(f.topic, f.partition, f.duplicates, f.missing) for f in report.findings] == [(src, 0, [103], [101])]
    assert report.findings[0].where == f"{src}/0: 1 duplicated offset(s) [103], 1 missing offset(s) [101]"
    assert json.loads(report.summary())["result"] == "ANOMALY"
    later = verify_settled(cfg, window_s=0, now_s=time.time() + 1)
    assert [f.where for f in later.findings] == [f.where for f in report.findings], "reported until repaired"
    assert rows(client) == before, "the verifier changes no data"


def store_rows(client: Any, cfg: SinkConfig, src: str, first: int, last: int, lost: set[int]) -> None:
    """Partition 0's offsets first..last stored but for `lost`, and its state row moved over them."""
    client.insert("ev", [[o, src, 0, o] for o in range(first, last + 1) if o not in lost],
                  column_names=["id", "_topic", "_partition", "_offset"])
    store = state_store(cfg, client)
    epoch = store.acquire_epoch(cfg.name)
    pk, rng = PartitionKey(cfg.name, src, 0), OffsetRange(first, last)
    store.begin(pk, rng, epoch)
    store.commit(pk, rng, epoch)


def dead_letter(kafka: Any, dlq: str, sink_name: str, src: str, offset: int) -> None:
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    p.produce(dlq, b"{}", partition=0, headers=[(HEADER_SINK, sink_name.encode()), (HEADER_TOPIC, src.encode()),
                                                (HEADER_PARTITION, b"0"), (HEADER_OFFSET, str(offset).encode())])
    assert p.flush(30) == 0


def test_the_dead_letter_topic_is_read_from_the_first_letter_not_yet_verified(ch_db, ch_dsn, chdb_config, kafka,
                                                                             topic):
    """Each run reads the DLQ from where the last left it, not from the start; a letter of an offset not settled
    yet (the writer dead-letters before it records the block) is read again by the run that verifies it."""
    client, db = ch_db
    src, dlq = topic(1), topic(1)
    produce_ids(kafka, src, 500)
    base = sink(client, db, ch_dsn, chdb_config, kafka, src)
    cfg = base.model_copy(update={"dlq": base.dlq.model_copy(update={"topic": dlq})})
    state_store(cfg, client).ensure_schema()
    store_rows(client, cfg, src, 0, 299, {5, 250})
    for name, offset in ((cfg.name, 5), ("another-sink", 7), (cfg.name, 250)):  # DLQ offsets 0, 1, 2
        dead_letter(kafka, dlq, name, src, offset)

    def mark() -> int:
        return VerifiedStore(state_store(cfg, client)).positions(cfg.name)[(dlq, 0)].verified_to

    first = verify_settled(cfg, window_s=0, now_s=time.time() + 1)
    assert (first.ok, first.checked) == (True, 300) and mark() == 3, first.findings
    dead_letter(kafka, dlq, cfg.name, src, 420)  # DLQ offset 3: dead-lettered, its block not recorded yet
    store_rows(client, cfg, src, 300, 410, set())
    second = verify_settled(cfg, window_s=0, now_s=time.time() + 1)
    assert (second.ok, second.checked) == (True, 111) and mark() == 3, "offset 420's letter is still needed"
    store_rows(client, cfg, src, 411, 499, {420})
    third = verify_settled(cfg, window_s=0, now_s=time.time() + 1)
    assert (third.ok, third.checked, third.offsets) == (True, 89, 500), third.findings
    assert mark() == 4


def test_the_summary_fits_a_termination_message_however_many_findings():
    report = SettledReport("s", 10, 10, [Finding("topic", p, list(range(50)), list(range(50, 99)))
                                         for p in range(500)])
    out = json.loads(s := report.summary())
    assert len(s.encode()) <= SUMMARY_LIMIT and out["result"] == "ANOMALY"
    assert out["findings"] and out["more"] == 500 - len(out["findings"])
