"""The state store on both engines: transitions, epochs and fencing, listing and deletion, schema version."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kazoo.client import KazooClient

from sparkapp.config import Engine
from sparkapp.core.state_machine import OffsetRange, Phase, StoredState
from sparkapp.edges.store import (
    SCHEMA_VERSION,
    DlqPhase,
    FencedError,
    PartitionKey,
    StateRow,
    StateStore,
    StateStoreError,
    resume_positions,
)


@pytest.fixture(params=[Engine.KEEPER_MAP, Engine.ROCKSDB], ids=["keepermap", "rocksdb"])
def store(request, ch_db):
    client, db = ch_db
    s = StateStore(client, "chsink_state", request.param, keeper_path=f"/store_{db}")
    s.ensure_schema()
    s.ensure_schema()  # idempotent
    return s


def test_transitions_and_listing(store):
    e = store.acquire_epoch("s1")
    a, b = PartitionKey("s1", "t", 0), PartitionKey("s1", "t", 1, "db.tbl")
    assert store.get(a) is None
    store.begin(a, OffsetRange(0, 9), e)
    assert store.get(a).state.phase is Phase.BEFORE
    store.commit(a, OffsetRange(0, 9), e)
    store.begin(b, OffsetRange(5, 7), e)
    got = store.get(a).state
    assert (got.range, got.phase, got.epoch) == (OffsetRange(0, 9), Phase.AFTER, e)
    assert [r.pk for r in store.list_sink("s1")] == [a, b]
    assert store.get_many([a, b]).keys() == {a, b}
    assert store.list_sink("other") == []


def test_one_table_many_sinks_and_delete(store):
    e1, e2 = store.acquire_epoch("s1"), store.acquire_epoch("s2")
    for p in range(3):
        store.begin(PartitionKey("s1", "t", p), OffsetRange(0, 1), e1)
        store.begin(PartitionKey("s2", "t", p), OffsetRange(0, 1), e2)
    assert store.delete("s1", [("t", 0), ("t", 2)]) == 2
    assert [r.pk.partition for r in store.list_sink("s1")] == [1]
    assert store.delete("s1") == 1
    assert store.list_sink("s1") == [] and len(store.list_sink("s2")) == 3
    assert store.current_epoch("s1") == 0  # the epoch row is gone with the sink


def test_epochs_increase_and_fence_stale_writers(store):
    old = store.acquire_epoch("s1")
    pk = PartitionKey("s1", "t", 0)
    store.begin(pk, OffsetRange(0, 9), old)
    new = store.acquire_epoch("s1")
    assert new == old + 1
    # the stale writer can't start anything new ...
    with pytest.raises(FencedError, match="stale"):
        store.begin(PartitionKey("s1", "t", 1), OffsetRange(0, 9), old)
    # ... and once the new run touched the partition, can neither move it nor insert
    store.begin(pk, OffsetRange(0, 9), new)
    with pytest.raises(FencedError):
        store.commit(pk, OffsetRange(0, 9), old)
    with pytest.raises(FencedError):
        store.check_fence(pk, old)
    assert store.get(pk).state.epoch == new


def test_newer_schema_version_is_refused(store):
    store.client.command(f"ALTER TABLE {store.fqn} UPDATE epoch = {SCHEMA_VERSION + 1} WHERE key = '__schema__'")
    with pytest.raises(StateStoreError, match="newer than this chsink"):
        store.ensure_schema()


def test_keepermap_state_lives_in_zookeeper(ch_db, zookeeper):
    client, db = ch_db
    s = StateStore(client, "st", Engine.KEEPER_MAP, keeper_path=f"/zk_{db}")
    s.ensure_schema()
    e = s.acquire_epoch("s1")
    s.begin(PartitionKey("s1", "t", 0), OffsetRange(0, 1), e)
    zk = KazooClient(hosts=zookeeper.hosts)
    zk.start(10)
    try:
        assert len(zk.get_children(f"/chsink_keeper_map/zk_{db}/data")) == 3  # schema, epoch, partition
    finally:
        zk.stop()


def test_each_run_owns_its_epoch_alone(store, monkeypatch):
    """Two runs in pods with the same hostname and pid (a restarted pod) must not both win one epoch: the
    compare-and-set is decided by reading one's own owner back."""
    import os
    import socket

    from sparkapp.spark.job import run_owner

    monkeypatch.setattr(socket, "gethostname", lambda: "chsink-driver")
    monkeypatch.setattr(os, "getpid", lambda: 7)
    a, b = run_owner(), run_owner()
    assert a != b and a.startswith("chsink-driver:7:")
    first, second = store.acquire_epoch("s1", owner=a), store.acquire_epoch("s1", owner=b)
    assert second == first + 1
    assert [r[9] for r in store._select("key = 's1/__epoch__'")] == [b]


