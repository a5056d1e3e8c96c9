"""The scheduled verifier (spec.verify): a Job per run, started once the last is `schedule` old; its result goes
to status.verification, the Verified condition, an Event and the metrics. An anomaly changes no data: it is
reported, again on every run, until someone repairs it."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import kopf

from . import kube
from .model import SinkSpec, Verification
from .render import Defaults, verify_job, verify_job_name
from .spec import Reason, VerifyResult
from .status import parse_stamp, stamp


def observe(body: Any, namespace: str, name: str, spec: SinkSpec, was: Verification | None,
            at: dt.datetime) -> Verification | None:
    """The verification as it stands after this reconcile: a finished run read (and its Job deleted), a due one
    started. None without spec.verify."""
    if spec.verify is None:
        return None
    current = was or Verification()
    job = verify_job_name(name)
    run = kube.job_run(namespace, job)
    if run is None:
        if _due(current, spec.verify.schedule_s, at):
            obj = verify_job(namespace, name, spec, spec.verify.window_s, Defaults.from_env())
            kopf.adopt(obj, owner=body)  # gone with the sink
            kube.create_job(obj)
            return current.model_copy(update={"started_at": stamp(at)})
        return current
    if not run.done:
        return current
    kube.delete_job(namespace, job)
    out = _result(run.succeeded, run.message, current, at)
    _report(body, out)
    return out


def _due(v: Verification, every_s: int, at: dt.datetime) -> bool:
    if not v.started_at:
        return True
    started = parse_stamp(v.started_at)
    return (at - started).total_seconds() >= every_s


def _result(succeeded: bool, message: str, was: Verification, at: dt.datetime) -> Verification:
    """What a finished run says: its summary line (verify_settled.SettledReport.summary) or why it failed."""
    base = Verification.model_validate({"startedAt": was.started_at, "finishedAt": stamp(at),
                                        "offsets": was.offsets})
    try:
        found = json.loads(message) if succeeded else None
    except ValueError:
        found = None
    if not isinstance(found, dict) or found.get("result") not in ("OK", "ANOMALY"):
        why = message or "its pod left no message"
        return base.model_copy(update={"result": VerifyResult.FAILED, "summary": f"FAILED: {why}"[:120],
                                       "message": why})
    offsets = int(found.get("offsets", 0))
    base = base.model_copy(update={"offsets": offsets, "checked": int(found.get("checked", 0)),
                                   "message": "; ".join(map(str, found.get("notes", [])))})
    if found["result"] == "OK":
        return base.model_copy(update={"result": VerifyResult.OK, "summary": f"OK {offsets:,} offsets"})
    findings = [str(f) for f in found.get("findings", [])]
    more = int(found.get("more", 0))
    anomalies = len(findings) + more
    if more:
        findings.append(f"and {more} more partition(s)")
    extra = f" (+{anomalies - 1})" if anomalies > 1 else ""
    return base.model_copy(update={"result": VerifyResult.ANOMALY, "findings": findings, "anomalies": anomalies,
                                   "summary": f"ANOMALY {findings[0]}"[:200] + extra})


def _report(body: Any, v: Verification) -> None:
    if v.result is VerifyResult.OK:
        kopf.info(body, reason="Verified", message=f"{v.checked:,} settled offset(s) checked, {v.offsets:,} in all: "
                  "each is in ClickHouse or the DLQ exactly once")
    elif v.result is VerifyResult.ANOMALY:
        kopf.warn(body, reason=Reason.VERIFY_ANOMALY, message="; ".join(v.findings) + " (no data was changed)")
    else:
        kopf.warn(body, reason=Reason.VERIFY_FAILED, message=f"the verifier's run did not finish: {v.message}")
