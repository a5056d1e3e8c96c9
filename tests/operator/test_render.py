"""Rendering a ClickHouseSink: golden files, the spec hash, secrets, and validation by the real API server."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from sinkoperator.model import SinkSpec
from sinkoperator.render import HASH_ANNOTATION, render
from sparkapp.config import ConfigError, parse_config

from .test_lifecycle import BAD_SPECS, bad_spec

HERE = Path(__file__).parent
SAMPLE = yaml.safe_load((HERE / "sample.yaml").read_text())


def rendered(spec=None, nonce=""):
    return render("default", "orders", SinkSpec.parse(spec or SAMPLE["spec"]), nonce)


def test_golden_files():
    cm, app = rendered()
    for obj, file in ((cm, "configmap.yaml"), (app, "sparkapplication.yaml")):
        text = yaml.safe_dump(obj, sort_keys=True)
        path = HERE / "golden" / file
        if os.environ.get("CHSINK_UPDATE_GOLDEN"):
            path.write_text(text)
        assert text == path.read_text(), f"{file} changed; rerun with CHSINK_UPDATE_GOLDEN=1 if intended"


def test_rendering_is_deterministic_and_hash_tracks_material_changes():
    _, app = rendered()
    assert rendered()[1] == app
    h = app["metadata"]["annotations"][HASH_ANNOTATION]
    changed = copy.deepcopy(SAMPLE["spec"])
    changed["batching"]["maxOffsetsPerTrigger"] = 5
    assert rendered(changed)[1]["metadata"]["annotations"][HASH_ANNOTATION] != h
    assert rendered(nonce="2026-11-21")[1]["metadata"]["annotations"][HASH_ANNOTATION] != h
    paused = copy.deepcopy(SAMPLE["spec"])
    paused["state"] = "paused"
    assert rendered(paused)[1]["spec"]["suspend"] is True


def test_where_a_sink_without_state_starts_reaches_the_job():
    spec = copy.deepcopy(SAMPLE["spec"])
    topic = spec["kafka"]["topics"][0]
    for given, ack in (("latest", False), ({topic: {"0": 12}}, False), ("earliest", True)):
        spec["kafka"].update(startingOffsets=given, acknowledgeRedelivery=ack)
        cm, _ = rendered(spec)
        kafka = parse_config(yaml.safe_load(cm["data"]["sink.yaml"])).kafka  # as the job reads it
        assert (kafka.starting_offsets, kafka.acknowledge_redelivery) == \
            (given if not isinstance(given, dict) else {topic: {0: 12}}, ack)
    spec["kafka"]["startingOffsets"] = "newest"
    with pytest.raises(ConfigError, match="startingOffsets"):
        rendered(spec)


def test_secrets_are_referenced_never_inlined():
    cm, app = rendered()
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in app["spec"]["driver"]["env"]}
    assert env == {"CHSINK_KAFKA_SASL_PASSWORD": {"name": "kafka-creds", "key": "password"},
                   "CHSINK_CLICKHOUSE_PASSWORD": {"name": "ch-creds", "key": "password"}}
    cfg = yaml.safe_load(cm["data"]["sink.yaml"])
    assert cfg["kafka"]["secretOptions"] == {"sasl.password": {"env": "CHSINK_KAFKA_SASL_PASSWORD"}}
    assert app["spec"]["sparkConf"]["spark.speculation"] == "false"
    assert app["spec"]["restartPolicy"]["type"] == "Always"


def test_a_sinks_own_env_envfrom_mounts_and_volumes_reach_both_pods_after_the_operators_env():
    spec = copy.deepcopy(SAMPLE["spec"])
    volume = {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}}
    pod = {"env": [{"name": "AWS_REGION", "value": "eu-west-1"}], "envFrom": [{"secretRef": {"name": "s3"}}],
           "volumeMounts": [{"name": "checkpoints", "mountPath": "/checkpoints"}]}
    spec["spark"] = {"volumes": [volume], "driver": pod, "executor": pod}
    s = rendered(spec)[1]["spec"]
    assert s["volumes"] == [volume]
    for role in ("driver", "executor"):
        assert [e["name"] for e in s[role]["env"]] == ["CHSINK_KAFKA_SASL_PASSWORD", "CHSINK_CLICKHOUSE_PASSWORD",
                                                       "AWS_REGION"], role
        assert (s[role]["envFrom"], s[role]["volumeMounts"]) == (pod["envFrom"], pod["volumeMounts"])
    assert [u.name for u in SinkSpec.parse(spec).spark.object_uses()] == ["s3", "s3"]  # envFrom of each pod
    plain = rendered()[1]["spec"]
    assert "volumes" not in plain and "envFrom" not in plain["driver"] and "volumeMounts" not in plain["executor"]


TEMPLATE = {
    "nodeSelector": {"pool": "sinks"}, "priorityClassName": "streaming", "terminationGracePeriodSeconds": 120,
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "sinks", "effect": "NoSchedule"}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50,
                 "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                     "labelSelector": {"matchLabels": {"chsink.io/sink": "orders"}}}}]}},
    "labels": {"team": "payments"}, "annotations": {"cost-centre": "42"},
    "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 1001, "fsGroup": 1001,
                           "seccompProfile": {"type": "RuntimeDefault"}},
    "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": False,
                        "capabilities": {"drop": ["ALL"]}},
    "coreLimit": "2", "memoryOverhead": "1g",
}


def test_a_pod_template_reaches_both_pods_and_survives_the_spark_operators_crd(chsink_crds):
    """Scheduling, security and metadata of the driver and the executors, under the SparkApplication's names;
    a server dry run through the spark-operator's CRD returns them whole (what it does not know it prunes), and
    the operator's own labels and annotations stay."""
    spec = copy.deepcopy(SAMPLE["spec"])
    spec["spark"] = {"driver": TEMPLATE, "executor": {**TEMPLATE, "serviceAccount": "orders-executors"}}
    _, app = rendered(spec)
    res = chsink_crds.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=yaml.safe_dump(app))
    kept = json.loads(res.stdout)["spec"]
    for role in ("driver", "executor"):
        pod = kept[role]
        for key in ("nodeSelector", "priorityClassName", "terminationGracePeriodSeconds", "tolerations", "affinity",
                    "podSecurityContext", "securityContext", "coreLimit", "memoryOverhead"):
            assert pod[key] == TEMPLATE[key], (role, key, pod.get(key))
        assert pod["labels"]["team"] == "payments" and pod["labels"]["chsink.io/sink"] == "orders", pod["labels"]
        assert pod["annotations"]["cost-centre"] == "42", pod["annotations"]
    assert kept["driver"]["annotations"]["prometheus.io/scrape"] == "true"
    assert kept["executor"]["serviceAccount"] == "orders-executors"


