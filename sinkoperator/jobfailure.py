"""What a failed driver said, and whether resubmitting it can help (pure).

The job exits with a code per kind of error and writes the error's line to its termination message. The
spark-operator reports only the exit code and, under restartPolicy Always, resubmits the job and deletes the
failed pod with its log. An error only a person can fix (a configuration error, data loss, state that does not
match Kafka) would fail the same way each time, so it is held instead: the application stays suspended until
what it runs with changes (the spec, a Secret it names, the restart nonce), or for $CHSINK_JOB_RETRY_SECONDS
(300) after it stopped, for a fix made outside Kubernetes (a table created, a grant given).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from .kube import Pod
from .lifecycle import Problem
from .model import JobFailure
from .spec import NONCE_ANNOTATION, Reason

# exit codes of errors a resubmission cannot fix (sparkapp/__main__.py), each with its reason
HELD = {2: Reason.JOB_CONFIG_ERROR, 4: Reason.JOB_DATA_LOSS, 5: Reason.JOB_STATE_MISMATCH}


def observed(pods: Sequence[Pod], spec_hash: str, last: JobFailure | None) -> JobFailure | None:
    """The driver's failure as the pods show it now, else the last one recorded."""
    driver = next((p for p in pods if p.role == "driver" and p.failed is not None), None)
    if driver is None or driver.failed is None:
        return last
    if last is not None and (last.pod, last.finished_at) == (driver.name, driver.failed.finished_at):
        return last  # the same failure, seen again
    return JobFailure.model_validate({"exitCode": driver.failed.code, "message": driver.failed.message,
                                      "pod": driver.name, "finishedAt": driver.failed.finished_at,
                                      "specHash": spec_hash})


def held(last: JobFailure | None, spec_hash: str, now: dt.datetime, hold_s: float) -> bool:
    """Whether the job stays suspended: it ran with `spec_hash` (what it would run with now) and failed in a way
    only a change fixes, less than `hold_s` ago."""
    if last is None or last.exit_code not in HELD or last.spec_hash != spec_hash or not last.finished_at:
        return False
    return (now - dt.datetime.fromisoformat(last.finished_at)).total_seconds() < hold_s


def hold_problem(last: JobFailure, hold_s: float) -> Problem:
    said = last.message or f"exit code {last.exit_code}"
    return Problem(HELD[last.exit_code], f"the job stopped: {said} (exit code {last.exit_code}, driver pod "
                   f"{last.pod} at {last.finished_at}); it is not resubmitted until the spec, a Secret it names or "
                   f"the {NONCE_ANNOTATION} annotation changes, or {hold_s:.0f}s after it stopped")


def said(last: JobFailure | None, spec_hash: str) -> str:
    """What the failed run said, for a JobFailed message ("" when nothing, or it ran with another spec)."""
    return f"; the job said: {last.message}" if last and last.message and last.spec_hash == spec_hash else ""
