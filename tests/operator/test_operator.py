"""The operator on the real API server (KopfRunner in-process): rendering, hash-gated patching, lifecycle,
printer columns, SinkStatus, and the finalizer's state cleanup in the ZooKeeper-backed KeeperMap."""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from kazoo.client import KazooClient

from sparkapp.core.state_machine import OffsetRange
from sparkapp.edges.store import PartitionKey

from .conftest import OperatorProcess

_seq = itertools.count()


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:  # not there yet
            last = e
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {last}")


def get(kube, kind: str, name: str) -> dict[str, Any] | None:
    res = kube.kubectl("get", kind, name, "-o", "yaml", check=False)
    return yaml.safe_load(res.stdout) if res.returncode == 0 else None


def app_of(s) -> dict[str, Any] | None:
    return get(s["kube"], "sparkapplication", f"chsink-{s['name']}")


def report(s, state: str, message: str = "", executors: dict[str, str] | None = None) -> None:
    """What the spark-operator would write (this test bed runs none): the application's and its executors' states."""
    body: dict[str, Any] = {"status": {"driverInfo": {}, "applicationState": {
        "state": state, **({"errorMessage": message} if message else {})}}}
    if executors:
        body["status"]["executorState"] = executors
    s["kube"].kubectl("patch", "sparkapplication", f"chsink-{s['name']}", "--subresource=status", "--type=merge",
                      "-p", json.dumps(body))


def cr_status(s) -> dict[str, Any]:
    return (get(s["kube"], "clickhousesink", s["name"]) or {}).get("status", {})


def condition(s, kind: str) -> dict[str, Any]:
    return next((c for c in cr_status(s).get("conditions", []) if c["type"] == kind), {})


def test_apply_creates_app_and_configmap_then_patches_only_on_material_change(sink):
    sink["apply"]()
    app = wait_for("SparkApplication", lambda: app_of(sink))
    cm = wait_for("ConfigMap", lambda: get(sink["kube"], "configmap", f"chsink-{sink['name']}"))
    assert yaml.safe_load(cm["data"]["sink.yaml"])["name"] == f"default.{sink['name']}"
    assert app["metadata"]["ownerReferences"][0]["kind"] == "ClickHouseSink"
    wait_for("Deploying", lambda: cr_status(sink).get("state") == "Deploying", timeout=20)
    report(sink, "RUNNING")
    wait_for("Running", lambda: cr_status(sink).get("state") == "Running", timeout=20)
    app = app_of(sink)
    rv, h = app["metadata"]["resourceVersion"], app["metadata"]["annotations"]["chsink.io/spec-hash"]

    sink["kube"].kubectl("label", "clickhousesink", sink["name"], "team=data")
    time.sleep(3)
    assert app_of(sink)["metadata"]["resourceVersion"] == rv  # immaterial: untouched

    sink["apply"](batching={"maxOffsetsPerTrigger": 1234})
    patched = wait_for("hash change", lambda: (a := app_of(sink)) and
                       a["metadata"]["annotations"]["chsink.io/spec-hash"] != h and a)
    assert "maxOffsetsPerTrigger: 1234" in get(sink["kube"], "configmap", f"chsink-{sink['name']}")["data"]["sink.yaml"]
    assert patched["spec"]["sparkConf"]["spark.speculation"] == "false"


def test_a_setting_removed_from_the_sink_is_gone_from_its_sparkapplication(sink):
    """The SparkApplication holds what render() gives: a merge patch kept every key it did not mention, so a
    removed sparkConf key, deps entry, coreRequest or service account stayed in force."""
    spark = {"sparkConf": {"spark.chsink.test.kept": "1", "spark.chsink.test.removed": "2"},
             "deps": {"jars": ["local:///opt/extra.jar"]}, "serviceAccount": "custom-driver",
             "driver": {"coreRequest": "500m"}}
    sink["apply"](spark=spark)
    app = wait_for("app", lambda: (a := app_of(sink)) and "spark.chsink.test.removed" in a["spec"]["sparkConf"] and a)
    assert app["spec"]["deps"]["jars"] == ["local:///opt/extra.jar"] and app["spec"]["driver"]["coreRequest"] == "500m"
    sink["apply"](spark={"sparkConf": {"spark.chsink.test.kept": "1"}})
    app = wait_for("patched", lambda: (a := app_of(sink)) and a["spec"]["sparkConf"].get("spark.chsink.test.kept")
                   and "spark.chsink.test.removed" not in a["spec"]["sparkConf"] and a, timeout=20)
    assert "jars" not in app["spec"].get("deps", {}), app["spec"].get("deps")
    assert "coreRequest" not in app["spec"]["driver"], app["spec"]["driver"]
    assert app["spec"]["driver"].get("serviceAccount") != "custom-driver", app["spec"]["driver"]
    assert app["metadata"]["ownerReferences"][0]["kind"] == "ClickHouseSink"


