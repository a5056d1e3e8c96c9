"""A benchmark stopped with SIGTERM (`kill`, a CI timeout) stops what it started: its broker and servers run in
sessions of their own and its job in a child process, so without it they ran on, holding ports and cores, and
the next run measured beside them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hack.testbed.process import REPO


def _started_under(tmp: Path) -> list[int]:
    """The processes (not this one) whose environment has TMPDIR=tmp: everything the benchmark started."""
    mark = f"TMPDIR={tmp}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _cmdlines(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
        except OSError:
            continue
    return out


def test_sigterm_stops_the_benchmarks_broker_and_job(tmp_path: Path) -> None:
    tmp = tmp_path / "t"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    bench = subprocess.Popen([sys.executable, "-m", "bench.latency", "--rate", "1000", "--seconds", "120",
                              "--warmup", "5", "--paths", "c", "--reps", "1", "--batch", "20000", "--block", "10000",
                              "--out", str(tmp_path / "out")], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not any("sparkapp run" in c for c in _cmdlines(_started_under(tmp))):
            assert bench.poll() is None and time.monotonic() < deadline, "the job never started"
            time.sleep(0.5)
        time.sleep(5)  # the job's JVM is up and the broker serving it
        bench.send_signal(signal.SIGTERM)
        bench.wait(90)
        assert bench.returncode != 0  # stopped, not finished
        deadline = time.monotonic() + 30
        while _started_under(tmp) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _started_under(tmp), _cmdlines(_started_under(tmp))
        # its work directory (the broker's log, the chdb) removed as well. Not pyspark's own: a job stopped while
        # it starts may leave the directory its gateway handed its port over in
        assert not list(tmp.glob("chsink-latency-*"))
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        for pid in _started_under(tmp):
            os.kill(pid, signal.SIGKILL)
