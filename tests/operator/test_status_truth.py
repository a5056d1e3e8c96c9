"""What `kubectl` shows is true, on the real API server: Ready follows the SparkApplication, outages are retried
(never Invalid), every failure is a condition and one Event, a fixed spec is taken at once, a stopped sink still
reports its lag. The spark-operator's part (the application's state) is written as it would write it."""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from typing import Any

import clickhouse_connect
import pytest
import yaml
from confluent_kafka import Producer

from hack.testbed.proxy import TcpRelay
from tests.helpers import events_oldest_first

from .test_operator import app_of, condition, cr_status, get, report, wait_for

_seq = itertools.count()


def show(s, title: str) -> None:
    """kubectl get and describe, for the closing note (KopfRunner swaps sys.stdout)."""
    k = s["kube"].kubectl
    desc = k("describe", "chs", s["name"]).stdout
    print(f"\n--- {title}\n{k('get', 'chs', s['name']).stdout}{desc[desc.find('Status:'):]}", file=sys.__stdout__)


def warnings(s, reason: str) -> int:
    """How many times a Warning with this reason was posted for the sink (Events' counts included)."""
    out = s["kube"].kubectl("get", "events", "-o", "json", "--field-selector",
                            f"involvedObject.name={s['name']},type=Warning,reason={reason}").stdout
    return sum(int(e.get("count") or 1) for e in json.loads(out)["items"])


@pytest.fixture
def hsink(operator, kafka, topic, clickhouse_server, tmp_path):
    """A sink on the real ClickHouse server, reached through a relay that a test can cut."""
    relay = TcpRelay(clickhouse_server.http_port).up()
    db = f"truth_{next(_seq)}_{os.getpid()}"
    client = clickhouse_connect.get_client(dsn=clickhouse_server.dsn)
    client.command(f"CREATE DATABASE IF NOT EXISTS {db}")
    client.command(f"CREATE TABLE {db}.events (id UInt64) ENGINE = MergeTree ORDER BY id")
    name, src = f"truth{next(_seq)}", topic(1)

    def apply(**spec: Any) -> None:
        ch = {"shards": [{"endpoint": f"http://127.0.0.1:{relay.port}"}], "database": db, "tables": {"*": "events"}}
        cr = {"apiVersion": "chsink.io/v1alpha1", "kind": "ClickHouseSink",
              "metadata": {"name": name, "namespace": "default"},
              "spec": {"kafka": {"bootstrapServers": kafka.bootstrap, "topics": [src]}, "clickhouse": ch,
                       "exactlyOnce": {"engine": "KeeperMap", "keeperPath": f"/{db}"},
                       "checkpointLocation": str(tmp_path / "ckpt"), **spec}}
        operator.kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))

    s = {"name": name, "kube": operator, "apply": apply, "relay": relay, "topic": src, "db": db}
    yield s
    relay.resume()
    if not relay.is_up:
        relay.up()
    operator.kubectl("delete", "clickhousesink", name, "--ignore-not-found", "--wait=true", "--timeout=90s",
                     check=False)
    relay.down()


def test_ready_follows_the_job_and_kubectl_wait_works(hsink):
    s = hsink
    s["apply"]()
    wait_for("Deploying", lambda: cr_status(s).get("state") == "Deploying")
    assert condition(s, "Ready")["status"] == "False" and condition(s, "Progressing")["status"] == "True"
    report(s, "RUNNING")
    res = s["kube"].kubectl("wait", "--for=condition=Ready", f"chs/{s['name']}", "--timeout=30s", check=False)
    assert res.returncode == 0, res.stderr
    show(s, "job RUNNING")
    report(s, "FAILED", "driver container failed with ExitCode: 2, Reason: Error")
    wait_for("Failed", lambda: cr_status(s).get("state") == "Failed")
    ready, degraded = condition(s, "Ready"), condition(s, "Degraded")
    assert (ready["status"], ready["reason"]) == ("False", "JobFailed")
    assert degraded["status"] == "True" and "ExitCode: 2" in degraded["message"]
    assert s["kube"].kubectl("wait", "--for=condition=Ready", f"chs/{s['name']}", "--timeout=2s",
                             check=False).returncode != 0
    line = s["kube"].kubectl("get", "chs", s["name"], "--no-headers").stdout.split()
    assert line[1:4] == ["False", "Failed", "FAILED"]
    wait_for("a JobFailed Warning", lambda: warnings(s, "JobFailed") == 1)
    show(s, "job FAILED (before)")
    report(s, "RUNNING")
    wait_for("Ready again", lambda: condition(s, "Ready").get("status") == "True")
    show(s, "job RUNNING again (after)")
    assert warnings(s, "JobFailed") == 1


