"""The Dockerfile is hadolint-clean and keeps its two targets and the job's entry file."""

import subprocess
import sys
from pathlib import Path

from hack.testbed.process import REPO


def test_dockerfile_is_hadolint_clean():
    hadolint = Path(sys.executable).parent / "hadolint"
    res = subprocess.run([str(hadolint), str(REPO / "Dockerfile")], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_dockerfile_targets_and_entry_file():
    text = (REPO / "Dockerfile").read_text()
    assert "AS operator" in text and "AS sparkapp" in text
    assert "/opt/chsink/main.py" in text and "spark-sql-kafka-0-10_2.13:4.0.0" in text
