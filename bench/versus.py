"""chsink over HTTP, exactly-once ((e) of `python -m bench`), alternated run for run with each peer on one topic,
every run on a ClickHouse server of its own.

`python -m bench` runs each peer once, after its rounds, so its ratios against a peer rest on one run of the peer.
Here every rep runs (e) and each peer back to back, the order reversed every other rep, and gives each rep's ratio
of (e) to each peer and each run's CPU per row without the broker: chsink's processes and the server, against the
peer's and the server. A peer that is not built (hack/peers.sh) is recorded as unavailable and left out."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from hack.testbed import Kafka
from hack.testbed.servers import ZooKeeper

from . import entry, peers, probe_options, publish
from .__main__ import PEERS, own_server, run_job, run_peer
from .data import probe_topics


def cpu_us_per_row(key: str, r: dict[str, Any]) -> float:
    """A run's CPU per row in µs without the broker's: (e)'s processes and the server, or the peer's and the server.
    """
    cores = r["cpu_cores_used"]
    used = cores["total"] + cores["clickhouse_server"] if key == "e" else cores["peer"] + cores["clickhouse_server"]
    return float(used) / float(r["rows_per_s"]) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.versus", description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", default=",".join(PEERS), help=f"of {', '.join(f'{k}: {v}' for k, v in PEERS.items())}")
    ap.add_argument("--events", type=int, default=2_400_000)
    probe_options(ap, "versus", 3)
    a = ap.parse_args(argv)
    asked = a.peers.split(",")
    if not asked or set(asked) - set(PEERS) or len(set(asked)) != len(asked):
        ap.error(f"--peers: each of {', '.join(PEERS)} at most once")
    unavailable: dict[str, str] = {}
    for key in asked:
        try:
            peers.require(key)
        except peers.PeerMissingError as e:
            unavailable[key] = str(e)
    keys = ["e", *(k for k in asked if k not in unavailable)]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="chsink-versus-") as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        kafka = stack.enter_context(Kafka(root / "kafka"))
        zookeeper = stack.enter_context(ZooKeeper(root / "zookeeper"))  # the Kafka Connect sink's KeeperMap
        probe_topics(kafka, a.events, a.partitions, 0.0)
        for rep in range(a.reps):
            for key in (keys if rep % 2 == 0 else keys[::-1]):
                work = root / f"{key}{rep}"
                with own_server(work, zookeeper) as server:
                    if key == "e":
                        r = run_job(work, kafka, "bench", a.events, a.batch, True, a.block, server=server,
                                    warm_s=a.warm_up)
                    else:
                        r = run_peer(key, work, kafka, "bench", a.events, server, a.warm_up)
                res = {"key": key, "rep": rep, "rows_per_s": round(r["rows_per_s"]),
                       "cpu_us_per_row": round(cpu_us_per_row(key, r), 2),
                       "clickhouse_server_pid": r["clickhouse_server_pid"],
                       **({"duplicates": r["duplicates"]} if key != "e" else {})}
                print(json.dumps(res), file=sys.stderr, flush=True)
                runs.append(res)
    rate = {(r["key"], r["rep"]): r["rows_per_s"] for r in runs}
    return publish({"date": dt.date.today().isoformat(), "warm_up_s": a.warm_up, "events": a.events,
                    "partitions": a.partitions, "max_offsets_per_trigger": a.batch, "block_offsets": a.block,
                    "peers": {k: PEERS[k] for k in keys[1:]}, "unavailable": unavailable,
                    "medians": {k: statistics.median(rate[(k, rep)] for rep in range(a.reps)) for k in keys},
                    "cpu_us_per_row_medians": {k: statistics.median(r["cpu_us_per_row"] for r in runs
                                                                    if r["key"] == k) for k in keys},
                    "ratios_e_to": {k: [round(rate[("e", rep)] / rate[(k, rep)], 3) for rep in range(a.reps)]
                                    for k in keys[1:]},
                    "runs": runs}, a.out, a.name)


if __name__ == "__main__":
    entry(main)
