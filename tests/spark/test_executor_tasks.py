"""An executor task over several Kafka partitions (the HTTP path coalesces a batch to one task per slot) writes
them as the driver does: every partition once, their state transitions shared, a fixed number of state-store
round trips per task, not per partition; and the ranges it delivered wait for the next batch's BEFOREs, which the
driver hands them to (real chdb and ZooKeeper; the task's function run as Spark runs it, the driver's part as the
job runs it)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from bench.writer import StateCalls
from sparkapp.config import parse_config
from sparkapp.delivery.context import PartitionOutcome
from sparkapp.delivery.runtime import Runtime
from sparkapp.edges.store import state_store
from sparkapp.spark import batches
from sparkapp.spark.job import ExecutorWriter, SinkJob
from tests.helpers import messages_table, msg

PARTITIONS = 4


class Driver:
    """The job's driver on the HTTP path (ExecutorWriter), its tasks run here one after another."""

    def __init__(self, ch_db: tuple[Any, str], ch_dsn: str, chdb_config: Any) -> None:
        self.client, db = ch_db
        self.db = db
        self.client.command("CREATE TABLE ev (id UInt64, _partition UInt32, _offset UInt64) ENGINE = MergeTree "
                            "ORDER BY (_partition, _offset) SETTINGS non_replicated_deduplication_window = 1000")
        cfg = parse_config({
            "name": f"ex-{db}", "kafka": {"bootstrapServers": "127.0.0.1:1", "topics": ["src"]},
            "clickhouse": {"endpoints": [ch_dsn], "database": db, "tables": {"src": "ev"},
                           "chdbConfigFile": str(chdb_config)},
            "state": {"keeperPath": f"/ex_{db}"}, "checkpointLocation": "/unused"})
        self.store = state_store(cfg, self.client)
        self.store.ensure_schema()
        self.counting = StateCalls(self.client)
        self.store.client = self.counting  # type: ignore[assignment]
        self.job = SinkJob(cfg)
        self.job.epoch = self.store.acquire_epoch(cfg.name)
        self.cfg_json = cfg.model_dump_json(by_alias=True)
        self.rt = Runtime(cfg, self.job.epoch, self.client, self.store, None)  # the workers' (one process here)
        batches._EXECUTOR_RUNTIMES[(self.cfg_json, self.job.epoch)] = self.rt
        self.writer = ExecutorWriter(self.job, Runtime(cfg, self.job.epoch, self.client, self.store, None))

    def task(self, tbl: Any) -> list[PartitionOutcome]:
        """One task of a batch over `tbl`, given what the driver hands over now."""
        fn = batches.executor_fn(self.cfg_json, self.job.epoch, batches.ranges_json(self.writer.waiting.values()))
        return [r for rb in fn(iter(tbl.to_batches(max_chunksize=30))) for r in rb.to_pylist()]  # type: ignore[misc]

    def phases(self) -> dict[int, str]:
        rows = self.client.query(f"SELECT partition, phase FROM `{self.db}`.chsink_state "
                                 "WHERE kind = 'partition'").result_rows
        return {int(p): str(ph) for p, ph in rows}

    def counts(self) -> list[tuple[int, int, int]]:
        return [tuple(r) for r in self.client.query(  # type: ignore[misc]
            "SELECT _partition, count(), uniqExact(_offset) FROM ev GROUP BY _partition ORDER BY _partition"
        ).result_rows]


@pytest.fixture
def driver(ch_db, ch_dsn, chdb_config) -> Iterator[Driver]:
    d = Driver(ch_db, ch_dsn, chdb_config)
    try:
        yield d
    finally:
        batches._EXECUTOR_RUNTIMES.clear()
        gc.unfreeze()  # a task with a Runtime open froze this process's objects, as it does a worker's


def _batch(b: int, parts: range = range(PARTITIONS)) -> Any:
    """Batch b as a coalesced task receives it: 20 records of each partition, one partition after another."""
    return messages_table([msg({"id": p * 1000 + b * 20 + i}, offset=b * 20 + i, topic="src", partition=p)
                           for p in parts for i in range(20)])


def test_a_task_over_many_partitions_shares_their_state_round_trips(driver):
    """A steady task makes three state round trips for all its partitions: one read, and one BEFORE write (with
    its read back) that also confirms the ranges the last batch's tasks delivered. The driver confirms the ranges
    of partitions without records in a batch itself, and the rest when the run stops."""
    for b in range(3):
        driver.counting.calls = []
        out = driver.task(_batch(b))
        assert sorted((r["partition"], r["inserted"]) for r in out) == [(p, 20) for p in range(PARTITIONS)], out
        # the first batch reads the rows again right before creating them
        assert driver.counting.round_trips <= (4 if b == 0 else 3), f"batch {b}: {driver.counting.round_trips}"
        driver.writer.tasks_done(out)
        assert driver.phases() == {p: "BEFORE" for p in range(PARTITIONS)}  # delivered, waiting
    out = driver.task(_batch(3, range(PARTITIONS - 1)))  # the last partition has no records
    driver.writer.tasks_done(out)
    assert driver.phases() == {**{p: "BEFORE" for p in range(PARTITIONS - 1)}, PARTITIONS - 1: "AFTER"}
    driver.writer.confirm()  # a graceful stop
    assert driver.phases() == {p: "AFTER" for p in range(PARTITIONS)}
    assert driver.counts() == [(p, 80, 80) for p in range(PARTITIONS - 1)] + [(PARTITIONS - 1, 60, 60)]


def test_a_retried_task_re_sends_what_its_first_attempt_began_and_lets_the_handed_ranges_go(driver):
    """Spark retries a task with the same hand-over. When its first attempt died after its BEFORE had taken over
    the handed ranges, the retry finds rows already past them: it re-sends that attempt's ranges identically
    under their tokens, and does not write an AFTER over rows that moved on (which would fail the task again)."""
    driver.writer.tasks_done(driver.task(_batch(0)))
    ctx = driver.rt.fast_context("src")
    assert ctx is not None

    def die(step: str) -> None:
        if step == "after_insert":
            raise OSError("the worker died")

    ctx.fault = die
    with pytest.raises(OSError):
        driver.task(_batch(1))  # every partition BEFORE over its new range; the first one's insert landed
    ctx.fault = lambda step: None
    out = driver.task(_batch(1))  # the retry, handed the same ranges
    assert sorted((r["partition"], r["inserted"], r["retried"]) for r in out) == [(p, 20, 1) for p in range(PARTITIONS)]
    driver.writer.tasks_done(out)
    driver.writer.tasks_done(driver.task(_batch(2)))
    driver.writer.confirm()
    assert driver.phases() == {p: "AFTER" for p in range(PARTITIONS)}
    assert driver.counts() == [(p, 60, 60) for p in range(PARTITIONS)]