def test_a_lost_executor_is_one_warning_and_the_sink_stays_ready(hsink):
    s = hsink
    s["apply"]()
    wait_for("Deploying", lambda: cr_status(s).get("state") == "Deploying")
    report(s, "RUNNING", executors={"app-exec-1": "RUNNING"})
    wait_for("Ready", lambda: condition(s, "Ready").get("status") == "True")
    assert cr_status(s)["sparkApplication"]["executors"] == 1
    report(s, "RUNNING", executors={"app-exec-1": "UNKNOWN", "app-exec-2": "RUNNING"})  # deleted, replaced
    wait_for("an ExecutorLost Warning", lambda: warnings(s, "ExecutorLost") == 1)
    app = cr_status(s)["sparkApplication"]
    assert app["lostExecutors"] == ["app-exec-1"] and app["executors"] == 1
    assert condition(s, "Ready")["status"] == "True"  # Spark replaced it: nothing is degraded
    time.sleep(5)  # later status ticks see the same lost executor: no second Warning
    assert warnings(s, "ExecutorLost") == 1


def test_a_clickhouse_outage_during_a_spec_change_is_retried_never_invalid(hsink):
    s = hsink
    s["apply"]()
    wait_for("app", lambda: app_of(s))
    report(s, "RUNNING")
    wait_for("Ready", lambda: condition(s, "Ready").get("status") == "True")
    s["relay"].down()
    second = {"endpoint": f"http://127.0.0.1:{s['relay'].port}", "database": f"{s['db']}_b"}
    s["apply"](clickhouse={"shards": [{"endpoint": f"http://127.0.0.1:{s['relay'].port}"}, second],
                           "database": s["db"], "tables": {"*": "events"}})  # a rebalance: needs the store
    cond = wait_for("Degraded", lambda: (c := condition(s, "Degraded")).get("status") == "True" and c)
    assert cond["reason"] == "ClickHouseUnavailable" and "spec.clickhouse" in cond["message"]
    time.sleep(25)  # two retries or more, and ticks
    assert cr_status(s)["state"] != "Invalid" and condition(s, "Ready")["status"] == "False"
    assert warnings(s, "ClickHouseUnavailable") == 1, "one Warning for a lasting problem, not one per retry"
    show(s, "ClickHouse unreachable during a spec change (before)")
    s["relay"].up()
    t0 = time.monotonic()
    wait_for("the plan once ClickHouse answers", lambda: cr_status(s).get("rebalance"), timeout=30)
    wait_for("not degraded", lambda: condition(s, "Degraded").get("status") == "False", timeout=30)
    assert time.monotonic() - t0 < 30
    show(s, "ClickHouse back (after)")
    # every Event of the sink through the outage, kopf's own included: one Warning, one Normal on recovery,
    # and no per-retry ("Handler 'reconcile' failed temporarily") or per-success ("Handler succeeded") ones
    seen = all_events(s)
    assert [e for e in seen if e[0] == "Warning"] == [("Warning", "ClickHouseUnavailable", 1)], seen
    assert ("Normal", "Recovered", 1) in seen and not [e for e in seen if e[1] == "Logging"], seen


def all_events(s) -> list[tuple[str, str, int]]:
    """(type, reason, count) of every Event posted for the sink, oldest first."""
    out = s["kube"].kubectl("get", "events", "-o", "json", "--field-selector", f"involvedObject.name={s['name']}").stdout
    return [(e["type"], e["reason"], int(e.get("count") or 1)) for e in events_oldest_first(json.loads(out)["items"])]