def test_many_partitions_go_before_and_after_together_each_on_its_own_planned_state(store):
    """begin_many/commit_many: one conditional write for all, each row compared with the state it was planned
    from; a row another writer moved is a conflict that writes nothing, the others move on."""
    from sparkapp.edges.store import Begin, StateConflict

    e = store.acquire_epoch("s1")
    pks = [PartitionKey("s1", "t", p) for p in range(4)]
    store.begin(pks[0], OffsetRange(0, 9), e)
    store.commit(pks[0], OffsetRange(0, 9), e)
    store.begin(pks[1], OffsetRange(0, 4), e)
    store.commit(pks[1], OffsetRange(0, 4), e)
    planned = store.load_many(pks, e)
    assert set(planned) == set(pks[:2])
    store.begin(pks[1], OffsetRange(5, 6), e)  # another attempt of the same epoch moved partition 1
    items = [Begin(pk, OffsetRange(10 * i + 10, 10 * i + 19), planned[pk].state if pk in planned else None,
                   layout=0, shard=i, block_offsets=7) for i, pk in enumerate(pks)]
    conflicts = store.begin_many(items, e)
    assert set(conflicts) == {pks[1]} and isinstance(conflicts[pks[1]], StateConflict)
    rows = store.get_many(pks)
    assert rows[pks[1]].state.range == OffsetRange(5, 6)  # untouched
    for i in (0, 2, 3):
        r = rows[pks[i]]
        assert (r.state.range, r.state.phase, r.state.epoch, r.shard, r.block_offsets) == \
            (OffsetRange(10 * i + 10, 10 * i + 19), Phase.BEFORE, e, i, 7)
    ok = [it for it in items if it.pk != pks[1]]
    store.commit_many(ok, e)
    assert {pk: r.state.phase for pk, r in store.get_many(pks).items()} == \
        {pks[0]: Phase.AFTER, pks[1]: Phase.BEFORE, pks[2]: Phase.AFTER, pks[3]: Phase.AFTER}

    newer = store.acquire_epoch("s1")  # a newer run: the old writer is fenced from BEFORE and AFTER alike
    again = [Begin(pk, OffsetRange(100, 109), store.get(pk).state) for pk in (pks[0], pks[2])]
    with pytest.raises(FencedError):
        store.begin_many(again, e)
    store.begin_many(again, newer)
    with pytest.raises(FencedError):
        store.commit_many(again, e)
    store.commit_many(again, newer)
    assert store.get(pks[2]).state.phase is Phase.AFTER


