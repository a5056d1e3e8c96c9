"""The Python workers of executor tasks: a reused worker starts its next task without reading Spark's archives
(pyspark.zip, py4j's zip, spark-core's jar) again, which PySpark's per-task `importlib.invalidate_caches()` makes
Python 3.10 and 3.11 do, for every package imported from them; an archive that changed is still read again. And
the full garbage collection PySpark runs after each task no longer visits what the worker keeps between tasks."""

from __future__ import annotations

import importlib
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkapp.spark import worker

rereads_archives = pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 reads archives lazily itself")


def _task(setup: bool) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A task reporting its worker's pid and how many archive directories were read since the worker's previous
    task ended (PySpark's setup of this task, in practice); -1 in a worker that had not run one of these yet."""

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import os
        import zipimport

        import pyarrow as pa

        for _ in batches:
            pass
        counter = getattr(zipimport, "_test_reads", None)
        reads = counter[0] if counter is not None else -1
        if counter is None:
            counter = [0]
            original = zipimport._read_directory  # type: ignore[attr-defined]

            def counting(archive: str) -> Any:
                counter[0] += 1
                return original(archive)

            zipimport._read_directory = counting  # type: ignore[attr-defined]
            zipimport._test_reads = counter  # type: ignore[attr-defined]
        if setup:
            worker.task_setup_once_per_archive()
        counter[0] = 0
        yield pa.RecordBatch.from_pylist([{"pid": os.getpid(), "reads": reads}])

    return fn


def _run(spark: Any, setup: bool) -> list[tuple[int, int]]:
    rows = spark.range(0, 2, 1, 2).mapInArrow(_task(setup), "pid long, reads long").collect()
    return [(r.pid, r.reads) for r in rows]


@rereads_archives
def test_a_reused_worker_does_not_read_sparks_archives_again_for_each_task(spark):
    before = [t for _ in range(3) for t in _run(spark, setup=False)]
    counted = [reads for _, reads in before if reads >= 0]
    assert counted and min(counted) > 0, before  # the cost, in Spark's own workers: every task pays it
    set_up = {pid for pid, _ in _run(spark, setup=True)}
    after = [t for _ in range(3) for t in _run(spark, setup=True)]
    reused = [reads for pid, reads in after if pid in set_up]
    assert reused and set(reused) == {0}, after


@rereads_archives
def test_an_archive_that_changed_is_read_again(tmp_path: Path):
    """In a process of its own: the patch is per process, as in a worker."""
    import subprocess

    probe = f"""
import importlib, sys, time, zipfile, zipimport
sys.path.insert(0, {str(tmp_path / 'lib.zip')!r})
import m
from sparkapp.spark.worker import task_setup_once_per_archive
task_setup_once_per_archive()
reads = [0]
original = zipimport._read_directory
def counting(a):
    reads[0] += 1
    return original(a)
zipimport._read_directory = counting
importlib.invalidate_caches()
assert reads[0] == 0, reads
time.sleep(0.01)
with zipfile.ZipFile({str(tmp_path / 'lib.zip')!r}, "a") as z:
    z.writestr("n.py", "X = 2")
importlib.invalidate_caches()
assert reads[0] == 1, reads
import n
assert m.X == 1 and n.X == 2
print("ok")
"""
    with zipfile.ZipFile(tmp_path / "lib.zip", "w") as z:
        z.writestr("m.py", "X = 1")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


@rereads_archives
def test_the_executor_tasks_function_sets_it_up(monkeypatch):
    import gc
    import zipimport

    from sparkapp.spark import batches

    froze: list[bool] = []
    monkeypatch.setattr(gc, "freeze", lambda: froze.append(True))  # not this test process's objects
    monkeypatch.setattr(worker, "_FROZEN", False)
    monkeypatch.setattr(batches, "_EXECUTOR_RUNTIMES", {})

    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches", zipimport.zipimporter.invalidate_caches)
    monkeypatch.setattr(zipimport.zipimporter, "_chsink_reads_when_changed", False, raising=False)
    from sparkapp.spark.batches import executor_fn

    assert list(executor_fn("{}", 1)(iter([]))) == []
    assert getattr(zipimport.zipimporter, "_chsink_reads_when_changed", False)
    assert froze == []  # the worker's first task: its Runtime is not open yet
    batches._EXECUTOR_RUNTIMES[("earlier", 1)] = None  # type: ignore[assignment]
    for _ in range(2):
        assert list(executor_fn("{}", 1)(iter([]))) == []
    assert froze == [True]  # once per worker
    importlib.invalidate_caches()


def _keeping_task(freeze: bool, anew: bool = False) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A task reporting its worker's pid and how many objects the collector tracks once the task is set up: the
    worker's first task leaves 50,000 objects behind for the next ones (as the writer's Runtime and caches stay).
    `anew`: as in a worker that has not frozen yet (an earlier test's chsink task may have run in it)."""

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import gc
        import os

        import pyarrow as pa

        # as the executor's task set-up does first: without it, each task re-reads Spark's archives and 12,755 new
        # objects were tracked here in every task, so the test passed only after the archive tests had set it up
        worker.task_setup_once_per_archive()
        if anew:
            worker._FROZEN = False
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

    first = {pid for pid, _ in run(freeze=False)}  # the first tasks of these workers keep their objects
    kept = [tracked for pid, tracked in run(freeze=False) if pid in first]
    assert kept and min(kept) > 50_000, kept  # the cost, in Spark's own workers
    frozen = [tracked for i in range(3) for pid, tracked in run(freeze=True, anew=i == 0) if pid in first]
    assert frozen and max(frozen) < 5_000, frozen


def _with_runtime_open(batches: Iterator[Any]) -> Iterator[Any]:
    """In a worker: as if an earlier chsink task had opened its Runtime, and nothing frozen yet."""
    import gc
    import os

    import pyarrow as pa

    from sparkapp.spark import batches as module

    for _ in batches:
        pass
    gc.unfreeze()
    worker._FROZEN = False
    module._EXECUTOR_RUNTIMES[("test", 0)] = None  # type: ignore[assignment]
    yield pa.RecordBatch.from_pylist([{"pid": os.getpid(), "frozen": gc.get_freeze_count()}])


def _frozen(batches: Iterator[Any]) -> Iterator[Any]:
    import gc
    import os

    import pyarrow as pa

    from sparkapp.spark import batches as module

    for _ in batches:
        pass
    module._EXECUTOR_RUNTIMES.pop(("test", 0), None)
    yield pa.RecordBatch.from_pylist([{"pid": os.getpid(), "frozen": gc.get_freeze_count()}])


def test_the_executor_tasks_freeze_in_sparks_own_workers(spark):
    """The executor function as Spark ships it (pickled, its globals copied) freezes in the workers whose Runtime
    is open: the check reads the worker's own runtimes, not the driver's copy."""
    from sparkapp.spark.batches import executor_fn, outcome_ddl

    def run(fn: Callable[[Iterator[Any]], Iterator[Any]]) -> dict[int, int]:
        return {r.pid: r.frozen for r in spark.range(0, 2, 1, 2).mapInArrow(fn, "pid long, frozen long").collect()}

    ready = run(_with_runtime_open)
    assert set(ready.values()) == {0}
    nothing = spark.range(0, 2, 1, 2).filter("id < 0")  # each task runs the function over no rows
    assert nothing.mapInArrow(executor_fn("{}", 1), outcome_ddl()).collect() == []
    after = {pid: n for pid, n in run(_frozen).items() if pid in ready}
    assert after and min(after.values()) > 10_000, after
