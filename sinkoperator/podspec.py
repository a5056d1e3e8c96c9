"""The parts of a Kubernetes pod a ClickHouseSink may give its Spark pods: environment from Secrets and
ConfigMaps, volumes, and the pod template's scheduling, security and metadata (pure).

Each is the core/v1 type under its own field names, narrowed to what a sink needs (a checkpoint on S3 with its
credentials from a Secret, or on a PersistentVolumeClaim): a field outside them is refused by name, where a
free-form object would reach the pod, or be dropped by the spark-operator, without a word.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, NamedTuple

from pydantic import Field, model_validator

from sparkapp.config import Strict

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?([KMGTPE]i?|[kmgtpe])?$"
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"  # what the API server takes for an environment variable's name
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def _one_of(model: Strict, fields: tuple[str, ...], what: str) -> None:
    given = [f for f in fields if getattr(model, f) is not None]
    if len(given) != 1:
        names = ", ".join(type(model).model_fields[f].alias or f for f in fields)
        raise ValueError(f"{what} takes exactly one of {names}")


class KeySelector(Strict):
    name: str = Field(min_length=1)
    key: str = Field(min_length=1)
    optional: bool | None = None


class FieldSelector(Strict):
    field_path: str = Field(alias="fieldPath", min_length=1)
    api_version: str | None = Field(default=None, alias="apiVersion")


class EnvVarSource(Strict):
    secret_key_ref: KeySelector | None = Field(default=None, alias="secretKeyRef")
    config_map_key_ref: KeySelector | None = Field(default=None, alias="configMapKeyRef")
    field_ref: FieldSelector | None = Field(default=None, alias="fieldRef")

    @model_validator(mode="after")
    def _one(self) -> EnvVarSource:
        _one_of(self, ("secret_key_ref", "config_map_key_ref", "field_ref"), "valueFrom")
        return self


class EnvVar(Strict):
    name: str = Field(pattern=ENV_NAME)
    value: str | None = None
    value_from: EnvVarSource | None = Field(default=None, alias="valueFrom")

    @model_validator(mode="after")
    def _one(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env {self.name}: give value or valueFrom, not both")
        return self


class LocalRef(Strict):
    name: str = Field(min_length=1)
    optional: bool | None = None


class EnvFromSource(Strict):
    prefix: str | None = None
    secret_ref: LocalRef | None = Field(default=None, alias="secretRef")
    config_map_ref: LocalRef | None = Field(default=None, alias="configMapRef")

    @model_validator(mode="after")
    def _one(self) -> EnvFromSource:
        _one_of(self, ("secret_ref", "config_map_ref"), "envFrom")
        return self


class KeyToPath(Strict):
    key: str = Field(min_length=1)
    path: str = Field(min_length=1)
    mode: int | None = Field(default=None, ge=0, le=0o777)


class SecretVolume(Strict):
    secret_name: str = Field(alias="secretName", min_length=1)
    items: list[KeyToPath] | None = Field(default=None, max_length=64)
    default_mode: int | None = Field(default=None, alias="defaultMode", ge=0, le=0o777)
    optional: bool | None = None


class ConfigMapVolume(Strict):
    name: str = Field(min_length=1)
    items: list[KeyToPath] | None = Field(default=None, max_length=64)
    default_mode: int | None = Field(default=None, alias="defaultMode", ge=0, le=0o777)
    optional: bool | None = None


class ClaimVolume(Strict):
    claim_name: str = Field(alias="claimName", min_length=1)
    read_only: bool | None = Field(default=None, alias="readOnly")


class EmptyDirVolume(Strict):
    medium: Literal["", "Memory"] | None = None
    size_limit: str | None = Field(default=None, alias="sizeLimit", pattern=QUANTITY)


class Volume(Strict):
    name: str = Field(pattern=DNS_LABEL, max_length=63)
    persistent_volume_claim: ClaimVolume | None = Field(default=None, alias="persistentVolumeClaim")
    secret: SecretVolume | None = None
    config_map: ConfigMapVolume | None = Field(default=None, alias="configMap")
    empty_dir: EmptyDirVolume | None = Field(default=None, alias="emptyDir")

    @model_validator(mode="after")
    def _one(self) -> Volume:
        _one_of(self, ("persistent_volume_claim", "secret", "config_map", "empty_dir"), f"volume {self.name}")
        return self


class VolumeMount(Strict):
    name: str = Field(min_length=1)
    mount_path: str = Field(alias="mountPath", pattern=r"^/")
    sub_path: str | None = Field(default=None, alias="subPath")
    read_only: bool | None = Field(default=None, alias="readOnly")


class PodExtras(Strict):
    """What a driver or an executor pod gets beyond its resources: its environment and mounts, and its template
    (scheduling, security, metadata)."""

    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    env_from: list[EnvFromSource] = Field(default_factory=list, alias="envFrom", max_length=16)
    volume_mounts: list[VolumeMount] = Field(default_factory=list, alias="volumeMounts", max_length=32)
    # Kubernetes' own types, checked by the CRD with core/v1's schemas (KUBERNETES_TYPED); passed through whole
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, max_length=32)
    affinity: dict[str, Any] | None = None
    pod_security_context: dict[str, Any] | None = Field(default=None, alias="podSecurityContext")
    security_context: dict[str, Any] | None = Field(default=None, alias="securityContext")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    priority_class_name: str | None = Field(default=None, alias="priorityClassName", pattern=DNS_SUBDOMAIN,
                                            max_length=253)
    termination_grace_period_seconds: int | None = Field(default=None, alias="terminationGracePeriodSeconds", ge=0)

    @model_validator(mode="after")
    def _owned_metadata(self) -> PodExtras:
        for what, keys in (("labels", self.labels), ("annotations", self.annotations)):
            if owned := sorted(k for k in keys if k.split("/", 1)[0] in OWNED_PREFIXES or k in OWNED_LABELS):
                raise ValueError(f"{what}: {owned} are set by the operator or the spark-operator")
        return self


# the template fields whose schema is core/v1's, as the spark-operator's CRD has them (tests compare the two)
KUBERNETES_TYPED = ("tolerations", "affinity", "podSecurityContext", "securityContext")
# label and annotation keys the operator and the spark-operator set on the pods and select them by
OWNED_PREFIXES = frozenset({"chsink.io", "sparkoperator.k8s.io", "prometheus.io"})
OWNED_LABELS = frozenset({"spark-role", "spark-app-selector", "spark-app-name", "spark-exec-id",
                          "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by"})

# Pod Security `restricted` for the Spark pods when a sink gives no security context: non-root (the Spark
# image's user, 185), no privilege escalation, every capability dropped, the runtime's default seccomp profile;
# fsGroup makes a mounted volume (a checkpoint's PVC) writable by that user.
SPARK_USER = 185
RESTRICTED_POD: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": SPARK_USER, "fsGroup": SPARK_USER,
                                  "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                        "runAsNonRoot": True}


class ObjectUse(NamedTuple):
    """A Secret or ConfigMap a sink's pods read: the spec field naming it, its name, the key it must hold (None:
    the whole object), whether it may be missing, and its kind."""

    field: str
    name: str
    key: str | None
    optional: bool
    kind: str = "Secret"


CONFIG_MAP = "ConfigMap"


def object_uses(field: str, pod: PodExtras, volumes: list[Volume]) -> Iterator[ObjectUse]:
    """The Secrets and ConfigMaps `pod` (at `field`) reads through its env, envFrom and the volumes it mounts."""
    for i, var in enumerate(pod.env):
        source = var.value_from
        for ref, kind in ((source.secret_key_ref, "Secret"), (source.config_map_key_ref, CONFIG_MAP)) if source else ():
            if ref is not None:
                yield ObjectUse(f"{field}.env[{i}]", ref.name, ref.key, bool(ref.optional), kind)
    for i, src in enumerate(pod.env_from):
        for whole, kind in ((src.secret_ref, "Secret"), (src.config_map_ref, CONFIG_MAP)):
            if whole is not None:
                yield ObjectUse(f"{field}.envFrom[{i}]", whole.name, None, bool(whole.optional), kind)
    mounted = {m.name for m in pod.volume_mounts}
    for i, vol in enumerate(volumes):
        if vol.name not in mounted:
            continue
        if vol.secret is not None:
            yield ObjectUse(f"spec.spark.volumes[{i}]", vol.secret.secret_name, None, bool(vol.secret.optional))
        if vol.config_map is not None:
            yield ObjectUse(f"spec.spark.volumes[{i}]", vol.config_map.name, None, bool(vol.config_map.optional),
                            CONFIG_MAP)


def env_object_uses(refs: list[tuple[str, dict[str, Any]]]) -> list[ObjectUse]:
    """(spec field, secretKeyRef env var) pairs as the Secrets they read."""
    return [ObjectUse(field, var["valueFrom"]["secretKeyRef"]["name"], var["valueFrom"]["secretKeyRef"]["key"], False)
            for field, var in refs]


def dump(items: list[Any]) -> list[dict[str, Any]]:
    """Models as the pod spec takes them: Kubernetes' field names, unset fields left out."""
    return [m.model_dump(by_alias=True, exclude_none=True, mode="json") for m in items]
