"""Sharded writes in-process, on real chdb with one database per shard (and ZooKeeper-backed state).

Covers what needs a crash at an exact point: between the sub-blocks of one window under `key` and
`offsetStripe` routing, and a BEFORE range left under one layout and retried after the sink moved
to the next.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from hack.testbed.process import free_port
from sparkapp.config import ClickHouseConfig, Engine
from sparkapp.core.records import Message
from sparkapp.core.routing import HashName, Layout, Policy
from sparkapp.core.state_machine import OffsetRange, Phase
from sparkapp.delivery.context import WriterContext
from sparkapp.delivery.writer import write_lines, write_partition
from sparkapp.edges.clickhouse import clickhouse_client, load_schema
from sparkapp.edges.insert import Inserter
from sparkapp.edges.shards import Health, LayoutError, ShardSet, ShardUnavailableError
from sparkapp.edges.store import PartitionKey, StateStore
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from tests.helpers import line_batch, msg

TABLE = ("CREATE TABLE IF NOT EXISTS `{db}`.ev (id UInt64, k String, _topic String, _partition UInt32, _offset UInt64) "
         "ENGINE = MergeTree ORDER BY (_partition, _offset) SETTINGS non_replicated_deduplication_window = 10000")
SINK = "shard-sink"


class Crash(Exception):
    pass


@pytest.fixture
def shards(ch_db):
    """Five shard databases next to the test's database; dropped afterwards."""
    client, db = ch_db
    dbs = [f"{db}_s{i}" for i in range(5)]
    for d in dbs:
        client.command(f"CREATE DATABASE IF NOT EXISTS `{d}`")
        client.command(TABLE.format(db=d))
    yield client, db, dbs
    for d in dbs:
        client.command(f"DROP DATABASE IF EXISTS `{d}` SYNC")


def shard_set(client: Any, dbs: dict[int, list[str]], layouts: dict[int, Layout], current: int) -> ShardSet:
    return ShardSet(layouts, current, lambda lay, s: Inserter(client, load_schema(client, dbs[lay][s], "ev")),
                    lambda lay, s: dbs[lay][s], Health())


def context(client: Any, store: StateStore, ss: ShardSet, fault: Any = None, refetch: Any = None) -> WriterContext:
    schema = load_schema(client, ss.label(ss.current, 0), "ev")
    return WriterContext(SINK, store, Inserter(client, schema), make_decoder(DecoderSpec(Format.JSON), schema),
                         store.acquire_epoch(SINK), block_offsets=7, shards=ss, layout=ss.current,
                         refetch=refetch, fault=fault or (lambda step: None))


def offsets_by_shard(client: Any, dbs: list[str]) -> dict[str, list[tuple[int, int]]]:
    return {d: [tuple(r) for r in client.query(f"SELECT _partition, _offset FROM `{d}`.ev ORDER BY 1, 2").result_rows]
            for d in dbs}


def stream(partition: int, n: int) -> list[Message]:
    """Keys of every kind the fast path reads: plain, escaped in JSON (\\u00fc, \\"), and missing (the default)."""
    def record(i: int) -> dict[str, Any]:
        k = {0: {}, 1: {"k": f'ü-"{i % 5}"'}}.get(i % 17, {"k": f"user-{(i * 7919) % 113}"})
        return {"id": partition * 10_000 + i, **k}

    return [msg(record(i), offset=i * 2, topic="src", partition=partition) for i in range(n)]