def test_a_zero_termination_grace_period_is_kept_and_an_empty_template_adds_nothing():
    """0 is a value a user means (kill at once), not an absent one; empty selectors and lists render nothing,
    so a sink without a template keeps its spec hash."""
    spec = copy.deepcopy(SAMPLE["spec"])
    spec["spark"] = {"driver": {"terminationGracePeriodSeconds": 0}, "executor": {"nodeSelector": {}, "tolerations": []}}
    s = rendered(spec)[1]["spec"]
    assert s["driver"]["terminationGracePeriodSeconds"] == 0, s["driver"]
    assert "nodeSelector" not in s["executor"] and "tolerations" not in s["executor"], s["executor"]


def test_the_spark_pods_pass_pod_security_restricted_by_default():
    """No security context given: non-root as the Spark image's user, no privilege escalation, every capability
    dropped, seccomp RuntimeDefault (what `restricted` asks; on the node the product's pods run in a namespace
    that enforces it)."""
    from sinkoperator.podspec import RESTRICTED_CONTAINER, RESTRICTED_POD

    s = rendered()[1]["spec"]
    for role in ("driver", "executor"):
        assert (s[role]["podSecurityContext"], s[role]["securityContext"]) == (RESTRICTED_POD, RESTRICTED_CONTAINER)
    assert RESTRICTED_POD["runAsNonRoot"] and RESTRICTED_POD["seccompProfile"] == {"type": "RuntimeDefault"}
    assert RESTRICTED_CONTAINER == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                    "runAsNonRoot": True}