def test_pause_resume_stop(sink):
    sink["apply"]()
    wait_for("app", lambda: app_of(sink))
    sink["apply"](state="paused")
    wait_for("suspend", lambda: app_of(sink)["spec"].get("suspend") is True)
    sink["apply"](state="running")
    wait_for("resume", lambda: app_of(sink)["spec"].get("suspend") is False)
    sink["apply"](state="stopped")
    wait_for("app deleted", lambda: app_of(sink) is None)
    state = wait_for("Stopped", lambda: get(sink["kube"], "clickhousesink", sink["name"])["status"]["state"] == "Stopped")
    assert state
    sink["apply"](state="running")
    wait_for("app back", lambda: app_of(sink))


def running_with_two_partitions_delivered(sink) -> None:
    """State rows of offsets 0..9 committed in both partitions, the sink applied and its job reported running."""
    e = sink["store"]
    e.ensure_schema()
    epoch = e.acquire_epoch(f"default.{sink['name']}")
    for p in (0, 1):
        pk = PartitionKey(f"default.{sink['name']}", sink["topic"], p)
        e.begin(pk, OffsetRange(0, 9), epoch)
        e.commit(pk, OffsetRange(0, 9), epoch)
    sink["apply"]()
    wait_for("app", lambda: app_of(sink))
    report(sink, "RUNNING")


def test_printer_columns_and_sinkstatus(sink):
    running_with_two_partitions_delivered(sink)
    wait_for("SinkStatus", lambda: (s := (get(sink["kube"], "sinkstatus", sink["name"]) or {}).get("status", {}))
             .get("partitionCount") == 2 and s.get("state") == "Running")
    wait_for("Ready", lambda: condition(sink, "Ready").get("status") == "True")
    out = sink["kube"].kubectl("get", "clickhousesinks", sink["name"]).stdout.splitlines()
    assert out[0].split() == ["NAME", "READY", "STATE", "JOB", "TOPICS", "SHARDS", "LAG", "REBALANCE", "VERIFIED",
                                "AGE"]
    assert out[1].split()[:7] == [sink["name"], "True", "Running", "RUNNING", sink["topic"], "1", "0"]
    st = sink["kube"].kubectl("get", "sinkstatus", sink["name"]).stdout.splitlines()
    assert st[0].split() == ["NAME", "SINK", "PARTITIONS", "LAG", "STATE", "LAST-COMMIT", "AGE"]
    assert st[1].split()[:5] == [sink["name"], f"default.{sink['name']}", "2", "0", "Running"]
    print("\n".join(out + st), file=sys.__stdout__)  # KopfRunner swaps sys.stdout


def test_the_operator_exports_each_sinks_health_labelled_as_the_jobs_metrics_are(sink, kafka):
    """Per sink, labelled namespace and sink as the job's metrics: lag summed and per topic (rising as records
    arrive that nothing delivers), the state one-hot, Ready, the last commit, the rebalance phase; the series go
    with the sink."""
    from confluent_kafka import Producer
    from prometheus_client import REGISTRY

    committed = time.time()
    running_with_two_partitions_delivered(sink)
    labels = {"namespace": "default", "sink": f"default.{sink['name']}"}

    def value(metric: str, **extra: str) -> float | None:
        return REGISTRY.get_sample_value(metric, {**labels, **extra})

    wait_for("Ready in the metrics", lambda: value("chsink_operator_sink_ready") == 1)
    assert value("chsink_operator_sink_state", state="Running") == 1
    assert value("chsink_operator_sink_state", state="Paused") == 0
    assert value("chsink_operator_sink_lag") == 0 and value("chsink_operator_sink_topic_lag", topic=sink["topic"]) == 0
    assert abs((value("chsink_operator_sink_last_commit_timestamp_seconds") or 0) - committed) < 120
    assert (value("chsink_operator_sink_last_commit_age_seconds") or -1) >= 0
    assert value("chsink_operator_sink_rebalance_phase", phase="Draining") == 0
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for _ in range(15):  # offsets 0..14 of partition 0: 10..14 are not delivered
        producer.produce(sink["topic"], value=b"{}", partition=0)
    producer.flush(30)
    wait_for("lag 5", lambda: value("chsink_operator_sink_lag") == 5, timeout=60)
    assert value("chsink_operator_sink_topic_lag", topic=sink["topic"]) == 5
    sink["kube"].kubectl("delete", "clickhousesink", sink["name"], "--wait=true", "--timeout=60s")
    wait_for("its series gone", lambda: value("chsink_operator_sink_ready") is None, timeout=30)
    assert value("chsink_operator_sink_lag") is None and value("chsink_operator_sink_state", state="Running") is None


