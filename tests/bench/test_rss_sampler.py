"""The benchmark's memory figures: a process the JVM forks to start a subprocess shares the JVM's pages until it
execs, so the tree's resident memory must not count it again (it doubled the JVM's peak whenever a sample caught
one: the Hadoop `chmod` Spark's checkpoint starts for each file)."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.__main__ import _tree

# a parent whose command line names java (as a JVM's does) touches 300 MB, then forks a child that never execs
_PARENT = """
import os, sys, time
held = bytearray(300 << 20)
for i in range(0, len(held), 4096):
    held[i] = 1
if os.fork() == 0:
    time.sleep(60)
    os._exit(0)
print("forked", flush=True)
time.sleep(60)
"""


def test_a_jvms_fork_before_its_exec_counts_no_memory_of_its_own():
    proc = subprocess.Popen([sys.executable, "-c", _PARENT, "java"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "forked"
        time.sleep(0.2)
        tree = _tree(proc.pid)
        assert len(tree) == 2, tree
        (parent, _, parent_mb), (_, child_cmd, child_mb) = tree
        assert parent == proc.pid and "java" in child_cmd
        assert parent_mb > 300, tree
        assert child_mb == 0.0, tree  # its resident pages are the parent's
    finally:
        _stop(proc)


def test_a_child_that_runs_another_program_counts_its_own_memory():
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.run(['sleep', '60'])", "java"],
                            text=True)
    try:
        for _ in range(100):
            tree = _tree(proc.pid)
            if len(tree) == 2 and tree[1][1].startswith("sleep"):
                break
            time.sleep(0.05)
        assert len(tree) == 2 and tree[1][1].startswith("sleep") and tree[1][2] > 0, tree
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[str]) -> None:
    """The process and its child, the child first (killed after its parent, it would linger)."""
    subprocess.run(["pkill", "-KILL", "-P", str(proc.pid)], check=False)
    proc.kill()
    proc.wait()
