"""The operator's Kubernetes API calls for the objects it owns (ConfigMap, SparkApplication, a deleted sink's
checkpoint cleanup Job), the pods the spark-operator runs for them, the Spark driver's identity in a sink's
namespace, and the Secrets a sink names. Status is written by status.py alone."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .podspec import CONFIG_MAP, ObjectUse, env_object_uses
from .spec import GROUP, HASH_ANNOTATION, LOST_EXECUTOR_STATES, PLURAL, SPARK, VERSION


class SparkOperatorMissingError(Exception):
    """The API server does not serve SparkApplications: the spark-operator (its CRDs) is not installed."""

    def __init__(self) -> None:
        super().__init__(f"the SparkApplication API ({SPARK[0]}/{SPARK[1]}) is not installed: install the "
                         "spark-operator (its CRDs), then the sink is deployed")


def load_config() -> None:
    """In-cluster service account, else $KUBECONFIG read now (the client library reads it at import)."""
    from kubernetes import config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # type: ignore[no-untyped-call]


def _api_missing(e: ApiException) -> bool:
    """A 404 for an API the server does not serve has a plain-text body; a missing object's is a JSON Status."""
    return e.status == 404 and not (e.body or "").lstrip().startswith("{")


def get_app(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        app = client.CustomObjectsApi().get_namespaced_custom_object(*SPARK[:2], namespace, SPARK[2], name)
        return app if isinstance(app, dict) else None
    except ApiException as e:
        if _api_missing(e):
            raise SparkOperatorMissingError() from None
        if e.status == 404:
            return None
        raise


def get_sink(namespace: str, name: str) -> dict[str, Any] | None:
    """The ClickHouseSink as it is now (None when gone)."""
    try:
        obj = client.CustomObjectsApi().get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return obj if isinstance(obj, dict) else None
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def annotate_sink(namespace: str, name: str, annotations: dict[str, str | None]) -> None:
    """Sets (None: removes) annotations of the ClickHouseSink."""
    client.CustomObjectsApi().patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                             {"metadata": {"annotations": annotations}})


def app_message(app: dict[str, Any] | None) -> str:
    """The spark-operator's errorMessage for the application ("" when none)."""
    return str(((app or {}).get("status") or {}).get("applicationState", {}).get("errorMessage", ""))[:1000]


def app_executors(app: dict[str, Any] | None, keep: int = 10) -> tuple[int, list[str]]:
    """(executor pods running, the last `keep` lost ones by executor number), from the executorState the
    spark-operator keeps for the application's current run."""
    states = {str(k): str(v) for k, v in (((app or {}).get("status") or {}).get("executorState") or {}).items()}
    lost = sorted((n for n, s in states.items() if s in LOST_EXECUTOR_STATES), key=lambda n: (len(n), n))
    return sum(s == "RUNNING" for s in states.values()), lost[-keep:]


def app_state(app: dict[str, Any] | None) -> str:
    """The SparkApplication's state as the spark-operator reports it ("" when unknown)."""
    return str(((app or {}).get("status") or {}).get("applicationState", {}).get("state", ""))


# the label the spark-operator puts on every pod of an application, the driver's and the executors'
APP_POD_LABEL = f"{SPARK[0]}/app-name"


@dataclass(frozen=True)
class Exit:
    """How a pod's Spark container ended, as the kubelet recorded it."""

    code: int
    message: str  # the container's termination message (the job writes its error's line there)
    finished_at: str


@dataclass(frozen=True)
class Pod:
    """One pod of an application, as much of it as the operator decides on."""

    name: str
    role: str  # driver or executor (the spark-role label)
    live: bool  # its containers may still run
    config_maps: frozenset[str]  # the ConfigMaps its volumes mount
    failed: Exit | None = None  # its Spark container exited with an error

    @property
    def label(self) -> str:
        return f"{self.name} ({self.role})"


