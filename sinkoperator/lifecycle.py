"""What a sink's state and conditions are, from what one reconcile observed (pure).

One function decides it, so `kubectl get chs` cannot say Ready while the job failed, is drained or was never
submitted: Ready is True only when the SparkApplication reports RUNNING, the user asked for running, and
nothing is degraded. Nor Paused or Stopped while a pod of the job is left, whatever the application reports: the
spark-operator reports SUSPENDED as it deletes the driver pod, which then finishes the batch it is in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .model import Condition, Verification
from .spec import (
    FAILED_APP_STATES,
    AppState,
    ConditionType,
    DesiredState,
    Reason,
    RebalancePhase,
    SinkState,
    VerifyResult,
)

# the rollout states: something is on its way, not wrong
_PROGRESSING = {SinkState.PENDING, SinkState.DEPLOYING, SinkState.DRAINING, SinkState.PAUSING, SinkState.STOPPING,
                SinkState.DELETING}


@dataclass(frozen=True)
class Problem:
    """Something that keeps the sink from working. `permanent`: only a change to the spec helps (no retry)."""

    reason: Reason
    message: str
    permanent: bool = False


@dataclass(frozen=True)
class Observed:
    """What one reconcile saw."""

    desired: DesiredState
    app: AppState | None  # None: no SparkApplication exists
    app_message: str = ""
    rebalance: RebalancePhase | None = None
    problem: Problem | None = None
    deleting: bool = False
    rollout: str = ""  # what this reconcile changed ("created", "patched", "deleted"), if anything
    pods: tuple[str, ...] = ()  # the job's pods that may still write (a stopping driver finishes its batch)
    held: bool = False  # the job failed in a way only a change fixes, and is kept suspended
    verification: Verification | None = None  # with spec.verify: where the scheduled verifier stands


def sink_state(o: Observed) -> SinkState:
    if o.deleting:
        return SinkState.DELETING
    if o.problem is not None and o.problem.permanent:
        return SinkState.INVALID
    # paused or stopped only once no pod of the job is left: until then its last batch may still land
    if o.desired is DesiredState.STOPPED:
        return SinkState.STOPPING if o.pods else SinkState.STOPPED
    if o.desired is DesiredState.PAUSED:
        return SinkState.PAUSING if o.pods else SinkState.PAUSED
    if o.rebalance is RebalancePhase.DRAINING:
        return SinkState.DRAINING
    if o.held:
        return SinkState.FAILED
    if o.app is None:
        return SinkState.PENDING if o.problem is not None else SinkState.DEPLOYING
    if o.app is AppState.RUNNING:
        return SinkState.RUNNING
    if o.app in FAILED_APP_STATES:
        return SinkState.FAILED
    return SinkState.DEPLOYING


def conditions(o: Observed, generation: int, now: str) -> tuple[SinkState, list[Condition]]:
    """The sink's state and its Ready, Progressing and Degraded conditions (one of each, always), and Verified
    with spec.verify."""
    state = sink_state(o)
    degraded: tuple[str, str] | None = None
    if o.problem is not None:
        degraded = (o.problem.reason, o.problem.message)
    elif state is SinkState.FAILED:
        degraded = (Reason.JOB_FAILED, f"the spark-operator reports the SparkApplication {o.app}"
                    + (f": {o.app_message}" if o.app_message else "") + "; it is resubmitted (restartPolicy Always)")
    ready = state is SinkState.RUNNING and degraded is None
    if ready:
        ready_reason, ready_msg = "Running", "the job runs"
    elif degraded is not None:
        ready_reason, ready_msg = degraded
    else:
        ready_reason, ready_msg = str(state), _WHY_NOT_READY.get(state, "")
        if state in (SinkState.PAUSING, SinkState.STOPPING):
            ready_msg += f": {named(o.pods)}"
    progressing = state in _PROGRESSING or o.rebalance is RebalancePhase.SETTLING or bool(o.rollout)
    if o.rebalance in (RebalancePhase.SETTLING, RebalancePhase.DRAINING):
        prog_reason, prog_msg = f"Rebalance{o.rebalance}", "a rebalance is under way (status.rebalance)"
    elif o.rollout:
        prog_reason, prog_msg = o.rollout.capitalize(), f"SparkApplication {o.rollout}"
    else:
        prog_reason, prog_msg = str(state), ""

    def cond(kind: ConditionType, ok: bool, reason: str, message: str) -> Condition:
        return Condition.model_validate({"type": kind, "status": "True" if ok else "False", "reason": reason,
                                         "message": message, "observedGeneration": generation,
                                         "lastTransitionTime": now})

    out = [cond(ConditionType.READY, ready, ready_reason, ready_msg),
           cond(ConditionType.PROGRESSING, progressing, prog_reason, prog_msg),
           cond(ConditionType.DEGRADED, degraded is not None, *(degraded or ("AsExpected", "")))]
    if (v := o.verification) is not None:
        status, reason, message = _verified(v)
        out.append(Condition.model_validate({"type": ConditionType.VERIFIED, "status": status, "reason": reason,
                                             "message": message, "observedGeneration": generation,
                                             "lastTransitionTime": now}))
    return state, out


def _verified(v: Verification) -> tuple[str, str, str]:
    """(status, reason, message) of the Verified condition: Unknown until a first run has finished."""
    if v.result is VerifyResult.OK:
        return "True", "Verified", f"{v.offsets:,} settled offsets each in ClickHouse or the DLQ exactly once " \
            f"(last run {v.finished_at})"
    if v.result is VerifyResult.ANOMALY:
        return "False", Reason.VERIFY_ANOMALY, "; ".join(v.findings)
    if v.result is VerifyResult.FAILED:
        return "Unknown", Reason.VERIFY_FAILED, v.message
    return "Unknown", Reason.VERIFICATION_PENDING, "the first run of the verifier has not finished"


_WHY_NOT_READY = {
    SinkState.DEPLOYING: "the SparkApplication is submitted; its driver does not run yet",
    SinkState.DRAINING: "the job is suspended for a rebalance",
    SinkState.PAUSING: "spec.state is paused; waiting for the job's pods to finish the batch they are in",
    SinkState.PAUSED: "spec.state is paused",
    SinkState.STOPPING: "spec.state is stopped; waiting for the job's pods to finish the batch they are in",
    SinkState.STOPPED: "spec.state is stopped",
    SinkState.DELETING: "the sink is being deleted",
}


def named(pods: Sequence[str], keep: int = 5) -> str:
    """The pods a message names: the first `keep`, and how many more."""
    return ", ".join(pods[:keep]) + (f" and {len(pods) - keep} more" if len(pods) > keep else "")


def keep_transition_times(old: list[Condition], new: list[Condition]) -> list[Condition]:
    """A condition keeps its lastTransitionTime while its status stays the same."""
    before = {c.type: c for c in old}
    return [c.model_copy(update={"last_transition_time": before[c.type].last_transition_time})
            if c.type in before and before[c.type].status == c.status and before[c.type].last_transition_time
            else c for c in new]
