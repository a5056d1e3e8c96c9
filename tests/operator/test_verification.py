"""The scheduled verifier (spec.verify) as the operator runs it: a Job owned by the sink, its result in the
Verified condition, the VERIFIED column, an Event and the metrics.

This test bed's API server runs no kubelet and no Job controller, so the test plays their parts: it runs the
Job's own command (the real verifier, on the sink's ConfigMap, against the real Kafka and ClickHouse), then writes
its termination message into a pod's status and marks the Job done, as the kubelet and the Job controller would."""

from __future__ import annotations

import datetime as dt
import json
import os
from typing import Any

import yaml
from confluent_kafka import Producer

from sparkapp.__main__ import main
from sparkapp.core.state_machine import OffsetRange
from sparkapp.edges.store import PartitionKey

from .test_operator import condition, cr_status, get, wait_for


def deliver_with_a_loss_and_a_duplicate(s: dict[str, Any], kafka: Any) -> None:
    """Partition 0's offsets 0..19 in Kafka and claimed delivered; in ClickHouse 5 is missing and 7 is twice."""
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(20):
        p.produce(s["topic"], json.dumps({"id": i}).encode(), partition=0)
    assert p.flush(30) == 0
    client = s["store"].client
    offsets = [o for o in range(20) if o != 5] + [7]
    client.insert(f"`{s['db']}`.events", [[o, s["topic"], 0, o] for o in offsets],
                  column_names=["id", "_topic", "_partition", "_offset"])
    store = s["store"]
    store.ensure_schema()
    sink_id = f"default.{s['name']}"
    epoch = store.acquire_epoch(sink_id)
    pk = PartitionKey(sink_id, s["topic"], 0)
    store.begin(pk, OffsetRange(0, 19), epoch)
    store.commit(pk, OffsetRange(0, 19), epoch)


def run_as_the_job_would(s: dict[str, Any], job: dict[str, Any], tmp_path: Any) -> str:
    """The Job's container command, here: its config from the sink's ConfigMap; returns its termination message."""
    cm = get(s["kube"], "configmap", f"chsink-{s['name']}")
    assert cm is not None
    config = tmp_path / "sink.yaml"
    config.write_text(cm["data"]["sink.yaml"])
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:5] == ["python3", "/opt/chsink/main.py", "verify", "--config", "/etc/chsink/sink.yaml"]
    log = tmp_path / "termination-log"
    log.write_text("")
    os.environ["CHSINK_TERMINATION_LOG"] = str(log)
    try:
        assert main(["verify", "--config", str(config), *command[5:]]) == 0
    finally:
        os.environ.pop("CHSINK_TERMINATION_LOG")
    return log.read_text()


def finish(s: dict[str, Any], job_name: str, message: str, succeeded: bool = True) -> None:
    """What the kubelet and the Job controller would write once the verifier's container exited."""
    kube = s["kube"]
    pod = f"{job_name}-x"
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": "default",
                                                        "labels": {"job-name": job_name}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "verify", "image": "chsink.local/spark"}]}}))
    at = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube.kubectl("patch", "pod", pod, "--subresource=status", "--type=merge", "-p", json.dumps({"status": {
        "phase": "Succeeded" if succeeded else "Failed", "containerStatuses": [{
            "name": "verify", "image": "chsink.local/spark", "imageID": "", "ready": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0 if succeeded else 1, "reason": "Completed", "message": message,
                                     "startedAt": at, "finishedAt": at}}}]}}))
    done = "Complete" if succeeded else "Failed"
    conds = [{"type": "SuccessCriteriaMet" if succeeded else "FailureTarget", "status": "True",
              "lastProbeTime": at, "lastTransitionTime": at},
             {"type": done, "status": "True", "lastProbeTime": at, "lastTransitionTime": at}]
    status: dict[str, Any] = {"startTime": at, "conditions": conds, "ready": 0, "active": 0,
                              "succeeded" if succeeded else "failed": 1, "terminating": 0}
    if succeeded:
        status["completionTime"] = at
    kube.kubectl("patch", "job", job_name, "--subresource=status", "--type=merge", "-p",
                 json.dumps({"status": status}))


