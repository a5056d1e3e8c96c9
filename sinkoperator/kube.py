"""The operator's Kubernetes API calls for the objects it owns (ConfigMap, SparkApplication), the pods the
spark-operator runs for them, the Spark driver's identity in a sink's namespace, and the Secrets a sink names.
Status is written by status.py alone."""

from __future__ import annotations

import base64
import os
import time
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

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


def live_pods(namespace: str, app_name: str) -> list[str]:
    """The application's pods whose containers may still run ("name (role)"), driver first. A pod being
    deleted counts until it is gone: a suspended or deleted application's driver finishes the batch it is in
    after SIGTERM, and its executors the inserts they send."""
    pods = client.CoreV1Api().list_namespaced_pod(namespace, label_selector=f"{APP_POD_LABEL}={app_name}").items
    live = [(p.metadata, p.status) for p in pods if p.metadata is not None]
    roles = [((meta.labels or {}).get("spark-role", "pod"), str(meta.name)) for meta, st in live
             if (st.phase if st else None) not in ("Succeeded", "Failed")]
    return [f"{name} ({role})" for role, name in sorted(roles, key=lambda r: (r[0] != "driver", r[1]))]


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
    if (current.data or {}) == cm["data"]:
        return "unchanged"
    core.patch_namespaced_config_map(name, ns, {"data": cm["data"]})
    return "patched"


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
    """A Secret the sink names cannot be read, or lacks the key: fixed outside the spec, so retried."""


def secret_values(namespace: str, refs: list[tuple[str, dict[str, Any]]]) -> dict[str, str]:
    """Env name -> value for (spec field, secretKeyRef env var) pairs, read with `get` on exactly the Secrets
    they name; errors name the field, the Secret and the key."""
    core = client.CoreV1Api()
    secrets: dict[str, dict[str, Any]] = {}
    out: dict[str, str] = {}
    for field, var in refs:
        ref = var["valueFrom"]["secretKeyRef"]
        if ref["name"] not in secrets:
            try:
                secrets[ref["name"]] = core.read_namespaced_secret(ref["name"], namespace).data or {}
            except ApiException as e:
                why = {404: "it does not exist",
                       403: "the operator may not read it (RBAC: add it to the chart's rbac.secretNames)"}.get(
                    e.status, f"{e.status} {e.reason}")
                raise SecretUnavailableError(f"{field}: cannot read Secret {namespace}/{ref['name']}: {why}") \
                    from None
        data = secrets[ref["name"]]
        if ref["key"] not in data:
            raise SecretUnavailableError(f"{field}: Secret {namespace}/{ref['name']} has no key {ref['key']!r}")
        out[var["name"]] = base64.b64decode(data[ref["key"]]).decode()
    return out


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