def znodes(zookeeper, path: str) -> int:
    zk = KazooClient(hosts=zookeeper.hosts)
    zk.start(10)
    try:
        return len(zk.get_children(path))
    finally:
        zk.stop()


@pytest.mark.parametrize("policy", ["Delete", "Retain"])
def test_finalizer_cleans_state_only_with_delete_and_the_sink_is_gone_in_seconds(sink, zookeeper, policy):
    """The delete returns within seconds: kopf polls a timer it stopped every 60 s by default, which held each
    deletion a minute after its cleanup had finished."""
    st = sink["store"]
    st.ensure_schema()
    epoch = st.acquire_epoch(f"default.{sink['name']}")
    st.begin(PartitionKey(f"default.{sink['name']}", sink["topic"], 0), OffsetRange(0, 9), epoch)
    path = f"/chsink_keeper_map/op_{sink['db']}/data"
    (sink["checkpoint"] / "offsets").mkdir(parents=True)
    (sink["checkpoint"] / "offsets" / "0").write_text("v1")
    (sink["checkpoint"] / "_chsink_sink").write_text(f"default.{sink['name']}")  # as the job marks it
    before = znodes(zookeeper, path)
    assert before == 3  # schema, epoch, one partition
    sink["apply"](deletionPolicy=policy)
    wait_for("app", lambda: app_of(sink))
    sink["kube"].kubectl("delete", "clickhousesink", sink["name"], "--wait=true", "--timeout=20s")
    assert get(sink["kube"], "clickhousesink", sink["name"]) is None
    assert znodes(zookeeper, path) == (1 if policy == "Delete" else 3)
    assert sink["checkpoint"].exists() == (policy == "Retain")  # a reachable checkpoint goes with Delete


def test_checkpoint_deletion_takes_only_what_chsink_marked_and_wrote(tmp_path):
    from sinkoperator.cleanup import delete_checkpoint
    from tests.helpers import checkpoint_deletions

    checkpoint_deletions(tmp_path, delete_checkpoint)
    assert "not an absolute local path" in delete_checkpoint("s3a://bucket/ckpt", "ns.a")


def test_invalid_spec_sets_degraded_naming_the_field(sink):
    sink["apply"](format={"type": "avro"})
    cond = wait_for("Degraded", lambda: next(
        (c for c in get(sink["kube"], "clickhousesink", sink["name"]).get("status", {}).get("conditions", [])
         if c["type"] == "Degraded" and c["status"] == "True"), None))
    assert "format" in cond["message"] and "avroSchema" in cond["message"]


def test_removed_topic_state_is_cleaned_after_fencing_the_job(sink):
    from sparkapp.edges.store import FencedError

    keep, drop = sink["topic"], sink["new_topic"]()
    sid = f"default.{sink['name']}"
    st = sink["store"]
    st.ensure_schema()
    job_epoch = st.acquire_epoch(sid)  # the running job's epoch
    for t in (keep, drop):
        st.begin(PartitionKey(sid, t, 0), OffsetRange(0, 9), job_epoch)
        st.commit(PartitionKey(sid, t, 0), OffsetRange(0, 9), job_epoch)
    sink["apply"](topics=[keep, drop])
    wait_for("topics in status", lambda: get(sink["kube"], "clickhousesink", sink["name"])["status"]
             .get("topics") == f"{keep},{drop}")
    sink["apply"](topics=[keep])
    wait_for("removed topic's state gone", lambda: [r.pk.topic for r in st.list_sink(sid)] == [keep])
    assert st.current_epoch(sid) > job_epoch
    with pytest.raises(FencedError):  # the old job can no longer re-create the removed topic's row
        st.commit(PartitionKey(sid, drop, 0), OffsetRange(10, 19), job_epoch)
    assert [r.pk.topic for r in st.list_sink(sid)] == [keep]


