"""Sharding on production's path: three ClickHouse server processes, one per shard, written over HTTP by
executor tasks, with real shard outages while a producer keeps writing: one shard's server SIGKILLed under
the inserts and restarted, another stopped (SIGSTOP: its connections hang without a reset, as behind a dead
link) for longer than a batch. Partitions routed elsewhere must keep flowing, and every offset must land once,
on the shard its state row records."""

from __future__ import annotations

import signal
import time

import clickhouse_connect

from .harness import EVENTS_TABLE, BackgroundProducer, SinkHarness

HUNG_S = 30


def test_three_shard_servers_one_killed_one_hung_every_offset_once(tmp_path, kafka, topic, clickhouse_shards):
    src, dlq = topic(6), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq, engine="KeeperMap", server=clickhouse_shards[0])
    clients = [clickhouse_connect.get_client(dsn=s.dsn) for s in clickhouse_shards]
    for c in clients:
        c.command(f"DROP DATABASE IF EXISTS {sink.db} SYNC")
        c.command(f"CREATE DATABASE {sink.db}")
        c.command(EVENTS_TABLE.format(db=sink.db))
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
        assert sink.proc is not None and sink.proc.poll() is None, sink.log_text()[-3000:]
    finally:
        producer.finish()
    sink.kill()
    sink.drain()

    report = sink.verify()
    totals = report["totals"]
    assert report["ok"], totals
    assert (totals["duplicates"], totals["gaps"], totals["pending"]) == (0, 0, 0)
    assert (totals["clickhouse"], totals["dead_lettered"]) == (producer.sent - producer.bad, producer.bad)
    landed = 0
    for shard, c in enumerate(clients):  # by SQL: no offset twice, each partition only on its shard
        [[n, unique, parts]] = c.query(f"SELECT count(), uniqExact(_partition, _offset), groupUniqArray(_partition) "
                                       f"FROM {sink.db}.events").result_rows
        assert n == unique and set(parts) <= {shard, shard + 3}, (shard, n, unique, parts)
        landed += n
    assert landed == producer.sent - producer.bad
    print(f"three shard servers: totals {totals}, per shard {[count(i) for i in range(3)]}")
