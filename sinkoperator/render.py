"""Rendering a ClickHouseSink into its ConfigMap (the job's SinkConfig) and SparkApplication (pure).

Deterministic: the same spec renders byte-identical objects. The SHA-256 of what matters to the
running job (the config, the Spark spec and the restart nonce) goes into an annotation, and the
operator patches the SparkApplication only when that hash changes, because the spark-operator
kills and resubmits an application on any spec change. Secrets are never inlined: they reach the
job as environment variables from secretKeyRef, and the SinkConfig only names those variables.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from sparkapp.config import SinkConfig, parse_config, with_jvm_defaults

from . import kafka_auth
from .model import SinkSpec
from .podspec import RESTRICTED_CONTAINER, RESTRICTED_POD, ObjectUse, PodExtras, dump, env_object_uses
from .rebalance import initial_layout, previous_config, routing
from .spec import (
    CONFIG_DIR,
    GROUP,
    HASH_ANNOTATION,
    LAYOUT_ANNOTATION,
    NONCE_ANNOTATION,
    OWNED_ENV,
    OWNED_ENV_PREFIX,
    SECRET_VERSIONS_ANNOTATION,
    DesiredState,
    object_name,
    sink_id,
)

CONFIG_FILE = "sink.yaml"
MAIN_FILE = "local:///opt/chsink/main.py"
DEFAULT_IMAGE = "ghcr.io/chsink/chsink-spark:0.1.0"
DEFAULT_SPARK_VERSION = "4.0.0"
CLICKHOUSE_PASSWORD_ENV = OWNED_ENV[0]
METRICS_PORT = 9091


@dataclass(frozen=True)
class Defaults:
    """Install-wide defaults for what a ClickHouseSink leaves out (set by the Helm chart as env vars)."""

    image: str = DEFAULT_IMAGE
    spark_version: str = DEFAULT_SPARK_VERSION
    service_account: str = ""
    packages: tuple[str, ...] = ()
    # a cluster-wide install's driver ClusterRole: the operator gives each sink namespace the default driver
    # ServiceAccount bound to it ("": the install created them, in the namespaces it watches)
    driver_role: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Defaults:
        return cls(env.get("CHSINK_SPARK_IMAGE") or DEFAULT_IMAGE,
                   env.get("CHSINK_SPARK_VERSION") or DEFAULT_SPARK_VERSION,
                   env.get("CHSINK_SPARK_SERVICE_ACCOUNT", ""),
                   tuple(p for p in env.get("CHSINK_SPARK_PACKAGES", "").split(",") if p),
                   env.get("CHSINK_SPARK_DRIVER_CLUSTERROLE", ""))

    def driver_identity(self, spec_account: str | None) -> tuple[str, str] | None:
        """(ServiceAccount, ClusterRole) the operator ensures in the sink's namespace, or None: a sink naming
        its own ServiceAccount manages it itself."""
        if self.driver_role and self.service_account and not spec_account:
            return self.service_account, self.driver_role
        return None


def secret_env(option: str) -> str:
    return OWNED_ENV_PREFIX + re.sub(r"[^A-Z0-9]", "_", option.upper())


def _auth_env(so: kafka_auth.SecretOption, i: int) -> str:
    """The env var of a Secret-backed option of kafka.tls / kafka.authentication (one per trusted certificate)."""
    return secret_env(so.option) + (f"_{i}" if len(so.keys) > 1 else "")


def sink_config(namespace: str, name: str, spec: SinkSpec, status: Mapping[str, Any] | None = None) -> SinkConfig:
    """The job's SinkConfig for a ClickHouseSink spec; errors name the field.

    The shards come from `status.layout` (what the job runs with) when there is one: a change of the
    spec's shards reaches the job only through a rebalance (rebalance.py).
    """
    k, ch = spec.kafka, spec.clickhouse
    auth_options, auth_secrets = kafka_auth.security(k)
    kafka: dict[str, Any] = {"bootstrapServers": k.bootstrap_servers, "options": {**k.options, **auth_options},
                             "secretOptions": {opt: {"env": secret_env(opt)} for opt in k.secret_options}}
    for so in auth_secrets:
        names = [_auth_env(so, i) for i in range(len(so.keys))]
        kafka["secretOptions"][so.option] = {"env": names[0]} if len(names) == 1 else {"envs": names}
    if (where := kafka_auth.credentials_from(auth_secrets)) is not None:
        kafka["credentialsFrom"] = where
    kafka.update({"topics": k.topics} if k.topics else {"topicPattern": k.topic_pattern})
    kafka.update({"startingOffsets": k.starting_offsets, "acknowledgeRedelivery": k.acknowledge_redelivery})
    if k.consumer_group:
        kafka["consumerGroup"] = k.consumer_group
    layout = dict((status or {}).get("layout") or initial_layout(spec))
    clickhouse: dict[str, Any] = {
        "endpoints": layout["endpoints"], "database": ch.database, "tables": ch.tables, "settings": ch.settings,
    }
    if any(d != clickhouse["database"] for d in layout["shardDatabases"]):
        clickhouse["shardDatabases"] = layout["shardDatabases"]
    sharding = {k: v for k, v in routing(layout).items() if v is not None}
    sharding["layout"] = int(layout["version"])
    if len(set(layout["weights"])) > 1:
        sharding["weights"] = layout["weights"]
    if layout.get("assignment"):
        sharding["assignment"] = layout["assignment"]
    if (status or {}).get("previousLayout"):
        sharding["previous"] = previous_config(status["previousLayout"])  # type: ignore[index]
    for key, value in (("tableField", ch.table_field), ("tableHeader", ch.table_header), ("username", ch.username),
                       ("requestTimeoutSeconds", ch.request_timeout_s)):
        if value:
            clickhouse[key] = value
    if ch.credentials_secret_ref:
        clickhouse["password"] = {"env": CLICKHOUSE_PASSWORD_ENV}
    eo = spec.exactly_once
    data: dict[str, Any] = {
        "name": sink_id(namespace, name), "kafka": kafka, "clickhouse": clickhouse,
        "format": spec.raw(spec.format),
        "state": {"engine": eo.engine, "table": eo.table, **({"keeperPath": eo.keeper_path} if eo.keeper_path else {})},
        "batching": spec.raw(spec.batching), "dlq": spec.raw(spec.dlq), "sharding": sharding,
        "checkpointLocation": spec.checkpoint_location,
    }
    return parse_config(data, f"ClickHouseSink {namespace}/{name}", prefix="spec")


def secret_refs(spec: SinkSpec) -> list[tuple[str, dict[str, Any]]]:
    """(spec field, environment variable from a Secret) for each secret the job gets; the operator reads the same."""
    out: list[tuple[str, dict[str, Any]]] = []
    k = spec.kafka
    for opt, key in sorted(k.secret_options.items()):
        assert k.secret_ref is not None  # the model requires it with secretOptions
        out.append((f"spec.kafka.secretOptions[{opt}]", {
            "name": secret_env(opt), "valueFrom": {"secretKeyRef": {"name": k.secret_ref.name, "key": key}}}))
    for so in kafka_auth.security(k)[1]:
        for i, (secret, key) in enumerate(so.keys):
            field = f"{so.field}[{i}]" if len(so.keys) > 1 else so.field
            out.append((field, {"name": _auth_env(so, i), "valueFrom": {"secretKeyRef": {"name": secret,
                                                                                          "key": key}}}))
    cred = spec.clickhouse.credentials_secret_ref
    if cred:
        out.append(("spec.clickhouse.credentialsSecretRef", {"name": CLICKHOUSE_PASSWORD_ENV, "valueFrom": {
            "secretKeyRef": {"name": cred.name, "key": cred.password_key}}}))
    return out


def object_uses(spec: SinkSpec) -> list[ObjectUse]:
    """Every Secret the sink's pods read: those the operator binds into env vars and the pods' own."""
    return [*env_object_uses(secret_refs(spec)), *spec.spark.object_uses()]


def spec_hash(material: Any) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def restart_annotations(nonce: str, object_versions: Mapping[str, str]) -> dict[str, str]:
    """The driver's annotations that restart the job when they change: the spark-operator resubmits an application
    only on a change of its spec, and the job reads its Secrets only at pod start."""
    out = {NONCE_ANNOTATION: nonce} if nonce else {}
    if object_versions:
        out[SECRET_VERSIONS_ANNOTATION] = ",".join(f"{n}@{v}" for n, v in sorted(object_versions.items()))
    return out


def layout_annotation(status: Mapping[str, Any] | None) -> dict[str, str]:
    """The applied layout (and the previous one) as the ConfigMap keeps it: status can be lost (a backup restore,
    a GitOps tool re-applying the object), and layout 0 in its place would route rows to other shards."""
    if not (status or {}).get("layout"):
        return {}
    kept = {k: status[k] for k in ("layout", "previousLayout") if status.get(k)}  # type: ignore[index,union-attr]
    return {LAYOUT_ANNOTATION: json.dumps(kept, sort_keys=True, separators=(",", ":"))}


def kept_layout(annotations: Mapping[str, str]) -> dict[str, Any]:
    """What layout_annotation() kept ({} when nothing is)."""
    text = annotations.get(LAYOUT_ANNOTATION)
    kept = json.loads(text) if text else {}
    return kept if isinstance(kept, dict) and kept.get("layout") else {}


def pod_extras(env: list[dict[str, Any]], pod: PodExtras) -> dict[str, Any]:
    """A driver's or executors' env (the operator's own first), envFrom and volumeMounts, as the SparkApplication
    takes them; empty lists left out, so a sink without them renders as before."""
    out: dict[str, Any] = {"env": [*env, *dump(pod.env)]}
    if pod.env_from:
        out["envFrom"] = dump(pod.env_from)
    if pod.volume_mounts:
        out["volumeMounts"] = dump(pod.volume_mounts)
    return out


def sink_labels(name: str) -> dict[str, str]:
    """What every object rendered for a sink carries: a selector for its objects and the operator's mark."""
    return {"app.kubernetes.io/name": "chsink", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/managed-by": "chsink-operator", f"{GROUP}/sink": name}


def pod_template(pod: PodExtras) -> dict[str, Any]:
    """A driver's or executors' scheduling and security, as the SparkApplication names them: Pod Security
    `restricted` unless the sink gives its own security contexts (each replaces its default whole)."""
    out: dict[str, Any] = {
        "podSecurityContext": pod.pod_security_context if pod.pod_security_context is not None else RESTRICTED_POD,
        "securityContext": pod.security_context if pod.security_context is not None else RESTRICTED_CONTAINER}
    for key, value in (("nodeSelector", pod.node_selector), ("tolerations", pod.tolerations),
                       ("affinity", pod.affinity), ("priorityClassName", pod.priority_class_name),
                       ("terminationGracePeriodSeconds", pod.termination_grace_period_seconds)):
        if value not in (None, {}, []):  # 0 seconds is meant
            out[key] = value
    return out


def render(namespace: str, name: str, spec: SinkSpec, nonce: str = "",
           defaults: Defaults = Defaults(), status: Mapping[str, Any] | None = None,
           suspend: bool = False, object_versions: Mapping[str, str] | None = None,
           ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Returns (ConfigMap, SparkApplication) for a ClickHouseSink; `suspend` drains it (a rebalance);
    `object_versions` (kube.object_versions of the Secrets and ConfigMaps its pods read) restarts it when one
    changes."""
    cfg = sink_config(namespace, name, spec, status)
    labels = sink_labels(name)
    config_text = yaml.safe_dump(cfg.redacted(), sort_keys=True)
    cm: dict[str, Any] = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": object_name(name), "namespace": namespace, "labels": labels},
        "data": {CONFIG_FILE: config_text}}
    if kept := layout_annotation(status):
        cm["metadata"]["annotations"] = kept
    spark = spec.spark
    env = [var for _, var in secret_refs(spec)]
    conf = {**with_jvm_defaults(spark.spark_conf), "spark.speculation": "false",
            "spark.kubernetes.driver.annotation.chsink.io/sink": name}
    driver: dict[str, Any] = {
        "cores": spark.driver.cores, "memory": spark.driver.memory,
        "labels": {**spark.driver.labels, **labels}, "configMaps": [{"name": object_name(name), "path": CONFIG_DIR}],
        **pod_extras(env, spark.driver), **pod_template(spark.driver),
        # the job's Prometheus endpoint (rows, inserts, retries, fencing, lag, batch durations)
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "annotations": {**spark.driver.annotations, "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(METRICS_PORT), **restart_annotations(nonce, object_versions or {})},
    }
    if spark.service_account or defaults.service_account:
        driver["serviceAccount"] = spark.service_account or defaults.service_account
    ex = spark.executor
    executor = {"cores": ex.cores, "memory": ex.memory, "instances": ex.instances,
                "labels": {**ex.labels, **labels}, "configMaps": [{"name": object_name(name), "path": CONFIG_DIR}],
                **pod_extras(env, ex), **pod_template(ex)}
    if ex.annotations:
        executor["annotations"] = dict(ex.annotations)
    if ex.service_account:
        executor["serviceAccount"] = ex.service_account
    for pod, out in ((spark.driver, driver), (ex, executor)):
        for key, value in (("coreRequest", pod.core_request), ("coreLimit", pod.core_limit),
                           ("memoryOverhead", pod.memory_overhead)):
            if value:
                out[key] = value
    app_spec: dict[str, Any] = {
        "type": "Python", "pythonVersion": "3", "mode": "cluster",
        "image": spark.image or defaults.image, "imagePullPolicy": spark.image_pull_policy,
        "mainApplicationFile": MAIN_FILE,
        "arguments": ["run", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}", "--metrics-port", str(METRICS_PORT)],
        "sparkVersion": spark.version or defaults.spark_version, "sparkConf": dict(sorted(conf.items())),
        # a stream is never "done": restart it after failures, forever, with a pause
        "restartPolicy": {"type": "Always", "onFailureRetryInterval": 10, "onSubmissionFailureRetryInterval": 30},
        "driver": driver, "executor": executor,
        "suspend": suspend or spec.state == DesiredState.PAUSED,
    }
    if spark.volumes:
        app_spec["volumes"] = dump(spark.volumes)
    deps = dict(spark.deps)
    if defaults.packages and "packages" not in deps:
        deps["packages"] = list(defaults.packages)
    if deps:
        app_spec["deps"] = deps
    digest = spec_hash({"config": config_text, "spark": app_spec, "nonce": nonce})
    app = {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
           "metadata": {"name": object_name(name), "namespace": namespace, "labels": labels,
                        "annotations": {HASH_ANNOTATION: digest}},
           "spec": app_spec}
    return cm, app


def checkpoint_job_name(name: str) -> str:
    return f"{object_name(name)}-checkpoint-cleanup"


# the cleanup Job's local Spark session: the smallest heap Spark starts with (it refuses under 450 MB:
# INVALID_DRIVER_MEMORY), in a pod sized for it and the JVM's own memory
CLEANUP_JVM_HEAP = "512m"
CLEANUP_RESOURCES = {"requests": {"cpu": "100m", "memory": "768Mi"}, "limits": {"memory": "1280Mi"}}


def checkpoint_job(namespace: str, name: str, spec: SinkSpec, sink: str, defaults: Defaults = Defaults(),
                   ) -> dict[str, Any]:
    """The Job that deletes a remote checkpoint (s3a://, hdfs://...) of a deleted sink, running
    `delete-checkpoint` with the sparkConf's Hadoop settings."""
    hadoop = {k: v for k, v in sorted(spec.spark.spark_conf.items()) if k.startswith("spark.hadoop.")}
    conf = [f"--conf={k}={v}" for k, v in {**hadoop, "spark.driver.memory": CLEANUP_JVM_HEAP}.items()]
    return _driver_job(namespace, name, spec, defaults, "checkpoint-cleanup", checkpoint_job_name(name),
                       ["delete-checkpoint", f"--location={spec.checkpoint_location}", f"--sink={sink}", *conf],
                       CLEANUP_RESOURCES, deadline_s=600)


def verify_job_name(name: str) -> str:
    return f"{object_name(name)}-verify"


# the verifier reads Kafka and ClickHouse from Python, without Spark: counts, and offsets only where they differ
VERIFY_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
_CONFIG_VOLUME = "chsink-config"


def verify_job(namespace: str, name: str, spec: SinkSpec, window_s: float, defaults: Defaults = Defaults(),
               ) -> dict[str, Any]:
    """A run of the scheduled verifier (spec.verify): `verify --settled-window` on the sink's ConfigMap, with the
    Secrets the job reads, as env vars named as the job's."""
    job = _driver_job(namespace, name, spec, defaults, "verify", verify_job_name(name),
                      ["verify", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}", "--settled-window", f"{window_s:g}"],
                      VERIFY_RESOURCES, deadline_s=3600, env=[var for _, var in secret_refs(spec)])
    pod = job["spec"]["template"]["spec"]
    pod["volumes"] = [*pod.get("volumes", []), {"name": _CONFIG_VOLUME, "configMap": {"name": object_name(name)}}]
    container = pod["containers"][0]
    container["volumeMounts"] = [*container.get("volumeMounts", []),
                                 {"name": _CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True}]
    return job


def _driver_job(namespace: str, name: str, spec: SinkSpec, defaults: Defaults, component: str, job_name: str,
                args: list[str], resources: dict[str, Any], deadline_s: int,
                env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Job of the job's image run as the driver is: its ServiceAccount, env, envFrom, volumes and pod template
    (scheduling and security, under a pod's own names)."""
    spark = spec.spark
    container: dict[str, Any] = {
        "name": component, "image": spark.image or defaults.image, "imagePullPolicy": spark.image_pull_policy,
        "command": ["python3", "/opt/chsink/main.py", *args], "resources": resources,
        **pod_extras(env or [], spark.driver)}
    template = pod_template(spark.driver)
    container["securityContext"] = template.pop("securityContext")
    pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [container],
                           "securityContext": template.pop("podSecurityContext"), **template}
    if spark.service_account or defaults.service_account:
        pod["serviceAccountName"] = spark.service_account or defaults.service_account
    if spark.volumes:
        pod["volumes"] = dump(spark.volumes)
    labels = {**sink_labels(name), "app.kubernetes.io/component": component}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": job_name, "namespace": namespace, "labels": labels},
            # a try or two for a flaky store; kept an hour for `kubectl logs` should the operator not delete it
            "spec": {"backoffLimit": 1, "activeDeadlineSeconds": deadline_s, "ttlSecondsAfterFinished": 3600,
                     "template": {"metadata": {"labels": labels}, "spec": pod}}}
