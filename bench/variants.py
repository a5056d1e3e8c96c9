"""(c), the exactly-once job on the embedded path, run with variants of its `sparkConf` (or of its Kafka source's
`sourceOptions`), alternated on one data set: a setting of Spark, of its JVM or of its Kafka consumers measured
side by side with the job's defaults, not across two full runs.

    python -m bench.variants '{"default": {}, "direct1m": {"spark.task.maxDirectResultSize": "1m"}}' \\
        [--reps 4] [--events 2400000] [--dirty 0.005] [--name direct-results]
    python -m bench.variants '{"default": {}, "wait500": {"sourceOptions": {"kafka.fetch.max.wait.ms": "500"}}}'

Each variant runs `--reps` times; the order is reversed every other rep, so that no variant always follows the
same one. Per run: rows/s and CPU per row over the steady batches, as `python -m bench` measures (c), peak RSS,
and the driver JVM's garbage collection over the whole run (`-Xlog:gc`: pauses, their total, full collections).
With `--dirty F` each run is followed by one on a second topic of the same events with a share F of bad records
(those of `python -m bench`, dead-lettered), and the rep's dirty/clean ratio. Writes results/<date>-<name>.json
(a probe: no test asserts a figure).

To compare two commits, run the same command in a worktree of each, one after the other."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from hack.testbed import Kafka

from . import entry, probe_options, publish
from .__main__ import per_row, run_job, with_driver_option
from .data import probe_topics

VARIANT_KEYS = {"sparkConf", "sourceOptions"}  # a variant of the job's Kafka source options as well
PAUSE = re.compile(r"Pause (Young|Full) .* ([\d.]+)ms$", re.M)


def gc_summary(log: str) -> dict[str, Any]:
    """Pauses, their total ms and the full collections in a `-Xlog:gc` log."""
    pauses = PAUSE.findall(log)
    return {"pauses": len(pauses), "pause_ms": round(sum(float(ms) for _, ms in pauses)),
            "full": sum(kind == "Full" for kind, _ in pauses)}


def normalized(variant: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A variant as {"sparkConf": {...}, "sourceOptions": {...}}; a flat one is its sparkConf."""
    if variant and set(variant) <= VARIANT_KEYS:
        return {k: dict(variant.get(k, {})) for k in ("sparkConf", "sourceOptions")}
    return {"sparkConf": dict(variant), "sourceOptions": {}}


def one(work: Path, kafka: Kafka, topic: str, n: int, a: argparse.Namespace, variant: dict[str, dict[str, Any]],
        dlq: str | None = None) -> dict[str, Any]:
    """One run of (c) with a normalized variant."""
    gc_log = work.with_suffix(".gc.log")
    r = run_job(work, kafka, topic, n, a.batch, True, a.block, dlq=dlq,
                spark_conf=with_driver_option(variant["sparkConf"], f"-Xlog:gc:file={gc_log}"),
                source_options=variant["sourceOptions"] or None, warm_s=a.warm_up)
    rate = r["rows_per_s"]
    return {"rows_per_s": round(rate), "batch_p50_s": r["batch_p50_s"], "peak_rss": r["peak_rss"],
            "us_per_row": per_row(r["cpu_cores_used"], rate),
            "us_per_row_by_thread": per_row(r["cpu_cores_by_thread"], rate),
            "gc": gc_summary(gc_log.read_text())}


def _medians(runs: list[dict[str, Any]], dirty: bool) -> dict[str, float]:
    out = {"rows_per_s": statistics.median(r["rows_per_s"] for r in runs),
           "driver_jvm_us_per_row": statistics.median(r["us_per_row"].get("driver_jvm", 0.0) for r in runs)}
    if dirty:
        out["dirty_rows_per_s"] = statistics.median(r["dirty"]["rows_per_s"] for r in runs)
        out["ratio_dirty_clean"] = statistics.median(r["ratio_dirty_clean"] for r in runs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.variants", description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", help='JSON: {"name": {sparkConf}, ...} or {"name": {"sparkConf": {...}, '
                                     '"sourceOptions": {...}}, ...}; names are identifiers')
    probe_options(ap, "variants", 4)
    ap.add_argument("--events", type=int, default=2_400_000)
    ap.add_argument("--dirty", type=float, default=0.0, help="also run each on a topic with this share of bad records")
    a = ap.parse_args(argv)
    variants = {name: normalized(v) for name, v in json.loads(a.variants).items()}
    if bad := [v for v in variants if not v.isidentifier()]:
        ap.error(f"variant names must be identifiers (they name databases): {bad}")
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="chsink-variants-") as tmp, Kafka(Path(tmp) / "kafka") as kafka:
        probe_topics(kafka, a.events, a.partitions, a.dirty)
        for rep in range(a.reps):
            for name in (list(variants) if rep % 2 == 0 else list(reversed(variants))):
                res = {"variant": name, "rep": rep,
                       **one(Path(tmp) / f"{name}_{rep}", kafka, "bench", a.events, a, variants[name])}
                if a.dirty:
                    res["dirty"] = one(Path(tmp) / f"{name}_{rep}_dirty", kafka, "bench-dirty", a.events, a,
                                       variants[name], dlq="bench-dlq")
                    res["ratio_dirty_clean"] = round(res["dirty"]["rows_per_s"] / res["rows_per_s"], 3)
                print(json.dumps(res), file=sys.stderr, flush=True)
                runs.append(res)
    medians = {name: _medians([r for r in runs if r["variant"] == name], bool(a.dirty)) for name in variants}
    return publish({"date": dt.date.today().isoformat(), "warm_up_s": a.warm_up, "events": a.events,
                    "partitions": a.partitions,
                    "dirty_share": a.dirty,
                    "max_offsets_per_trigger": a.batch, "block_offsets": a.block, "variants": variants,
                    "medians": medians, "runs": runs}, a.out, a.name)


if __name__ == "__main__":
    entry(main)
