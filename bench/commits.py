"""(c), (e) or (k) run from checkouts of two or more commits, alternated on one data set: a change measured side by side
with the commit before it in one run, not across two runs on a machine that drifts between them.

    python -m bench.commits HEAD~1 HEAD [--path e|c|k] [--dirty 0.005] [--reps 4] [--events 2400000] [--name commits]

Each commit is checked out in a git worktree of its own (removed afterwards). A run starts the job from that
worktree, with the worktree first on PYTHONPATH, so that the executors' Python workers also run its code. The
order is reversed every other rep, so that no commit always follows the same one. Per run: rows/s over the steady
batches and CPU per row by component, as `python -m bench` measures them. The results file has the medians, and
each rep's ratio of every commit to the first: results/<date>-<name>.json (a probe: no test asserts a figure).
With `--dirty`, each commit also runs, in every rep, on a second data set with that share of bad records
(dead-lettered), and the results add each rep's dirty/clean ratio per commit: the full run's dirty-data ratio, side by
side. With `--with-d` (and `--path c`), each run of (c) has one of (d), the job at-least-once, on the same data beside
it, the two in alternating order: the results add each rep's c/d per commit, the full run's exactly-once cost, run
for run."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hack.testbed import Kafka
from hack.testbed.process import REPO

from . import entry, probe_options, publish
from .__main__ import own_server, per_row, run_job
from .data import probe_topics


@contextlib.contextmanager
def worktrees(refs: list[str], root: Path) -> Iterator[dict[str, tuple[str, Path]]]:
    """ref -> (commit, worktree) for each ref, removed on the way out."""
    made: dict[str, tuple[str, Path]] = {}
    try:
        for i, ref in enumerate(refs):
            sha = subprocess.run(["git", "rev-parse", "--short", ref], cwd=REPO, check=True, capture_output=True,
                                 text=True).stdout.strip()
            path = root / f"wt{i}"
            subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=REPO, check=True,
                           capture_output=True)
            made[ref] = (sha, path)
        yield made
    finally:
        for _, path in made.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO, capture_output=True)


def run_order(refs: list[str], data: list[str], paths: list[str], reps: int) -> list[tuple[int, str, str, str]]:
    """(rep, ref, data, path) of each run in turn: every rep runs each ref on each data set by each path, and every
    other rep in the reverse order at each level, so that no run always follows the same one."""
    def turn(xs: list[str], rep: int) -> list[str]:
        return xs if rep % 2 == 0 else list(reversed(xs))

    return [(rep, ref, kind, path) for rep in range(reps) for ref in turn(refs, rep) for kind in turn(data, rep)
            for path in turn(paths, rep)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.commits", description=__doc__.split("\n\n")[0])
    ap.add_argument("refs", nargs="+", help="git refs; ratios are to the first")
    ap.add_argument("--path", choices=("c", "e", "k"), default="e",
                    help="(c) embedded, (e) HTTP with executors writing, or (k) embedded with rows routed by key")
    probe_options(ap, "commits", 4)
    ap.add_argument("--events", type=int, default=2_400_000)
    ap.add_argument("--dirty", type=float, default=0.0, help="also run on data with this share of bad records")
    ap.add_argument("--with-d", action="store_true", help="beside each run of (c), one of (d): c/d run for run")
    a = ap.parse_args(argv)
    if len(set(a.refs)) != len(a.refs):
        ap.error("each ref once")
    if a.with_d and a.path != "c":
        ap.error("--with-d pairs (c) with (d): --path c")
    paths = ["c", "d"] if a.with_d else [a.path]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="chsink-commits-") as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        trees = stack.enter_context(worktrees(a.refs, root))
        commits = {ref: sha for ref, (sha, _) in trees.items()}
        kafka = stack.enter_context(Kafka(root / "kafka"))
        probe_topics(kafka, a.events, a.partitions, a.dirty)
        for rep, ref, kind, path in run_order(a.refs, ["clean", "dirty"] if a.dirty else ["clean"], paths, a.reps):
            _, tree = trees[ref]
            dirty = kind == "dirty"
            work = root / f"run{len(runs)}"
            with own_server(work) if path == "e" else contextlib.nullcontext() as server:
                r = run_job(work, kafka, "bench-dirty" if dirty else "bench", a.events, a.batch,
                            path != "d", a.block, server=server, dlq="bench-dlq" if dirty else None,
                            key_shards=2 if path == "k" else 0, repo=tree, warm_s=a.warm_up)
            rate = r["rows_per_s"]
            res = {"ref": ref, "rep": rep, "data": kind, **({"path": path} if a.with_d else {}),
                   "rows_per_s": round(rate),
                   "us_per_row": per_row(r["cpu_cores_used"], rate),
                   "us_per_row_by_thread": per_row(r["cpu_cores_by_thread"], rate)}
            print(json.dumps(res), file=sys.stderr, flush=True)
            runs.append(res)
    base = a.refs[0]
    rate = {(r["ref"], r["rep"]): r["rows_per_s"] for r in runs if r["data"] == "clean" and r.get("path") != "d"}
    dirty_rate = {(r["ref"], r["rep"]): r["rows_per_s"] for r in runs if r["data"] == "dirty" and r.get("path") != "d"}
    d_rate = {(r["ref"], r["rep"]): r["rows_per_s"] for r in runs if r["data"] == "clean" and r.get("path") == "d"}
    return publish({"date": dt.date.today().isoformat(), "warm_up_s": a.warm_up, "path": a.path, "events": a.events,
                    "partitions": a.partitions, "max_offsets_per_trigger": a.batch, "block_offsets": a.block,
                    "commits": commits,
                    "medians": {ref: statistics.median(rate[(ref, rep)] for rep in range(a.reps)) for ref in a.refs},
                    "ratios_to_first": {ref: [round(rate[(ref, rep)] / rate[(base, rep)], 3) for rep in range(a.reps)]
                                        for ref in a.refs[1:]},
                    **({"dirty_share": a.dirty,
                        "dirty_medians": {ref: statistics.median(dirty_rate[(ref, rep)] for rep in range(a.reps))
                                          for ref in a.refs},
                        "dirty_clean": {ref: [round(dirty_rate[(ref, rep)] / rate[(ref, rep)], 3)
                                              for rep in range(a.reps)] for ref in a.refs}} if a.dirty else {}),
                    **({"d_medians": {ref: statistics.median(d_rate[(ref, rep)] for rep in range(a.reps))
                                      for ref in a.refs},
                        "c_d": {ref: [round(rate[(ref, rep)] / d_rate[(ref, rep)], 3) for rep in range(a.reps)]
                                for ref in a.refs}} if a.with_d else {}),
                    "runs": runs}, a.out, a.name)


if __name__ == "__main__":
    entry(main)