def test_a_remote_checkpoints_cleanup_job_reaches_it_as_the_driver_does(chsink_crds):
    """The Job a deletion starts for an s3a:// checkpoint: the job's image and the driver's identity, env,
    envFrom, mounts and volumes, and the sparkConf's Hadoop settings only (not the rest of sparkConf); the API
    server takes it as a Job."""
    from sinkoperator.render import checkpoint_job

    spec = copy.deepcopy(SAMPLE["spec"])
    spec["checkpointLocation"] = "s3a://bucket/checkpoints/orders"
    volume = {"name": "ca", "secret": {"secretName": "s3-ca"}}
    driver = {"env": [{"name": "AWS_REGION", "value": "eu-west-1"}], "envFrom": [{"secretRef": {"name": "s3"}}],
              "volumeMounts": [{"name": "ca", "mountPath": "/ca"}]}
    spec["spark"] = {"volumes": [volume], "driver": driver, "serviceAccount": "orders-s3", "image": "reg/spark:1",
                     "sparkConf": {"spark.hadoop.fs.s3a.endpoint": "http://s3:8080", "spark.sql.shuffle.partitions": "4"}}
    job = checkpoint_job("default", "orders", SinkSpec.parse(spec), "default.orders")
    pod = job["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert (job["metadata"]["name"], pod["serviceAccountName"], pod["volumes"], c["image"]) == (
        "chsink-orders-checkpoint-cleanup", "orders-s3", [volume], "reg/spark:1")
    assert (c["env"], c["envFrom"], c["volumeMounts"]) == (driver["env"], driver["envFrom"], driver["volumeMounts"])
    assert c["command"][2:5] == ["delete-checkpoint", "--location=s3a://bucket/checkpoints/orders",
                                 "--sink=default.orders"]
    conf = [a for a in c["command"] if a.startswith("--conf=")]
    assert "--conf=spark.hadoop.fs.s3a.endpoint=http://s3:8080" in conf and not any("shuffle" in a for a in conf)
    res = chsink_crds.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(job), check=False)
    assert res.returncode == 0, res.stderr


def test_invalid_spec_names_the_field():
    bad = copy.deepcopy(SAMPLE["spec"])
    bad["batching"]["maxOffsetsPerTrigger"] = 0
    with pytest.raises(ConfigError, match=r"batching.maxOffsetsPerTrigger: Input should be greater than 0"):
        rendered(bad)


def test_a_spec_the_next_layout_could_not_run_is_invalid_before_any_plan():
    """The ConfigMap is rendered from status.layout, so the spec's shards are validated on their own too."""
    from sinkoperator.render import sink_config

    bad = copy.deepcopy(SAMPLE["spec"])
    bad["sharding"] = {"weights": [1, 2]}
    with pytest.raises(ConfigError, match=r"sharding.weights has 2 entries for 1 clickhouse endpoints"):
        sink_config("default", "orders", SinkSpec.parse(bad))
    status = {"layout": {"version": 0, "endpoints": ["https://ch-0.data:8443"], "shardDatabases": ["shop"],
                         "weights": [1], "assignment": {}}}
    assert sink_config("default", "orders", SinkSpec.parse(bad), status).sharding.layout == 0  # why both are checked


def test_rendered_objects_pass_upstream_sparkapplication_validation(chsink_crds):
    cm, app = rendered()
    for obj in (cm, app):
        res = chsink_crds.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(obj))
        assert "created (server dry run)" in res.stdout


def test_a_core_request_below_cores_reaches_the_spark_pods_and_passes_upstream_validation(chsink_crds):
    """On a small node a driver and an executor of one core each do not fit: coreRequest asks for less."""
    spec = copy.deepcopy(SAMPLE["spec"])
    spec["spark"] = {"driver": {"cores": 1, "coreRequest": "200m"}, "executor": {"cores": 2, "coreRequest": "0.5"}}
    _, app = rendered(spec)
    assert (app["spec"]["driver"]["coreRequest"], app["spec"]["executor"]["coreRequest"]) == ("200m", "0.5")
    assert "coreRequest" not in rendered()[1]["spec"]["driver"]
    res = chsink_crds.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(app))
    assert "created (server dry run)" in res.stdout


def test_sample_cr_is_accepted_and_defaulted(chsink_crds):
    chsink_crds.kubectl("apply", "-f", str(HERE / "sample.yaml"))
    got = yaml.safe_load(chsink_crds.kubectl("get", "clickhousesink", "orders", "-o", "yaml").stdout)
    assert (got["spec"]["state"], got["spec"]["deletionPolicy"], got["spec"]["clickhouse"]["database"]) == \
        ("running", "Retain", "shop")
    header = chsink_crds.kubectl("get", "chs").stdout.splitlines()[0].split()
    assert header == ["NAME", "READY", "STATE", "JOB", "TOPICS", "SHARDS", "LAG", "REBALANCE", "VERIFIED", "AGE"]