@pytest.mark.parametrize("loaded", [False, True], ids=["read", "loaded"])
def test_many_partitions_go_before_from_any_state_each_exactly_as_planned(store, loaded):
    """begin_many's one write assigns only what changes (not the epoch and layout its condition holds at their
    new values; a range that follows the row's own as `max_offset + 1`): rows of an older and of this epoch,
    ranges that follow on or skip offsets, a layout that changes, dead-letter fields set or reset, all come out
    exactly as planned, whether it reads the rows itself or takes what load_many read."""
    from sparkapp.edges.store import Begin

    old = store.acquire_epoch("s1")
    pks = [PartitionKey("s1", "t", p) for p in range(6)]
    for pk in pks[:3]:
        store.begin(pk, OffsetRange(0, 9), old)
        store.commit(pk, OffsetRange(0, 9), old)
    e = store.acquire_epoch("s1")
    for pk in pks[3:]:
        store.begin(pk, OffsetRange(0, 9), e)
        if pk.partition == 4:  # its range had dead letters: DONE from a mark, which the next range resets
            store.mark_dlq_sending(pk, e, "m0")
            store.mark_dlq_done(pk, e)
        store.commit(pk, OffsetRange(0, 9), e)

    def before(plans: dict[int, tuple[int, int, int, int, int, str | None]]) -> str:
        """partition -> (min, max, layout, shard, block_offsets, dlq mark): BEFORE for all, then checked; returns
        what the write assigned."""
        rows = store.load_many(pks, e)
        items = [Begin(pk, OffsetRange(*plans[pk.partition][:2]), rows[pk].state, *plans[pk.partition][2:])
                 for pk in pks]
        writes: list[str] = []
        update = store._update
        store._update = lambda assignments, where: (writes.append(assignments), update(assignments, where))[1]
        try:
            assert store.begin_many(items, e, loaded=rows if loaded else None) == {}
        finally:
            store._update = update
        got = store.get_many(pks)
        assert {pk.partition: (got[pk].state.range.min, got[pk].state.range.max, got[pk].state.phase,
                               got[pk].state.epoch, got[pk].state.layout, got[pk].shard, got[pk].block_offsets,
                               got[pk].dlq, got[pk].dlq_mark) for pk in pks} == \
            {p: (lo, hi, Phase.BEFORE, e, layout, shard, bo, DlqPhase.NONE if mark is None else DlqPhase.SENDING,
                 mark or "") for p, (lo, hi, layout, shard, bo, mark) in plans.items()}
        store.commit_many(items, e)
        return writes[0]

    # partitions 0-2 of the older epoch: the epoch changes; 1 skips offsets (a transaction's markers); 2 takes
    # another layout and shard; 3 records a dead-letter mark; 4's DONE mark is reset; 5 another window size
    before({0: (10, 19, 0, 0, 7, None), 1: (15, 30, 0, 0, 7, None), 2: (10, 19, 1, 3, 7, None),
            3: (10, 19, 0, 0, 7, "m1"), 4: (10, 19, 0, 0, 7, None), 5: (10, 19, 0, 0, 9, None)})
    # all of this epoch now, every range following on, one layout changing back
    before({0: (20, 29, 0, 0, 7, None), 1: (31, 35, 0, 0, 7, None), 2: (20, 29, 0, 3, 7, None),
            3: (20, 29, 0, 0, 7, None), 4: (20, 24, 0, 0, 7, None), 5: (20, 21, 0, 0, 9, None)})
    # all following on with the same layout, shards and window sizes, offsets as wide as Kafka's: nothing but the
    # range is assigned a value (and the dead-letter fields their reset)
    steady = before({p: (36 if p == 1 else 30 if p != 4 else 25, 2**62 + p, 0, 0 if p != 2 else 3,
                         7 if p != 5 else 9, None) for p in range(6)})
    assert [a.split(" = ")[0] for a in steady.split(", ") if " = " in a and not a.startswith("'")] == \
        ["phase", "min_offset", "max_offset", "dlq", "dlq_mark", "updated_at"], steady


def test_after_confirms_only_ranges_its_own_epoch_recorded_dead_letters_done_where_marked(store):
    """commit_many (and commit) confirm a range only where this epoch recorded it: an older run's BEFORE range is the new
    run's to re-send, not to confirm (its insert may never have landed). Dead letters are DONE where the range
    was begun with a mark, and a row left SENDING against the items' marks is an error, not a silent SENDING."""
    from sparkapp.edges.store import Begin

    old = store.acquire_epoch("s1")
    pks = [PartitionKey("s1", "t", p) for p in range(3)]
    first = [Begin(pk, OffsetRange(0, 9), None, dlq_mark="m0" if pk.partition == 1 else None) for pk in pks]
    assert store.begin_many(first, old) == {}
    e = store.acquire_epoch("s1")
    with pytest.raises(FencedError):
        store.commit_many(first, e)
    with pytest.raises(FencedError):
        store.commit(pks[0], OffsetRange(0, 9), e)
    assert {pk: (r.state.phase, r.state.epoch) for pk, r in store.get_many(pks).items()} == \
        dict.fromkeys(pks, (Phase.BEFORE, old))

    def through(rng: OffsetRange, marked: set[int]) -> dict[int, tuple[Phase, int, DlqPhase]]:
        rows = store.load_many(pks, e)
        items = [Begin(pk, rng, rows[pk].state, dlq_mark=f"m{rng.min}" if pk.partition in marked else None)
                 for pk in pks]
        assert store.begin_many(items, e, loaded=rows) == {}
        store.commit_many(items, e)
        got = store.get_many(pks)
        return {pk.partition: (got[pk].state.phase, got[pk].state.epoch, got[pk].dlq) for pk in pks}

    assert through(OffsetRange(10, 19), {2}) == {0: (Phase.AFTER, e, DlqPhase.NONE),
                                                 1: (Phase.AFTER, e, DlqPhase.NONE),
                                                 2: (Phase.AFTER, e, DlqPhase.DONE)}
    assert through(OffsetRange(20, 29), set()) == dict.fromkeys(range(3), (Phase.AFTER, e, DlqPhase.NONE))
    rows = store.load_many(pks, e)
    marked = [Begin(pk, OffsetRange(30, 39), rows[pk].state, dlq_mark="m30") for pk in pks]
    assert store.begin_many(marked, e, loaded=rows) == {}
    with pytest.raises(StateStoreError, match="SENDING"):
        store.commit_many([Begin(it.pk, it.rng, it.expected) for it in marked], e)


