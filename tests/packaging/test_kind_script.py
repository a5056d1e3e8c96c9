"""The kind end-to-end script cannot run here (no Docker engine); what can be checked is: it parses,
and its manifests (Kafka, ClickHouse with Keeper, the sink) are accepted by the real API server."""

from __future__ import annotations

import shutil
import subprocess

from hack.testbed.process import REPO

KIND = REPO / "tests" / "e2e" / "kind"


def test_script_parses_and_fails_clearly_without_its_tools(tmp_path):
    subprocess.run(["bash", "-n", str(KIND / "run.sh")], check=True)
    for tool in ("dirname", "grep", "cut", "tr"):  # coreutils only: no docker, kind, kubectl or helm
        (tmp_path / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    res = subprocess.run([shutil.which("bash") or "/bin/bash", str(KIND / "run.sh")], capture_output=True,
                         text=True, env={"PATH": str(tmp_path)}, timeout=30)
    assert res.returncode == 2 and "is required" in res.stderr


def test_manifests_pass_server_side_dry_run(kube):
    kube.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    kube.api.wait_crd("clickhousesinks.chsink.io")
    kube.kubectl("create", "namespace", "data", check=False)
    for f in ("infra.yaml", "sink.yaml"):
        res = kube.kubectl("apply", "--dry-run=server", "-f", str(KIND / f))
        assert "(server dry run)" in res.stdout
