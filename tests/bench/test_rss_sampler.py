"""The benchmark's memory figures: a process the JVM forks to start a subprocess shares the JVM's pages until it
execs, so the tree's resident memory must not count it again (it doubled the JVM's peak whenever a sample caught
one: the Hadoop `chmod` Spark's checkpoint starts for each file)."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.__main__ import RssSampler, _tree, thread_group

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


# a process whose command line names java, with one thread busy under two names in turn (ClickHouse renames a
# pool's threads for each job: ThreadPool, QueryPipelineEx, ...), then idle under a third
_BUSY_THREAD = """
import ctypes, threading, time

def name(n):
    ctypes.CDLL(None).prctl(15, n, 0, 0, 0)  # PR_SET_NAME: the kernel's name of this thread

def spin(s):
    end = time.monotonic() + s
    while time.monotonic() < end:
        pass

def work():
    name(b"C2 CompilerThre")
    spin(3.0)
    name(b"QueryPipelineEx")
    spin(3.0)
    name(b"idle")
    time.sleep(60)

threading.Thread(target=work, daemon=True).start()
print("spinning", flush=True)
time.sleep(60)
"""


def test_thread_groups_by_name():
    assert thread_group("C1 CompilerThre") == thread_group("C2 CompilerThre") == "jit"
    assert thread_group("GC Thread#1") == thread_group("VM Thread") == "gc"
    assert thread_group("Executor task l") == "spark_tasks"
    assert thread_group("MergeMutate") == "clickhouse_merges" and thread_group("HTTPHandler") == "clickhouse_handlers"
    assert thread_group("ThreadPool") == thread_group("QueryPushPipeEx") == "clickhouse_queries"
    assert thread_group("python3") == "python" and thread_group("kafka-producer-") == "other"


def test_the_sampler_splits_a_process_s_cpu_by_the_names_its_threads_had():
    proc = subprocess.Popen([sys.executable, "-c", _BUSY_THREAD, "java"], stdout=subprocess.PIPE, text=True)
    sampler = RssSampler(proc.pid)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "spinning"
        start = time.time()
        sampler.start()
        time.sleep(7.5)
        by_thread = sampler.thread_cores(start, time.time())
        by_part = sampler.cores_used(start, time.time())
    finally:
        sampler.done.set()
        _stop(proc)
    jvm = by_thread["driver_jvm"]
    # the busy thread's CPU under each name it had while it spent it, not all of it under its last name; what it
    # spent since the reading before a rename (a second, more on a loaded machine) goes under the new name, so each
    # name holds the thread for 3 s: that slop stays under what each name is owed. As shares: the other test worker
    # may take half the core the thread spins on
    total = sum(jvm.values())
    assert total > 0.1 and min(jvm.get("jit", 0.0), jvm.get("clickhouse_queries", 0.0)) > 0.25 * total, by_thread
    assert jvm.get("other", 0.0) < min(jvm["jit"], jvm["clickhouse_queries"]), by_thread
    assert jvm.get("python", 0.0) < 0.1, by_thread  # the main thread only waited
    assert sum(jvm.values()) <= by_part["driver_jvm"] + 0.1, (by_thread, by_part)  # the process's CPU, split
    assert set(sampler.thread_cores(start, time.time(), by_part=False)) == {"all"}