def app_pods(namespace: str, app_name: str) -> list[Pod]:
    """The application's pods, driver first. A pod being deleted counts as live until it is gone: a suspended
    or deleted application's driver finishes the batch it is in after SIGTERM, and its executors the inserts
    they send."""
    found = client.CoreV1Api().list_namespaced_pod(namespace, label_selector=f"{APP_POD_LABEL}={app_name}").items
    pods = [Pod(str(p.metadata.name), (p.metadata.labels or {}).get("spark-role", "pod"),
                (p.status.phase if p.status else None) not in ("Succeeded", "Failed"),
                frozenset(str(v.config_map.name) for v in (p.spec.volumes if p.spec else None) or [] if v.config_map),
                _failed(p.status))
            for p in found if p.metadata is not None]
    return sorted(pods, key=lambda p: (p.role != "driver", p.name))


SPARK_CONTAINERS = ("spark-kubernetes-driver", "spark-kubernetes-executor")


def _failed(status: Any) -> Exit | None:
    for c in (status.container_statuses if status else None) or []:
        ended = c.state.terminated if c.state else None
        if c.name in SPARK_CONTAINERS and ended is not None and ended.exit_code:
            at = ended.finished_at.isoformat() if ended.finished_at else ""
            return Exit(int(ended.exit_code), str(ended.message or "").strip(), at)
    return None


def live_pods(namespace: str, app_name: str) -> list[str]:
    """The application's pods whose containers may still run ("name (role)"), driver first."""
    return [p.label for p in app_pods(namespace, app_name) if p.live]


def spark_app_spec_fields() -> frozenset[str] | None:
    """The fields the installed SparkApplication CRD's v1beta2 spec has (the API server prunes any other);
    None when the CRD cannot be read (not installed, or the operator may not get it)."""
    try:  # read raw: the client's models for a schema of 10,000 lines cost more than the check
        resp = client.ApiextensionsV1Api().read_custom_resource_definition(f"{SPARK[2]}.{SPARK[0]}",
                                                                          _preload_content=False)
    except ApiException as e:
        if e.status in (403, 404):
            return None
        raise
    crd: dict[str, Any] = json.loads(resp.data)  # type: ignore[attr-defined]  # the raw response
    for v in crd.get("spec", {}).get("versions") or []:
        if v.get("name") == SPARK[1]:
            spec = v.get("schema", {}).get("openAPIV3Schema", {}).get("properties", {}).get("spec", {})
            return frozenset(spec.get("properties") or ())
    return None


def apply_configmap(cm: dict[str, Any]) -> str:
    core = client.CoreV1Api()
    ns, name = cm["metadata"]["namespace"], cm["metadata"]["name"]
    try:
        current = core.read_namespaced_config_map(name, ns)
    except ApiException as e:
        if e.status != 404:
            raise
        core.create_namespaced_config_map(ns, cm)  # type: ignore[arg-type]
        return "created"
    ours = cm["metadata"].get("annotations") or {}
    if (current.data or {}) == cm["data"] and all(
            ((current.metadata and current.metadata.annotations) or {}).get(k) == v for k, v in ours.items()):
        return "unchanged"
    core.patch_namespaced_config_map(name, ns, {"metadata": {"annotations": ours}, "data": cm["data"]})
    return "patched"


def configmap_annotations(namespace: str, name: str) -> dict[str, str]:
    """A ConfigMap's annotations ({} when it does not exist)."""
    try:
        meta = client.CoreV1Api().read_namespaced_config_map(name, namespace).metadata
        return dict((meta and meta.annotations) or {})
    except ApiException as e:
        if e.status == 404:
            return {}
        raise


def apply_app(app: dict[str, Any]) -> str:
    """Creates the SparkApplication, or replaces its spec whole when the spec hash changed: a merge patch would
    keep every key render() no longer gives (a removed sparkConf key, deps entry or coreRequest). The
    replace carries the read's resourceVersion, so a concurrent writer makes it fail and be retried, never lost;
    labels and annotations others set are kept beside ours."""
    api = client.CustomObjectsApi()
    ns, name = app["metadata"]["namespace"], app["metadata"]["name"]
    current = get_app(ns, name)
    if current is None:
        api.create_namespaced_custom_object(*SPARK[:2], ns, SPARK[2], app)
        return "created"
    meta = current["metadata"]
    if (meta.get("annotations") or {}).get(HASH_ANNOTATION) == app["metadata"]["annotations"][HASH_ANNOTATION]:
        return "unchanged"
    ours = app["metadata"]
    body = {**app, "metadata": {
        "name": name, "namespace": ns, "resourceVersion": meta["resourceVersion"],
        "labels": {**(meta.get("labels") or {}), **(ours.get("labels") or {})},
        "annotations": {**(meta.get("annotations") or {}), **ours["annotations"]},
        "ownerReferences": ours.get("ownerReferences", meta.get("ownerReferences", []))}}
    api.replace_namespaced_custom_object(*SPARK[:2], ns, SPARK[2], name, body)
    return "patched"


