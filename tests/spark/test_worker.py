"""The Python workers of executor tasks: a reused worker starts its next task without reading Spark's archives
(pyspark.zip, py4j's zip, spark-core's jar) again, which PySpark's per-task `importlib.invalidate_caches()` makes
Python 3.10 and 3.11 do, for every package imported from them; an archive that changed is still read again."""

from __future__ import annotations

import importlib
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkapp.spark import worker

pytestmark = pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 reads archives lazily itself")


def _task(setup: bool) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A task reporting its worker's pid and how many archive directories were read since the worker's previous
    task ended (PySpark's setup of this task, in practice); -1 in a worker that had not run one of these yet. Not
    `setup`: the worker is left as stock PySpark leaves it."""

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
        elif getattr(zipimport.zipimporter, "_chsink_reads_when_changed", False):
            # set up by an earlier test's chsink task in this worker: back to stock, the method the patch wraps
            patched = zipimport.zipimporter.invalidate_caches
            zipimport.zipimporter.invalidate_caches = next(  # type: ignore[method-assign]
                c.cell_contents for c in patched.__closure__ or () if callable(c.cell_contents))
            zipimport.zipimporter._chsink_reads_when_changed = False  # type: ignore[attr-defined]
        counter[0] = 0
        yield pa.RecordBatch.from_pylist([{"pid": os.getpid(), "reads": reads}])

    return fn


def _run(spark: Any, setup: bool) -> list[tuple[int, int]]:
    rows = spark.range(0, 2, 1, 2).mapInArrow(_task(setup), "pid long, reads long").collect()
    return [(r.pid, r.reads) for r in rows]


def test_a_reused_worker_does_not_read_sparks_archives_again_for_each_task(spark):
    before = [t for _ in range(3) for t in _run(spark, setup=False)]
    counted = [reads for _, reads in before if reads >= 0]
    assert counted and min(counted) > 0, before  # the cost, in Spark's own workers: every task pays it
    set_up = {pid for pid, _ in _run(spark, setup=True)}
    after = [t for _ in range(3) for t in _run(spark, setup=True)]
    reused = [reads for pid, reads in after if pid in set_up]
    assert reused and set(reused) == {0}, after


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


def test_the_executor_tasks_function_sets_it_up(monkeypatch):
    import zipimport

    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches", zipimport.zipimporter.invalidate_caches)
    monkeypatch.setattr(zipimport.zipimporter, "_chsink_reads_when_changed", False, raising=False)
    from sparkapp.spark.batches import executor_fn

    assert list(executor_fn("{}", 1)(iter([]))) == []
    assert getattr(zipimport.zipimporter, "_chsink_reads_when_changed", False)
    importlib.invalidate_caches()
