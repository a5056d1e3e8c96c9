"""Our CRDs installed on the real API server, and the operator running in-process (KopfRunner)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.testbed.process import REPO


@pytest.fixture(scope="session")
def chsink_crds(kube):
    for f in sorted((REPO / "crds").glob("*.yaml")):
        kube.kubectl("apply", "--server-side", "-f", str(f))
    kube.api.wait_crd("clickhousesinks.chsink.io")
    kube.api.wait_crd("sinkstatuses.chsink.io")
    return kube


@contextlib.contextmanager
def kopf_runner(kubeconfig: Path, namespace: str) -> Iterator[Any]:
    """The operator in-process (KopfRunner) against a kubeconfig, scoped to one namespace."""
    from kopf.testing import KopfRunner

    old = {k: os.environ.get(k) for k in ("KUBECONFIG", "CHSINK_STATUS_INTERVAL")}
    os.environ.update(KUBECONFIG=str(kubeconfig), CHSINK_STATUS_INTERVAL="2")
    try:
        with KopfRunner(["run", "--standalone", f"--namespace={namespace}", "-m", "sinkoperator.handlers"],
                        timeout=120) as runner:
            yield runner
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert runner.exception is None or isinstance(runner.exception, SystemExit), runner.output[-3000:]


@pytest.fixture(scope="module")
def operator(chsink_crds, ch_factory):
    ch_factory()  # the session's chdb engine (with the ZooKeeper config) exists before the operator uses it
    with kopf_runner(chsink_crds.kubeconfig, "default"):
        yield chsink_crds
