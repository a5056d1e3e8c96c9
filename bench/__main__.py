"""`make bench`: (a) Spark's Kafka source (a batch read, and as the job runs it: streaming), (b) raw insert,
(c) the exactly-once job, (d) the same job at least once, both on the embedded chdb (the driver writes),
(e)/(f) the same two over HTTP to a real ClickHouse server process (executors write: production's path), and
the peers (g)/(h)/(i) on that server, on the same data in the same run; JSON + PNG in bench/results/. See
bench/README.md."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml

from hack.testbed import Kafka
from hack.testbed.process import REPO
from hack.testbed.servers import ClickHouseServer, ZooKeeper
from hack.testbed.spark import connector_jars

from . import entry, peers, stop_child, warm_up_option
from .data import TABLE, produce
from .measure import rate, steady
from .profile import summarize_jfr

BATCH_LINE = re.compile(r"^(\S+ \S+) INFO chsink\.job: batch (\d+): (\d+) records from \d+ partitions in ([\d.]+)s")


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


class RssSampler(threading.Thread):
    """Peak resident memory and CPU of a process tree, split into the driver's Python, its JVM (Spark) and the
    Python workers (executors' writers); any other tree (a server) counts as `other`."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = {"driver_python_mb": 0.0, "driver_jvm_mb": 0.0, "python_workers_mb": 0.0}
        self.peak_total = 0.0  # MB, the whole tree
        self.cpu: dict[int, tuple[str, float]] = {}  # last seen (part, user+system CPU seconds) per process
        self.samples: list[tuple[float, dict[str, float]]] = []  # (epoch seconds, CPU seconds so far per part)
        # the same per thread group within each part (thread_group), read every THREAD_EVERY samples: a JVM or a
        # ClickHouse server has a hundred threads or more. ClickHouse renames a pool's thread for each job it runs,
        # so each reading's CPU since the last goes to the group of the name the thread has now
        self.thread_seen: dict[tuple[int, int], float] = {}  # (pid, tid) -> its CPU seconds at the last reading
        self.group_cpu: dict[str, float] = {}  # "part/group" -> CPU seconds so far
        self.thread_samples: list[tuple[float, dict[str, float]]] = []
        self.done = threading.Event()

    def run(self) -> None:
        tick = 0
        while not self.done.wait(0.25):
            now = {k: 0.0 for k in self.peak}
            total = 0.0
            for pid, cmd, rss in _tree(self.pid):
                total += rss
                part = ("driver_python" if "-m sparkapp run" in cmd else "driver_jvm" if "java" in cmd
                        else "python_workers" if "pyspark" in cmd else "other")
                self.cpu[pid] = (part, max(self.cpu.get(pid, ("", 0.0))[1], _cpu_seconds(pid)))
                if part != "other":
                    now[f"{part}_mb"] += rss
                if tick % THREAD_EVERY == 0:
                    for tid, comm, cpu in _threads(pid):
                        # a thread id used again by a new thread starts lower: nothing counted, then counted from there
                        spent = cpu - self.thread_seen.get((pid, tid), 0.0)
                        self.thread_seen[(pid, tid)] = cpu
                        if spent > 0:
                            group = f"{part}/{thread_group(comm)}"
                            self.group_cpu[group] = self.group_cpu.get(group, 0.0) + spent
            if tick % THREAD_EVERY == 0:
                self.thread_samples.append((time.time(), dict(self.group_cpu)))
            tick += 1
            for k, v in now.items():
                self.peak[k] = max(self.peak[k], v)
            self.peak_total = max(self.peak_total, total)
            parts: dict[str, float] = {}
            for part, cpu in self.cpu.values():
                parts[part] = parts.get(part, 0.0) + cpu
            self.samples.append((time.time(), parts))

    def cores_used(self, start: float, end: float) -> dict[str, float]:
        """Average CPU cores each part of the tree used between two wall-clock instants (and `total`)."""
        inside = [(t, c) for t, c in self.samples if start <= t <= end]
        if len(inside) < 2:
            return {"total": 0.0}
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        out = {k: round((v - c0.get(k, 0.0)) / (t1 - t0), 2) for k, v in c1.items()}
        return {**out, "total": round(sum(out.values()), 2)}

    def thread_cores(self, start: float, end: float, by_part: bool = True) -> dict[str, dict[str, float]]:
        """Average CPU cores each thread group (thread_group) of each part used between two instants: what the
        JVM's JIT compilers and collector took beside Spark's tasks, ClickHouse's merges beside its inserts.
        `by_part=False`: the whole tree's groups, under `all`."""
        inside = [(t, c) for t, c in self.thread_samples if start <= t <= end]
        if len(inside) < 2:
            return {}
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        out: dict[str, dict[str, float]] = {}
        for key, v in sorted(c1.items()):
            part, group = key.split("/")
            into = out.setdefault(part if by_part else "all", {})
            into[group] = into.get(group, 0.0) + (v - c0.get(key, 0.0)) / (t1 - t0)
        return {part: {g: round(c, 3) for g, c in groups.items() if c > 0} for part, groups in out.items()}


def per_row(cores: dict[str, Any], rate: float) -> dict[str, Any]:
    """CPU cores used (cores_used, or thread_cores's nested groups) as µs of CPU per row at `rate` rows/s."""
    return {k: per_row(v, rate) if isinstance(v, dict) else round(v / rate * 1e6, 2) for k, v in cores.items()}


THREAD_EVERY = 4  # the sampler reads every thread once a second

# Thread names as the kernel keeps them (15 bytes), by what the thread does. The JVM names its JIT compilers, its
# collector's threads and Spark's task threads; ClickHouse (the server, and chdb inside the driver's Python) its
# merges, its HTTP/TCP handlers and the pools that run queries, inserts among them.
_THREAD_GROUPS = (
    ("jit", ("C1 CompilerThre", "C2 CompilerThre")),
    ("gc", ("GC Thread", "G1 ", "VM Thread")),
    ("spark_tasks", ("Executor task l",)),
    ("clickhouse_merges", ("MergeMutate",)),
    ("clickhouse_handlers", ("HTTPHandler", "TCPHandler")),
    ("clickhouse_queries", ("ThreadPool", "Query")),  # QueryPipelineEx, QueryPullPipeEx, QueryPushPipeEx
    ("python", ("python", "pyspark")),
)


def thread_group(comm: str) -> str:
    """The group of a thread by its name (_THREAD_GROUPS), `other` for the rest."""
    return next((g for g, prefixes in _THREAD_GROUPS if comm.startswith(prefixes)), "other")


def _threads(pid: int) -> list[tuple[int, str, float]]:
    """(tid, name, user+system CPU seconds) of each thread of a process."""
    out: list[tuple[int, str, float]] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for t in tasks:
        try:
            stat = (t / "stat").read_text()
            out.append((int(t.name), stat[stat.index("(") + 1:stat.rindex(")")], _stat_cpu(stat)))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _cpu_seconds(pid: int) -> float:
    try:
        return _stat_cpu(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, IndexError, ValueError):
        return 0.0


def _stat_cpu(stat: str) -> float:
    """User+system CPU seconds from a process's or thread's /proc stat line."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree(root: int) -> list[tuple[int, str, float]]:
    """(pid, command line, RSS in MB) of each process of the tree under `root`. A JVM's child that still has the
    JVM's command line is the JVM starting a subprocess (Hadoop's `chmod` of each checkpoint file, several a
    batch), caught between its fork and its exec: it shares the JVM's pages, so its RSS is given as 0. Counted,
    it doubled the JVM's peak in the runs where a sample caught one (the "spikes" of 1.8-2.6 GB)."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [(root, "")]
    while todo:
        pid, parent = todo.pop()
        try:
            cmd = (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")).decode(errors="replace")
            rss = next(int(x.split()[1]) for x in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if x.startswith("VmRSS:")) / 1024
        except (OSError, StopIteration):
            continue
        todo += [(kid, cmd) for kid in kids.get(pid, [])]
        out.append((pid, cmd, 0.0 if "java" in parent and cmd == parent else rss))
    return out


def _sample(proc: subprocess.Popen[Any] | None) -> RssSampler | None:
    if proc is None:
        return None
    sampler = RssSampler(proc.pid)
    sampler.start()
    return sampler


@contextlib.contextmanager
def own_server(work: Path, zookeeper: ZooKeeper | None = None) -> Iterator[ClickHouseServer]:
    """A fresh ClickHouse server for one run over HTTP, beside its work dir. A server that served an earlier run
    may still be merging that run's parts, and the next run would pay for it: (e) used 2.3-4.3 us of server CPU per
    row in full runs where it shared a server with (f), and 2.1 alone on a fresh one."""
    with ClickHouseServer(work.with_name(f"{work.name}-clickhouse"), zookeeper) as server:
        assert isinstance(server, ClickHouseServer)
        yield server


def jfr(profile: Path) -> Path:
    """Where the driver JVM's flight recording of a profiled run goes, beside py-spy's profile."""
    return profile.with_name("profile-c.jfr")


def run_job(work: Path, kafka: Kafka, topic: str, n: int, max_offsets: int, exactly_once: bool,
            block_offsets: int, profile: Path | None = None, server: ClickHouseServer | None = None,
            dlq: str | None = None, key_shards: int = 0, spark_conf: dict[str, str] | None = None,
            source_options: dict[str, str] | None = None, table: str = TABLE, repo: Path = REPO,
            warm_s: float = 0.0) -> dict[str, Any]:
    """(c)/(d): the real job (`python -m sparkapp run`) on its own chdb; (e)/(f) with `server`: over HTTP to
    that ClickHouse server, in a database of its own; until the topic is drained. `dlq`: bad records go there
    (the dirty-data runs). `key_shards`: rows routed by `user_id` over that many shards (a database each on
    the same ClickHouse), each window split into per-shard sub-blocks. `spark_conf`: the job's `sparkConf` (a probe of
    a Spark or JVM setting); `source_options`: its `kafka.sourceOptions` (one of Spark's Kafka source); `table`: the
    events table's DDL; `repo`: the checkout the job runs from, its executors' Python workers too; `warm_s`: the
    seconds of batches left out of the rate for the JVM's warm-up (bench.measure.steady)."""
    chdb = work / "chdb"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    db = f"bench_{work.name}"
    dbs = [f"{db}_s{i}" for i in range(key_shards)] or [db]
    ddl = [s for d in dbs for s in (f"CREATE DATABASE IF NOT EXISTS {d}", table.format(db=d, table="events"))]
    if server is None:
        subprocess.run([sys.executable, "-m", "hack.chsql", str(chdb), *ddl], cwd=REPO, check=True,
                       capture_output=True)
    else:
        import clickhouse_connect

        client = clickhouse_connect.get_client(dsn=server.dsn)
        for stmt in ddl:
            client.command(stmt)
    endpoint = server.dsn if server else f"chdb://{chdb}"
    cfg = {"name": f"bench-{work.name}", "kafka": {"bootstrapServers": kafka.bootstrap, "topics": [topic],
                                                   **({"sourceOptions": source_options} if source_options else {})},
           "clickhouse": {"endpoints": [endpoint] * len(dbs), "database": dbs[0], "tables": {topic: "events"},
                          **({"shardDatabases": dbs} if key_shards else {})},
           **({"sharding": {"policy": "key", "key": "user_id"}} if key_shards else {}),
           "state": {"engine": "EmbeddedRocksDB", "enabled": exactly_once},
           "batching": {"maxOffsetsPerTrigger": max_offsets, "blockOffsets": block_offsets,
                        "triggerInterval": "0 seconds"},
           "checkpointLocation": str(work / "checkpoint"), **({"dlq": {"topic": dlq}} if dlq else {}),
           "sparkConf": _spark_conf(spark_conf or {}, profile)}
    (work / "sink.yaml").write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if repo != REPO:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH", "")) if p)
    log = work / "job.log"
    with open(log, "wb") as out:
        spy = [str(Path(sys.executable).parent / "py-spy"), "record", "-r", "50", "-f", "speedscope",
               "-o", str(profile), "--"] if profile else []
        proc = subprocess.Popen([*spy, sys.executable, "-m", "sparkapp", "run", "--config", str(work / "sink.yaml"),
                                 "--until-idle", "4", "--quiet"], cwd=repo, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    sampler = _sample(proc)
    others = {"clickhouse_server": _sample(server.proc if server is not None else None), "kafka": _sample(kafka.proc)}
    try:
        code = proc.wait(3600)
    finally:
        for s in (sampler, *others.values()):
            if s is not None:
                s.done.set()
        stop_child(proc)
    assert sampler is not None
    text = log.read_text(errors="replace")
    keep = Path(os.environ.get("CHSINK_BENCH_LOGS", "")) if os.environ.get("CHSINK_BENCH_LOGS") else None
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, keep / f"{work.name}.log")
    if code != 0:
        raise RuntimeError(f"job failed ({code}):\n{text[-3000:]}")
    batches = []
    for line in text.splitlines():
        m = BATCH_LINE.match(line)
        if m and int(m.group(3)) > 0:
            end = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            batches.append((end - float(m.group(4)), end, int(m.group(3)), float(m.group(4))))
    rows = sum(b[2] for b in batches)
    if rows != n:
        raise RuntimeError(f"job delivered {rows} records, expected {n}:\n{text[-3000:]}")
    kept = steady([b[:3] for b in batches], warm_s)
    if profile:
        profile.with_name("profile-c-jvm.txt").write_text(summarize_jfr(str(jfr(profile)), kept[0][0],
                                                                        kept[-1][1]) + "\n")
    lat = sorted(b[3] for b in batches)
    warming = [b for b in batches[1:] if b[0] < kept[0][0]]  # the warm-up's own rate, as a run without one measures
    return {"rows": rows, "seconds": kept[-1][1] - kept[0][0], "rows_per_s": rate(kept), "batches": len(batches),
            "steady_batches": len(kept),
            **({"warm_up_rows_per_s": rate(warming)} if len(warming) > 1 else {}),
            "first_batch_s": batches[0][3], "all_batches_rows_per_s": rate(batches),
            "batch_p50_s": statistics.median(lat), "batch_p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            "peak_rss": {k: round(v, 1) for k, v in sampler.peak.items()},
            "cpu_cores_used": {**sampler.cores_used(kept[0][0], kept[-1][1]),
                               **{k: s.cores_used(kept[0][0], kept[-1][1])["total"]
                                  for k, s in others.items() if s is not None}},
            "cpu_cores_by_thread": {**sampler.thread_cores(kept[0][0], kept[-1][1]),
                                    **{k: s.thread_cores(kept[0][0], kept[-1][1], by_part=False).get("all", {})
                                       for k, s in others.items() if s is not None}},
            "path": "http, executors" if server else "embedded chdb, driver",
            **peers.served_by(server),
            "max_offsets_per_trigger": max_offsets}


def with_driver_option(conf: dict[str, str], option: str) -> dict[str, str]:
    """`conf` (a job's sparkConf) with one more option for the driver JVM, after its own."""
    key = "spark.driver.extraJavaOptions"
    return {**conf, key: f"{conf.get(key, '')} {option}".strip()}


def _spark_conf(conf: dict[str, str], profile: Path | None) -> dict[str, str]:
    """The job's sparkConf; with a profile, Java Flight Recorder samples the driver JVM too (written when the JVM
    exits)."""
    if profile is None:
        return dict(conf)
    return with_driver_option(conf, f"-XX:StartFlightRecording=filename={jfr(profile)},settings=profile,"
                                     "dumponexit=true")


PEERS = {"g": "ClickHouse Kafka Connect sink, exactlyOnce=true (KeeperMap)",
         "h": "ClickHouse Kafka Connect sink, at-least-once", "i": "clickhouse_sinker, at-least-once"}


def run_peer(key: str, work: Path, kafka: Kafka, topic: str, n: int, server: ClickHouseServer,
             warm_s: float = 0.0, table: str = TABLE) -> dict[str, Any]:
    """Peer `key` of PEERS on `server` until it landed n rows in the events table `table` makes: its figures
    (bench.peers)."""
    if key == "i":
        return peers.run_sinker(work, kafka.bootstrap, topic, n, server, _sample, warm_s, table)
    return peers.run_connect(work, kafka.bootstrap, topic, n, server, key == "g", _sample, warm_s, table)


def run_peers(work: Path, kafka: Kafka, topic: str, n: int, zookeeper: ZooKeeper,
              warm_s: float = 0.0) -> dict[str, Any]:
    """(g)/(h)/(i), each on a ClickHouse server of its own, as chsink's HTTP runs are (own_server); a peer that is
    not built, fails, or runs shorter than the warm-up is reported with the reason instead of figures."""
    out: dict[str, Any] = {}
    for key in PEERS:
        say(f"({key}) {PEERS[key]}")
        try:
            with own_server(work / key, zookeeper) as server:
                out[key] = run_peer(key, work / key, kafka, topic, n, server, warm_s)
            say(f"    {out[key]['rows_per_s']:,.0f} rows/s, {out[key]['duplicates']} duplicates")
        except peers.NOT_MEASURED as e:
            out[key] = {"unavailable": str(e)[:2000]}
            say(f"    not measured: {str(e).splitlines()[0]}")
    return out


T = TypeVar("T")


def in_turn(runs: list[T], flip: bool) -> list[T]:
    """A round's runs in their order, reversed every other round (`flip`): neither side of a ratio always runs
    first."""
    return runs[::-1] if flip else runs


def embedded_runs(flip: bool) -> list[tuple[str, bool, bool]]:
    """(key, exactly-once, on dirty data) of (c) and (d), clean and dirty, in their order in a round: a chain in
    which each target ratio's two runs are neighbours (c/d, and (c) dirty against (c)), in turn."""
    return in_turn([("d", False, False), ("c", True, False), ("c_dirty", True, True), ("d_dirty", False, True)], flip)


def one_round(work: Path, kafka: Kafka, topic: str, small: str, a: argparse.Namespace, sweep: list[int],
              profile: Path | None, flip: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    """One round of the measurements: (a), (c) and (d), both on dirty data (embedded_runs), (k), (e) and (f) each on
    a ClickHouse server of its own, then the sweep; each as (key, result) when done. `flip` reverses the order of
    each pair and of embedded_runs, so that no side of a ratio always follows the same run."""
    def pair(exactly_once: str, at_least_once: str) -> list[tuple[str, bool]]:
        return in_turn([(exactly_once, True), (at_least_once, False)], flip)

    jars = ",".join(connector_jars())
    warm = a.warm_up
    yield "a", measure("source", kafka.bootstrap, topic, jars, str(warm))
    yield "a_stream", measure("stream-source", kafka.bootstrap, topic, jars, str(a.events), str(a.batch), str(warm),
                              kafka=kafka)
    for key, eo, dirty in embedded_runs(flip):
        yield key, run_job(work / key, kafka, "bench-dirty" if dirty else topic, a.events, a.batch, eo, a.block,
                           profile if key == "c" else None, dlq="bench-dlq" if dirty else None, warm_s=warm)
    yield "k", run_job(work / "k", kafka, topic, a.events, a.batch, True, a.block, key_shards=2, warm_s=warm)
    if not a.no_http:
        for key, eo in pair("e", "f"):
            with own_server(work / key) as server:
                yield key, run_job(work / key, kafka, topic, a.events, a.batch, eo, a.block, server=server,
                                   warm_s=warm)
    for m in sweep:
        for key, eo in pair("c", "d"):
            yield f"{key}@{m}", run_job(work / f"s{key}{m}", kafka, small, a.sweep_events, m, eo, min(a.block, m),
                                        warm_s=warm)


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median rate (the lower middle one of an even number): a real run, CPU figures and all."""
    return sorted(runs, key=lambda r: float(r["rows_per_s"]))[(len(runs) - 1) // 2]


def measure(kind: str, *args: str, kafka: Kafka | None = None) -> dict[str, Any]:
    """One bench.measure run. With `kafka`, a measurement that reports its steady window (`steady_from`,
    `steady_to`) also gets the CPU cores its process tree (Spark) and the broker used meanwhile."""
    proc = subprocess.Popen([sys.executable, "-m", "bench.measure", kind, *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    samplers = {"spark": _sample(proc), "kafka": _sample(kafka.proc)} if kafka is not None else {}
    try:
        stdout, stderr = proc.communicate(timeout=3600)
    finally:
        for s in samplers.values():
            if s is not None:
                s.done.set()
        stop_child(proc)
    line = next((x for x in stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"bench.measure {kind} failed:\n{stderr[-3000:]}")
    out: dict[str, Any] = json.loads(line[len("RESULT "):])
    if samplers and "steady_from" in out:
        out["cpu_cores_used"] = {k: s.cores_used(out["steady_from"], out["steady_to"])["total"]
                                 for k, s in samplers.items() if s is not None}
        window = out["steady_from"], out["steady_to"]
        out["cpu_cores_by_thread"] = {k: s.thread_cores(*window, by_part=False).get("all", {})
                                      for k, s in samplers.items() if s is not None}
    return out


# every run the chart's bars show, in this order, where the results have it (a peer not built has no rate)
BARS = {"a": "(a) Spark's Kafka source alone", "a_stream": "(a_stream) the source, as the job runs it",
        "c": "(c) exactly-once, embedded", "d": "(d) at-least-once, embedded", "c_dirty": "(c) on dirty data",
        "k": "(k) exactly-once, key routing", "e": "(e) exactly-once, HTTP", "f": "(f) at-least-once, HTTP",
        "g": "(g) Kafka Connect, exactly-once", "h": "(h) Kafka Connect, at-least-once", "i": "(i) clickhouse_sinker"}


def chart(results: dict[str, Any], path: Path) -> None:
    """Left: (c) and (d) over the sweep of batch sizes, with (a) and (b) as lines. Right: every run's rows/s (the
    median round), chsink's and the peers' side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bars) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [1, 1.2]})
    for key, label in (("c", "exactly-once (c)"), ("d", "at-least-once (d)")):
        pts = sorted((r["max_offsets_per_trigger"], r["rows_per_s"]) for r in [*results["sweep"][key], results[key]])
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    for key, style in (("a", ":"), ("b", "--")):
        ax.axhline(results[key]["rows_per_s"], linestyle=style, color="grey",
                   label=f"({key}) {'Spark Kafka source' if key == 'a' else 'raw insert'}")
    ax.set_xscale("log")
    ax.set_xlabel("maxOffsetsPerTrigger")
    ax.set_ylabel("rows/s")
    ax.set_title("the sweep")
    ax.legend(fontsize=8)
    shown = [key for key in BARS if isinstance(results.get(key), dict) and "rows_per_s" in results[key]]
    ys = range(len(shown))
    bars.barh(list(ys), [results[key]["rows_per_s"] for key in shown],
              color=["tab:orange" if key in PEERS else "grey" if key.startswith("a") else "tab:blue" for key in shown])
    bars.set_yticks(list(ys), [BARS[key] for key in shown], fontsize=8)
    bars.invert_yaxis()
    bars.set_xlabel("rows/s, median round")
    bars.set_title("every run (orange: the peers)")
    fig.suptitle(f"chsink, {results['events']:,} events, {results['cores']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batch", type=int, default=400_000, help="maxOffsetsPerTrigger of the main runs")
    ap.add_argument("--block", type=int, default=200_000, help="blockOffsets")
    ap.add_argument("--sweep", default="25000,100000,400000", help="maxOffsetsPerTrigger values for the chart")
    ap.add_argument("--sweep-events", type=int, default=800_000)
    ap.add_argument("--dirty", type=float, default=0.005, help="bad records' share in the dirty-data runs")
    ap.add_argument("--no-peers", action="store_true", help="leave the peers out")
    ap.add_argument("--no-http", action="store_true", help="leave out (e), (f) and the peers (the embedded path only)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of every measurement but the raw insert and the peers, interleaved; each figure is "
                         "its median round's, so the ratios compare runs made minutes apart, not a run's luck")
    warm_up_option(ap)
    ap.add_argument("--quick", action="store_true", help="a small smoke run (tests use it)")
    ap.add_argument("--profile", action="store_true",
                    help="also record the first round's (c) under py-spy (a speedscope file) and its driver JVM "
                         "under Java Flight Recorder (profile-c.jfr; by component in profile-c-jvm.txt)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    a = ap.parse_args(argv)
    if a.quick:
        a.events, a.batch, a.block, a.sweep, a.rounds = 20_000, 5_000, 2_500, "", 1  # no sweep: the main runs cover it
    sweep = [int(x) for x in a.sweep.split(",") if x.strip()]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="chsink-bench-") as tmp:
        work = Path(tmp)
        with Kafka(work / "kafka") as kafka:
            assert isinstance(kafka, Kafka)
            topic, small = "bench", "bench-sweep"
            kafka.create_topic(topic, a.partitions)
            kafka.create_topic(small, a.partitions)
            for t in ("bench-dirty", "bench-dlq"):
                kafka.create_topic(t, a.partitions if t == "bench-dirty" else 1)
            say(f"producing {a.events:,} events over {a.partitions} partitions, clean and {a.dirty:.1%} dirty")
            size = produce(kafka.bootstrap, topic, a.events, a.partitions)
            produce(kafka.bootstrap, "bench-dirty", a.events, a.partitions, dirty=a.dirty)
            if sweep:
                produce(kafka.bootstrap, small, a.sweep_events, a.partitions)
            say("(b) raw insert into chdb")
            res_b = measure("raw", str(work / "raw"), str(min(a.events, 1_000_000)), str(a.block))
            say(f"    {res_b['rows_per_s']:,.0f} rows/s")
            runs: dict[str, list[dict[str, Any]]] = {}
            for r in range(1, a.rounds + 1):
                say(f"round {r} of {a.rounds}")
                for key, res in one_round(work / f"r{r}", kafka, topic, small, a, sweep,
                                          out / "profile-c.speedscope.json" if a.profile and r == 1 else None,
                                          flip=r % 2 == 0):
                    runs.setdefault(key, []).append(res)
                    say(f"    ({key}) {res['rows_per_s']:,.0f} rows/s")
            res_peers: dict[str, Any] = {}
            if not a.no_http and not a.no_peers:
                with ZooKeeper(work / "zookeeper") as zk:
                    res_peers = run_peers(work, kafka, topic, a.events, zk, a.warm_up)
    med = {key: _median_run(rs) for key, rs in runs.items()}
    res_a, res_c, res_d, res_k = med["a"], med["c"], med["d"], med["k"]
    res_e, res_f = med.get("e", {}), med.get("f", {})
    dirty = {"c": med["c_dirty"], "d": med["d_dirty"]}
    swept = {key: [med[f"{key}@{m}"] for m in sweep] for key in ("c", "d")}
    c = res_c["rows_per_s"]
    results = {
        "date": dt.date.today().isoformat(), "events": a.events, "partitions": a.partitions, "cores": cores,
        "mean_value_bytes": round(size, 1), "max_offsets_per_trigger": a.batch, "block_offsets": a.block,
        "a": res_a, "a_stream": med["a_stream"], "b": res_b, "c": res_c, "d": res_d, "e": res_e, "f": res_f,
        **res_peers, "sweep": swept,
        "dirty_share": a.dirty, "c_dirty": dirty["c"], "d_dirty": dirty["d"], "k": res_k,
        "ratio_k_c": res_k["rows_per_s"] / c,
        "ratio_c_dirty_clean": dirty["c"]["rows_per_s"] / c,
        "ratio_d_dirty_clean": dirty["d"]["rows_per_s"] / res_d["rows_per_s"],
        "ratio_c_d_dirty": dirty["c"]["rows_per_s"] / dirty["d"]["rows_per_s"],
        "rows_per_s": c, "rows_per_s_per_core": c / cores,
        "ratio_c_a": c / res_a["rows_per_s"], "ratio_c_b": c / res_b["rows_per_s"],
        "ratio_c_a_stream": c / med["a_stream"]["rows_per_s"],
        "ratio_c_d": c / res_d["rows_per_s"],
        "ratio_c_min_ab": c / min(res_a["rows_per_s"], res_b["rows_per_s"]),
        **({"ratio_e_a": res_e["rows_per_s"] / res_a["rows_per_s"],
            "ratio_e_a_stream": res_e["rows_per_s"] / med["a_stream"]["rows_per_s"],
            "ratio_e_f": res_e["rows_per_s"] / res_f["rows_per_s"], "ratio_e_c": res_e["rows_per_s"] / c}
           if res_e else {}),
        **{f"ratio_{mine}_{k}": r["rows_per_s"] / p["rows_per_s"]  # chsink over HTTP against each peer
           for k, p in res_peers.items() if "rows_per_s" in p for mine, r in (("e", res_e), ("f", res_f))},
        "targets": {"ratio_c_d>=0.95": c / res_d["rows_per_s"] >= 0.95,
                    "ratio_c_dirty_clean>=0.9": dirty["c"]["rows_per_s"] / c >= 0.9,
                    "ratio_c_min_ab>=0.5": c / min(res_a["rows_per_s"], res_b["rows_per_s"]) >= 0.5,
                    "rows_per_s_per_core>=100000": c / cores >= 100_000},
        "quick": a.quick, "rounds": a.rounds, "warm_up_s": a.warm_up,
        "per_round_rows_per_s": {key: [round(r["rows_per_s"]) for r in rs] for key, rs in runs.items()},
        "per_round_ratios": {f"{x}/{y}": [round(p["rows_per_s"] / q["rows_per_s"], 3)
                                          for p, q in zip(runs[x], runs[y], strict=True)]
                             for x, y in (("c", "a"), ("c", "a_stream"), ("c", "d"), ("c_dirty", "c"), ("e", "a"),
                                          ("e", "a_stream"), ("k", "c"),
                                          *((f"c@{m}", f"d@{m}") for m in sweep)) if x in runs and y in runs},
    }
    stem = f"{results['date']}{'-quick' if a.quick else ''}"
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    chart(results, out / f"{stem}.png")
    print(json.dumps({k: v for k, v in results.items() if k != "sweep"}, indent=2))
    say(f"wrote {out / (stem + '.json')} and {out / (stem + '.png')}")
    return 0


if __name__ == "__main__":
    entry(main)
