"""Names the operator and its CRDs share: API group, annotations, and the enums of states, phases and
conditions, each defined once."""

from __future__ import annotations

import enum

GROUP = "chsink.io"
VERSION = "v1alpha1"
PLURAL = "clickhousesinks"
STATUS_PLURAL = "sinkstatuses"
SPARK = ("sparkoperator.k8s.io", "v1beta2", "sparkapplications")  # group, version, plural

HASH_ANNOTATION = f"{GROUP}/spec-hash"
NONCE_ANNOTATION = f"{GROUP}/restart-nonce"
SECRET_VERSIONS_ANNOTATION = f"{GROUP}/secret-versions"  # on the driver: the Secrets' versions it was started with
LAYOUT_ANNOTATION = f"{GROUP}/layout"  # on the ConfigMap: the applied layout, kept where a lost status is not
FORCE_DELETE_ANNOTATION = f"{GROUP}/force-delete"
APPROVAL_ANNOTATION = f"{GROUP}/rebalance-approval"  # "required": a plan waits for APPROVE_ANNOTATION
APPROVE_ANNOTATION = f"{GROUP}/approve-rebalance"  # APPROVE_WORD (the plan shown now) or the plan's toLayout
APPROVE_WORD = "approve"
CONFIG_DIR = "/etc/chsink"  # where the Spark pods mount the sink's ConfigMap
# the environment variables the operator sets on the Spark pods itself (a sink's own env must not shadow them)
OWNED_ENV_PREFIX, OWNED_ENV = "CHSINK_KAFKA_", ("CHSINK_CLICKHOUSE_PASSWORD",)


class DesiredState(enum.StrEnum):
    """spec.state: what the user asks for."""

    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"


class SinkState(enum.StrEnum):
    """status.state: the sink's lifecycle, from the spec, the SparkApplication and what the operator met."""

    PENDING = "Pending"  # waiting for something outside the spec (a Secret, Kafka, ClickHouse, the spark-operator)
    DEPLOYING = "Deploying"  # the SparkApplication is submitted, (re)starting or resuming; no driver runs yet
    RUNNING = "Running"  # the driver runs
    DRAINING = "Draining"  # suspended for a rebalance; the new layout is applied once it stopped
    PAUSING = "Pausing"  # paused in the spec; a pod of the job still runs (it finishes the batch it is in)
    PAUSED = "Paused"  # and no pod of the job is left
    STOPPING = "Stopping"  # stopped in the spec (the SparkApplication deleted); a pod of the job still runs
    STOPPED = "Stopped"
    FAILED = "Failed"  # the spark-operator reports the job failed (it is resubmitted: restartPolicy Always)
    INVALID = "Invalid"  # the spec is wrong; only a change to it helps
    DELETING = "Deleting"


class ConditionType(enum.StrEnum):
    READY = "Ready"  # the job runs and nothing is degraded: `kubectl wait --for=condition=Ready` means it works
    PROGRESSING = "Progressing"  # something is being rolled out: a (re)submission, a rebalance
    DEGRADED = "Degraded"  # a problem, named by the reason
    VERIFIED = "Verified"  # with spec.verify: the last scheduled verifier run found every settled offset once


class Reason(enum.StrEnum):
    """Condition and Event reasons for problems, each defined once."""

    INVALID_SPEC = "InvalidSpec"
    SECRET_UNAVAILABLE = "SecretUnavailable"
    KAFKA_UNAVAILABLE = "KafkaUnavailable"
    KAFKA_REFUSED = "KafkaRefused"  # reached, but it refused the credentials or the TLS handshake
    CLICKHOUSE_UNAVAILABLE = "ClickHouseUnavailable"
    SPARK_OPERATOR_MISSING = "SparkOperatorMissing"
    SPARK_OPERATOR_TOO_OLD = "SparkOperatorTooOld"
    SPARK_OPERATOR_NOT_WATCHING = "SparkOperatorNotWatching"
    SPARK_OPERATOR_WEBHOOK_MISSING = "SparkOperatorWebhookMissing"
    FORBIDDEN = "Forbidden"
    RECONCILE_FAILED = "ReconcileFailed"
    JOB_FAILED = "JobFailed"
    JOB_CONFIG_ERROR = "JobConfigError"
    JOB_DATA_LOSS = "JobDataLoss"
    JOB_STATE_MISMATCH = "JobStateMismatch"
    EXECUTOR_LOST = "ExecutorLost"
    SHARD_STALLED = "ShardStalled"
    CLEANUP_FAILED = "CleanupFailed"
    VERIFY_ANOMALY = "VerifyAnomaly"
    VERIFY_FAILED = "VerifyFailed"
    VERIFICATION_PENDING = "VerificationPending"


class VerifyResult(enum.StrEnum):
    """status.verification.result: what the last scheduled verifier run found."""

    OK = "OK"  # every settled offset is in ClickHouse or the DLQ exactly once
    ANOMALY = "ANOMALY"  # an offset is missing or stored twice: findings name them
    FAILED = "FAILED"  # the run itself did not finish (Kafka or ClickHouse unreachable, its pod failed)


class AppState(enum.StrEnum):
    """The spark-operator's SparkApplication states (status.applicationState.state)."""

    NEW = ""
    SUBMITTED = "SUBMITTED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    SUBMISSION_FAILED = "SUBMISSION_FAILED"
    PENDING_RERUN = "PENDING_RERUN"
    INVALIDATING = "INVALIDATING"
    SUCCEEDING = "SUCCEEDING"
    FAILING = "FAILING"
    UNKNOWN = "UNKNOWN"
    SUSPENDING = "SUSPENDING"
    SUSPENDED = "SUSPENDED"
    RESUMING = "RESUMING"

    @classmethod
    def parse(cls, value: str) -> AppState:
        try:
            return cls(value)
        except ValueError:  # a state a newer spark-operator added
            return cls.UNKNOWN


# a stream never ends on its own: an application that completed has failed as much as one that failed
FAILED_APP_STATES = frozenset({AppState.FAILED, AppState.SUBMISSION_FAILED, AppState.FAILING, AppState.COMPLETED,
                               AppState.SUCCEEDING})
# states the spark-operator reports once it has told the driver to stop (a drain waits for one of these, then for
# the job's pods to be gone: the driver finishes the batch it is in)
STOPPED_APP_STATES = frozenset({AppState.SUSPENDED, AppState.COMPLETED, AppState.FAILED, AppState.SUBMISSION_FAILED})
# executor states (status.executorState) of a pod that is gone: FAILED, or UNKNOWN when deleted while the driver runs
LOST_EXECUTOR_STATES = frozenset({"FAILED", "UNKNOWN"})


class RebalancePhase(enum.StrEnum):
    """Where a rebalance stands; the phases before APPLIED are re-checked on every status refresh."""

    AWAITING_APPROVAL = "AwaitingApproval"
    SETTLING = "Settling"  # the job keeps running until no range is unconfirmed under a layout the plan would drop
    DRAINING = "Draining"  # the job is suspended; applied as soon as it has stopped
    APPLIED = "Applied"
    CANCELLED = "Cancelled"


def object_name(name: str) -> str:
    """The SparkApplication's and ConfigMap's name for a sink."""
    return f"chsink-{name}"


def sink_id(namespace: str, name: str) -> str:
    """The sink id the job runs under: it namespaces state rows and dedup tokens."""
    return f"{namespace}.{name}"
