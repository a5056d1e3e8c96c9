"""The chart's PrometheusRule: valid rules, and every alert unit-tested with `promtool test rules`
(alerts_test.yaml), on the rules exactly as the chart renders them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from .test_chart import template

HERE = Path(__file__).parent


def rendered_rules(*sets: str) -> dict:
    [rule] = [d for d in template("t", sets=("metrics.prometheusRule.enabled=true", *sets))
              if d["kind"] == "PrometheusRule"]
    return rule


def test_every_alert_passes_its_promtool_unit_test(promtool, tmp_path):
    rule = rendered_rules()
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    shutil.copy(HERE / "alerts_test.yaml", tmp_path / "alerts_test.yaml")
    check = subprocess.run([str(promtool), "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    res = subprocess.run([str(promtool), "test", "rules", "alerts_test.yaml"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    tested = set(re.findall(r"alertname: (\w+)", (HERE / "alerts_test.yaml").read_text()))
    assert alerts == tested, f"alerts without a unit test: {alerts - tested}"
    assert len(alerts) >= 9


def test_the_rule_is_opt_in_and_takes_its_thresholds_and_labels_from_values():
    assert not [d for d in template("t") if d["kind"] == "PrometheusRule"]
    rule = rendered_rules("metrics.prometheusRule.minLag=50", "metrics.prometheusRule.lagGrowingFor=30m",
                          "metrics.prometheusRule.labels.release=kube-prometheus-stack",
                          "metrics.prometheusRule.anomalySeverity=page")
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert rules["ChsinkLagGrowing"]["for"] == "30m" and "> 50 " in rules["ChsinkLagGrowing"]["expr"]
    assert rules["ChsinkVerifyAnomaly"]["labels"]["severity"] == "page"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