def test_read_through_lifts_a_quiet_tables_after_row_only_rises_is_fenced_and_goes_with_its_partition(store):
    e = store.acquire_epoch("s1")
    busy, quiet, waiting = (PartitionKey("s1", "t", 0, "busy"), PartitionKey("s1", "t", 0, "quiet"),
                            PartitionKey("s1", "t", 1, "quiet"))
    for pk, rng in ((busy, OffsetRange(10, 99)), (quiet, OffsetRange(0, 4)), (waiting, OffsetRange(3, 8))):
        store.begin(pk, rng, e)
    store.commit(busy, OffsetRange(10, 99), e)
    store.commit(quiet, OffsetRange(0, 4), e)  # partition 1's `quiet` stays BEFORE: it stalled
    assert store.sink_state("s1").resume() == {("t", 0): 5, ("t", 1): 3}
    store.record_read_through("s1", {("t", 0): 100, ("t", 1): 50}, e)
    state = store.sink_state("s1")
    assert [r.pk for r in state.rows] == [busy, quiet, waiting]  # the positions are no table's rows
    assert state.read_through == {("t", 0): 100, ("t", 1): 50}
    assert state.resume() == {("t", 0): 100, ("t", 1): 3}  # a BEFORE range is re-read whatever the position
    assert [state.table_resume(r) for r in state.rows] == [100, 100, 3]
    store.record_read_through("s1", {("t", 0): 60, ("t", 1): 70}, e)  # a run that started lower never lowers it
    assert store.sink_state("s1").read_through == {("t", 0): 100, ("t", 1): 70}
    newer = store.acquire_epoch("s1")
    with pytest.raises(FencedError, match="sink taken over"):
        store.record_read_through("s1", {("t", 0): 200}, e)
    store.record_read_through("s1", {("t", 0): 200}, newer)
    assert store.sink_state("s1").read_through == {("t", 0): 200, ("t", 1): 70}
    assert store.delete("s1", [("t", 0)]) == 3  # a reset partition starts over: its position goes with it
    assert store.sink_state("s1").read_through == {("t", 1): 70}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["a", "b", "c"]), st.integers(0, 50), st.integers(0, 50),
                          st.booleans()), max_size=12),
       st.dictionaries(st.integers(0, 2), st.integers(1, 120)))
def test_a_read_through_position_only_lifts_confirmed_tables(spec, through):
    rows = {}
    for p, table, lo, n, after in spec:
        pk = PartitionKey("s", "t", p, table)
        rows[pk] = StateRow(pk, StoredState(OffsetRange(lo, lo + n), Phase.AFTER if after else Phase.BEFORE),
                            "", 0, DlqPhase.NONE, "", dt.datetime.now(dt.UTC))
    positions = {("t", p): at for p, at in through.items()}
    plain, lifted = resume_positions(rows.values()), resume_positions(rows.values(), positions)
    assert lifted.keys() == plain.keys()  # a position alone never makes a partition resume anywhere
    for tp, at in lifted.items():
        mine = [r.state for r in rows.values() if (r.pk.topic, r.pk.partition) == tp]
        assert plain[tp] <= at <= max(plain[tp], positions.get(tp, 0))
        assert all(at <= s.range.min for s in mine if s.phase is Phase.BEFORE)  # unconfirmed ranges are re-read
        assert all(at <= s.resume_offset or at <= positions[tp] for s in mine)
