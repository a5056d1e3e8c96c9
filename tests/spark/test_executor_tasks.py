"""An executor task over several Kafka partitions (the HTTP path coalesces a batch to one task per slot) writes
them as the driver does: every partition once, their state transitions shared: a fixed number of state-store
round trips per task, not per partition (real chdb and ZooKeeper; the task's function run as Spark runs it)."""

from __future__ import annotations

import gc

from bench.writer import StateCalls
from sparkapp.config import parse_config
from sparkapp.delivery.runtime import Runtime
from sparkapp.edges.store import state_store
from sparkapp.spark import batches
from tests.helpers import messages_table, msg

PARTITIONS = 4


def test_a_task_over_many_partitions_shares_their_state_round_trips(ch_db, ch_dsn, chdb_config):
    client, db = ch_db
    client.command("CREATE TABLE ev (id UInt64, _partition UInt32, _offset UInt64) ENGINE = MergeTree "
                   "ORDER BY (_partition, _offset) SETTINGS non_replicated_deduplication_window = 1000")
    cfg = parse_config({
        "name": f"ex-{db}", "kafka": {"bootstrapServers": "127.0.0.1:1", "topics": ["src"]},
        "clickhouse": {"endpoints": [ch_dsn], "database": db, "tables": {"src": "ev"},
                       "chdbConfigFile": str(chdb_config)},
        "state": {"keeperPath": f"/ex_{db}"}, "checkpointLocation": "/unused"})
    store = state_store(cfg, client)
    store.ensure_schema()
    counting = StateCalls(client)
    store.client = counting  # type: ignore[assignment]
    epoch = store.acquire_epoch(cfg.name)
    cfg_json = cfg.model_dump_json(by_alias=True)
    batches._EXECUTOR_RUNTIMES[(cfg_json, epoch)] = Runtime(cfg, epoch, client, store, None)
    task = batches.executor_fn(cfg_json, epoch)
    try:
        for b in range(3):
            # the partitions as a coalesced task receives them: one after another, in Arrow batches
            tbl = messages_table([msg({"id": p * 1000 + b * 20 + i}, offset=b * 20 + i, topic="src", partition=p)
                                  for p in range(PARTITIONS) for i in range(20)])
            counting.calls = []
            out = [r for rb in task(iter(tbl.to_batches(max_chunksize=30))) for r in rb.to_pylist()]
            assert sorted((r["partition"], r["inserted"]) for r in out) == [(p, 20) for p in range(PARTITIONS)], out
            # the first batch reads the rows again right before creating them
            assert counting.round_trips <= (6 if b == 0 else 5), f"batch {b}: {counting.round_trips} state round trips"
    finally:
        batches._EXECUTOR_RUNTIMES.clear()
        gc.unfreeze()  # a task with a Runtime open froze this process's objects, as it does a worker's
    got = client.query("SELECT _partition, count(), uniqExact(_offset) FROM ev GROUP BY _partition "
                       "ORDER BY _partition").result_rows
    assert got == [(p, 60, 60) for p in range(PARTITIONS)]
