"""Faults that only the executor path has, on real processes: production's path (a ClickHouse server over HTTP,
each Kafka partition written by a task in a Spark Python worker), state in KeeperMap on ZooKeeper.

- a zombie task: a worker is stopped inside an insert and its socket to the JVM reset, so Spark retries the task (same
  run, same epoch) while the first attempt is still alive; the stopped worker is then let go on;
- an executor killed mid-insert: a busy worker SIGKILLed, its task retried;
- an insert that committed whose AFTER could not be written: ZooKeeper paused while inserts go on, then the
  ClickHouse server SIGKILLed, then both back;
- a zombie run: the whole job stopped, a redeploy with other batch sizes (and a new checkpoint) takes over,
  then the old run is let go on for a while before it is killed.

Every produced offset must be in ClickHouse or the DLQ exactly once: checked by the verifier and by SQL.
"""

from __future__ import annotations

import os
import random
import signal
import time

from .harness import BackgroundProducer, SinkHarness
from .procs import busiest, cut_from_jvm, in_frame, python_workers
from .test_faults import check_exactly_once


def _count(sink: SinkHarness) -> int:
    return int(sink.sql(f"SELECT count() FROM {sink.db}.events")[0][0][0])


def _busy_worker(sink: SinkHarness, frame: str | None = None, timeout: float = 60) -> tuple[int, int]:
    """(daemon, worker) of a Python worker inside a task (inside `frame`, when given)."""
    assert sink.proc is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = python_workers(sink.proc.pid)
        worker = busiest(list(workers), 0.15) if frame is None else in_frame(list(workers), frame)
        if worker is not None:
            return workers[worker], worker
    raise AssertionError(f"no busy Python worker in {timeout}s:\n{sink.log_text()[-2000:]}")


def _running(sink: SinkHarness, batches: int) -> None:
    """The job is running and has logged `batches` more batches (restarted if a fault made it exit)."""
    if sink.proc is None or sink.proc.poll() is not None:
        sink.start("--quiet")
        batches = max(batches, 1)
    done = sink.log_text().count("INFO chsink.job: batch ")
    if not sink.wait_for_batches(done + batches, timeout=240):
        sink.start("--quiet")
        assert sink.wait_for_batches(1, timeout=240), sink.log_text()[-3000:]


def zombie_task(sink: SinkHarness, **_: object) -> str:
    """Stopped inside a range's window loop (after its BEFORE, blocks still to send): when let go on, it sends
    them after its retry sent them all, under the same tokens."""
    daemon, worker = _busy_worker(sink, frame="_send")
    os.kill(worker, signal.SIGSTOP)
    lost = sink.log_text().count("Lost task")
    try:
        cut_from_jvm(daemon, worker)
        _running(sink, 2)  # the retried attempt finished the batch, and the next one ran
    finally:
        os.kill(worker, signal.SIGCONT)  # the first attempt goes on with its inserts, fenced or deduplicated
    time.sleep(3)
    assert sink.log_text().count("Lost task") > lost, "Spark did not retry the task"
    return "zombie task"


def executor_killed(sink: SinkHarness, **_: object) -> str:
    _, worker = _busy_worker(sink)
    os.kill(worker, signal.SIGKILL)
    _running(sink, 2)
    return "worker sigkill"


def after_lost(sink: SinkHarness, zookeeper, server, **_: object) -> str:  # type: ignore[no-untyped-def]
    """Inserts that commit while their AFTER cannot be written (state writes wait on ZooKeeper), then the
    server dies. Tried until an insert landed during the pause."""
    for attempt in range(5):
        before = _count(sink)
        zookeeper.signal(signal.SIGSTOP)
        try:
            time.sleep(1.5)
            grew = _count(sink) > before
            if grew or attempt == 4:
                server.kill()
        finally:
            zookeeper.signal(signal.SIGCONT)
        if grew or attempt == 4:
            time.sleep(1)
            server.start()
            _running(sink, 2)
            return f"server sigkill with AFTER pending ({'insert landed' if grew else 'no insert seen'})"
        _running(sink, 1)
    raise AssertionError("unreachable")


def zombie_run(sink: SinkHarness, **_: object) -> str:
    old = sink.proc
    assert old is not None
    os.killpg(old.pid, signal.SIGSTOP)
    try:
        sink.proc = None
        sink.config["batching"].update(maxOffsetsPerTrigger=1777, blockOffsets=400)
        sink.config["checkpointLocation"] = str(sink.workdir / "checkpoint-redeploy")
        sink.write_config()
        sink.start("--quiet")
        assert sink.wait_for_batches(2, timeout=240), sink.log_text()[-3000:]
    finally:
        os.killpg(old.pid, signal.SIGCONT)  # the old run's tasks go on under its stale epoch
    time.sleep(6)
    os.killpg(old.pid, signal.SIGKILL)
    old.wait(30)
    return "zombie run"


def test_executor_path_faults(tmp_path, kafka, topic, zookeeper, clickhouse_server):
    src, dlq = topic(4), topic(1)
    # small windows: a range is many blocks, so a worker stopped inside one has blocks left to send late
    sink = SinkHarness(tmp_path, kafka, src, dlq, engine="KeeperMap", server=clickhouse_server, blockOffsets=100)
    sink.extra_env["CHSINK_SPARK_MASTER"] = "local[2,4]"  # tasks are retried, as on a cluster
    producer = BackgroundProducer(kafka, src, total=10**9, per_second=600)
    producer.start()
    faults = []
    try:
        sink.start("--quiet")
        assert sink.wait_for_batches(2, timeout=240), sink.log_text()[-3000:]
        for fault in (zombie_task, executor_killed, after_lost, zombie_task, zombie_run):
            time.sleep(random.Random(len(faults)).uniform(0, 1.5))
            faults.append(fault(sink, zookeeper=zookeeper, server=clickhouse_server))
    finally:
        sink.kill()
        producer.finish()
    sink.drain()
    report = check_exactly_once(sink, producer.sent, producer.bad)
    print(f"executor path survived {faults}; totals {report['totals']}")
