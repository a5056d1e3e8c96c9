"""The ClickHouseSink's spec and status as typed models (pure).

The CRD's schema checks shapes at apply time (and CEL rules what it can express); these models are what the
operator works with, and their validators hold the checks the API server cannot do, each naming its
`spec.` field. The sections the job reads unchanged (format, batching, dlq) are the job's own models.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sparkapp.config import BatchingConfig, ConfigError, DlqConfig, FormatConfig, Strict, validation_lines

from .podspec import DNS_SUBDOMAIN, ObjectUse, PodExtras, Volume, object_uses
from .spec import (
    CONFIG_DIR,
    OWNED_ENV,
    OWNED_ENV_PREFIX,
    AppState,
    ConditionType,
    DesiredState,
    RebalancePhase,
    SinkState,
    VerifyResult,
)

CPU = r"^[0-9]+(\.[0-9]+)?m?$"  # Spark's cores as Kubernetes takes them: "1", "0.5", "500m"
JVM_MEMORY = r"^[0-9]+[kmgtKMGT]?$"  # a JVM size as Spark takes it: "512m", "2g"

# the operator must own these Spark settings: a user value would silently break a promise
OWNED_SPARK_CONF = {
    "spark.speculation": "a speculative copy of a task would write the same Kafka partition's windows in "
                         "parallel with the original; chsink runs with speculation off",
}
NAME_MAX = 45  # chsink-<name>: the spark-operator derives Services (63-character DNS labels) from it


class SecretRefName(Strict):
    name: str = Field(min_length=1)


class CertSecretSource(Strict):
    """A certificate in a Secret, as Strimzi names it: a cluster CA Secret (`<cluster>-cluster-ca-cert`, key
    `ca.crt`) as it is."""

    secret_name: str = Field(alias="secretName", pattern=DNS_SUBDOMAIN)
    certificate: str = Field(min_length=1)


class CertAndKeySecretSource(CertSecretSource):
    """A certificate and its PEM key in a Secret: a KafkaUser's (`user.crt`, `user.key`) as it is."""

    key: str = Field(min_length=1)


class PasswordSecretSource(Strict):
    secret_name: str = Field(alias="secretName", pattern=DNS_SUBDOMAIN)
    password: str = Field(min_length=1)


class KafkaTls(Strict):
    """spec.kafka.tls: TLS to the brokers, trusting these certificates."""

    trusted_certificates: list[CertSecretSource] = Field(alias="trustedCertificates", min_length=1, max_length=16)


class KafkaAuthentication(Strict):
    """spec.kafka.authentication, as Strimzi's KafkaClientAuthentication* types spell it."""

    type: Literal["tls", "scram-sha-512", "scram-sha-256", "plain", "oauth"]
    certificate_and_key: CertAndKeySecretSource | None = Field(default=None, alias="certificateAndKey")
    username: str | None = Field(default=None, min_length=1)
    password_secret: PasswordSecretSource | None = Field(default=None, alias="passwordSecret")

    @model_validator(mode="after")
    def _fields_of_the_type(self) -> KafkaAuthentication:
        if self.type == "oauth":
            raise ValueError("type oauth: not supported: OAUTHBEARER needs a token endpoint, and none runs where "
                             "chsink is tested; use tls or scram-sha-512, or give the clients' own options "
                             "(kafka.options with sourceOptions kafka.sasl.jaas.config)")
        if self.type == "tls":
            if self.certificate_and_key is None:
                raise ValueError("type tls: give certificateAndKey (secretName, certificate, key), e.g. a "
                                 "KafkaUser's Secret with user.crt and user.key")
            if self.username is not None or self.password_secret is not None:
                raise ValueError("type tls takes certificateAndKey, not username or passwordSecret")
        else:
            if self.username is None or self.password_secret is None:
                raise ValueError(f"type {self.type}: give username and passwordSecret (secretName, password)")
            if self.certificate_and_key is not None:
                raise ValueError(f"type {self.type} takes username and passwordSecret, not certificateAndKey")
        return self


# what kafka.tls and kafka.authentication set: a raw option beside them would say it twice, differently
_SECURITY_OPTIONS = ("security.protocol", "sasl.", "ssl.")