def test_restart_nonce_restarts_the_job(sink):
    """The spark-operator resubmits an application only when its spec changes (a metadata change it ignores),
    so the nonce is in the spec: the driver pod's annotations."""
    sink["apply"]()
    h = wait_for("app", lambda: app_of(sink))["metadata"]["annotations"]["chsink.io/spec-hash"]
    sink["kube"].kubectl("annotate", "clickhousesink", sink["name"], "chsink.io/restart-nonce=2026-11-21T18:00")
    app = wait_for("hash change", lambda: (a := app_of(sink))["metadata"]["annotations"]["chsink.io/spec-hash"] != h
                   and a)
    assert app["spec"]["driver"]["annotations"]["chsink.io/restart-nonce"] == "2026-11-21T18:00"


def test_a_rotated_secret_restarts_the_job(sink):
    """The job reads its Secrets at pod start: a rotation changes the spec (the Secrets' resourceVersions in the
    driver's annotations), so the spark-operator resubmits it, and only then."""
    kubectl = sink["kube"].kubectl
    ref = f"creds-{sink['name']}"

    def secret(password: str) -> None:
        text = kubectl("create", "secret", "generic", ref, f"--from-literal=password={password}", "--dry-run=client",
                       "-o", "yaml").stdout
        kubectl("apply", "-f", "-", input=text)

    secret("first")
    sink["apply"](clickhouse={"shards": [{"endpoint": sink["dsn"]}], "database": sink["db"],
                              "tables": {"*": "events"}, "credentialsSecretRef": {"name": ref}})
    app = wait_for("app", lambda: app_of(sink))
    version = get(sink["kube"], "secret", ref)["metadata"]["resourceVersion"]
    assert app["spec"]["driver"]["annotations"]["chsink.io/secret-versions"] == f"{ref}@{version}"
    spec, h = app["spec"], app["metadata"]["annotations"]["chsink.io/spec-hash"]
    time.sleep(3)  # ticks with nothing rotated change nothing
    assert app_of(sink)["metadata"]["annotations"]["chsink.io/spec-hash"] == h
    secret("second")
    rotated = get(sink["kube"], "secret", ref)["metadata"]["resourceVersion"]
    app = wait_for("the rotation in the spec", lambda: (a := app_of(sink))["spec"]["driver"]["annotations"]
                   ["chsink.io/secret-versions"] == f"{ref}@{rotated}" and a, timeout=30)
    spec["driver"]["annotations"]["chsink.io/secret-versions"] = f"{ref}@{rotated}"
    assert app["spec"] == spec, "nothing else changed"
    kubectl("delete", "secret", ref)


