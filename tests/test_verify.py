"""The verifier on real Kafka and chdb: every gap is reported, however many and wherever they are."""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka import Producer

from sparkapp.config import SinkConfig, parse_config
from sparkapp.core.state_machine import OffsetRange
from sparkapp.edges.kafka import read_range
from sparkapp.edges.store import PartitionKey, state_store
from sparkapp.verify import verify

TABLE = ("CREATE TABLE `{db}`.ev (id UInt64, _topic String, _partition UInt32, _offset UInt64) "
         "ENGINE = MergeTree ORDER BY _offset")


def sink(client: Any, db: str, ch_dsn: str, chdb_config: Any, kafka: Any, src: str) -> SinkConfig:
    client.command(TABLE.format(db=db))
    return parse_config({
        "name": f"v-{db}", "kafka": {"bootstrapServers": kafka.bootstrap, "topics": [src]},
        "clickhouse": {"endpoints": [ch_dsn], "database": db, "tables": {src: "ev"}, "chdbConfigFile": str(chdb_config)},
        "state": {"keeperPath": f"/verify_{db}"}, "checkpointLocation": "/unused"})


def deliver_all_but(client: Any, cfg: SinkConfig, src: str, lost: set[int]) -> None:
    """Stores every committed record of partition 0 except `lost`, and a state row claiming all delivered."""
    msgs = read_range(cfg.kafka, src, 0, OffsetRange(0, 1 << 40))
    rows = [[m.offset, src, 0, m.offset] for m in msgs if m.offset not in lost]
    client.insert("ev", rows, column_names=["id", "_topic", "_partition", "_offset"])
    store = state_store(cfg, client)
    store.ensure_schema()
    epoch = store.acquire_epoch(cfg.name)
    pk, rng = PartitionKey(cfg.name, src, 0), OffsetRange(0, msgs[-1].offset)
    store.begin(pk, rng, epoch)
    store.commit(pk, rng, epoch)


def produce_ids(kafka: Any, src: str, n: int) -> None:
    """n records {"id": i} to partition 0 of src."""
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(n):
        p.produce(src, json.dumps({"id": i}).encode(), partition=0)
    assert p.flush(30) == 0


def test_hundreds_of_gaps_are_all_reported(ch_db, ch_dsn, chdb_config, kafka, topic):
    client, db = ch_db
    src = topic(1)
    produce_ids(kafka, src, 900)
    cfg = sink(client, db, ch_dsn, chdb_config, kafka, src)
    lost = set(range(0, 900, 3))  # 300 separate runs of missing offsets
    deliver_all_but(client, cfg, src, lost)
    [part] = verify(cfg).partitions
    assert part.gaps == sorted(lost) and part.pending == 0


def test_a_loss_after_hundreds_of_holes_without_records_is_reported(ch_db, ch_dsn, chdb_config, kafka, topic):
    """Offsets without a record (here aborted transactions and their markers; compaction leaves the same) are
    no gaps, and a real loss past hundreds of them is still found."""
    client, db = ch_db
    src = topic(1)
    plain = Producer({"bootstrap.servers": kafka.bootstrap})
    tx = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"v-{src}"})
    tx.init_transactions(30)
    for i in range(220):
        tx.begin_transaction()
        tx.produce(src, json.dumps({"id": -1}).encode(), partition=0)
        assert tx.flush(30) == 0  # on the broker (aborting before would drop it unsent), then aborted
        tx.abort_transaction(30)
        plain.produce(src, json.dumps({"id": i}).encode(), partition=0)
        assert plain.flush(30) == 0
    for i in range(10):
        plain.produce(src, json.dumps({"id": 1000 + i}).encode(), partition=0)
    assert plain.flush(30) == 0
    cfg = sink(client, db, ch_dsn, chdb_config, kafka, src)
    committed = read_range(cfg.kafka, src, 0, OffsetRange(0, 1 << 40))
    assert committed[-1].offset > 2 * 220 + 5, "each aborted transaction leaves a hole of two offsets"
    last = committed[-3].offset
    deliver_all_but(client, cfg, src, {last})
    [part] = verify(cfg).partitions
    assert part.gaps == [last] and part.pending == 0


def test_a_loss_above_a_silent_table_of_a_routed_sink_is_reported(ch_db, ch_dsn, chdb_config, kafka, topic):
    """A routed sink whose table `b` got its last record at offset 9: the partition resumes at b's position,
    but a loss at 50 in table `a`, whose state says delivered through 99, is a gap, not "pending"."""
    client, db = ch_db
    src = topic(1)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(100):
        p.produce(src, json.dumps({"id": i, "t": "b" if i < 10 else "a"}).encode(), partition=0)
    assert p.flush(30) == 0
    for t in ("a", "b"):
        client.command(TABLE.replace(".ev ", f".{t} ").format(db=db))
    cfg = parse_config({
        "name": f"v-{db}", "kafka": {"bootstrapServers": kafka.bootstrap, "topics": [src]},
        "clickhouse": {"endpoints": [ch_dsn], "database": db, "tables": {src: "a"}, "tableField": "t",
                       "chdbConfigFile": str(chdb_config)},
        "state": {"keeperPath": f"/verify_{db}"}, "checkpointLocation": "/unused"})
    store = state_store(cfg, client)
    store.ensure_schema()
    epoch = store.acquire_epoch(cfg.name)
    for table, rng, lost in (("b", OffsetRange(0, 9), set()), ("a", OffsetRange(10, 99), {50})):
        client.insert(table, [[o, src, 0, o] for o in range(rng.min, rng.max + 1) if o not in lost],
                      column_names=["id", "_topic", "_partition", "_offset"])
        pk = PartitionKey(cfg.name, src, 0, table)
        store.begin(pk, rng, epoch)
        store.commit(pk, rng, epoch)
    [part] = verify(cfg).partitions
    assert part.gaps == [50] and part.pending == 0


def test_records_in_a_table_the_topic_was_routed_to_before_are_delivered_not_gaps(ch_db, ch_dsn, chdb_config, kafka,
                                                                                  topic):
    """The topic moved from table ev to ev2 once the sink had delivered all it read (the routing change a run
    takes then): what ev holds was delivered. The verifier reads every table the topic's recorded routings
    named, not only the one the config names now."""
    from sparkapp.delivery.runtime import check_routing

    client, db = ch_db
    src = topic(1)
    produce_ids(kafka, src, 20)
    cfg = sink(client, db, ch_dsn, chdb_config, kafka, src)
    store = state_store(cfg, client)
    store.ensure_schema()
    check_routing(store, cfg.name, cfg.clickhouse, [src])  # the first run: its routing recorded
    deliver_all_but(client, cfg, src, set())
    client.command(TABLE.format(db=db).replace(".ev ", ".ev2 "))
    moved = cfg.model_copy(update={"clickhouse": cfg.clickhouse.model_copy(update={"tables": {src: "ev2"}})})
    check_routing(store, moved.name, moved.clickhouse, [src])  # taken: nothing would be read again
    [part] = verify(moved).partitions
    assert (part.clickhouse, part.gaps, part.duplicates) == (20, [], [])
    client.command(f"DROP TABLE `{db}`.ev SYNC")  # what it held is gone: gaps, and a note why, not a crash
    report = verify(moved)
    assert report.partitions[0].gaps == list(range(20))
    assert any("`ev` does not exist" in n for n in report.notes), report.notes
