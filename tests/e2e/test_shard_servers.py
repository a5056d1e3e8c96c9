"""Sharding on production's path: three ClickHouse server processes, one per shard, written over HTTP by
executor tasks, with real shard outages while a producer keeps writing: one shard's server SIGKILLed under
the inserts and restarted, another stopped (SIGSTOP: its connections hang without a reset, as behind a dead
link) for longer than a batch. Partitions routed elsewhere must keep flowing, and every offset must land once,
on the shard its state row records."""

from __future__ import annotations

import signal
import time
from typing import Any

import clickhouse_connect

from sinkoperator.rebalance import plan, previous_config
from sparkapp.config import parse_config
from sparkapp.edges.store import state_store

from .harness import EVENTS_TABLE, BackgroundProducer, SinkHarness

HUNG_S = 30


def _sharded_sink(tmp_path: Any, kafka: Any, src: str, dlq: str, servers: list[Any]) -> tuple[SinkHarness, list[Any]]:
    """A sink over the shard servers, the events table in a database of its own on each."""
    sink = SinkHarness(tmp_path, kafka, src, dlq, engine="KeeperMap", server=servers[0])
    clients = [clickhouse_connect.get_client(dsn=s.dsn) for s in servers]
    for c in clients:
        c.command(f"DROP DATABASE IF EXISTS {sink.db} SYNC")
        c.command(f"CREATE DATABASE {sink.db}")
        c.command(EVENTS_TABLE.format(db=sink.db))
    return sink, clients


def _once_on_their_shards(sink: SinkHarness, clients: list[Any], sent: int, bad: int,
                          fixed: bool = True) -> dict[str, Any]:
    """Verifier and SQL: every offset once; with `fixed` placement, partition p only on shard p % 3."""
    report = sink.verify()
    totals = report["totals"]
    assert report["ok"], totals
    assert (totals["duplicates"], totals["gaps"], totals["pending"]) == (0, 0, 0)
    assert (totals["clickhouse"], totals["dead_lettered"]) == (sent - bad, bad)
    landed = 0
    for shard, c in enumerate(clients):
        [[n, unique]] = c.query(f"SELECT count(), uniqExact(_partition, _offset) FROM {sink.db}.events").result_rows
        assert n == unique, (shard, n, unique)
        landed += n
        if fixed:
            parts = {int(p) for (p,) in c.query(f"SELECT DISTINCT _partition FROM {sink.db}.events").result_rows}
            assert parts <= {shard, shard + 3}, (shard, parts)
    assert landed == sent - bad
    return dict(totals)


def test_three_shard_servers_one_killed_one_hung_every_offset_once(tmp_path, kafka, topic, clickhouse_shards):
    src, dlq = topic(6), topic(1)
    sink, clients = _sharded_sink(tmp_path, kafka, src, dlq, clickhouse_shards)
    sink.config["clickhouse"].update(endpoints=[s.dsn for s in clickhouse_shards], requestTimeoutSeconds=3)
    sink.config["sharding"] = {"policy": "partition", "assignment": {f"{src}/{p}": p % 3 for p in range(6)}}
    sink.write_config()

    def count(shard: int) -> int:
        return int(clients[shard].query(f"SELECT count() FROM {sink.db}.events").result_rows[0][0])

    producer = BackgroundProducer(kafka, src, total=10**9, per_second=900, partitions=6)
    producer.start()
    try:
        sink.start("--quiet")
        assert sink.wait_for_batches(2, timeout=240), sink.log_text()[-3000:]
        clickhouse_shards[1].kill()  # under the executors' inserts
        time.sleep(2)
        clickhouse_shards[1].start()
        assert sink.wait_for_batches(5, timeout=240), sink.log_text()[-3000:]
        hung = clickhouse_shards[2]
        a0, a1 = count(0), count(1)
        hung.signal(signal.SIGSTOP)
        try:
            time.sleep(HUNG_S)
            b0, b1 = count(0), count(1)
        finally:
            hung.signal(signal.SIGCONT)
        assert b0 > a0 and b1 > a1, f"shards 0 and 1 kept receiving rows while shard 2 hung: {a0, a1} -> {b0, b1}"
        # the hung shard's partitions stalled (and the driver's catch-up met the shard for the first time):
        # the job lives on through it and after, and shard 2 takes rows again
        c2 = count(2)
        assert sink.wait_for_batches(sink.log_text().count("INFO chsink.job: batch ") + 4, timeout=240), \
            sink.log_text()[-3000:]
        assert sink.proc is not None and sink.proc.poll() is None, sink.log_text()[-3000:]
        assert "chsink: unavailable" not in sink.log_text(), sink.log_text()[-3000:]
        deadline = time.monotonic() + 60
        while count(2) <= c2 and time.monotonic() < deadline:
            time.sleep(1)
        assert count(2) > c2, sink.log_text()[-3000:]
    finally:
        producer.finish()
    sink.kill()
    sink.drain()

    totals = _once_on_their_shards(sink, clients, producer.sent, producer.bad)
    print(f"three shard servers: totals {totals}, per shard {[count(i) for i in range(3)]}")


