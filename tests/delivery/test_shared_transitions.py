"""A micro-batch's partitions share their state transitions (write_lines_many): the state store is read and
written a fixed number of times per batch, not per partition, and a partition whose state moved meanwhile
plans again alone (real chdb and ZooKeeper)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.writer import StateCalls
from sparkapp.config import Engine
from sparkapp.core.records import Message
from sparkapp.core.state_machine import OffsetRange, Phase
from sparkapp.delivery.context import WriterContext
from sparkapp.delivery.writer import Waiting, write_lines_many
from sparkapp.edges.clickhouse import load_schema
from sparkapp.edges.dlq import HEADER_OFFSET, KafkaDeadLetterSink
from sparkapp.edges.insert import Inserter
from sparkapp.edges.store import FencedError, PartitionKey, StateStore
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from tests.helpers import line_batch, msg, read_dlq

PARTITIONS = 8


def _batch(p: int, lo: int, n: int, bad: bool = False) -> list[Message]:
    return [msg(b"{oops" if bad and i == 3 else {"id": p * 10_000 + lo + i}, offset=lo + i, topic="src", partition=p)
            for i in range(n)]


def _counted(ch_db: Any, name: str) -> tuple[Any, Any, StateCalls, StateStore]:
    """The target table, and a KeeperMap state store whose client counts its round trips."""
    client, db = ch_db
    client.command("CREATE TABLE ev (id UInt64, _partition UInt32, _offset UInt64) ENGINE = MergeTree "
                   "ORDER BY (_partition, _offset) SETTINGS non_replicated_deduplication_window = 1000")
    counting = StateCalls(client)
    store = StateStore(counting, "state", Engine.KEEPER_MAP, keeper_path=f"/{name}_{db}")  # type: ignore[arg-type]
    store.ensure_schema()
    return client, load_schema(client, db, "ev"), counting, store


def test_a_batch_of_many_partitions_costs_a_fixed_number_of_state_round_trips(ch_db, kafka, topic):
    client, schema, counting, store = _counted(ch_db, "shared")
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


def test_with_ranges_waiting_the_next_before_confirms_them_in_the_batch_s_only_state_write(ch_db):
    """The driver's way (Waiting): a delivered range's AFTER is not written; the partition's next BEFORE, conditioned
    on that BEFORE row of this epoch, confirms it. A steady batch then costs one state write and its read back, no
    read before it: the driver plans from the rows the last BEFORE read back. A partition with no records in a batch gets its AFTER in one write for all such; one that goes
    alone (a replayed batch) is confirmed before it plans, so it skips its delivered range instead of re-sending
    it; `flush` confirms the rest, and a newer epoch's takeover fences it."""
    client, schema, counting, store = _counted(ch_db, "waiting")
    epoch = store.acquire_epoch("shared")
    ctx = WriterContext("shared", store, Inserter(client, schema), make_decoder(DecoderSpec(Format.JSON), schema),
                        epoch, block_offsets=10)
    waiting = Waiting(store, epoch)
    pks = [PartitionKey("shared", "src", p) for p in range(PARTITIONS)]

    def batch(lo: int, parts: list[PartitionKey]) -> list[Any]:
        counting.calls = []
        return write_lines_many([(ctx, pk, line_batch(_batch(pk.partition, lo, 25), schema.names)) for pk in parts],
                                waiting)

    def writes() -> int:
        return sum(1 for kind, _ in counting.calls if kind == "write")

    def phases() -> dict[int, tuple[str, int, int]]:
        return {pk.partition: (r.state.phase.value, r.state.range.min, r.state.range.max)
                for pk, r in store.get_many(pks).items()}

    batch(0, pks)  # creates the rows, BEFORE; their ranges wait
    assert set(phases().values()) == {("BEFORE", 0, 24)} and set(waiting.ranges) == set(pks)
    for b in (1, 2):
        results = batch(25 * b, pks)
        assert [r.committed for r in results] == [OffsetRange(25 * b, 25 * b + 24)] * PARTITIONS  # type: ignore[union-attr]
        # one write (BEFORE of this batch, which confirms the last) and its read back
        assert (writes(), counting.round_trips) == (1, 2), counting.calls
        assert set(phases().values()) == {("BEFORE", 25 * b, 25 * b + 24)}

    # half the partitions get records: the other half are confirmed in one write of their own
    batch(75, pks[:4])
    assert writes() == 2
    assert phases() == {p: ("BEFORE", 75, 99) if p < 4 else ("AFTER", 50, 74) for p in range(PARTITIONS)}

    # partition 0's batch again (Spark replayed it): it goes alone, and skips it as delivered
    counting.calls = []
    again = write_lines_many([(ctx, pks[0], line_batch(_batch(0, 75, 25), schema.names))], waiting)
    assert again[0].skipped == 25 and again[0].inserted_rows == 0 and again[0].retried is None  # type: ignore[union-attr]
    assert phases()[0] == ("AFTER", 75, 99)

    batch(100, pks[1:3])
    stale = Waiting(store, epoch)
    stale.ranges = dict(waiting.ranges)
    waiting.flush()
    assert phases() == {p: ("AFTER", 100, 124) if p in (1, 2) else ("AFTER", 75, 99) if p < 4 else ("AFTER", 50, 74)
                        for p in range(PARTITIONS)}
    got = client.query("SELECT _partition, count(), uniqExact(_offset) FROM ev GROUP BY _partition "
                       "ORDER BY _partition").result_rows
    assert got == [(p, n, n) for p, n in enumerate([100, 125, 125, 100, 75, 75, 75, 75])]

    # a run that lost the sink keeps its waiting ranges unconfirmed: the newer run decides about them
    batch_rows = {pk: store.get(pk) for pk in pks[1:3]}
    store.begin(pks[1], OffsetRange(125, 149), store.acquire_epoch("shared"), block_offsets=10,
                expected=batch_rows[pks[1]].state)  # type: ignore[union-attr]
    stale.ranges = {pk: b for pk, b in stale.ranges.items() if pk == pks[1]}
    with pytest.raises(FencedError):
        stale.flush()
    assert phases()[1] == ("BEFORE", 125, 149)