def test_a_clickhouse_that_hangs_holds_the_sink_for_seconds_not_its_request_timeout(hsink):
    """A server that accepts and never answers (no reset): the operator's own calls give up long before the
    sink's requestTimeoutSeconds (meant for large inserts), so the sink says so and takes a fix at once."""
    s = hsink
    s["apply"](clickhouse={"shards": [{"endpoint": f"http://127.0.0.1:{s['relay'].port}"}], "database": s["db"],
                           "tables": {"*": "events"}, "requestTimeoutSeconds": 600})
    wait_for("app", lambda: app_of(s))
    report(s, "RUNNING")
    wait_for("Ready", lambda: condition(s, "Ready").get("status") == "True")
    s["relay"].hang()
    t0 = time.monotonic()
    second = {"endpoint": f"http://127.0.0.1:{s['relay'].port}", "database": f"{s['db']}_b"}
    s["apply"](clickhouse={"shards": [{"endpoint": f"http://127.0.0.1:{s['relay'].port}"}, second],
                           "database": s["db"], "tables": {"*": "events"}, "requestTimeoutSeconds": 600})
    cond = wait_for("Degraded", lambda: (c := condition(s, "Degraded")).get("status") == "True" and c, timeout=90)
    assert cond["reason"] == "ClickHouseUnavailable" and "spec.clickhouse" in cond["message"], cond
    assert time.monotonic() - t0 < 60, "held for the request timeout"
    assert condition(s, "Ready")["status"] == "False"
    show(s, "ClickHouse hangs without a reset (before)")
    s["relay"].resume()
    wait_for("the plan once ClickHouse answers", lambda: cr_status(s).get("rebalance"), timeout=60)
    wait_for("not degraded", lambda: condition(s, "Degraded").get("status") == "False", timeout=60)
    show(s, "ClickHouse answers again (after)")


def test_a_host_that_does_not_resolve_is_never_ready(hsink):
    s = hsink
    s["apply"](clickhouse={"shards": [{"endpoint": "http://chsink-no-such-host.invalid:8123"}],
                           "database": s["db"], "tables": {"*": "events"}})
    wait_for("app", lambda: app_of(s))
    report(s, "RUNNING")  # even with the job running, the operator cannot see it deliver anything
    cond = wait_for("Degraded", lambda: (c := condition(s, "Degraded")).get("status") == "True" and c)
    assert cond["reason"] == "ClickHouseUnavailable" and "chsink-no-such-host.invalid" in cond["message"]
    time.sleep(3)
    assert condition(s, "Ready")["status"] == "False"


def test_a_missing_secret_is_named_and_creating_it_recovers_without_touching_the_sink(sink):
    s = sink
    ref = f"creds-{s['name']}"
    s["apply"](clickhouse={"shards": [{"endpoint": s["dsn"]}], "database": s["db"], "tables": {"*": "events"},
                           "credentialsSecretRef": {"name": ref}})
    cond = wait_for("SecretUnavailable", lambda: (c := condition(s, "Degraded")).get("reason") ==
                    "SecretUnavailable" and c)
    assert f"spec.clickhouse.credentialsSecretRef: cannot read Secret default/{ref}: it does not exist" == \
        cond["message"]
    show(s, "a missing Secret (before)")
    s["kube"].kubectl("create", "secret", "generic", ref, "--from-literal=pass=x")
    wait_for("no key", lambda: "has no key 'password'" in condition(s, "Degraded").get("message", ""))
    s["kube"].kubectl("delete", "secret", ref)
    s["kube"].kubectl("create", "secret", "generic", ref, "--from-literal=password=x")
    wait_for("recovered", lambda: condition(s, "Degraded").get("status") == "False", timeout=30)
    show(s, "the Secret created (after)")
    s["kube"].kubectl("delete", "secret", ref)


def test_a_wrong_spec_is_invalid_naming_the_field_and_its_fix_is_taken_at_once(sink):
    s = sink
    s["apply"]()
    wait_for("app", lambda: app_of(s))
    spec = get(s["kube"], "clickhousesink", s["name"])["spec"]
    spec["kafka"] = {"bootstrapServers": spec["kafka"]["bootstrapServers"], "topicPattern": "orders["}
    body = {"apiVersion": "chsink.io/v1alpha1", "kind": "ClickHouseSink",
            "metadata": {"name": s["name"], "namespace": "default"}, "spec": spec}
    s["kube"].kubectl("apply", "-f", "-", input=yaml.safe_dump(body))
    wait_for("Invalid", lambda: cr_status(s).get("state") == "Invalid")
    cond = condition(s, "Degraded")
    assert cond["reason"] == "InvalidSpec" and "spec.kafka: topicPattern 'orders[' is not a regular expression: " \
        "unterminated character set" in cond["message"]
    wait_for("an InvalidSpec Warning", lambda: warnings(s, "InvalidSpec") == 1)
    show(s, "an invalid topicPattern (before)")
    t0 = time.monotonic()
    s["apply"]()
    wait_for("valid again", lambda: cr_status(s).get("state") == "Deploying", timeout=20)
    took = time.monotonic() - t0
    assert took < 15, f"the fix waited {took:.0f}s"
    show(s, "fixed (after)")


