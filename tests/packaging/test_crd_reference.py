"""docs/reference/crd.md is what `python -m hack.crdref` makes of the CRDs now: a description edited in a CRD
and not regenerated fails here."""

from __future__ import annotations

import shutil
import subprocess
import sys

from hack.testbed.process import REPO


def test_the_crd_reference_is_generated_from_the_crds_as_they_are():
    res = subprocess.run([sys.executable, "-m", "hack.crdref", "--check"], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_a_changed_description_makes_the_reference_stale(tmp_path):
    """The check reads the CRDs themselves: a copy of the repository's hack/, crds/ and docs/ with one description
    changed is reported stale, and regenerating it is fresh again."""
    for part in ("hack", "crds", "docs"):
        shutil.copytree(REPO / part, tmp_path / part)
    crd = tmp_path / "crds" / "chsink.io_clickhousesinks.yaml"
    crd.write_text(crd.read_text().replace("What to deliver where, and how the job runs.", "What goes where."))
    run = [sys.executable, "-m", "hack.crdref"]
    stale = subprocess.run([*run, "--check"], cwd=tmp_path, capture_output=True, text=True)
    assert stale.returncode == 1 and "docs/reference/crd.md is stale" in stale.stderr, stale.stderr
    subprocess.run(run, cwd=tmp_path, check=True)
    assert "What goes where." in (tmp_path / "docs" / "reference" / "crd.md").read_text()
    assert subprocess.run([*run, "--check"], cwd=tmp_path).returncode == 0
