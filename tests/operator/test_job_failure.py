"""A failed job's own words in `kubectl describe chs`, and no restart storm for an error only a change fixes.

This test bed's API server runs no kubelet and no spark-operator, so the test plays their parts where a node
would: the driver pod's status as the kubelet writes it (the container's exit code and termination message,
which `sparkapp` writes: tests/e2e/test_first_run.py) and the application's state."""

from __future__ import annotations

import datetime as dt
import json

import yaml

from .test_operator import app_of, condition, cr_status, report, wait_for

LINE = ("chsink: configuration error: spec.clickhouse.tables: table db.events_missing does not exist on "
        "http://ch-0:8123; create it or fix the name")


def failed_driver(s, code: int, message: str, finished: dt.datetime | None = None) -> str:
    """The driver pod after its container exited, as the kubelet reports it."""
    name = f"chsink-{s['name']}-driver"
    s["kube"].kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": {
            "sparkoperator.k8s.io/app-name": f"chsink-{s['name']}", "spark-role": "driver"}},
        "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "chsink.local/spark"}],
                 "volumes": [{"name": "cm", "configMap": {"name": f"chsink-{s['name']}"}}]}}))
    at = (finished or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    s["kube"].kubectl("patch", "pod", name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": {
        "phase": "Failed", "containerStatuses": [{
            "name": "spark-kubernetes-driver", "image": "chsink.local/spark", "imageID": "", "ready": False,
            "restartCount": 0, "state": {"terminated": {"exitCode": code, "reason": "Error", "message": message,
                                                        "startedAt": at, "finishedAt": at}}}]}}))
    return name


def warnings(s, reason: str) -> int:
    out = s["kube"].kubectl("get", "events", "-o", "json", "--field-selector",
                            f"involvedObject.name={s['name']},type=Warning,reason={reason}").stdout
    return len(json.loads(out)["items"])


def suspended(s) -> bool:
    return bool((app_of(s) or {}).get("spec", {}).get("suspend"))


def test_a_configuration_error_is_described_and_held_until_the_spec_changes(sink):
    s = sink
    s["apply"]()
    wait_for("app", lambda: app_of(s))
    report(s, "RUNNING")
    wait_for("Running", lambda: cr_status(s).get("state") == "Running")
    pod = failed_driver(s, 2, LINE)
    report(s, "FAILING", "driver container failed with ExitCode: 2, Reason: Error")
    cond = wait_for("JobConfigError", lambda: (c := condition(s, "Degraded")).get("reason") == "JobConfigError" and c)
    assert LINE in cond["message"] and pod in cond["message"] and "not resubmitted" in cond["message"], cond
    assert "chsink.io/restart-nonce" in cond["message"], cond
    assert cr_status(s)["state"] == "Failed" and condition(s, "Ready")["reason"] == "JobConfigError"
    wait_for("the application held (suspended), not resubmitted", lambda: suspended(s), timeout=15)
    failure = cr_status(s)["sparkApplication"]["lastFailure"]
    assert (failure["exitCode"], failure["message"], failure["pod"]) == (2, LINE, pod), failure
    describe = s["kube"].kubectl("describe", "chs", s["name"]).stdout
    assert LINE in describe and "JobConfigError" in describe, describe
    # the spark-operator deletes the driver pod once suspended: what it said stays in the status
    s["kube"].kubectl("delete", "pod", pod, "--grace-period=0", "--force")
    report(s, "SUSPENDED")
    # a tick reads Kafka's watermarks (bounded at 15 s) and the store: under CI's load one tick took longer than
    # the 15 s this waited (CI of 5788bef), so it waits for a few slow ticks, not two quick ones
    wait_for("the next ticks", lambda: cr_status(s)["sparkApplication"].get("state") == "SUSPENDED", timeout=60)
    wait_for("still held", lambda: suspended(s) and condition(s, "Degraded").get("reason") == "JobConfigError",
             timeout=10)
    assert warnings(s, "JobConfigError") == 1
    # a change (here the restart nonce) is a new attempt: resubmitted at once
    s["kube"].kubectl("annotate", "clickhousesink", s["name"], "chsink.io/restart-nonce=fixed-the-table")
    wait_for("released", lambda: not suspended(s), timeout=15)
    report(s, "RUNNING")
    wait_for("Ready", lambda: condition(s, "Ready").get("status") == "True", timeout=30)
    assert warnings(s, "JobConfigError") == 1


def test_an_error_a_retry_can_fix_is_resubmitted_and_says_what_the_job_said(sink):
    s = sink
    s["apply"]()
    wait_for("app", lambda: app_of(s))
    line = "chsink: unavailable: ClickHouse http://ch-0:8123 refused the connection"
    failed_driver(s, 6, line)
    report(s, "FAILING", "driver container failed with ExitCode: 6, Reason: Error")
    cond = wait_for("JobFailed", lambda: (c := condition(s, "Degraded")).get("reason") == "JobFailed" and c)
    assert f"the job said: {line}" in cond["message"] and "resubmitted" in cond["message"], cond
    assert not suspended(s)
    assert cr_status(s)["sparkApplication"]["lastFailure"]["exitCode"] == 6


def test_a_held_job_is_tried_again_after_the_retry_interval(sink):
    """For a fix made outside Kubernetes (the table created): held for CHSINK_JOB_RETRY_SECONDS (300) after the
    driver stopped, then resubmitted. This failure is 290 s old, so the hold ends 10 s later."""
    s = sink
    s["apply"]()
    wait_for("app", lambda: app_of(s))
    failed_driver(s, 2, LINE, finished=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=290))
    report(s, "FAILING", "driver container failed with ExitCode: 2, Reason: Error")
    wait_for("held", lambda: suspended(s), timeout=10)
    wait_for("tried again", lambda: not suspended(s), timeout=30)