def test_a_stopped_sink_says_stopped_and_its_lag_keeps_counting(sink, kafka):
    s = sink
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(5):
        p.produce(s["topic"], json.dumps({"id": i}).encode(), partition=0)
    p.flush(10)
    s["apply"](state="stopped")
    wait_for("Stopped", lambda: cr_status(s).get("state") == "Stopped")
    wait_for("SinkStatus Stopped with lag 5", lambda: (st := (get(s["kube"], "sinkstatus", s["name"]) or {})
                                                      .get("status", {})).get("state") == "Stopped"
             and st.get("lag") == 5)
    for i in range(3):
        p.produce(s["topic"], json.dumps({"id": i}).encode(), partition=1)
    p.flush(10)
    wait_for("lag 8", lambda: cr_status(s).get("lag") == 8 and
             get(s["kube"], "sinkstatus", s["name"])["status"]["lag"] == 8)
    assert condition(s, "Ready")["reason"] == "Stopped"


def job_pod(s, role: str, name: str) -> str:
    """A pod labelled as the spark-operator labels the job's, with the ConfigMap its webhook mounts. This test bed
    has no node, so it stays Pending (not finished) until deleted, and an unscheduled pod is gone as soon as it is
    deleted."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default",
                        "labels": {"sparkoperator.k8s.io/app-name": f"chsink-{s['name']}", "spark-role": role}},
           "spec": {"containers": [{"name": "spark", "image": "chsink-none:0"}],
                    "volumes": [{"name": "config", "configMap": {"name": f"chsink-{s['name']}"}}]}}
    s["kube"].kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
    return name


def events(s) -> list[str]:
    """The reasons of the sink's Events, oldest first."""
    out = s["kube"].kubectl("get", "events", "-o", "json", "--field-selector",
                            f"involvedObject.name={s['name']}").stdout
    return [e["reason"] for e in events_oldest_first(json.loads(out)["items"])]


def test_paused_and_stopped_only_once_no_pod_of_the_job_is_left(sink):
    """The spark-operator reports SUSPENDED as it deletes the driver pod, which then finishes the batch it is in:
    until the job's pods are gone the sink is Pausing (or Stopping), never Paused (or Stopped)."""
    s = sink
    s["apply"]()
    wait_for("app", lambda: app_of(s))
    report(s, "RUNNING")
    wait_for("Running", lambda: cr_status(s).get("state") == "Running")
    driver = job_pod(s, "driver", f"chsink-{s['name']}-driver")
    executor = job_pod(s, "executor", f"chsink-{s['name']}-exec-1")
    s["apply"](state="paused")
    wait_for("Pausing", lambda: cr_status(s).get("state") == "Pausing")
    report(s, "SUSPENDED")
    time.sleep(5)  # two status ticks
    assert cr_status(s)["state"] == "Pausing" and condition(s, "Progressing")["status"] == "True"
    ready = condition(s, "Ready")
    assert ready["status"] == "False" and f"{driver} (driver), {executor} (executor)" in ready["message"], ready
    show(s, "pausing: the application SUSPENDED, its pods still there")
    s["kube"].kubectl("delete", "pod", driver, "--wait=true")
    wait_for("the driver gone from Ready's message", lambda: driver not in condition(s, "Ready")["message"])
    assert cr_status(s)["state"] == "Pausing" and executor in condition(s, "Ready")["message"]
    s["kube"].kubectl("delete", "pod", executor, "--wait=true")
    wait_for("Paused", lambda: cr_status(s).get("state") == "Paused")
    assert condition(s, "Progressing")["status"] == "False"

    s["apply"](state="running")  # a pod that appears while paused makes it Pausing again: resume first
    wait_for("resumed", lambda: app_of(s)["spec"].get("suspend") is False)
    report(s, "RUNNING")
    wait_for("Running again", lambda: cr_status(s).get("state") == "Running")
    job_pod(s, "driver", driver)
    s["apply"](state="stopped")
    wait_for("app deleted", lambda: app_of(s) is None)
    wait_for("Stopping", lambda: cr_status(s).get("state") == "Stopping")
    time.sleep(5)
    assert cr_status(s)["state"] == "Stopping"
    s["kube"].kubectl("delete", "pod", driver, "--wait=true")
    wait_for("Stopped", lambda: cr_status(s).get("state") == "Stopped")
    reasons = events(s)
    assert [r for r in reasons if r in ("Pausing", "Paused", "Stopping", "Stopped")] == \
        ["Pausing", "Paused", "Stopping", "Stopped"], reasons