def delete_app(namespace: str, name: str, wait_s: float = 0) -> bool:
    """Deletes the SparkApplication; with wait_s, waits (bounded) until it is gone."""
    try:
        client.CustomObjectsApi().delete_namespaced_custom_object(*SPARK[:2], namespace, SPARK[2], name)
    except ApiException as e:
        if e.status != 404:
            raise
        return False  # gone, or the API itself is (then no application exists either)
    deadline = time.monotonic() + wait_s
    while wait_s and get_app(namespace, name) is not None:
        if time.monotonic() > deadline:
            raise kopf.TemporaryError(f"SparkApplication {name} still exists after {wait_s:.0f}s", delay=10)
        time.sleep(0.5)
    return True


@dataclass(frozen=True)
class JobRun:
    """Where a Job is: done (succeeded or failed) or not, with its pod's termination message once done."""

    done: bool
    succeeded: bool
    message: str


def job_run(namespace: str, name: str) -> JobRun | None:
    """The Job's run, None when there is no such Job."""
    try:
        job = client.BatchV1Api().read_namespaced_job(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    st = job.status
    succeeded, failed = bool(st and st.succeeded), bool(st and st.failed and any(
        c.type == "Failed" and c.status == "True" for c in st.conditions or []))
    if not (succeeded or failed):
        return JobRun(False, False, "")
    pods = client.CoreV1Api().list_namespaced_pod(namespace, label_selector=f"job-name={name}").items
    messages = [str(c.state.terminated.message or "").strip() for p in pods if p.status
                for c in p.status.container_statuses or [] if c.state and c.state.terminated]
    return JobRun(True, succeeded, next((m for m in reversed(messages) if m), ""))


def create_job(job: dict[str, Any]) -> None:
    try:
        client.BatchV1Api().create_namespaced_job(job["metadata"]["namespace"], job)  # type: ignore[arg-type]
    except ApiException as e:
        if e.status != 409:  # created by an earlier try
            raise


def delete_job(namespace: str, name: str) -> None:
    """Deletes the Job and, in the background, its pods."""
    try:
        client.BatchV1Api().delete_namespaced_job(name, namespace, propagation_policy="Background")
    except ApiException as e:
        if e.status != 404:
            raise


_IDENTITIES: set[tuple[str, str, str]] = set()  # (namespace, account, role) known to exist: one check each


def ensure_driver_identity(namespace: str, account: str, role: str) -> list[str]:
    """Creates the Spark driver's ServiceAccount and its RoleBinding to `role` (a ClusterRole) in the sink's
    namespace when missing; returns what it created. Create only: an existing object, maybe the user's own,
    is never changed."""
    if (namespace, account, role) in _IDENTITIES:
        return []
    labels = {"app.kubernetes.io/managed-by": "chsink"}
    account_body: Any = {"metadata": {"name": account, "labels": labels}}
    # named after the role, as the chart names it: a roleRef cannot change, and installs differ in roles
    binding_body: Any = {"metadata": {"name": role, "labels": labels},
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]}
    created = []
    objects: list[tuple[str, Any]] = [
        (f"ServiceAccount {namespace}/{account}",
         lambda: client.CoreV1Api().create_namespaced_service_account(namespace, account_body)),
        (f"RoleBinding {namespace}/{role}",
         lambda: client.RbacAuthorizationV1Api().create_namespaced_role_binding(namespace, binding_body))]
    for what, create in objects:
        try:
            create()
            created.append(what)
        except ApiException as e:
            if e.status != 409:
                raise
    _IDENTITIES.add((namespace, account, role))
    return created


