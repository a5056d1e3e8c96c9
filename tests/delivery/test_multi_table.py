"""Multi-table (routed) partitions: one table's outage never costs another table its rows.

A batch whose first table stalls on an unavailable shard must still deliver the other tables' records;
otherwise the next batch lands above a hole in their ranges and the skipped records are lost.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import Producer

from sparkapp.config import parse_config
from sparkapp.core.state_machine import OffsetRange, Phase
from sparkapp.delivery.runtime import REGISTRY, Runtime
from sparkapp.edges.kafka import read_range
from sparkapp.edges.shards import ShardUnavailableError
from sparkapp.edges.store import state_store

TABLE = ("CREATE TABLE IF NOT EXISTS `{db}`.{t} (id UInt64, _topic String, _partition UInt32, _offset UInt64) "
         "ENGINE = MergeTree ORDER BY _offset SETTINGS non_replicated_deduplication_window = 10000")


def _routed(ch_db, ch_dsn, chdb_config, kafka, topic, **fmt: Any) -> tuple[Runtime, str, list[list[Any]]]:
    """Tables a and b, 40 records of one partition routed to them in turn, and a runtime that has delivered the
    first 10 of them; returns the runtime, the topic and the three batches."""
    client, db = ch_db
    for t in ("a", "b"):
        client.command(TABLE.format(db=db, t=t))
    src = topic(1)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(40):
        p.produce(src, json.dumps({"id": i, "table": "ab"[i % 2]}).encode(), partition=0)
    assert p.flush(30) == 0
    cfg = parse_config({
        "name": f"mt-{db}", "kafka": {"bootstrapServers": kafka.bootstrap, "topics": [src]},
        "clickhouse": {"endpoints": [ch_dsn], "database": db, "tables": {"*": "a"}, "tableField": "table",
                       "chdbConfigFile": str(chdb_config)},
        "state": {"keeperPath": f"/mt_{db}"}, "checkpointLocation": "/unused", "format": fmt})
    store = state_store(cfg, client)
    store.ensure_schema()
    rt = Runtime(cfg, store.acquire_epoch(cfg.name), client, store, None)
    batches = [read_range(cfg.kafka, src, 0, OffsetRange(lo, hi)) for lo, hi in ((0, 9), (10, 29), (30, 39))]
    rt.process(src, 0, batches[0])  # both tables answer
    return rt, src, batches


def _each_once(client: Any, db: str) -> None:
    for t, first in (("a", 0), ("b", 1)):
        got = [r[0] for r in client.query(f"SELECT _offset FROM `{db}`.{t} ORDER BY _offset").result_rows]
        assert got == list(range(first, 40, 2)), (t, got)


def test_a_stalled_table_does_not_cost_the_other_table_its_batch(ch_db, ch_dsn, chdb_config, kafka, topic):
    client, db = ch_db
    rt, src, (_, batch1, batch2) = _routed(ch_db, ch_dsn, chdb_config, kafka, topic)
    store, cfg = rt.store, rt.cfg
    rt.health.retry_interval_s = 0  # try the shard again at once when it is back

    client.command(f"DETACH TABLE `{db}`.a")  # table a's shard stops answering (past the inserter's retries)
    try:
        rt.process(src, 0, batch1)
        raise AssertionError("table a's outage must stall the partition")
    except ShardUnavailableError:
        pass
    finally:
        client.command(f"ATTACH TABLE `{db}`.a")
    rows = {r.pk.table: r for r in store.list_sink(cfg.name)}
    assert rows["a"].state.phase is Phase.BEFORE  # waits, nothing lost
    # b was not skipped: its range is recorded (AFTER, or BEFORE when it shares a's shard, which is then down)
    assert rows["b"].state.range == OffsetRange(11, 29)

    rt.process(src, 0, batch2)  # table a is back: its BEFORE range is re-read; b goes on from where it was
    _each_once(client, db)


@pytest.mark.parametrize("where", ["decoding", "adding columns"])
def test_a_table_whose_records_cannot_be_read_yet_stalls_before_and_loses_nothing(ch_db, ch_dsn, chdb_config, kafka,
                                                                                  topic, where):
    """A schema registry that does not answer stalls a table as an unavailable shard does: its range is recorded
    BEFORE first, so the next batch re-reads it, and the partition's other tables take their records. Read before
    the range was recorded (to decode, or to find the columns to add), such a stall left the table's state below
    a hole that the next batch's range landed above, or skipped the other tables."""
    rt, src, (_, batch1, batch2) = _routed(ch_db, ch_dsn, chdb_config, kafka, topic,
                                           addColumns=where == "adding columns")
    ctx, read = rt.contexts["a"], rt.readers["a"]
    decode = ctx.decode

    def registry_down(m: Any) -> Any:  # where the registry's reader raises (runtime.waits_for_registry)
        raise ShardUnavailableError(REGISTRY, "schema registry at http://127.0.0.1:9 did not answer")

    ctx.decode = registry_down
    if where == "adding columns":
        rt.readers["a"] = registry_down
    with pytest.raises(ShardUnavailableError):
        rt.process(src, 0, batch1)
    ctx.decode, rt.readers["a"] = decode, read
    assert {r.pk.table: r.state.phase for r in rt.store.list_sink(rt.cfg.name)} == \
        {"a": Phase.BEFORE, "b": Phase.AFTER}

    rt.process(src, 0, batch2)  # the registry answers again
    _each_once(*ch_db)


