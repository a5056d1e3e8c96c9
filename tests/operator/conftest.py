"""Our CRDs installed on the real API server, and the operator running in-process (KopfRunner)."""

from __future__ import annotations

import os

import pytest

from tests.testbed.process import REPO


@pytest.fixture(scope="session")
def chsink_crds(kube):
    for f in sorted((REPO / "crds").glob("*.yaml")):
        kube.kubectl("apply", "--server-side", "-f", str(f))
    kube.api.wait_crd("clickhousesinks.chsink.io")
    kube.api.wait_crd("sinkstatuses.chsink.io")
    return kube


@pytest.fixture(scope="module")
def operator(chsink_crds, ch_factory):
    from kopf.testing import KopfRunner

    ch_factory()  # the session's chdb engine (with the ZooKeeper config) exists before the operator uses it
    old = {k: os.environ.get(k) for k in ("KUBECONFIG", "CHSINK_STATUS_INTERVAL")}
    os.environ["KUBECONFIG"] = str(chsink_crds.kubeconfig)
    os.environ["CHSINK_STATUS_INTERVAL"] = "2"
    with KopfRunner(["run", "--standalone", "--namespace=default", "-m", "sinkoperator.handlers"],
                    timeout=120) as runner:
        yield chsink_crds
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    assert runner.exception is None or isinstance(runner.exception, SystemExit), runner.output[-3000:]