def test_a_handed_range_whose_row_another_attempt_moved_on_is_let_go_not_confirmed_over_it(ch_db):
    """An executor task's ranges come from the driver (`handed`), and Spark may run a task again with the same
    hand-over after its first attempt's BEFORE took them over. The retry's flush then finds rows past those ranges:
    they need no AFTER, and are let go, rows untouched. The driver's own ranges stay strict, and a newer run's rows
    fence a handed flush all the same."""
    client, schema, _, store = _counted(ch_db, "handed")
    epoch = store.acquire_epoch("shared")
    ctx = WriterContext("shared", store, Inserter(client, schema), make_decoder(DecoderSpec(Format.JSON), schema),
                        epoch, block_offsets=10)
    pks = [PartitionKey("shared", "src", p) for p in range(3)]

    def batch(lo: int, waiting: Waiting) -> None:
        write_lines_many([(ctx, pk, line_batch(_batch(pk.partition, lo, 25), schema.names)) for pk in pks], waiting)

    first = Waiting(store, epoch, handed=True)
    batch(0, first)
    handed = dict(first.ranges)  # what the driver hands to the next batch's task
    batch(25, Waiting(store, epoch, dict(handed), handed=True))  # the first attempt, which then dies
    Waiting(store, epoch, dict(handed), handed=True).flush()  # its retry's flush
    assert {pk.partition: (r.state.phase.value, r.state.range.min) for pk, r in store.get_many(pks).items()} == {
        p: ("BEFORE", 25) for p in range(3)}
    with pytest.raises(FencedError):
        Waiting(store, epoch, dict(handed)).flush()
    store.begin(pks[0], OffsetRange(50, 74), store.acquire_epoch("shared"), block_offsets=10,
                expected=store.get(pks[0]).state)  # type: ignore[union-attr]
    with pytest.raises(FencedError):
        Waiting(store, epoch, dict(handed), handed=True).flush()