@pytest.mark.parametrize("policy", [Policy.KEY, Policy.OFFSET_STRIPE])
def test_crash_between_sub_blocks_leaves_no_duplicates_and_no_gaps(shards, policy):
    client, db, dbs = shards
    dbs = dbs[:3]
    store = StateStore(client, "state", Engine.KEEPER_MAP, keeper_path=f"/shard_{db}")
    store.ensure_schema()
    layout = Layout(0, (1, 2, 1), policy, HashName.XXHASH64, "String", stripe=5, key="k")
    logs = {p: stream(p, 120) for p in (0, 1)}
    rng = random.Random(11)

    def refetch(topic: str, partition: int, r: OffsetRange) -> list[Message]:
        return [m for m in logs[partition] if m.offset in r]

    crashes = 0
    between = 0  # crashes with some, not all, sub-blocks of a window sent

    for run in range(200):
        countdown = rng.randrange(1, 12)
        def fault(step: str, run: int = run) -> None:
            nonlocal countdown, crashes, between
            if step in ("after_begin", "after_block", "after_insert", "after_commit"):
                countdown -= 1
                if countdown == 0 and run < 40:
                    crashes += 1
                    between += step == "after_block"
                    raise Crash(step)

        ctx = context(client, store, shard_set(client, {0: dbs}, {0: layout}, 0), fault, refetch)
        try:
            for p, log in logs.items():
                pk = PartitionKey(SINK, "src", p)
                row = store.get(pk)
                start = 0 if row is None else row.state.resume_offset
                pos = next((i for i, m in enumerate(log) if m.offset >= start), len(log))
                while pos < len(log):
                    n = rng.randrange(3, 25)
                    batch = log[pos:pos + n]
                    if rng.random() < 0.5:  # either path, a retry often on the other one: same sub-blocks
                        write_lines(ctx, pk, line_batch(batch, ctx.inserter.schema.names))
                    else:
                        write_partition(ctx, pk, batch)
                    pos += n
        except Crash:
            continue
        break
    assert crashes >= 30 and between >= 8, (crashes, between)
    got = offsets_by_shard(client, dbs)
    every = sorted(o for rows in got.values() for o in rows)
    assert every == sorted((p, m.offset) for p, log in logs.items() for m in log), "duplicates or gaps across shards"
    for i, d in enumerate(dbs):  # every row on the shard its routing selects, checked in SQL
        if policy is Policy.KEY:
            wrong = f"multiIf(xxHash64(k) % 4 < 1, 0, xxHash64(k) % 4 < 3, 1, 2) != {i}"
        else:
            wrong = f"intDiv(_offset, 5) % 3 != {i}"
        assert client.query(f"SELECT count() FROM `{d}`.ev WHERE {wrong}").result_rows[0][0] == 0
        assert got[d], f"shard {i} received nothing"
    for p in logs:
        row = store.get(PartitionKey(SINK, "src", p))
        assert row is not None and row.state.phase is Phase.AFTER and row.state.layout == 0


def test_before_range_is_retried_on_its_first_shard_after_a_layout_change(shards):
    """Partition routing, 2 -> 3 shards: the unconfirmed range goes back to shard 0 under layout 0, the rest
    to the partition's new shard under layout 1; without the previous layout the writer refuses."""
    client, db, dbs = shards
    store = StateStore(client, "state", Engine.KEEPER_MAP, keeper_path=f"/shardmove_{db}")
    store.ensure_schema()
    log = stream(0, 40)
    old = Layout(0, (1, 1), assignment={("src", 0): 0})
    new = Layout(1, (1, 1, 1), assignment={("src", 0): 2})
    dbs_of = {0: dbs[:2], 1: [dbs[0], dbs[1], dbs[2]]}
    pk = PartitionKey(SINK, "src", 0)

    def crash_after_insert(step: str) -> None:
        if step == "after_insert":
            raise Crash(step)

    ctx = context(client, store, shard_set(client, dbs_of, {0: old}, 0), crash_after_insert)
    with pytest.raises(Crash):
        write_partition(ctx, pk, log[:15])
    row = store.get(pk)
    assert row is not None and row.state.phase is Phase.BEFORE and (row.state.layout, row.shard) == (0, 0)

    ctx = context(client, store, shard_set(client, {1: dbs_of[1]}, {1: new}, 1))
    with pytest.raises(LayoutError, match="layout v0"):
        write_partition(ctx, pk, log[:30])

    ctx = context(client, store, shard_set(client, dbs_of, {0: old, 1: new}, 1))
    write_partition(ctx, pk, log[:30])
    write_partition(ctx, pk, log[30:])
    got = offsets_by_shard(client, dbs[:3])
    assert [o for _, o in got[dbs[0]]] == [m.offset for m in log[:15]], "the retry reached its first shard"
    assert got[dbs[1]] == []
    assert [o for _, o in got[dbs[2]]] == [m.offset for m in log[15:]]
    row = store.get(pk)
    assert row is not None and row.state.phase is Phase.AFTER and (row.state.layout, row.shard) == (1, 2)


