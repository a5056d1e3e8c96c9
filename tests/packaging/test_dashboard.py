"""The Grafana dashboards: installed as ConfigMaps for Grafana's sidecar, every per-sink panel filtered by sink,
every query valid PromQL (parsed by promtool) that names only metrics the job or the operator registers."""

from __future__ import annotations

import json
import re
import subprocess

import yaml
from prometheus_client import REGISTRY

import sinkoperator.metrics  # noqa: F401  (registers the operator's metrics)
import sparkapp.metrics  # noqa: F401  (registers the job's metrics)
from hack.testbed.process import REPO

from .test_chart import template

DASHBOARDS = REPO / "charts" / "chsink" / "dashboards"
SINK_DASHBOARD = DASHBOARDS / "chsink.json"


def exposed_names() -> set[str]:
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names = set()
    for metric in REGISTRY.collect():
        if metric.name.startswith("chsink_"):
            names |= {metric.name + sfx for sfx in suffixes.get(metric.type, ("",))}
    return names


def exprs(path) -> list[str]:
    return [t["expr"] for p in json.loads(path.read_text())["panels"] for t in p["targets"]]


def test_every_query_names_an_existing_metric_and_every_job_and_sink_metric_is_on_a_dashboard():
    every = [e for path in sorted(DASHBOARDS.glob("*.json")) for e in exprs(path)]
    assert len(every) >= 20
    known = exposed_names()
    for e in every:
        used = set(re.findall(r"\bchsink_[a-z_]+", e))
        assert used, f"query names no chsink metric: {e}"
        assert used <= known, f"unknown metric(s) {used - known} in {e}"
    from sinkoperator.metrics import _PER_SINK
    from sparkapp.metrics import NAMES

    on_board = {n for e in every for n in re.findall(r"\bchsink_[a-z_]+", e)}
    per_sink = {m._name for m in _PER_SINK}
    assert all(any(u.startswith(n) for u in on_board) for n in (*NAMES, *per_sink)), on_board


def test_every_panel_of_the_sink_dashboard_is_filtered_by_sink():
    for e in exprs(SINK_DASHBOARD):
        for selector in re.findall(r"\bchsink_[a-z_]+(\{[^}]*\})?", e):
            assert 'sink=~"$sink"' in selector, f"not filtered by sink: {e}"


def test_every_query_is_valid_promql(promtool, tmp_path):
    """Each query as Grafana sends it (the variable given a value), parsed by promtool as a recording rule."""
    rules = [{"record": f"chsink_dashboard_query_{i}", "expr": e.replace("$sink", "data.events")}
             for i, e in enumerate(e for path in sorted(DASHBOARDS.glob("*.json")) for e in exprs(path))]
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    res = subprocess.run([str(promtool), "check", "rules", "queries.yaml"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rules)} rules found" in res.stdout + res.stderr, res.stdout + res.stderr


def test_the_dashboards_are_configmaps_for_grafanas_sidecar_when_asked():
    assert not [d for d in template("t") if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]]
    cms = [d for d in template("t", sets=("metrics.dashboards.enabled=true",))
           if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]]
    assert sorted(next(iter(c["data"])) for c in cms) == sorted(p.name for p in DASHBOARDS.glob("*.json"))
    for c in cms:
        assert c["metadata"]["labels"]["grafana_dashboard"] == "1"
        [(name, text)] = c["data"].items()
        assert json.loads(text) == json.loads((DASHBOARDS / name).read_text())
