"""The full garbage collection PySpark runs in a Python worker after each task no longer visits what the worker
keeps between tasks (its imports, the writer's Runtime): once a Runtime is open, an executor task freezes it, once
per worker. Run in Spark's own workers, on every Python version."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from sparkapp.spark import worker


def _keeping_task(freeze: bool, anew: bool = False) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A task reporting its worker's pid and how many objects the collector tracks once the task is set up: the
    worker's first task leaves 50,000 objects behind for the next ones (as the writer's Runtime and caches stay).
    `anew`: as in a worker that has not frozen yet (an earlier test's chsink task may have run in it)."""

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import gc
        import os

        import pyarrow as pa

        if anew:
            gc.unfreeze()
        if freeze:
            worker.freeze_survivors()
        tracked = len(gc.get_objects())
        for _ in batches:
            pass
        if not hasattr(worker, "_test_kept"):
            worker._test_kept = [[i] for i in range(50_000)]  # type: ignore[attr-defined]
        yield pa.RecordBatch.from_pylist([{"pid": os.getpid(), "tracked": tracked}])

    return fn


def test_pysparks_collection_after_each_task_skips_what_the_worker_keeps(spark):
    """PySpark's `gc.collect()` after a task visits every object the collector tracks: in a worker that kept
    50,000 objects from its first task, each later task's collection visits them all, unless they were frozen
    (gc.freeze, once per worker; a frozen object is not in gc.get_objects()), and later tasks stay small."""

    def run(freeze: bool, anew: bool = False) -> list[tuple[int, int]]:
        rows = spark.range(0, 2, 1, 2).mapInArrow(_keeping_task(freeze, anew), "pid long, tracked long").collect()
        return [(r.pid, r.tracked) for r in rows]

    first = {pid for pid, _ in run(freeze=False, anew=True)}  # the first tasks of these workers keep their objects
    kept = [tracked for pid, tracked in run(freeze=False) if pid in first]
    assert kept and min(kept) > 50_000, kept  # the cost, in Spark's own workers
    # frozen afresh twice: the first frozen task also makes, once, what a worker makes after its freeze
    frozen = [tracked for i in range(4) for pid, tracked in run(freeze=True, anew=i < 2) if pid in first][2:]
    # what a task makes anew stays: on Python 3.10 and 3.11 a worker not set up by a chsink task yet reads Spark's
    # archives again in every task (13,000 objects; see test_worker.py), and this test leaves that as it finds it
    assert frozen and max(frozen) < 20_000, frozen


def _set_runtime(open_: bool) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A task that makes its worker look as if an earlier chsink task had opened a Runtime (`open_`) or not, with
    nothing frozen, and reports its pid."""

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import gc
        import os

        import pyarrow as pa

        from sparkapp.spark import batches as module

        for _ in batches:
            pass
        gc.unfreeze()
        if open_:
            module._EXECUTOR_RUNTIMES[("test", 0)] = None  # type: ignore[assignment]
        else:
            module._EXECUTOR_RUNTIMES.pop(("test", 0), None)
        yield pa.RecordBatch.from_pylist([{"pid": os.getpid(), "frozen": gc.get_freeze_count()}])

    return fn


def _frozen(batches: Iterator[Any]) -> Iterator[Any]:
    import gc
    import os

    import pyarrow as pa

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"pid": os.getpid(), "frozen": gc.get_freeze_count()}])


def _keep_more(batches: Iterator[Any]) -> Iterator[Any]:
    """Leaves 20,000 more objects in the worker, made after its freeze."""
    import os

    import pyarrow as pa

    for _ in batches:
        pass
    worker._test_more = [[i] for i in range(20_000)]  # type: ignore[attr-defined]
    yield pa.RecordBatch.from_pylist([{"pid": os.getpid(), "frozen": 0}])


def test_the_executor_tasks_freeze_in_sparks_own_workers(spark):
    """The executor function as Spark ships it (pickled, its globals copied) reads the worker's own runtimes: no
    freeze in a worker's first task (no Runtime open yet), one once a Runtime is open, and not a second one."""
    from sparkapp.spark.batches import executor_fn, outcome_ddl

    def run(fn: Callable[[Iterator[Any]], Iterator[Any]]) -> dict[int, int]:
        return {r.pid: r.frozen for r in spark.range(0, 2, 1, 2).mapInArrow(fn, "pid long, frozen long").collect()}

    def executor_tasks() -> None:
        nothing = spark.range(0, 2, 1, 2).filter("id < 0")  # each task runs the function over no rows
        assert nothing.mapInArrow(executor_fn("{}", 1), outcome_ddl()).collect() == []

    workers = set(run(_set_runtime(open_=False)))
    executor_tasks()
    assert {pid: n for pid, n in run(_frozen).items() if pid in workers} == dict.fromkeys(workers, 0)
    assert set(run(_set_runtime(open_=True)).values()) == {0}
    executor_tasks()
    once = {pid: n for pid, n in run(_frozen).items() if pid in workers}
    assert once and min(once.values()) > 10_000, once
    run(_keep_more)
    executor_tasks()
    again = {pid: n for pid, n in run(_frozen).items() if pid in once}
    assert again and all(again[pid] < once[pid] + 10_000 for pid in again), (once, again)  # not frozen twice
    run(_set_runtime(open_=False))