def test_stalled_partition_catches_up_from_its_before_range(shards):
    """A partition whose shard failed keeps its BEFORE range; a later batch, with the batches in between
    never seen, re-reads everything from that range on (nothing is lost)."""
    client, db, dbs = shards
    store = StateStore(client, "state", Engine.KEEPER_MAP, keeper_path=f"/shardstall_{db}")
    store.ensure_schema()
    log = stream(0, 60)
    pk = PartitionKey(SINK, "src", 0)
    layout = Layout(0, (1,), assignment={("src", 0): 0})

    def refetch(topic: str, partition: int, r: OffsetRange) -> list[Message]:
        return [m for m in log if m.offset in r]

    def crash_after_begin(step: str) -> None:  # begin recorded, the shard never answered
        if step == "after_begin":
            raise Crash(step)

    write_partition(context(client, store, shard_set(client, {0: dbs[:1]}, {0: layout}, 0)), pk, log[:10])
    ctx = context(client, store, shard_set(client, {0: dbs[:1]}, {0: layout}, 0), crash_after_begin, refetch)
    with pytest.raises(Crash):
        write_partition(ctx, pk, log[10:20])
    # batches 20..40 went by while the partition stalled; the next one starts at 40
    ctx = context(client, store, shard_set(client, {0: dbs[:1]}, {0: layout}, 0), refetch=refetch)
    write_partition(ctx, pk, log[40:])
    assert [o for _, o in offsets_by_shard(client, dbs[:1])[dbs[0]]] == [m.offset for m in log]


