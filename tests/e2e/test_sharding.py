"""Sharded delivery end to end: the real job (Spark's Kafka source, the driver-side writer) in this process,
on the session's chdb engine with one database per shard, against real Kafka.

The job runs in-process (not as a subprocess like the other e2e tests) so that the test can act on
the shards while it runs: chdb serves one engine per process, and only its owner can detach a
shard's table. Rebalance plans come from the operator's own planner (sinkoperator/rebalance.py);
the operator's status, approval and drain are tested on the API server in tests/operator.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from sinkoperator.rebalance import plan, previous_config
from sparkapp import metrics
from sparkapp.config import SinkConfig, parse_config
from sparkapp.edges.store import state_store
from sparkapp.spark.job import SinkJob
from sparkapp.verify import verify

from .harness import EVENTS_TABLE, BackgroundProducer, event

SHARDS = 4
pytestmark = pytest.mark.timeout(420)  # a hung Spark stop fails fast, with the stacks pytest-timeout prints


@pytest.fixture
def shard_dbs(ch_db):
    client, db = ch_db
    dbs = [f"{db}_s{i}" for i in range(SHARDS)]
    for d in dbs:
        client.command(f"CREATE DATABASE IF NOT EXISTS `{d}`")
        client.command(EVENTS_TABLE.format(db=f"`{d}`"))
    yield client, db, dbs
    for d in dbs:
        client.command(f"DROP DATABASE IF EXISTS `{d}` SYNC")


@pytest.fixture
def job_env(spark, monkeypatch):
    monkeypatch.delenv("CHSINK_SPARK_JARS", raising=False)  # found where `make setup` put it
    return spark


def config(tmp_path: Path, kafka: Any, src: str, dlq: str, ch_dsn: str, chdb_config: Path, db: str,
           shards: list[int], sharding: dict[str, Any], **batching: Any) -> SinkConfig:
    return parse_config({
        "name": f"sh-{src}"[:60].lower().rstrip("_-."),
        "kafka": {"bootstrapServers": kafka.bootstrap, "topics": [src]},
        "clickhouse": {"endpoints": [ch_dsn] * len(shards), "database": db,
                       "shardDatabases": [f"{db}_s{i}" for i in shards], "tables": {src: "events"},
                       "chdbConfigFile": str(chdb_config)},
        "state": {"engine": "EmbeddedRocksDB", "database": db},
        "dlq": {"topic": dlq},
        "batching": {"maxOffsetsPerTrigger": 3000, "blockOffsets": 700, "triggerInterval": "1 second", **batching},
        "sharding": sharding,
        "checkpointLocation": str(tmp_path / "checkpoint"),
    })


def run(cfg: SinkConfig, **kw: Any) -> SinkJob:
    job = SinkJob(cfg, quiet=True)
    assert job.run(**kw) == 0
    return job


def assert_exactly_once(cfg: SinkConfig, sent: int) -> dict[str, Any]:
    report = verify(cfg)
    t = report.totals
    assert report.ok, report.to_text()
    assert (t["duplicates"], t["gaps"], t["pending"]) == (0, 0, 0), report.to_text()
    assert t["clickhouse"] + t["dead_lettered"] == sent == t["kafka"], report.to_text()
    return t


def count(client: Any, db: str, where: str = "1") -> int:
    return int(client.query(f"SELECT count() FROM `{db}`.events WHERE {where}").result_rows[0][0])


CASES = {
    "partition": ({"policy": "partition"}, None),
    "key-xxHash64": ({"policy": "key", "key": "name", "hash": "xxHash64", "weights": [1, 2, 1]},
                     "multiIf(xxHash64(name) % 4 < 1, 0, xxHash64(name) % 4 < 3, 1, 2)"),
    "key-cityHash64": ({"policy": "key", "key": "id", "hash": "cityHash64"}, "cityHash64(id) % 3"),
    "offsetStripe": ({"policy": "offsetStripe", "stripe": 500}, "intDiv(_offset, 500) % 3"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_three_shards_every_offset_once_on_the_shard_its_policy_selects(
        tmp_path, kafka, topic, ch_dsn, chdb_config, shard_dbs, job_env, case):
    client, db, dbs = shard_dbs
    src, dlq = topic(4), topic(1)
    sharding, expr = CASES[case]
    cfg = config(tmp_path, kafka, src, dlq, ch_dsn, chdb_config, db, [0, 1, 2], sharding)
    producer = BackgroundProducer(kafka, src, 6000, per_second=100_000)
    producer.run()
    assert producer.error is None
    run(cfg, until_idle=4, max_seconds=240)
    assert_exactly_once(cfg, producer.sent)
    for i, d in enumerate(dbs[:3]):
        assert count(client, d) > 0, f"shard {i} got no rows"
        if expr is not None:  # the same hash ClickHouse's Distributed table would compute
            assert count(client, d, f"({expr}) != {i}") == 0, f"rows on shard {i} that belong elsewhere"
    assert count(client, dbs[3]) == 0
    if case == "partition":  # each partition wholly on the one shard its state row records
        rows = {r.pk.partition: r.shard for r in state_store(cfg, client).list_sink(cfg.name)}
        for i, d in enumerate(dbs[:3]):
            parts = {int(p) for (p,) in client.query(f"SELECT DISTINCT _partition FROM `{d}`.events").result_rows}
            assert parts == {p for p, s in rows.items() if s == i}


def test_growing_and_shrinking_shards_while_producing(tmp_path, kafka, topic, ch_dsn, chdb_config, shard_dbs,
                                                      job_env):
    """2 -> 3 shards, then 3 -> 2 (the middle one removed), each through the operator's plan, with the
    job stopped at a batch boundary (the drain) and restarted under the new layout."""
    client, db, _ = shard_dbs
    src, dlq = topic(6), topic(1)
    producer = BackgroundProducer(kafka, src, 40_000, per_second=1200, partitions=6)
    producer.start()
    layouts: list[dict[str, Any]] = [{"version": 0, "endpoints": [ch_dsn] * 2, "weights": [1, 1],
                                      "shardDatabases": [f"{db}_s0", f"{db}_s1"], "assignment": {}}]
    cfg = config(tmp_path, kafka, src, dlq, ch_dsn, chdb_config, db, [0, 1], {"policy": "partition"})
    run(cfg, max_seconds=12)
    plans = []
    for shards in ([0, 1, 2], [0, 2]):
        store = state_store(cfg, client)
        stored = {(r.pk.topic, r.pk.partition): (r.state.layout, r.shard) for r in store.list_sink(cfg.name)}
        want = {"endpoints": [ch_dsn] * len(shards), "shardDatabases": [f"{db}_s{i}" for i in shards],
                "weights": [1] * len(shards)}
        new = plan(layouts[-1], want, [(src, p) for p in range(6)], stored)
        assert new["moves"], f"no moves planned for {shards}"
        plans.append(new["moves"])
        cfg = config(tmp_path, kafka, src, dlq, ch_dsn, chdb_config, db, shards, {
            "policy": "partition", "layout": new["target"]["version"], "assignment": new["target"]["assignment"],
            "previous": previous_config(layouts[-1])})
        layouts.append(new["target"])
        if shards == [0, 2]:
            producer.finish()
            run(cfg, until_idle=4, max_seconds=300)
        else:
            run(cfg, max_seconds=12)
    print(json.dumps(plans, indent=1))
    assert_exactly_once(cfg, producer.sent)
    for r in state_store(cfg, client).list_sink(cfg.name):  # every partition ended under the last layout
        assert (r.state.layout, r.shard) == (2, layouts[-1]["assignment"][f"{src}/{r.pk.partition}"])


def test_partitions_added_while_producing_are_consumed_without_a_restart(
        tmp_path, kafka, topic, ch_dsn, chdb_config, shard_dbs, job_env):
    client, db, _ = shard_dbs
    src, dlq = topic(2), topic(1)
    cfg = config(tmp_path, kafka, src, dlq, ch_dsn, chdb_config, db, [0, 1, 2], {"policy": "partition"},
                 maxOffsetsPerTrigger=1000)
    sent = [0]

    def produce() -> None:
        p = Producer({"bootstrap.servers": kafka.bootstrap})
        for i in range(3000):
            p.produce(src, json.dumps(event(i)).encode(), partition=i % 2)
        p.flush(30)
        time.sleep(3)
        kafka.add_partitions(src, 5)
        p = Producer({"bootstrap.servers": kafka.bootstrap})  # a producer that knows the new partitions
        while len(p.list_topics(src, timeout=5).topics[src].partitions) < 5:
            time.sleep(0.2)
        for i in range(3000, 6000):
            p.produce(src, json.dumps(event(i)).encode(), partition=i % 5)
        assert p.flush(30) == 0
        sent[0] = 6000

    t = threading.Thread(target=produce)
    t.start()
    run(cfg, until_idle=8, max_seconds=240)
    t.join()
    totals = assert_exactly_once(cfg, sent[0])
    assert totals["kafka"] == 6000
    rows = state_store(cfg, client).list_sink(cfg.name)
    assert sorted(r.pk.partition for r in rows) == [0, 1, 2, 3, 4], "the new partitions were consumed"
    layout = cfg.layouts()[0]
    assert all(r.shard == layout.partition_shard(src, r.pk.partition) for r in rows)


def test_a_failing_shard_stalls_only_its_partitions_and_recovers_exactly_once(
        tmp_path, kafka, topic, ch_dsn, chdb_config, shard_dbs, job_env, caplog):
    """Shard 1's table is detached for a while (its endpoint "fails"); partitions 1 and 4, routed to it, wait
    in BEFORE while the others keep flowing to shards 0 and 2; after it is attached again, everything lands
    once."""
    client, db, dbs = shard_dbs
    src, dlq = topic(6), topic(1)
    assignment = {f"{src}/{p}": p % 3 for p in range(6)}
    cfg = config(tmp_path, kafka, src, dlq, ch_dsn, chdb_config, db, [0, 1, 2],
                 {"policy": "partition", "assignment": assignment})
    producer = BackgroundProducer(kafka, src, 36_000, per_second=1200, partitions=6)
    label = f"{ch_dsn}#{dbs[1]}"
    seen: dict[str, Any] = {}

    def outage() -> None:
        try:
            time.sleep(10)
            client.command(f"DETACH TABLE `{dbs[1]}`.events")
            before = (count(client, dbs[0]), count(client, dbs[2]))
            stalled = 0.0
            for _ in range(40):
                time.sleep(0.5)
                stalled = max(stalled, metrics.STALLED.labels(cfg.name, label)._value.get())
            seen["during"] = (before, (count(client, dbs[0]), count(client, dbs[2])))
            seen["stalled"] = stalled
        finally:
            client.command(f"ATTACH TABLE `{dbs[1]}`.events")
            producer.finish()

    caplog.set_level(logging.WARNING, logger="chsink.job")
    producer.start()
    fault = threading.Thread(target=outage)
    fault.start()
    run(cfg, until_idle=6, max_seconds=300)
    fault.join()
    (a0, a2), (b0, b2) = seen["during"]
    assert b0 > a0 and b2 > a2, f"shards 0 and 2 kept receiving rows during the outage: {seen}"
    assert seen["stalled"] >= 1, "the stalled-partitions metric named the shard"
    stalls = {r.getMessage().split(" stalls:")[0] for r in caplog.records if " stalls: " in r.getMessage()}
    assert stalls and stalls <= {f"{src}/1", f"{src}/4"}, stalls
    assert_exactly_once(cfg, producer.sent)
