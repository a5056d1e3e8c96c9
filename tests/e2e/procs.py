"""The processes of a running job, seen from outside: its Spark Python workers (the executors' writers), how
busy each is, and the loopback socket each holds to the JVM. Read from /proc and `ss`, as an operator would."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # fields from `state` on: ppid=1, session=3, utime=11, stime=12


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def session_pids(sid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            st = _stat(int(d.name))
            if st is not None and int(st[3]) == sid:
                out.append(int(d.name))
    return out


def python_workers(sid: int) -> dict[int, int]:
    """worker -> the pyspark daemon that forked it, for the job whose session is `sid` (Spark may have started a
    new daemon after a worker crashed)."""
    pids = session_pids(sid)
    daemons = {p for p in pids if "pyspark.daemon" in _cmdline(p)}
    return {p: int(st[1]) for p in pids if (st := _stat(p)) is not None and int(st[1]) in daemons}


def cpu_ticks(pid: int) -> int:
    st = _stat(pid)
    return int(st[11]) + int(st[12]) if st else -1


def busiest(pids: list[int], window: float = 0.3) -> int | None:
    """The process that used the most CPU over `window` seconds (a worker inside a task), if any did."""
    before = {p: cpu_ticks(p) for p in pids}
    time.sleep(window)
    used = {p: cpu_ticks(p) - t for p, t in before.items() if t >= 0}
    best = max(used, key=lambda p: used[p], default=None)
    return best if best is not None and used[best] > 0 else None


def in_frame(pids: list[int], frame: str) -> int | None:
    """The first process whose Python stack (py-spy) is inside a function named `frame`."""
    spy = str(Path(sys.executable).parent / "py-spy")
    for pid in pids:
        res = subprocess.run([spy, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True)
        if f" {frame} (" in res.stdout:
            return pid
    return None


def _sockets(pid: int, listening: bool = False) -> list[tuple[int, int]]:
    """(local port, peer port) of the process's loopback TCP sockets."""
    res = subprocess.run(["ss", "-tnpH", *(["-l"] if listening else [])], capture_output=True, text=True, check=True)
    out = []
    for line in res.stdout.splitlines():
        if f"pid={pid}," in line:
            m = re.search(r"127\.0\.0\.1:(\d+)\s+(?:127\.0\.0\.1:(\d+)|\S+)", line)
            if m:
                out.append((int(m.group(1)), int(m.group(2) or 0)))
    return out


def cut_from_jvm(daemon: int, worker: int) -> tuple[int, int]:
    """Resets the worker's socket to the JVM (the one accepted on the daemon's port), as a network fault would:
    Spark sees the task fail and retries it, while the worker itself, if stopped, is still alive."""
    listen = {lp for lp, _ in _sockets(daemon, listening=True)}
    for lp, rp in _sockets(worker):
        if lp in listen:
            subprocess.run(["ss", "-K", "-tn", "sport", "=", f":{lp}", "dport", "=", f":{rp}"],
                           capture_output=True, check=True)
            return lp, rp
    raise AssertionError(f"worker {worker} holds no socket on the daemon's ports {listen}")