def test_pod_volumes_and_env_from_secrets_and_configmaps_arrive_unpruned_and_a_change_of_any_restarts_the_job(sink):
    """A checkpoint on S3 needs credentials from a Secret, one on a volume a PVC: both reach the driver and the
    executors as written, through the spark-operator's own CRD (a field it does not know would be pruned without
    a word), and the Secrets and ConfigMaps they read are versioned like the sink's own Secrets: a change of one
    restarts the job, which reads them only at its pods' start."""
    kubectl = sink["kube"].kubectl
    s3, keys, conf = f"s3-{sink['name']}", f"keys-{sink['name']}", f"conf-{sink['name']}"
    for secret, literal in ((s3, "AWS_ACCESS_KEY_ID=chsink"), (keys, "ca.pem=PEM")):
        kubectl("create", "secret", "generic", secret, f"--from-literal={literal}")
    kubectl("create", "configmap", conf, "--from-literal=AWS_REGION=eu-west-1")
    volumes = [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": "chsink-checkpoints"}},
               {"name": "keys", "secret": {"secretName": keys, "items": [{"key": "ca.pem", "path": "ca.pem"}]}},
               {"name": "conf", "configMap": {"name": conf}},
               {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}]
    pod = {"env": [{"name": "AWS_REGION", "value": "eu-west-1"},
                   {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
           "envFrom": [{"secretRef": {"name": s3}}, {"configMapRef": {"name": conf}}],
           "volumeMounts": [{"name": "checkpoints", "mountPath": "/checkpoints"},
                            {"name": "keys", "mountPath": "/keys", "readOnly": True},
                            {"name": "conf", "mountPath": "/conf"}]}
    sink["apply"](spark={"volumes": volumes, "driver": pod, "executor": {"instances": 1, **pod}})
    app = wait_for("app", lambda: app_of(sink))
    spec = app["spec"]
    assert spec["volumes"] == volumes
    for role in ("driver", "executor"):
        assert spec[role]["envFrom"] == pod["envFrom"] and spec[role]["volumeMounts"] == pod["volumeMounts"], role
        assert spec[role]["env"][-2:] == pod["env"], role
    versions = dict(v.split("@") for v in spec["driver"]["annotations"]["chsink.io/secret-versions"].split(","))
    assert set(versions) == {s3, keys, f"configmap/{conf}"}
    kubectl("patch", "secret", keys, "-p", json.dumps({"stringData": {"ca.pem": "ROTATED"}}))
    rotated = get(sink["kube"], "secret", keys)["metadata"]["resourceVersion"]
    wait_for("the mounted Secret's rotation in the spec", lambda: f"{keys}@{rotated}" in app_of(sink)["spec"][
        "driver"]["annotations"]["chsink.io/secret-versions"], timeout=30)
    kubectl("patch", "configmap", conf, "-p", json.dumps({"data": {"AWS_REGION": "us-east-1"}}))
    changed = get(sink["kube"], "configmap", conf)["metadata"]["resourceVersion"]
    wait_for("the ConfigMap's change in the spec", lambda: f"configmap/{conf}@{changed}" in app_of(sink)["spec"][
        "driver"]["annotations"]["chsink.io/secret-versions"], timeout=30)
    # the API server refuses what the job could not run with, naming it
    bad = kubectl("apply", "-f", "-", check=False, input=yaml.safe_dump({
        "apiVersion": "chsink.io/v1alpha1", "kind": "ClickHouseSink", "metadata": {"name": f"{sink['name']}-bad"},
        "spec": {"kafka": {"bootstrapServers": "k:9092", "topics": ["t"]}, "checkpointLocation": "/c",
                 "clickhouse": {"shards": [{"endpoint": "http://c:8123"}], "tables": {"*": "t"}},
                 "spark": {"volumes": [{"name": "two", "emptyDir": {}, "secret": {"secretName": s3}}]}}}))
    assert bad.returncode != 0 and "exactly one of persistentVolumeClaim, secret, configMap, emptyDir" in bad.stderr
    for secret in (s3, keys):
        kubectl("delete", "secret", secret)
    kubectl("delete", "configmap", conf)


def test_entry_point_serves_liveness(chsink_crds, tmp_path):
    import urllib.request

    from hack.testbed import free_port

    mport = free_port()
    op = OperatorProcess(chsink_crds.kubeconfig, tmp_path / "op.log", "--namespace=nowhere", f"--metrics-port={mport}")
    try:
        wait_for("liveness", lambda: op.probe() == 200, timeout=60)
        text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
        assert "chsink_operator_reconcile_total" in text and "chsink_operator_sinks" in text
    finally:
        op.stop()
    out = op.output()
    assert "[INFO" in out and "[DEBUG" not in out, out[-2000:]  # the default level is INFO, no object bodies


def test_json_logs_are_one_object_per_line(chsink_crds, tmp_path):
    """`logFormat: json` (the chart's --log-format=json): a log pipeline parses every line, the election's too."""
    op = OperatorProcess(chsink_crds.kubeconfig, tmp_path / "op.log", "--namespace=nowhere", "--log-format=json",
                         "--leader-election=json-logs", "--lease-namespace=default", identity="json-1")
    try:
        wait_for("kopf started", lambda: "Initial authentication has finished" in op.output(), timeout=60)
    finally:
        op.stop()
    lines = [json.loads(line) for line in op.output().splitlines()]
    assert any("acquired the Lease" in line["message"] for line in lines), lines
    assert all(line.get("severity") in ("info", "warning", "debug", "error") for line in lines), lines
    assert any("released the Lease" in line["message"] for line in lines), lines
