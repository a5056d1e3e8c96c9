from __future__ import annotations

from pathlib import Path

import pytest

from hack.testbed.process import cached, versions


@pytest.fixture(scope="session")
def promtool() -> Path:
    """promtool built from the Prometheus module (hack/provision.sh promtool), at the end of the background build."""
    return cached(f"promtool-{versions()['PROMETHEUS_VERSION']}") / "bin" / "promtool"
