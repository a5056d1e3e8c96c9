"""A micro-batch's partitions share their state transitions (write_lines_many): the state store is read and
written a fixed number of times per batch, not per partition, and a partition whose state moved meanwhile
plans again alone (real chdb and ZooKeeper)."""

from __future__ import annotations

from typing import Any

from bench.writer import StateCalls
from sparkapp.config import Engine
from sparkapp.core.records import Message
from sparkapp.core.state_machine import OffsetRange, Phase
from sparkapp.delivery.context import WriterContext
from sparkapp.delivery.writer import write_lines_many
from sparkapp.edges.clickhouse import load_schema
from sparkapp.edges.dlq import HEADER_OFFSET, KafkaDeadLetterSink
from sparkapp.edges.insert import Inserter
from sparkapp.edges.store import PartitionKey, StateStore
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from tests.helpers import line_batch, msg, read_dlq

PARTITIONS = 8


def _batch(p: int, lo: int, n: int, bad: bool = False) -> list[Message]:
    return [msg(b"{oops" if bad and i == 3 else {"id": p * 10_000 + lo + i}, offset=lo + i, topic="src", partition=p)
            for i in range(n)]


def test_a_batch_of_many_partitions_costs_a_fixed_number_of_state_round_trips(ch_db, kafka, topic):
    client, db = ch_db
    client.command("CREATE TABLE ev (id UInt64, _partition UInt32, _offset UInt64) ENGINE = MergeTree "
                   "ORDER BY (_partition, _offset)")
    schema = load_schema(client, db, "ev")
    counting = StateCalls(client)
    store = StateStore(counting, "state", Engine.KEEPER_MAP, keeper_path=f"/shared_{db}")  # type: ignore[arg-type]
    store.ensure_schema()
    dlq_topic = topic(1)
    ctx = WriterContext("shared", store, Inserter(client, schema), make_decoder(DecoderSpec(Format.JSON), schema),
                        store.acquire_epoch("shared"), block_offsets=10,
                        dlq=KafkaDeadLetterSink(dlq_topic, {"bootstrap.servers": kafka.bootstrap}))
    pks = [PartitionKey("shared", "src", p) for p in range(PARTITIONS)]
    for b in range(3):  # the first batch creates the rows, the others move them
        counting.calls = []
        results = write_lines_many([(ctx, pk, line_batch(_batch(pk.partition, 25 * b, 25), schema.names))
                                    for pk in pks])
        assert [r.committed for r in results] == [OffsetRange(25 * b, 25 * b + 24)] * PARTITIONS  # type: ignore[union-attr]
        # one read to plan (the sink's epoch too), BEFORE (write, read back), AFTER (write, read back): 5, for 8
        # partitions; the first batch reads again right before creating the rows: 6
        assert counting.round_trips <= (6 if b == 0 else 5), f"batch {b}: {counting.round_trips} state round trips"
    got = client.query("SELECT _partition, count(), uniqExact(_offset) FROM ev GROUP BY _partition "
                       "ORDER BY _partition").result_rows
    assert got == [(p, 75, 75) for p in range(PARTITIONS)]

    # dead letters cost no state round trip of their own: the BEFORE write records the dead-letter mark of the
    # ranges that have any (SENDING), and the AFTER write ends it (DONE)
    counting.calls = []
    results = write_lines_many([(ctx, pk, line_batch(_batch(pk.partition, 75, 25, bad=pk.partition in (2, 5)),
                                                     schema.names)) for pk in pks])
    assert sum(r.dead_lettered for r in results) == 2  # type: ignore[union-attr]
    assert counting.round_trips <= 5, counting.round_trips
    assert {pk.partition: r.dlq.value for pk, r in store.get_many(pks).items() if r.dlq_mark} == \
        {2: "DONE", 5: "DONE"}
    dead = read_dlq(kafka.bootstrap, dlq_topic, 2)
    assert sorted(int(dict(d.headers())[HEADER_OFFSET]) for d in dead) == [78, 78]


def test_a_partition_another_writer_moved_plans_again_alone_and_the_rest_moves_on(ch_db):
    client, db = ch_db
    client.command("CREATE TABLE ev (id UInt64, _partition UInt32, _offset UInt64) ENGINE = MergeTree "
                   "ORDER BY (_partition, _offset) SETTINGS non_replicated_deduplication_window = 1000")
    schema = load_schema(client, db, "ev")
    store = StateStore(client, "state", Engine.KEEPER_MAP, keeper_path=f"/shared_{db}")
    store.ensure_schema()

    def context(epoch: int, fault: Any = lambda step: None) -> WriterContext:
        return WriterContext("shared", store, Inserter(client, schema), make_decoder(DecoderSpec(Format.JSON), schema),
                             epoch, block_offsets=10, fault=fault)

    epoch = store.acquire_epoch("shared")
    pks = [PartitionKey("shared", "src", p) for p in range(3)]
    batch = {pk: _batch(pk.partition, 0, 20) for pk in pks}

    def meddle(step: str) -> None:  # a retried task of the same epoch takes partition 1 between read and BEFORE
        if step == "before_begin" and store.get(pks[1]) is None:
            store.begin(pks[1], OffsetRange(0, 19), epoch, block_offsets=10)

    results = write_lines_many([(context(epoch, meddle), pk, line_batch(batch[pk], schema.names)) for pk in pks])
    assert all(r.committed == OffsetRange(0, 19) for r in results)  # type: ignore[union-attr]
    assert results[1].retried == OffsetRange(0, 19)  # type: ignore[union-attr]  # re-sent as the other recorded it
    assert all(store.get(pk).state.phase is Phase.AFTER for pk in pks)  # type: ignore[union-attr]
    got = client.query("SELECT _partition, count(), uniqExact(_offset) FROM ev GROUP BY _partition "
                       "ORDER BY _partition").result_rows
    assert got == [(p, 20, 20) for p in range(3)]