def test_a_failing_cleanup_keeps_every_condition_and_posts_one_warning(hsink):
    s = hsink
    s["apply"](deletionPolicy="Delete")
    wait_for("app", lambda: app_of(s))
    s["relay"].down()
    s["kube"].kubectl("delete", "chs", s["name"], "--wait=false")
    cond = wait_for("CleanupFailed", lambda: (c := condition(s, "Degraded")).get("reason") == "CleanupFailed" and c)
    assert "chsink.io/force-delete=true" in cond["message"]
    time.sleep(25)  # retried every 10 s
    st = cr_status(s)
    assert st["state"] == "Deleting" and {c["type"] for c in st["conditions"]} == {"Ready", "Progressing",
                                                                                  "Degraded"}
    assert warnings(s, "CleanupFailed") == 1
    show(s, "cleanup failing, ClickHouse unreachable (before)")
    s["relay"].up()
    wait_for("deleted", lambda: get(s["kube"], "clickhousesink", s["name"]) is None, timeout=60)


def test_a_rebalance_is_approved_with_the_word_approve(sink, ch_factory):
    s = sink
    ch_factory(f"{s['db']}_b").command(f"CREATE TABLE IF NOT EXISTS `{s['db']}_b`.events (id UInt64, _topic String, "
                                       "_partition UInt16, _offset UInt64) ENGINE = MergeTree ORDER BY _offset")
    s["apply"]()
    wait_for("layout", lambda: cr_status(s).get("layout"))
    s["kube"].kubectl("annotate", "chs", s["name"], "chsink.io/rebalance-approval=required")
    s["apply"](clickhouse={"shards": [{"endpoint": s["dsn"]}, {"endpoint": s["dsn"], "database": f"{s['db']}_b"}],
                           "database": s["db"], "tables": {"*": "events"}})
    rb = wait_for("awaiting", lambda: (r := cr_status(s).get("rebalance")) and r["phase"] == "AwaitingApproval" and r)
    assert "chsink.io/approve-rebalance=approve" in rb["message"] and cr_status(s)["shards"] == "1->2"
    s["kube"].kubectl("annotate", "chs", s["name"], "chsink.io/approve-rebalance=approve")
    wait_for("approved", lambda: cr_status(s)["rebalance"].get("approvedAt"))
    wait_for("the annotation used up", lambda: "chsink.io/approve-rebalance" not in
             (get(s["kube"], "chs", s["name"])["metadata"].get("annotations") or {}))
    wait_for("draining", lambda: cr_status(s)["state"] == "Draining")
    driver = job_pod(s, "driver", f"chsink-{s['name']}-driver")
    report(s, "SUSPENDED")  # as the spark-operator reports it: when it deletes the driver pod, not once it is gone
    wait_for("waiting for the driver", lambda: driver in cr_status(s)["rebalance"]["message"])
    time.sleep(5)  # two status ticks
    assert cr_status(s)["rebalance"]["phase"] == "Draining" and cr_status(s)["shards"] == "1->2"
    s["kube"].kubectl("delete", "pod", driver, "--wait=true")
    wait_for("applied", lambda: cr_status(s)["rebalance"]["phase"] == "Applied" and cr_status(s)["shards"] == "2")
    # each step of the plan is an Event, though the plan object is the one read (and changed in place)
    wait_for("the plan's Events", lambda: {"RebalanceAwaitingApproval", "RebalanceApproved", "RebalanceDraining",
                                           "RebalanceApplied"} <= set(events(s)), timeout=30)

    # the next plan is a new plan: it carries neither the last one's approval nor its appliedAt (a merge patch
    # keeps every key it is not told to delete)
    s["apply"](clickhouse={"shards": [{"endpoint": s["dsn"]}], "database": s["db"], "tables": {"*": "events"}})
    rb = wait_for("the next plan", lambda: (r := cr_status(s).get("rebalance")) and r["toLayout"] == 2 and r)
    assert rb["phase"] == "AwaitingApproval" and "approvedAt" not in rb and "appliedAt" not in rb, rb
    time.sleep(5)  # two status ticks
    rb = cr_status(s)["rebalance"]
    assert rb["phase"] == "AwaitingApproval" and "approvedAt" not in rb and cr_status(s)["shards"] == "2->1", rb
