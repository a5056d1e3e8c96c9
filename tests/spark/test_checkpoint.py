"""Pipelined runs start in a fresh checkpoint directory and clean only what Spark or chsink put there."""

from __future__ import annotations

from sparkapp.spark.session import fresh_checkpoint


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
