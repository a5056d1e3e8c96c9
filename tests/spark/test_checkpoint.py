"""Pipelined runs start in a fresh checkpoint directory and clean only what Spark or chsink put there; a deleted
sink's checkpoint goes through Hadoop's FileSystem the same way as through the operator's own files."""

from __future__ import annotations

import os

from sparkapp.edges.checkpoint import delete_checkpoint
from sparkapp.spark.checkpoint import HadoopFiles
from sparkapp.spark.session import fresh_checkpoint
from tests.helpers import checkpoint_deletions


def test_fresh_checkpoint_removes_old_runs_and_spark_state_only(spark, tmp_path):
    base = tmp_path / "ckpt"
    for d in ("run-3", "offsets", "commits", "sources"):
        (base / d).mkdir(parents=True)
    (base / "metadata").write_text("{}")
    (base / "notes.txt").write_text("not ours")
    (base / "backup").mkdir()
    got = fresh_checkpoint(spark, str(base), 4)
    assert got == f"{base}/run-4"
    assert sorted(p.name for p in base.iterdir()) == ["backup", "notes.txt"]


def test_a_checkpoint_deleted_through_hadoop_loses_only_what_chsink_marked_and_wrote(spark, tmp_path):
    """The cleanup Job's path (HadoopFiles, as on s3a://), here on Hadoop's local file system: the same outcomes as
    the operator's pathlib deletion."""
    checkpoint_deletions(tmp_path, lambda location, sink: delete_checkpoint(HadoopFiles(spark, location), location,
                                                                            sink))


def test_the_cleanup_jobs_own_command_deletes_a_checkpoint(tmp_path):
    """The command line the operator's cleanup Job runs, as it renders it (its JVM heap included: Spark refuses
    to start under 450 MB), run here on a file: location: it deletes, and says so in its termination message."""
    import subprocess
    import sys

    import yaml

    from hack.testbed.process import REPO
    from sinkoperator.model import SinkSpec
    from sinkoperator.render import checkpoint_job

    location = tmp_path / "ckpt"
    (location / "run-4" / "offsets").mkdir(parents=True)
    (location / "_chsink_sink").write_text("default.orders")
    spec = yaml.safe_load((REPO / "tests" / "operator" / "sample.yaml").read_text())["spec"]
    spec["checkpointLocation"] = f"file://{location}"
    [container] = checkpoint_job("default", "orders", SinkSpec.parse(spec), "default.orders")["spec"]["template"][
        "spec"]["containers"]
    assert container["command"][:2] == ["python3", "/opt/chsink/main.py"]
    message = tmp_path / "termination-log"
    message.write_text("")
    res = subprocess.run([sys.executable, "-m", "sparkapp", *container["command"][2:]], cwd=REPO, capture_output=True,
                         text=True, timeout=180, env={**os.environ, "CHSINK_TERMINATION_LOG": str(message)})
    assert res.returncode == 0, res.stderr[-3000:]
    assert message.read_text() == f"deleted checkpoint file://{location}" and not location.exists()