class KafkaSpec(Strict):
    bootstrap_servers: str = Field(alias="bootstrapServers", min_length=1)
    topics: list[str] = Field(default_factory=list)
    topic_pattern: str | None = Field(default=None, alias="topicPattern")
    options: dict[str, str] = Field(default_factory=dict)
    secret_ref: SecretRefName | None = Field(default=None, alias="secretRef")
    secret_options: dict[str, str] = Field(default_factory=dict, alias="secretOptions")
    starting_offsets: Literal["earliest", "latest"] | dict[str, dict[int, int]] = Field(
        default="earliest", alias="startingOffsets")
    acknowledge_redelivery: bool = Field(default=False, alias="acknowledgeRedelivery")
    consumer_group: str | None = Field(default=None, alias="consumerGroup")
    tls: KafkaTls | None = None
    authentication: KafkaAuthentication | None = None

    @model_validator(mode="after")
    def _secret_ref(self) -> KafkaSpec:
        if self.secret_options and self.secret_ref is None:
            raise ValueError("secretOptions names keys of a Secret: give secretRef.name, the Secret holding them")
        if self.authentication is not None and self.authentication.type == "tls" and self.tls is None:
            raise ValueError("authentication type tls needs tls.trustedCertificates: client certificates are "
                             "presented over TLS, which trusts the brokers' CA")
        if self.tls is not None or self.authentication is not None:
            clash = sorted(o for o in (*self.options, *self.secret_options) if o.startswith(_SECURITY_OPTIONS))
            if clash:
                raise ValueError(f"options / secretOptions {clash}: set by tls and authentication; give the "
                                 "security one way")
        return self


class ShardSpec(Strict):
    endpoint: str
    database: str | None = None
    replicas: list[str] = Field(default_factory=list)


class CredentialsRef(Strict):
    name: str = Field(min_length=1)
    password_key: str = Field(default="password", alias="passwordKey")


class ClickHouseSpec(Strict):
    shards: list[ShardSpec] = Field(min_length=1)
    database: str = "default"
    tables: dict[str, str] = Field(min_length=1)
    table_field: str | None = Field(default=None, alias="tableField")
    table_header: str | None = Field(default=None, alias="tableHeader")
    username: str | None = None
    request_timeout_s: int | None = Field(default=None, alias="requestTimeoutSeconds", gt=0)
    credentials_secret_ref: CredentialsRef | None = Field(default=None, alias="credentialsSecretRef")
    settings: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _distinct_shards(self) -> ClickHouseSpec:
        seen: dict[tuple[str, str], int] = {}
        for i, s in enumerate(self.shards):
            key = (s.endpoint, s.database or self.database)
            if key in seen:
                raise ValueError(f"shards[{i}] repeats shards[{seen[key]}] ({key[0]}, database {key[1]}): "
                                 "each shard is one (endpoint, database)")
            seen[key] = i
        return self


class ExactlyOnceSpec(Strict):
    engine: str = "KeeperMap"
    table: str = "chsink_state"
    keeper_path: str | None = Field(default=None, alias="keeperPath")


class ShardingSpec(Strict):
    policy: str = "partition"
    key: str | None = None
    hash: str | None = None
    weights: list[int] = Field(default_factory=list)
    stripe: int | None = None


class Driver(PodExtras):
    cores: int = Field(default=1, ge=1)
    # what the pod requests from the scheduler, when less than `cores` (Spark's coreRequest, e.g. "500m")
    core_request: str | None = Field(default=None, alias="coreRequest", pattern=CPU)
    core_limit: str | None = Field(default=None, alias="coreLimit", pattern=CPU)
    memory: str = Field(default="1g", pattern=JVM_MEMORY)
    # beyond the JVM's heap (Python workers, Arrow buffers, off-heap): Spark's default is max(384m, 10%)
    memory_overhead: str | None = Field(default=None, alias="memoryOverhead", pattern=JVM_MEMORY)


class Executor(Driver):
    instances: int = Field(default=1, ge=1)
    # the driver's is spark.serviceAccount; executors call no Kubernetes API, but a workload identity
    # (IRSA, Workload Identity) for a checkpoint's or a table's storage comes with the pod's ServiceAccount
    service_account: str | None = Field(default=None, alias="serviceAccount", pattern=DNS_SUBDOMAIN)