def test_before_range_keeps_its_policy_when_the_policy_changes(shards):
    """offsetStripe -> partition: the unconfirmed range is re-sent striped, as first sent; the rest follows
    the new policy."""
    client, db, dbs = shards
    store = StateStore(client, "state", Engine.KEEPER_MAP, keeper_path=f"/shardpolicy_{db}")
    store.ensure_schema()
    log = stream(0, 40)
    old = Layout(0, (1, 1), Policy.OFFSET_STRIPE, stripe=4)
    new = Layout(1, (1, 1), assignment={("src", 0): 1})
    pk = PartitionKey(SINK, "src", 0)

    def crash_after_insert(step: str) -> None:
        if step == "after_insert":
            raise Crash(step)

    with pytest.raises(Crash):
        write_partition(context(client, store, shard_set(client, {0: dbs[:2]}, {0: old}, 0), crash_after_insert),
                        pk, log[:15])
    ctx = context(client, store, shard_set(client, {0: dbs[:2], 1: dbs[:2]}, {0: old, 1: new}, 1))
    write_partition(ctx, pk, log)
    got = offsets_by_shard(client, dbs[:2])
    first = [m.offset for m in log[:15]]
    assert [o for _, o in got[dbs[0]]] == [o for o in first if (o // 4) % 2 == 0]
    assert [o for _, o in got[dbs[1]]] == sorted([o for o in first if (o // 4) % 2 == 1] +
                                                  [m.offset for m in log[15:]])


def test_shard_unreachable_when_its_inserter_is_first_built_stalls_only_its_partitions(shards):
    """A writer that meets a shard for the first time while it does not answer (a driver's catch-up, a new
    executor worker) stalls the partitions routed there; it does not fail the batch or the job."""
    client, db, dbs = shards
    store = StateStore(client, "state", Engine.KEEPER_MAP, keeper_path=f"/shardfirst_{db}")
    store.ensure_schema()
    dead = ClickHouseConfig(endpoints=[f"http://127.0.0.1:{free_port()}"], tables={"*": "ev"})

    def make(lay: int, s: int) -> Inserter:
        c = client if s == 0 else clickhouse_client(dead)  # shard 1's server is down: connection refused
        return Inserter(c, load_schema(c, dbs[s], "ev"))

    layout = Layout(0, (1, 1), assignment={("src", 0): 0, ("src", 1): 1})
    ctx = context(client, store, ShardSet({0: layout}, 0, make, lambda lay, s: dbs[s], Health()))
    write_partition(ctx, PartitionKey(SINK, "src", 0), stream(0, 10))
    with pytest.raises(ShardUnavailableError):
        write_partition(ctx, PartitionKey(SINK, "src", 1), stream(1, 10))
    assert ctx.shards is not None and dbs[1] in ctx.shards.health.down
    with pytest.raises(ShardUnavailableError, match="next try in"):  # not tried again at once
        write_partition(ctx, PartitionKey(SINK, "src", 1), stream(1, 10))
    write_partition(ctx, PartitionKey(SINK, "src", 0), stream(0, 20)[10:])
    assert [o for _, o in offsets_by_shard(client, dbs[:1])[dbs[0]]] == [m.offset for m in stream(0, 20)]
    row = store.get(PartitionKey(SINK, "src", 1))
    assert row is None or row.state.phase is Phase.BEFORE


def test_a_line_clickhouse_refuses_leaves_its_window_s_other_rows_on_the_shards_their_keys_pick(shards, kafka, topic):
    """Rows routed by `key` on the fast path, a window holding a line the Guard lets through and ClickHouse refuses
    (`1.5` in a UInt64): the window's insert is refused, the line dead-lettered with the decoder's reason, and the
    rest of the window sent again, each row still on the shard its own key picks (the keys of the lines left, not
    of the window's first lines). The next window loses a record that is no object before its keys are read: its
    lines are pieces, each row keyed by its own."""
    from sparkapp.edges.dlq import HEADER_OFFSET, KafkaDeadLetterSink
    from tests.helpers import read_dlq

    client, db, dbs = shards
    dbs = dbs[:3]
    store = StateStore(client, "state", Engine.KEEPER_MAP, keeper_path=f"/refused_{db}")
    store.ensure_schema()
    layout = Layout(0, (1, 2, 1), Policy.KEY, HashName.XXHASH64, "String", key="k")
    dlq_topic = topic(1)
    ctx = context(client, store, shard_set(client, {0: dbs}, {0: layout}, 0))
    ctx.dlq = KafkaDeadLetterSink(dlq_topic, {"bootstrap.servers": kafka.bootstrap})
    log = [msg({"id": i, "k": f"user-{(i * 7919) % 113}"}, offset=i, topic="src") for i in range(12)]
    refused = 2  # early in its window of 7: a key taken by position would shift every later row's shard
    log[refused] = msg(b'{"id": 1.5, "k": "user-x"}', offset=refused, topic="src")
    no_object = 9
    log[no_object] = msg(b'["user-y"]', offset=no_object, topic="src")
    r = write_lines(ctx, PartitionKey(SINK, "src", 0), line_batch(log, ctx.inserter.schema.names))
    assert (r.inserted_rows, r.dead_lettered) == (10, 2)
    got = offsets_by_shard(client, dbs)
    assert sorted(o for _, o in (row for rows in got.values() for row in rows)) == [
        o for o in range(12) if o not in (refused, no_object)]
    for i, d in enumerate(dbs):
        wrong = f"multiIf(xxHash64(k) % 4 < 1, 0, xxHash64(k) % 4 < 3, 1, 2) != {i}"
        assert client.query(f"SELECT count() FROM `{d}`.ev WHERE {wrong}").result_rows[0][0] == 0, d
    dead = read_dlq(kafka.bootstrap, dlq_topic, 2)
    assert sorted(int(dict(d.headers())[HEADER_OFFSET]) for d in dead) == [refused, no_object]