def test_rebalance_across_shard_servers_while_producing(tmp_path, kafka, topic, clickhouse_shards):
    """2 -> 3 shard servers, then 3 -> 2 (the middle one removed), each through the operator's planner, the job
    drained by SIGTERM (it finishes its batch and stops) and restarted under the new layout."""
    src, dlq = topic(6), topic(1)
    sink, clients = _sharded_sink(tmp_path, kafka, src, dlq, clickhouse_shards)
    dsns = [s.dsn for s in clickhouse_shards]
    layouts: list[dict[str, Any]] = [{"version": 0, "endpoints": dsns[:2], "weights": [1, 1],
                                      "shardDatabases": [sink.db] * 2, "assignment": {}}]
    sink.config["clickhouse"]["endpoints"] = dsns[:2]
    sink.config["sharding"] = {"policy": "partition"}
    sink.write_config()
    producer = BackgroundProducer(kafka, src, 30_000, per_second=1200, partitions=6)
    producer.start()
    for shards in ([0, 1, 2], [0, 2]):
        sink.start("--quiet")
        assert sink.wait_for_batches(4, timeout=240), sink.log_text()[-3000:]
        assert sink.proc is not None
        sink.proc.send_signal(signal.SIGTERM)  # the drain: the batch in flight finishes, then the job stops
        assert sink.wait(120) == 0, sink.log_text()[-3000:]
        cfg = parse_config(sink.config)
        stored = {(r.pk.topic, r.pk.partition): (r.state.layout, r.shard)
                  for r in state_store(cfg, clients[0]).list_sink(cfg.name)}
        new = plan(layouts[-1], {"endpoints": [dsns[i] for i in shards], "shardDatabases": [sink.db] * len(shards),
                                 "weights": [1] * len(shards)}, [(src, p) for p in range(6)], stored)
        assert new["moves"], f"no moves planned for {shards}"
        sink.config["clickhouse"]["endpoints"] = [dsns[i] for i in shards]
        sink.config["sharding"] = {"policy": "partition", "layout": new["target"]["version"],
                                   "assignment": new["target"]["assignment"], "previous": previous_config(layouts[-1])}
        sink.write_config()
        layouts.append(new["target"])
    producer.finish()
    sink.drain()
    _once_on_their_shards(sink, clients, producer.sent, producer.bad, fixed=False)
    cfg = parse_config(sink.config)
    final = layouts[-1]["assignment"]
    for r in state_store(cfg, clients[0]).list_sink(cfg.name):  # every partition ended under the last layout
        assert (r.state.layout, r.shard) == (2, final[f"{src}/{r.pk.partition}"])
    for p in range(6):  # the partition's newest records are on the server its final layout names
        tops = [int(c.query(f"SELECT max(_offset) FROM {sink.db}.events WHERE _partition = {p}").result_rows[0][0])
                for c in clients]
        assert tops[[0, 2][final[f"{src}/{p}"]]] == max(tops), (p, tops)