class SparkSpec(Strict):
    image: str | None = None
    image_pull_policy: str = Field(default="IfNotPresent", alias="imagePullPolicy")
    version: str | None = None
    service_account: str | None = Field(default=None, alias="serviceAccount")
    spark_conf: dict[str, str] = Field(default_factory=dict, alias="sparkConf")
    deps: dict[str, Any] = Field(default_factory=dict)
    volumes: list[Volume] = Field(default_factory=list, max_length=32)
    driver: Driver = Field(default_factory=Driver)
    executor: Executor = Field(default_factory=Executor)

    @model_validator(mode="after")
    def _owned_conf(self) -> SparkSpec:
        for key, why in OWNED_SPARK_CONF.items():
            if key in self.spark_conf and self.spark_conf[key].strip().lower() != "false":
                raise ValueError(f"sparkConf {key}={self.spark_conf[key]!r} is not allowed: {why}")
        return self

    @model_validator(mode="after")
    def _pods(self) -> SparkSpec:
        """What the API server would take but the job could not run with: a mount of no volume, a shadowed
        config mount or operator-set variable."""
        names = [v.name for v in self.volumes]
        if dup := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"volumes: {dup} named more than once")
        for role, pod in (("driver", self.driver), ("executor", self.executor)):
            for i, m in enumerate(pod.volume_mounts):
                if m.name not in names:
                    raise ValueError(f"{role}.volumeMounts[{i}]: no volume {m.name!r} in spark.volumes {names}")
                if (m.mount_path.rstrip("/") + "/").startswith(CONFIG_DIR + "/") or \
                        CONFIG_DIR.startswith(m.mount_path.rstrip("/") + "/"):
                    raise ValueError(f"{role}.volumeMounts[{i}]: {m.mount_path} overlaps {CONFIG_DIR}, where the "
                                     "sink's ConfigMap is mounted")
            for i, var in enumerate(pod.env):
                if var.name in OWNED_ENV or var.name.startswith(OWNED_ENV_PREFIX):
                    raise ValueError(f"{role}.env[{i}]: {var.name} is set by the operator (from kafka.secretOptions "
                                     "or clickhouse.credentialsSecretRef)")
        return self

    def object_uses(self) -> list[ObjectUse]:
        """The Secrets the driver and the executors read through their own env, envFrom and volumes."""
        return [*object_uses("spec.spark.driver", self.driver, self.volumes),
                *object_uses("spec.spark.executor", self.executor, self.volumes)]


DURATION = r"^[0-9]+(s|m|h)$"  # "90s", "10m", "6h"


def seconds(duration: str) -> int:
    """A DURATION in seconds."""
    return int(duration[:-1]) * {"s": 1, "m": 60, "h": 3600}[duration[-1]]


class VerifySpec(Strict):
    """spec.verify: the verifier, run by the operator as a Job, over the offsets settled since its last run."""

    schedule: str = Field(default="30m", pattern=DURATION,
                          description="how long after one run the next starts (a duration: 90s, 30m, 6h)")
    window: str = Field(default="10m", pattern=DURATION,
                        description="an offset is checked once Kafka has held it this long and it was delivered")

    @property
    def schedule_s(self) -> int:
        return seconds(self.schedule)

    @property
    def window_s(self) -> int:
        return seconds(self.window)


class SinkSpec(Strict):
    """spec of a ClickHouseSink."""

    kafka: KafkaSpec
    clickhouse: ClickHouseSpec
    format: FormatConfig = Field(default_factory=FormatConfig)
    exactly_once: ExactlyOnceSpec = Field(default_factory=ExactlyOnceSpec, alias="exactlyOnce")
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    sharding: ShardingSpec = Field(default_factory=ShardingSpec)
    dlq: DlqConfig = Field(default_factory=DlqConfig)
    checkpoint_location: str = Field(alias="checkpointLocation", min_length=1)
    spark: SparkSpec = Field(default_factory=SparkSpec)
    state: DesiredState = DesiredState.RUNNING
    deletion_policy: str = Field(default="Retain", alias="deletionPolicy")
    verify: VerifySpec | None = None

    @classmethod
    def parse(cls, spec: Any, name: str = "") -> SinkSpec:
        """The spec, or ConfigError naming each wrong `spec.` field (and metadata.name)."""
        lines = []
        if len(name) > NAME_MAX:
            lines.append(f"  metadata.name: {len(name)} characters; at most {NAME_MAX} (it names the "
                         f"SparkApplication chsink-{name[:8]}..., whose Services Kubernetes limits to 63)")
        try:
            out = cls.model_validate(dict(spec or {}))
        except ValidationError as e:
            lines += validation_lines(e, "spec")
        if lines:
            raise ConfigError("invalid ClickHouseSink:\n" + "\n".join(lines))
        return out

    def raw(self, section: BaseModel) -> dict[str, Any]:
        """A section as the user wrote it (the fields they set), for the job's config."""
        return section.model_dump(by_alias=True, exclude_unset=True, mode="json")


