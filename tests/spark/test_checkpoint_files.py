"""The streaming checkpoint on the local file system without a process per file: Hadoop's FileContext (Spark's
default checkpoint manager) starts `readlink` for each file it looks at and `chmod` for each it writes, all
forked from the driver JVM, when Hadoop's native library is absent (as in Spark's distribution). The job writes
a local checkpoint through the FileSystem API instead; other file systems, and a manager the user's sparkConf
names, keep their choice. The processes are counted by putting logging wrappers of those commands first on the
driver's PATH, which is where the JVM looks them up."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hack.testbed.process import REPO
from sparkapp.config import SinkConfig, is_local_path
from sparkapp.spark.session import CHECKPOINT_FILE_MANAGER, FILE_SYSTEM_CHECKPOINTS, session_conf
from tests.helpers import sink_config

# the commands Hadoop's Shell runs on local files
_COMMANDS = ("chmod", "chown", "readlink", "stat", "ls", "ln")
_BATCHES = 20

_PROBE = """
import json, sys, time
from sparkapp.config import SinkConfig
from sparkapp.spark.session import build_session, session_conf
cfg = SinkConfig.model_validate(json.loads(sys.argv[1]))
checkpoint, log, batches = cfg.checkpoint_location, sys.argv[2], int(sys.argv[3])
spark = build_session(cfg, session_conf(cfg))
q = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
     .writeStream.foreachBatch(lambda df, i: None).option("checkpointLocation", checkpoint).start())

def at(batch):
    while not q.lastProgress or q.lastProgress["batchId"] < batch:
        time.sleep(0.01)
    return q.lastProgress["batchId"], sum(1 for _ in open(log))

b0, n0 = at(3)  # past the first batches' one-off files (metadata, sources)
b1, n1 = at(b0 + batches)  # each count may hold a batch's processes more or fewer: a bound, not an exact count
q.stop()
spark.stop()
print("SPAWNS " + json.dumps({"batches": b1 - b0, "spawns": n1 - n0}))
"""


def _spawns_per_batch(tmp: Path, checkpoint: str) -> float:
    bin_dir, log = tmp / "bin", tmp / "spawns.log"
    bin_dir.mkdir()
    log.write_text("")
    for name in _COMMANDS:
        real = shutil.which(name)
        assert real, name
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    res = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(sink_config(checkpoint)), str(log), str(_BATCHES)], cwd=REPO, capture_output=True,
                         text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(next(x for x in res.stdout.splitlines() if x.startswith("SPAWNS "))[len("SPAWNS "):])
    assert out["batches"] >= _BATCHES, out
    return float(out["spawns"]) / out["batches"]


def test_a_local_checkpoint_starts_about_4_processes_per_batch(tmp_path: Path) -> None:
    # 4: a chmod for each of the two files written and their checksums. Spark's default starts about 19: a
    # readlink for every file looked at, a chmod for every file written
    per_batch = _spawns_per_batch(tmp_path, str(tmp_path / "checkpoint"))
    assert per_batch <= 5, per_batch


def _conf(checkpoint: str, spark_conf: dict[str, str] | None = None) -> dict[str, str]:
    return session_conf(SinkConfig.model_validate(sink_config(checkpoint, spark_conf)))


@pytest.mark.parametrize(("location", "default_fs", "local"), [
    ("/data/ckpt", "file:///", True), ("file:///data/ckpt", "file:///", True), ("FILE:/data/ckpt", "", True),
    ("relative/ckpt", "file:///", True), ("/data/ckpt", "", True), ("/data/ckpt", "hdfs://nn:8020", False),
    ("s3a://bucket/ckpt", "file:///", False), ("hdfs://nn/ckpt", "file:///", False),
    ("file:/data/ckpt", "hdfs://nn:8020", True)])
def test_which_checkpoints_are_local(location: str, default_fs: str, local: bool) -> None:
    assert is_local_path(location, default_fs) is local


def test_only_a_local_checkpoint_gets_the_file_system_manager_and_the_users_choice_wins() -> None:
    assert _conf("/data/ckpt")[CHECKPOINT_FILE_MANAGER] == FILE_SYSTEM_CHECKPOINTS
    assert CHECKPOINT_FILE_MANAGER not in _conf("s3a://bucket/ckpt")
    assert CHECKPOINT_FILE_MANAGER not in _conf("/data/ckpt", {"spark.hadoop.fs.defaultFS": "hdfs://nn:8020"})
    own = "org.apache.spark.sql.execution.streaming.FileContextBasedCheckpointFileManager"
    assert _conf("/data/ckpt", {CHECKPOINT_FILE_MANAGER: own})[CHECKPOINT_FILE_MANAGER] == own