def test_a_long_catch_up_is_read_a_micro_batch_at_a_time(ch_db, ch_dsn, chdb_config, kafka, topic, monkeypatch):
    """A partition that stalled while Spark moved on is caught up from Kafka in stretches of at most
    maxOffsetsPerTrigger offsets: memory stays bounded by a micro-batch, and every record lands once."""
    from sparkapp.delivery import runtime

    client, db = ch_db
    client.command(TABLE.format(db=db, t="a"))
    src = topic(1)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(95):
        p.produce(src, json.dumps({"id": i}).encode(), partition=0)
    assert p.flush(30) == 0
    cfg = parse_config({
        "name": f"cu-{db}", "kafka": {"bootstrapServers": kafka.bootstrap, "topics": [src]},
        "clickhouse": {"endpoints": [ch_dsn], "database": db, "tables": {"*": "a"},
                       "chdbConfigFile": str(chdb_config)},
        "batching": {"maxOffsetsPerTrigger": 20, "blockOffsets": 8},
        "state": {"keeperPath": f"/cu_{db}"}, "checkpointLocation": "/unused"})
    store = state_store(cfg, client)
    store.ensure_schema()
    rt = Runtime(cfg, store.acquire_epoch(cfg.name), client, store, None)
    rt.process(src, 0, read_range(cfg.kafka, src, 0, OffsetRange(0, 14)))
    pk = store.list_sink(cfg.name)[0].pk
    store.begin(pk, OffsetRange(15, 34), rt.epoch, block_offsets=8)  # the batch that stalled, never sent

    reads: list[int] = []
    real = runtime.read_range

    def counted(*a, **kw):
        got = real(*a, **kw)
        reads.append(len(got))
        return got
    monkeypatch.setattr(runtime, "read_range", counted)
    rt.catch_up(src, 0, 15, 94)
    assert reads and max(reads) <= 20, reads
    got = [r[0] for r in client.query(f"SELECT _offset FROM `{db}`.a ORDER BY _offset").result_rows]
    assert got == list(range(95))
    assert store.get(pk).state.range.max == 94


def test_a_routing_change_waits_until_nothing_would_be_read_again(ch_db, ch_dsn, chdb_config, kafka, topic):
    """Table a's range is left BEFORE (its shard down) when the routing changes. Re-read under the new routing,
    a record of that range could reach another table than its first attempt, which skips it as delivered (lost)
    or stores it again. So a run refuses the change at start, naming the range, and takes it once the sink has
    delivered all it read."""
    from sparkapp.config import ConfigError
    from sparkapp.delivery.runtime import check_routing, routing_spec

    client, db = ch_db
    rt, src, (_, batch1, batch2) = _routed(ch_db, ch_dsn, chdb_config, kafka, topic)
    store, cfg = rt.store, rt.cfg
    check_routing(store, cfg.name, cfg.clickhouse, [src])  # the first run records its routing
    assert store.routing(cfg.name, src) == routing_spec(cfg.clickhouse, src)
    rt.health.retry_interval_s = 0
    client.command(f"DETACH TABLE `{db}`.a")
    with pytest.raises(ShardUnavailableError):
        rt.process(src, 0, batch1)
    client.command(f"ATTACH TABLE `{db}`.a")

    moved = cfg.clickhouse.model_copy(update={"table_field": None, "table_header": "table"})
    with pytest.raises(ConfigError, match=rf"routing of topic '{src}' changed .* table a has range \[10, 28\] sent "
                                          "but not confirmed"):
        check_routing(store, cfg.name, moved, [src])
    check_routing(store, cfg.name, cfg.clickhouse, [src])  # the old routing still runs

    rt.process(src, 0, batch2)  # a is back: the sink delivers what it read under its routing
    _each_once(client, db)
    with pytest.raises(ConfigError, match=r"resume at offsets \[39, 40\], so the records from 39 on are read again"):
        check_routing(store, cfg.name, moved, [src])  # 39 went to b; a's next record would be read from there
    store.record_read_through(cfg.name, {(src, 0): 40}, rt.epoch)  # as the job does after each batch
    check_routing(store, cfg.name, moved, [src])
    assert store.routing(cfg.name, src) == routing_spec(moved, src)