class Condition(BaseModel):
    """A metav1.Condition."""

    model_config = ConfigDict(populate_by_name=True)
    type: ConditionType
    status: str
    reason: str
    message: str = ""
    observed_generation: int = Field(default=0, alias="observedGeneration")
    last_transition_time: str = Field(default="", alias="lastTransitionTime")

    @property
    def true(self) -> bool:
        return self.status == "True"


class JobFailure(BaseModel):
    """status.sparkApplication.lastFailure: how the job's last driver ended in error, kept after the spark-operator
    deletes the pod (and its log) to resubmit it."""

    model_config = ConfigDict(populate_by_name=True)
    exit_code: int = Field(alias="exitCode")
    message: str = Field(default="", description="the driver's termination message: the job's error line")
    pod: str = ""
    finished_at: str = Field(default="", alias="finishedAt")
    spec_hash: str = Field(default="", alias="specHash", description="the specHash the failed run ran with")


class AppStatus(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    name: str = ""
    state: str = Field(default="", description="the spark-operator's applicationState.state")
    message: str = Field(default="", description="its errorMessage")
    spec_hash: str = Field(default="", alias="specHash")
    executors: int = Field(default=0, description="executor pods running")
    lost_executors: list[str] = Field(default_factory=list, alias="lostExecutors",
                                      description="executor pods of this run the spark-operator reports FAILED or "
                                                  "UNKNOWN (deleted), the last 10")
    last_failure: JobFailure | None = Field(default=None, alias="lastFailure")

    @property
    def app_state(self) -> AppState:
        return AppState.parse(self.state)


class Rebalance(BaseModel):
    """status.rebalance: a plan from status.layout to the spec's shards, and where it stands."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")
    phase: RebalancePhase
    from_layout: int = Field(alias="fromLayout")
    to_layout: int = Field(alias="toLayout")
    target: dict[str, Any]
    plan: list[dict[str, Any]] = Field(default_factory=list)
    affected: list[str] = Field(default_factory=list)
    message: str = ""
    proposed_at: str = Field(default="", alias="proposedAt")
    approved_at: str | None = Field(default=None, alias="approvedAt")
    applied_at: str | None = Field(default=None, alias="appliedAt")

    @property
    def pending(self) -> bool:
        return self.phase in (RebalancePhase.AWAITING_APPROVAL, RebalancePhase.SETTLING, RebalancePhase.DRAINING)


class Verification(BaseModel):
    """status.verification: the scheduled verifier's last run (spec.verify)."""

    model_config = ConfigDict(populate_by_name=True)
    result: VerifyResult | None = Field(default=None, description="unset until the first run finishes")
    summary: str = Field(default="", description="what `kubectl get chs` shows: `OK 12,345 offsets`, `ANOMALY ...`")
    offsets: int = Field(default=0, description="offsets verified by every run so far")
    checked: int = Field(default=0, description="offsets the last run verified")
    findings: list[str] = Field(default_factory=list, description="the partitions and offsets at fault")
    anomalies: int = Field(default=0, description="partitions the last run found at fault")
    message: str = Field(default="", description="why the last run failed, or what it noted")
    started_at: str = Field(default="", alias="startedAt", description="when the last run's Job was created")
    finished_at: str = Field(default="", alias="finishedAt")


class SinkStatus(BaseModel):
    """status of a ClickHouseSink: what `kubectl get chs` shows (the SinkStatus object holds per-partition rows)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")
    state: SinkState | None = None
    topics: str = ""
    shards: str = Field(default="", description="shards in the applied layout; `2->3` while a rebalance waits")
    lag: int | None = None
    observed_generation: int = Field(default=0, alias="observedGeneration")
    layout: dict[str, Any] | None = None
    previous_layout: dict[str, Any] | None = Field(default=None, alias="previousLayout")
    rebalance: Rebalance | None = None
    spark_application: AppStatus = Field(default_factory=AppStatus, alias="sparkApplication")
    verification: Verification | None = None
    conditions: list[Condition] = Field(default_factory=list)

    @classmethod
    def of(cls, status: Any) -> SinkStatus:
        data = dict(status or {})
        if not isinstance(data.get("shards", ""), str):  # written as an integer before
            data["shards"] = str(data["shards"])
        return cls.model_validate(data)

    def condition(self, kind: ConditionType) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)

    def dump(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)

    def stored(self) -> dict[str, Any]:
        """The fields as read from the object, without the defaults filled in for the ones it lacks."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True, exclude_unset=True)
