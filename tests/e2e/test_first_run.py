"""A newcomer's first run: the job finds Spark's Kafka connector itself or says in one line what is missing,
and the demo shows each run's work as it happens."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from hack.testbed.process import REPO


def test_job_without_the_kafka_connector_exits_2_with_one_line_saying_how_to_get_it(tmp_path: Path) -> None:
    """The line also goes to the container's termination message, where `kubectl describe chs` gets it."""
    cfg = tmp_path / "sink.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "first", "kafka": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"]},
        "clickhouse": {"endpoints": [f"chdb://{tmp_path / 'chdb'}"], "tables": {"t": "t"}},
        "checkpointLocation": str(tmp_path / "ckpt")}))
    env = {k: v for k, v in os.environ.items() if k not in ("CHSINK_SPARK_JARS", "SPARK_HOME")}
    env["CHSINK_CACHE"] = str(tmp_path / "empty-cache")
    termination = tmp_path / "termination-log"  # as the kubelet makes it: there, empty
    termination.touch()
    env["CHSINK_TERMINATION_LOG"] = str(termination)
    res = subprocess.run([sys.executable, "-m", "sparkapp", "run", "--config", str(cfg)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    lines = [line for line in res.stderr.splitlines() if line.strip() and " INFO " not in line]
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(lines) == 1, lines
    assert "Kafka connector" in lines[0] and "make setup" in lines[0] and "spark.jars.packages" in lines[0]
    assert termination.read_text() == lines[0]


def test_demo_shows_each_runs_batches_and_what_was_delivered_before_each_kill() -> None:
    res = subprocess.run([sys.executable, "-m", "hack.demo", "--events", "60000", "--partitions", "2",
                          "--batch", "6000"], cwd=REPO, capture_output=True, text=True, timeout=600)
    out = res.stdout
    assert res.returncode == 0, out[-3000:] + res.stderr[-3000:]
    for run in (1, 2, 3):
        assert re.search(rf"run {run}, batch \d+: [\d,]+ records from \d+ partitions .* rows/s", out), out
    kills = re.findall(r"SIGKILL #(\d) mid-stream \(run (\d) had delivered (\d+) batch\(es\), ([\d,]+) records\)", out)
    assert [(k, r) for k, r, _, _ in kills] == [("1", "1"), ("2", "2")], out
    assert all(int(b) > 0 and int(n.replace(",", "")) > 0 for _, _, b, n in kills), out
    assert "exactly once: OK" in out
