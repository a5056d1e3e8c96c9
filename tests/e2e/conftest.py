"""The two paths every e2e suite runs on: the embedded chdb written by the driver (the default), and
production's, a real ClickHouse server over HTTP with each partition written by an executor task."""

from __future__ import annotations

import pytest

from hack.testbed.servers import ClickHouseServer


@pytest.fixture(params=["embedded", "server"])
def ch_path(request: pytest.FixtureRequest) -> ClickHouseServer | None:
    """None on the embedded path; the session's ClickHouse server on the HTTP/executor path."""
    if request.param == "embedded":
        return None
    server: ClickHouseServer = request.getfixturevalue("clickhouse_server")
    return server
