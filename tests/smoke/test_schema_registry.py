"""The test bed's schema registry listens on free ports only: `make test`'s two workers each start one."""

from __future__ import annotations

import urllib.request

from hack.testbed.servers import SchemaRegistry


def test_two_registries_run_side_by_side(tmp_path):
    with SchemaRegistry(tmp_path / "a") as a, SchemaRegistry(tmp_path / "b") as b:
        assert isinstance(a, SchemaRegistry) and isinstance(b, SchemaRegistry)
        for reg in (a, b):
            with urllib.request.urlopen(f"{reg.url}/subjects", timeout=5) as r:
                assert r.status == 200