class SecretUnavailableError(Exception):
    """A Secret or ConfigMap the sink names cannot be read, or lacks the key: fixed outside the spec, so retried."""


def _secrets(namespace: str, uses: Iterable[ObjectUse]) -> dict[str, client.V1Secret]:
    """The Secrets `uses` name, each read once with `get`, each holding the key it is used for; a missing optional
    one is left out. Errors name the field, the Secret and the key."""
    core = client.CoreV1Api()
    secrets: dict[str, client.V1Secret] = {}
    missing: set[str] = set()
    for use in uses:
        if use.name not in secrets and use.name not in missing:
            try:
                secrets[use.name] = core.read_namespaced_secret(use.name, namespace)
            except ApiException as e:
                if e.status == 404 and use.optional:
                    missing.add(use.name)
                    continue
                raise _unreadable(e, "Secret", namespace, use) from None
        if use.name in secrets and use.key is not None and use.key not in (secrets[use.name].data or {}) \
                and not use.optional:
            raise SecretUnavailableError(f"{use.field}: Secret {namespace}/{use.name} has no key {use.key!r}")
    return secrets


def secret_values(namespace: str, refs: list[tuple[str, dict[str, Any]]]) -> dict[str, str]:
    """Env name -> value for (spec field, secretKeyRef env var) pairs."""
    secrets = _secrets(namespace, env_object_uses(refs))
    out: dict[str, str] = {}
    for _, var in refs:
        ref = var["valueFrom"]["secretKeyRef"]
        out[var["name"]] = base64.b64decode((secrets[ref["name"]].data or {})[ref["key"]]).decode()
    return out


def object_versions(namespace: str, uses: Iterable[ObjectUse]) -> dict[str, str]:
    """Secret name (or "configmap/" + ConfigMap name) -> resourceVersion, for the objects `uses` name: a change of
    one changes it (values never leave the Secret: a hash of a short password in an annotation could be guessed
    back)."""
    uses = list(uses)
    versions = {name: _version(secret)
                for name, secret in _secrets(namespace, [u for u in uses if u.kind != CONFIG_MAP]).items()}
    core = client.CoreV1Api()
    for use in (u for u in uses if u.kind == CONFIG_MAP):
        if f"configmap/{use.name}" in versions:
            continue
        try:
            versions[f"configmap/{use.name}"] = _version(core.read_namespaced_config_map(use.name, namespace))
        except ApiException as e:
            if e.status == 404 and use.optional:
                continue
            raise _unreadable(e, "ConfigMap", namespace, use) from None
    return versions


def _unreadable(e: ApiException, kind: str, namespace: str, use: ObjectUse) -> SecretUnavailableError:
    """Why an object a pod reads cannot be read, naming the spec field that reads it."""
    why = {404: "it does not exist",
           403: "the operator may not read it (RBAC: add it to the chart's rbac.secretNames)"}.get(
        e.status, f"{e.status} {e.reason}")
    return SecretUnavailableError(f"{use.field}: cannot read {kind} {namespace}/{use.name}: {why}")


def _version(obj: Any) -> str:
    return str(obj.metadata.resource_version if obj.metadata else "")


def upsert_status_object(group_version: tuple[str, str], namespace: str, plural: str, obj: dict[str, Any]) -> None:
    """Creates a namespaced custom object, or patches its status when it exists."""
    api = client.CustomObjectsApi()
    try:
        api.create_namespaced_custom_object(*group_version, namespace, plural, obj)
    except ApiException as e:
        if e.status != 409:
            raise
        api.patch_namespaced_custom_object(*group_version, namespace, plural, obj["metadata"]["name"],
                                           {"status": obj["status"]})


def patch_status(group_version: tuple[str, str], namespace: str, plural: str, name: str,
                 status: dict[str, Any]) -> None:
    client.CustomObjectsApi().patch_namespaced_custom_object_status(*group_version, namespace, plural, name,
                                                                    {"status": status})