def test_an_anomaly_is_described_with_its_offsets_and_a_removed_verify_leaves_nothing(sink, kafka, tmp_path):
    from prometheus_client import REGISTRY

    s = sink
    deliver_with_a_loss_and_a_duplicate(s, kafka)
    before = s["store"].client.query(f"SELECT _offset, count() FROM `{s['db']}`.events GROUP BY _offset "
                                     "ORDER BY _offset").result_rows
    cr = s["apply"](verify={"schedule": "1h", "window": "0s"})
    job_name = f"chsink-{s['name']}-verify"
    job = wait_for("the verifier's Job", lambda: get(s["kube"], "job", job_name))
    [owner] = job["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("ClickHouseSink", s["name"]), "gone with the sink"
    pod = job["spec"]["template"]["spec"]
    assert [v["configMap"]["name"] for v in pod["volumes"] if v["name"] == "chsink-config"] == [f"chsink-{s['name']}"]
    pending = wait_for("Verified Unknown", lambda: condition(s, "Verified"))
    assert (pending["status"], pending["reason"]) == ("Unknown", "VerificationPending"), pending

    finish(s, job_name, run_as_the_job_would(s, job, tmp_path))
    where = f"{s['topic']}/0: 1 duplicated offset(s) [7], 1 missing offset(s) [5]"
    cond = wait_for("VerifyAnomaly", lambda: (c := condition(s, "Verified")).get("reason") == "VerifyAnomaly" and c)
    assert cond["status"] == "False" and where in cond["message"], cond
    verification = cr_status(s)["verification"]
    assert (verification["result"], verification["findings"], verification["anomalies"]) == ("ANOMALY", [where], 1)
    out = s["kube"].kubectl("get", "clickhousesinks", s["name"]).stdout.splitlines()
    assert out[0].split()[-2:] == ["VERIFIED", "AGE"] and f"ANOMALY {where}" in out[1], out
    events = json.loads(s["kube"].kubectl("get", "events", "-o", "json", "--field-selector",
                                          f"involvedObject.name={s['name']},reason=VerifyAnomaly").stdout)["items"]
    assert [e["type"] for e in events] == ["Warning"] and where in events[0]["message"], events
    labels = {"namespace": "default", "sink": f"default.{s['name']}"}
    assert REGISTRY.get_sample_value("chsink_operator_sink_verify_anomalies", labels) == 1
    assert REGISTRY.get_sample_value("chsink_operator_sink_verify_ok", labels) == 0
    wait_for("the finished Job deleted", lambda: get(s["kube"], "job", job_name) is None, timeout=30)
    assert get(s["kube"], "job", job_name) is None, "not started again before its schedule"
    after = s["store"].client.query(f"SELECT _offset, count() FROM `{s['db']}`.events GROUP BY _offset "
                                    "ORDER BY _offset").result_rows
    assert after == before, "the verifier changes no data"

    del cr["spec"]["verify"]
    s["kube"].kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))
    wait_for("no verification left", lambda: "verification" not in cr_status(s) and not condition(s, "Verified"))


def test_a_clean_run_is_ok_with_its_count_and_a_failed_run_is_unknown_with_its_reason(sink, kafka, tmp_path):
    s = sink
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(30):
        p.produce(s["topic"], json.dumps({"id": i}).encode(), partition=1)
    assert p.flush(30) == 0
    s["store"].client.insert(f"`{s['db']}`.events", [[o, s["topic"], 1, o] for o in range(30)],
                             column_names=["id", "_topic", "_partition", "_offset"])
    store = s["store"]
    store.ensure_schema()
    epoch = store.acquire_epoch(f"default.{s['name']}")
    pk = PartitionKey(f"default.{s['name']}", s["topic"], 1)
    store.begin(pk, OffsetRange(0, 29), epoch)
    store.commit(pk, OffsetRange(0, 29), epoch)
    s["apply"](verify={"schedule": "2s", "window": "0s"})
    job_name = f"chsink-{s['name']}-verify"
    job = wait_for("the verifier's Job", lambda: get(s["kube"], "job", job_name))
    finish(s, job_name, run_as_the_job_would(s, job, tmp_path))
    cond = wait_for("Verified", lambda: (c := condition(s, "Verified")).get("status") == "True" and c)
    assert "30 settled offsets" in cond["message"], cond
    assert cr_status(s)["verification"]["summary"] == "OK 30 offsets"
    # the next run is due after 2 s; its pod fails without a word (evicted, out of memory)
    wait_for("the next Job", lambda: (j := get(s["kube"], "job", job_name)) and
             j["metadata"]["uid"] != job["metadata"]["uid"], timeout=30)
    finish(s, job_name, "", succeeded=False)
    cond = wait_for("VerifyFailed", lambda: (c := condition(s, "Verified")).get("reason") == "VerifyFailed" and c)
    assert cond["status"] == "Unknown" and "left no message" in cond["message"], cond
    assert cr_status(s)["verification"]["offsets"] == 30, "what was verified stays counted"
