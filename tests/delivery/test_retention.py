"""Records deleted from Kafka (DeleteRecords, as retention does) between a crash and its retry, on real
Kafka, chdb and ZooKeeper.

A BEFORE range may have landed; what Kafka still holds of it is re-sent in the recorded windows (nothing
doubles, nothing is dead-lettered). Only when the deleted records are not in the table either are they
lost, and the writer says so instead of going on silently.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from sparkapp.config import KafkaConfig
from sparkapp.core.state_machine import IrrecoverableStateError, OffsetRange, Phase
from sparkapp.delivery.context import DataLossError, WriterContext
from sparkapp.delivery.runtime import starting_offsets
from sparkapp.delivery.writer import write_partition
from sparkapp.edges.kafka import all_watermarks, read_range
from sparkapp.edges.store import PartitionKey
from tests.delivery.test_lost_reply import OFFSETS, Crash, counts, setup
from tests.delivery.test_zombie import ctx_for


def produce(bootstrap: str, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        p.produce(topic, json.dumps({"id": i, "pad": "x"}).encode(), partition=0)
    assert p.flush(30) == 0


def delete_below(bootstrap: str, topic: str, offset: int) -> None:
    """Kafka's DeleteRecords: the partition's log start moves to `offset`, as retention would move it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept referenced: its thread resolves the futures
    for f in admin.delete_records([TopicPartition(topic, 0, offset)], operation_timeout=30).values():
        f.result(60)


def crash_at(step: str) -> Any:
    def fault(s: str) -> None:
        if s == step:
            raise Crash(s)
    return fault


def rereading(ctx: WriterContext, kafka_cfg: KafkaConfig, fail_on_data_loss: bool = True) -> WriterContext:
    ctx.refetch = lambda t, p, rng: read_range(kafka_cfg, t, p, rng)
    ctx.fail_on_data_loss = fail_on_data_loss
    return ctx


@pytest.fixture
def source(kafka, topic):
    name = topic(1)
    produce(kafka.bootstrap, name, 300)
    cfg = KafkaConfig(bootstrapServers=kafka.bootstrap, topics=[name])
    return name, cfg, read_range(cfg, name, 0, OffsetRange(0, 299))


def test_a_landed_range_whose_records_were_deleted_is_neither_doubled_nor_dead_lettered(ch_db, kafka, source):
    client, db = ch_db
    name, cfg, msgs = source
    store, schema = setup(client, db, OFFSETS, 100)
    pk = PartitionKey("lost", name, 0)
    with pytest.raises(Crash):  # [0, 199] landed; AFTER was never written
        write_partition(ctx_for(client, store, schema, store.acquire_epoch("lost"), 50, crash_at("after_insert")),
                        pk, msgs[:200])
    delete_below(kafka.bootstrap, name, 120)
    # the restart cannot start Spark below the log start; it starts there, and the writer re-reads the rest
    parts = {name: 1}
    assert starting_offsets(store, "lost", parts, all_watermarks(cfg, parts)) == {name: {"0": 120}}
    ctx = rereading(ctx_for(client, store, schema, store.acquire_epoch("lost"), 70), cfg)
    res = write_partition(ctx, pk, [m for m in msgs if m.offset >= 200])
    assert res.dead_lettered == 0 and res.retried == OffsetRange(0, 199)
    assert counts(client) == (300, 300)
    row = store.get(pk)
    assert row is not None and (row.state.phase, row.state.range.max) == (Phase.AFTER, 299)


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_range_deleted_before_it_landed_is_reported_as_lost(ch_db, kafka, source, fail_on_data_loss):
    client, db = ch_db
    name, cfg, msgs = source
    store, schema = setup(client, db, OFFSETS, 100)
    pk = PartitionKey("lost", name, 0)
    with pytest.raises(Crash):  # BEFORE [0, 199] recorded, nothing sent
        write_partition(ctx_for(client, store, schema, store.acquire_epoch("lost"), 50, crash_at("after_begin")),
                        pk, msgs[:200])
    delete_below(kafka.bootstrap, name, 120)
    ctx = rereading(ctx_for(client, store, schema, store.acquire_epoch("lost"), 70), cfg, fail_on_data_loss)
    later = [m for m in msgs if m.offset >= 200]
    if fail_on_data_loss:
        with pytest.raises(DataLossError, match=r"offsets \[0, 119\] of the unconfirmed range \[0, 199\]"):
            write_partition(ctx, pk, later)
        assert counts(client) == (0, 0)
    else:
        write_partition(ctx, pk, later)
        assert counts(client) == (180, 180)  # [120, 299]: what Kafka still held, once


def test_a_delivered_position_below_the_log_start_is_data_loss(ch_db, kafka, source):
    """An AFTER row whose next offset retention deleted: those records were never delivered."""
    client, db = ch_db
    name, cfg, msgs = source
    store, schema = setup(client, db, OFFSETS, 100)
    write_partition(ctx_for(client, store, schema, store.acquire_epoch("lost"), 50), PartitionKey("lost", name, 0),
                    msgs[:100])
    delete_below(kafka.bootstrap, name, 150)
    parts = {name: 1}
    with pytest.raises(DataLossError, match=r"offsets \[100, 149\] were deleted from Kafka"):
        starting_offsets(store, "lost", parts, all_watermarks(cfg, parts))
    assert starting_offsets(store, "lost", parts, all_watermarks(cfg, parts), fail_on_data_loss=False) == {
        name: {"0": 150}}


def test_fail_on_data_loss_follows_the_source_option():
    base = {"bootstrapServers": "k:9092", "topics": ["t"]}
    assert KafkaConfig(**base).fail_on_data_loss
    assert not KafkaConfig(**base, sourceOptions={"failOnDataLoss": "false"}).fail_on_data_loss


def test_a_recreated_topic_is_refused_not_taken_for_a_replay(ch_db, kafka, topic):
    """State says delivered through 299; the topic was deleted and recreated and holds 0..49 now. On a
    multi-table sink those records would look like a replay of delivered ones and be skipped."""
    client, db = ch_db
    name = topic(1)
    produce(kafka.bootstrap, name, 50)
    cfg = KafkaConfig(bootstrapServers=kafka.bootstrap, topics=[name])
    store, _ = setup(client, db, OFFSETS, 100)
    epoch = store.acquire_epoch("lost")
    for table in ("a", "b"):
        store.begin(PartitionKey("lost", name, 0, table), OffsetRange(0, 299), epoch)
        store.commit(PartitionKey("lost", name, 0, table), OffsetRange(0, 299), epoch)
    parts = {name: 1}
    with pytest.raises(IrrecoverableStateError, match="recorded offset 299, but the partition ends at 49"):
        starting_offsets(store, "lost", parts, all_watermarks(cfg, parts))
