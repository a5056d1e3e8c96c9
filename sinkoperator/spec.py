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
FORCE_DELETE_ANNOTATION = f"{GROUP}/force-delete"
APPROVAL_ANNOTATION = f"{GROUP}/rebalance-approval"  # "required": a plan waits for APPROVE_ANNOTATION
APPROVE_ANNOTATION = f"{GROUP}/approve-rebalance"  # the plan's toLayout, to approve it


class DesiredState(enum.StrEnum):
    """spec.state: what the user asks for."""

    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"


class SinkState(enum.StrEnum):
    """status.state: what the operator made of it."""

    RUNNING = "Running"
    PAUSED = "Paused"
    STOPPED = "Stopped"
    INVALID = "Invalid"


class ConditionType(enum.StrEnum):
    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"


class RebalancePhase(enum.StrEnum):
    """Where a rebalance stands; the phases before APPLIED are re-checked on every status refresh."""

    AWAITING_APPROVAL = "AwaitingApproval"
    SETTLING = "Settling"  # the job keeps running until no range is unconfirmed under a layout the plan would drop
    DRAINING = "Draining"  # the job is suspended; applied as soon as it has stopped
    APPLIED = "Applied"
    CANCELLED = "Cancelled"


# SparkApplication states (the spark-operator's) in which no driver runs
STOPPED_APP_STATES = frozenset({"SUSPENDED", "COMPLETED", "FAILED", "SUBMISSION_FAILED", "FAILED_SUBMISSION"})


def object_name(name: str) -> str:
    """The SparkApplication's and ConfigMap's name for a sink."""
    return f"chsink-{name}"


def sink_id(namespace: str, name: str) -> str:
    """The sink id the job runs under: it namespaces state rows and dedup tokens."""
    return f"{namespace}.{name}"