@pytest.mark.parametrize(("path", "value", "needle"), [
    (("kafka", "topics"), [], "give either a non-empty topics list or topicPattern"),
    (("clickhouse", "shards"), [{"endpoint": "ftp://x"}], "spec.clickhouse.shards[0].endpoint"),
    (("exactlyOnce", "engine"), "Memory", "spec.exactlyOnce.engine"),
    (("spark", "driver"), {"memory": "lots"}, "spec.spark.driver.memory"),
    (("spark", "executor"), {"coreRequest": "half"}, "spec.spark.executor.coreRequest"),
    (("sharding",), {"weights": [1, 2]}, "sharding.weights needs one weight per clickhouse.shards entry"),
    (("sharding",), {"policy": "key"}, "sharding.policy key needs sharding.key"),
])
def test_invalid_cr_is_rejected_by_the_schema_naming_the_field(chsink_crds, path, value, needle):
    cr = copy.deepcopy(SAMPLE)
    cr["metadata"]["name"] = "invalid"
    node = cr["spec"]
    for p in path[:-1]:
        node = node.setdefault(p, {})
    node[path[-1]] = value
    res = chsink_crds.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(cr), check=False)
    assert res.returncode != 0 and needle in res.stderr, res.stderr


def test_install_defaults_from_the_chart_apply_where_the_cr_is_silent():
    from sinkoperator.render import Defaults

    d = Defaults.from_env({"CHSINK_SPARK_IMAGE": "reg/spark:1", "CHSINK_SPARK_VERSION": "4.0.1",
                           "CHSINK_SPARK_SERVICE_ACCOUNT": "spark-sa",
                           "CHSINK_SPARK_PACKAGES": "a:b:1,c:d:2"})
    spec = copy.deepcopy(SAMPLE["spec"])
    del spec["spark"]
    _, app = render("default", "orders", SinkSpec.parse(spec), "", d)
    s = app["spec"]
    assert (s["image"], s["sparkVersion"], s["driver"]["serviceAccount"]) == ("reg/spark:1", "4.0.1", "spark-sa")
    assert s["deps"]["packages"] == ["a:b:1", "c:d:2"]
    _, mine = render("default", "orders", SinkSpec.parse(SAMPLE["spec"]), "", d)  # the CR's own values win
    assert (mine["spec"]["image"], mine["spec"]["driver"]["serviceAccount"]) == ("registry.example/chsink-spark:0.1.0",
                                                                                 "chsink-spark")
    assert Defaults.from_env({}) == Defaults()


CEL_CASES = [(path, value, cel) for path, value, _, cel in BAD_SPECS if cel is not None]


@pytest.mark.parametrize(("path", "value", "needle"), CEL_CASES, ids=[".".join(c[0]) for c in CEL_CASES])
def test_semantic_mistakes_are_refused_at_apply_time(chsink_crds, path, value, needle):
    """The same mistakes the operator names itself (test_lifecycle.py), refused by the API server's CEL rules."""
    cr = {**copy.deepcopy(SAMPLE), "spec": bad_spec(path, value)}
    cr["metadata"]["name"] = "semantic"
    res = chsink_crds.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(cr), check=False)
    assert res.returncode != 0 and needle in res.stderr, res.stderr
    print(f"\n--- kubectl apply, spec.{'.'.join(path)}: {value!r}\n{res.stderr}", file=sys.__stdout__)


def test_a_name_too_long_for_its_objects_is_refused_at_apply_time(chsink_crds):
    cr = copy.deepcopy(SAMPLE)
    cr["metadata"]["name"] = "n" * 50
    res = chsink_crds.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(cr), check=False)
    assert res.returncode != 0 and "metadata.name: at most 45 characters" in res.stderr, res.stderr
    print(f"\n--- kubectl apply, a 50-character name\n{res.stderr}", file=sys.__stdout__)


def test_the_jvms_run_the_throughput_collector_unless_spark_conf_names_one():
    """Driver and executors get JVM_COLLECTOR next to the user's own options; a user's collector is kept alone,
    since the JVM refuses to start with two."""
    conf = rendered()[1]["spec"]["sparkConf"]
    assert conf["spark.driver.extraJavaOptions"] == conf["spark.executor.extraJavaOptions"] == "-XX:+UseParallelGC"
    own = copy.deepcopy(SAMPLE["spec"])
    own.setdefault("spark", {})["sparkConf"] = {"spark.driver.extraJavaOptions": "-Dx=1 -XX:+UseG1GC",
                                                "spark.executor.extraJavaOptions": "-Dy=2"}
    conf = rendered(own)[1]["spec"]["sparkConf"]
    assert conf["spark.driver.extraJavaOptions"] == "-Dx=1 -XX:+UseG1GC"
    assert conf["spark.executor.extraJavaOptions"] == "-XX:+UseParallelGC -Dy=2"
    own["spark"]["sparkConf"] = {"spark.executor.defaultJavaOptions": "-XX:+UseZGC"}  # Spark's admin defaults
    conf = rendered(own)[1]["spec"]["sparkConf"]
    assert "spark.executor.extraJavaOptions" not in conf, conf
    assert conf["spark.driver.extraJavaOptions"] == "-XX:+UseParallelGC"
