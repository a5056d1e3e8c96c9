"""Setup of the Python workers executor tasks run in (the HTTP path's writers).

Before every task, PySpark's worker calls `importlib.invalidate_caches()`. On Python 3.10 and 3.11, that makes each
`zipimporter` on the import path read its archive's whole directory again. Spark puts pyspark.zip, py4j's zip and
spark-core's jar (5,000 entries) on the workers' PYTHONPATH, and imports pyspark from the zip. Every package
imported from one of them holds a zipimporter of its own, so each task re-read those directories 16 times:
about 0.1 s of a worker's CPU per task of the benchmark's (e), for nothing, since the archives do not change.
Python 3.12 re-reads lazily (CPython gh-103200); `task_setup_once_per_archive` gives older Pythons the same effect.

After every task, PySpark's worker runs a full garbage collection (`gc.collect()`), which visits every object the
worker tracks: its imports and the writer's Runtime, 70,000 objects and more, for 10% of the workers' CPU in the
benchmark's (e). What is alive when the worker's second task starts has survived the collection after the first,
the Runtime included, and lives as long as the worker: `freeze_survivors` takes it out of the collector's sight
once, so each collection visits only what was made since.
"""

from __future__ import annotations

import gc
import os
import sys
import zipimport
from typing import Any

_MARK = "_chsink_reads_when_changed"


def task_setup(runtime_open: bool) -> None:
    """What an executor task of the writer does first, in its Python worker (`runtime_open`: whether an earlier
    task of this worker opened the writer's Runtime)."""
    task_setup_once_per_archive()
    if runtime_open:
        freeze_survivors()


def freeze_survivors() -> None:
    """Once per worker, moves every object the collector tracks into its permanent generation (see the module's
    docstring). Called as a task starts, just after PySpark's collection: what it moves survived that, so it is no
    garbage. Once, not at every task: should some of it die later, only a cycle among it would stay in memory,
    and objects made after it are collected as before."""
    if not gc.get_freeze_count():
        gc.freeze()


def task_setup_once_per_archive() -> None:
    """From now on, in this worker process, an archive's directory is read again only when the file changed
    (its size or mtime), which is when a new read could find anything new. Idempotent; nothing on 3.12+."""
    if sys.version_info >= (3, 12) or getattr(zipimport.zipimporter, _MARK, False):
        return
    reread = zipimport.zipimporter.invalidate_caches

    def invalidate_caches(self: Any) -> None:
        seen = _stamp(self.archive)
        if seen is None or getattr(self, _MARK, None) != seen:
            reread(self)
            setattr(self, _MARK, seen)

    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign]
    setattr(zipimport.zipimporter, _MARK, True)
    for finder in list(sys.path_importer_cache.values()):  # read by this task's setup, just before this call
        if isinstance(finder, zipimport.zipimporter):
            setattr(finder, _MARK, _stamp(finder.archive))


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns
