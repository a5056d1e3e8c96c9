"""The Grafana dashboard only queries metrics that the job or the operator really registers."""

from __future__ import annotations

import json
import re

from prometheus_client import REGISTRY

import sinkoperator.metrics  # noqa: F401  (registers the operator's metrics)
import sparkapp.metrics  # noqa: F401  (registers the job's metrics)
from hack.testbed.process import REPO

DASHBOARD = REPO / "charts" / "chsink" / "dashboards" / "chsink.json"


def exposed_names() -> set[str]:
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names = set()
    for metric in REGISTRY.collect():
        if metric.name.startswith("chsink_"):
            names |= {metric.name + sfx for sfx in suffixes.get(metric.type, ("",))}
    return names


def test_every_dashboard_query_names_an_existing_metric():
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    known = exposed_names()
    for e in exprs:
        used = set(re.findall(r"\bchsink_[a-z_]+", e))
        assert used, f"query names no chsink metric: {e}"
        assert used <= known, f"unknown metric(s) {used - known} in {e}"
    # and every job metric is on the dashboard
    from sparkapp.metrics import NAMES

    on_board = {n for e in exprs for n in re.findall(r"\bchsink_[a-z_]+", e)}
    assert all(any(u.startswith(n) for u in on_board) for n in NAMES), NAMES
