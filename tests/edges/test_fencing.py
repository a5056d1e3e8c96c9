"""Two writers in separate processes on the same partitions, state in the real ZooKeeper: the older is fenced."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

from hack.testbed.process import REPO


def test_stale_writer_is_fenced_and_no_offset_is_duplicated(tmp_path, zookeeper):
    signals = tmp_path / "signals"
    signals.mkdir()
    keeper_path = f"/fence_{tmp_path.name}"
    procs = {
        role: subprocess.Popen(
            [
                sys.executable, "-m", "tests.edges.fence_worker", role, str(tmp_path / f"chdb-{role}"),
                str(zookeeper.clickhouse_config(tmp_path / f"config-{role}.xml")), keeper_path, str(signals)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for role in ("stale", "fresh")
    }
    reports = {}
    for role, p in procs.items():
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"{role} writer failed:\n{err[-3000:]}"
        reports[role] = json.loads(out.strip().splitlines()[-1])

    stale, fresh = reports["stale"], reports["fresh"]
    assert fresh["epoch"] > stale["epoch"]
    assert fresh["fenced"] == []
    # the stale writer was stopped on both partitions: once it saw the takeover, and on the partition
    # it had not touched yet because the sink's epoch had moved on
    assert len(stale["fenced"]) == 2 and all("stale" in f or "lost to epoch" in f for f in stale["fenced"])
    assert stale["rows"] == []  # it inserted nothing after being overtaken
    union = Counter(tuple(r) for r in stale["rows"] + fresh["rows"])
    assert set(union) == {(p, o) for p in (0, 1) for o in range(200)}
    assert max(union.values()) == 1
