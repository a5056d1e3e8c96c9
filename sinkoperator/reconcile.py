"""One reconcile of a ClickHouseSink, run on every change and on every status tick:

observe (the object as it is now) -> validate (the spec renders a valid config) -> reconcile (the layout, the
ConfigMap and SparkApplication, removed topics) -> observe the job and the store -> record (status.py).

Every failure becomes a Problem in the status: a wrong spec is permanent (only a change helps); anything
outside the spec is retried, by kopf after a short delay and by the next tick.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import kopf

from sparkapp.config import ConfigError, SinkConfig
from sparkapp.core.state_machine import Phase
from sparkapp.edges.kafka import topic_partitions

from . import jobfailure, kube, metrics, prerequisites, status, verification
from .access import open_store, operator_config
from .cleanup import clean_removed_topics
from .lifecycle import Observed, Problem, named
from .model import JobFailure, Rebalance, SinkSpec, SinkStatus
from .problems import classify, invalid_spec
from .rebalance import initial_layout, plan, same_shards, spec_layout
from .render import Defaults, kept_layout, object_uses, render, sink_config
from .spec import (
    APPROVAL_ANNOTATION,
    APPROVE_ANNOTATION,
    APPROVE_WORD,
    FAILED_APP_STATES,
    HASH_ANNOTATION,
    NONCE_ANNOTATION,
    STOPPED_APP_STATES,
    AppState,
    DesiredState,
    RebalancePhase,
    object_name,
)

_LOCKS: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)


@dataclass(frozen=True)
class Outcome:
    changed: str  # what happened to the SparkApplication
    problem: Problem | None


def reconcile(namespace: str, name: str) -> Outcome | None:
    """Reconciles the sink as it is now (read afresh, so a change handler and a tick never act on an older
    spec than each other); None when it is gone or being deleted."""
    with lock(namespace, name):
        body = kube.get_sink(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None  # gone, or the finalizer's to report on
        return _reconcile(body)


def lock(namespace: str, name: str) -> threading.Lock:
    """The sink's lock: one reconcile or cleanup at a time, so none writes status over a later one's."""
    return _LOCKS[(namespace, name)]


def forget(namespace: str, name: str) -> None:
    _LOCKS.pop((namespace, name), None)


def _reconcile(body: Any) -> Outcome:
    meta = body["metadata"]
    namespace, name, generation = meta["namespace"], meta["name"], int(meta.get("generation", 0))
    old = SinkStatus.of(body.get("status"))
    new = old.model_copy()
    changed, problem, unmet, stall, spec, progress = "", None, None, None, None, None
    hold: JobFailure | None = None
    app_state: AppState | None = None
    app_msg = ""
    pods: tuple[str, ...] = ()
    desired = DesiredState(str((body.get("spec") or {}).get("state", DesiredState.RUNNING)))
    try:
        spec = SinkSpec.parse(body.get("spec"), name)
        desired = spec.state
        sink_config(namespace, name, spec)  # the spec's own shards, as a next layout would run them
        sink_config(namespace, name, spec, old.dump())  # and as the job runs now
    except ConfigError as e:
        problem = invalid_spec(e)
        metrics.RECONCILE_ERRORS.labels(problem.reason).inc()
    if spec is not None and problem is None:
        shards: SinkStatus | None = None
        try:
            shards = layout_status(body, spec, old)
            new, changed, hold = _apply(body, spec, old, shards)
        except Exception as e:  # anything outside the spec: retried
            problem = classify(e)
            metrics.RECONCILE_ERRORS.labels(problem.reason).inc()
            if shards is not None and old.layout is None:  # decided (first) or restored, and maybe in the
                new = new.model_copy(update={  # ConfigMap already: kept, so the retry does not "restore" it
                    "layout": shards.layout, "previous_layout": shards.previous_layout})
        try:
            app = kube.get_app(namespace, object_name(name))
            app_state = AppState.parse(kube.app_state(app)) if app is not None else None
            app_msg = kube.app_message(app)
            # listed before the store is read: the reconcile that finds no pod left reads what their last batch
            # delivered, so a Paused status already holds it
            found = kube.app_pods(namespace, object_name(name))
            pods = tuple(p.label for p in found if p.live)
            unmet = prerequisites.check(namespace, name, app, found, dt.datetime.now(dt.UTC))
            ran_with = str((((app or {}).get("metadata") or {}).get("annotations") or {}).get(HASH_ANNOTATION, ""))
            recorded = new.spark_application.last_failure
            failure = jobfailure.observed(found, ran_with, recorded)
            running, lost = kube.app_executors(app)
            new = new.model_copy(update={"spark_application": new.spark_application.model_copy(update={
                "name": object_name(name), "state": app_state or "", "message": app_msg, "executors": running,
                "lost_executors": lost, "last_failure": failure})})
            if failure is not None and failure is not recorded and failure.exit_code in jobfailure.HELD \
                    and problem is None:
                # a failure only a change fixes: held at once
                new, changed, hold = _apply(body, spec, new, layout_status(body, spec, new))
            if app_state in FAILED_APP_STATES and hold is None:
                app_msg += jobfailure.said(failure, ran_with)
            cfg = operator_config(namespace, name, spec, new.dump())
            progress = status.progress(namespace, name, cfg, open_store(cfg), new)
            new, stall = new.model_copy(update={"lag": progress.lag}), progress.stall
            new = new.model_copy(update={"verification": verification.observe(
                body, namespace, name, spec, new.verification, dt.datetime.now(dt.UTC))})
        except Exception as e:
            problem = problem or classify(e)
    observed = Observed(desired, app_state, app_msg, new.rebalance.phase if new.rebalance else None,
                        problem or (hold and jobfailure.hold_problem(hold, job_retry_seconds())) or unmet or stall,
                        pods=pods, held=hold is not None, verification=new.verification,
                        rollout=changed if changed in ("created", "patched", "deleted") else "")
    status.record(body, old, new, observed, generation, progress)
    metrics.RECONCILES.labels(changed or "failed").inc()
    return Outcome(changed, problem)


def _apply(body: Any, spec: SinkSpec, old: SinkStatus, shards: SinkStatus) -> tuple[SinkStatus, str,
                                                                                   JobFailure | None]:
    """Brings the ConfigMap and SparkApplication in line with the spec and `shards` (the status with the layout
    this reconcile decided); returns the new status fields, what happened to the SparkApplication, and the failure
    it is held on (suspended) if any."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    nonce = (meta.get("annotations") or {}).get(NONCE_ANNOTATION, "")
    draining = shards.rebalance is not None and shards.rebalance.phase is RebalancePhase.DRAINING
    defaults = Defaults.from_env()
    running = spec.state is not DesiredState.STOPPED
    versions = kube.object_versions(namespace, object_uses(spec)) if running else {}
    cm, app = render(namespace, name, spec, nonce, defaults, shards.dump(), suspend=draining,
                     object_versions=versions)
    last = old.spark_application.last_failure
    hold = last if running and not draining and jobfailure.held(
        last, app["metadata"]["annotations"][HASH_ANNOTATION], dt.datetime.now(dt.UTC), job_retry_seconds()) else None
    if hold is not None:  # what it would run with is what failed: suspended, not resubmitted
        cm, app = render(namespace, name, spec, nonce, defaults, shards.dump(), suspend=True,
                         object_versions=versions)
    obj = object_name(name)
    if not running:
        changed = "deleted" if kube.delete_app(namespace, obj) else "unchanged"
    else:
        identity = defaults.driver_identity(spec.spark.service_account)
        for what in kube.ensure_driver_identity(namespace, *identity) if identity else []:
            kopf.info(body, reason="DriverIdentityCreated", message=f"{what} created for the Spark driver")
        kopf.adopt([cm, app], owner=body)
        kube.apply_configmap(cm)
        changed = kube.apply_app(app)
    cfg = sink_config(namespace, name, spec, shards.dump())
    removed = sorted(set(filter(None, old.topics.split(","))) - set(cfg.kafka.topics)) \
        if cfg.kafka.topics and old.topics else []
    if removed:
        clean_removed_topics(body, operator_config(namespace, name, spec, shards.dump()), removed)
    layout = shards.layout or {}
    rb = shards.rebalance
    count = str(len(layout.get("endpoints") or []))
    if rb is not None and rb.pending:
        count += f"->{len(rb.target['endpoints'])}"
    new = shards.model_copy(update={
        "topics": ",".join(cfg.kafka.topics) or cfg.kafka.topic_pattern or "", "shards": count,
        "spark_application": shards.spark_application.model_copy(update={
            "name": obj, "spec_hash": app["metadata"]["annotations"][HASH_ANNOTATION]
            if spec.state is not DesiredState.STOPPED else ""})})
    if changed in ("created", "patched", "deleted"):
        kopf.info(body, reason=f"SparkApplication{changed.capitalize()}", message=f"SparkApplication {obj} {changed}")
    old_rb = old.rebalance
    if rb and (rb.phase, rb.to_layout) != ((old_rb.phase, old_rb.to_layout) if old_rb else (None, None)):
        kopf.info(body, reason=f"Rebalance{rb.phase}", message=rb.message)
    return new, changed, hold


def job_retry_seconds() -> float:
    """How long a job that failed in a way only a change fixes stays suspended before it is tried again."""
    return float(os.environ.get("CHSINK_JOB_RETRY_SECONDS", "300"))


def layout_status(body: Any, spec: SinkSpec, current: SinkStatus) -> SinkStatus:
    """status.layout, previousLayout and rebalance after this reconcile: plans a rebalance when the spec's
    shards differ from the applied layout, and applies it once the suspended job has stopped (a range it left
    BEFORE is re-sent under the layout it was sent under, kept as the previous one)."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    out = current.model_copy(deep=True)  # the plan is changed in place below; `current` stays what was read
    if out.layout is None:
        kept = kept_layout(kube.configmap_annotations(namespace, object_name(name)))
        if not kept:
            return out.model_copy(update={"layout": initial_layout(spec)})
        out.layout, out.previous_layout = kept["layout"], kept.get("previousLayout")
        kopf.info(body, reason="LayoutRestored", message=f"the status had no layout: layout v{out.layout['version']} "
                  f"(as applied) restored from ConfigMap {object_name(name)}")
    want, rb = spec_layout(spec), out.rebalance
    pending = rb is not None and rb.pending
    if same_shards(out.layout, want):
        if rb is not None and pending:
            out.rebalance = rb.model_copy(update={"phase": RebalancePhase.CANCELLED,
                                                  "message": "the spec's shards match the applied layout"})
        _approval_used(body, None)
        return out
    cfg = operator_config(namespace, name, spec, out.dump())
    if not (rb is not None and pending and same_shards(rb.target, want)):  # a new plan (or the spec changed again)
        rows = open_store(cfg).list_sink(cfg.name)
        parts = [(t, p) for t, n in topic_partitions(cfg.kafka).items() for p in range(n)]
        stored = {(r.pk.topic, r.pk.partition): (r.state.layout, r.shard) for r in rows}
        new = plan(out.layout, want, parts, stored)
        rb = Rebalance.model_validate({
            "phase": RebalancePhase.AWAITING_APPROVAL, "fromLayout": out.layout["version"],
            "toLayout": new["target"]["version"], "target": new["target"], "plan": new["moves"],
            "affected": new["affected"], "proposedAt": status.now()})
    annotations = meta.get("annotations") or {}
    if annotations.get(APPROVE_ANNOTATION) == APPROVE_WORD and rb.approved_at is None:
        rb.approved_at = status.now()  # approves the plan shown now; a later plan needs a new approval
        _approval_used(body, rb.to_layout)
    approved = annotations.get(APPROVAL_ANNOTATION) != "required" or rb.approved_at is not None or \
        annotations.get(APPROVE_ANNOTATION) == str(rb.to_layout)
    moves = f"{len(rb.plan)} partition move(s) from layout v{rb.from_layout} to v{rb.to_layout}"
    if not approved:
        rb.phase, rb.message = RebalancePhase.AWAITING_APPROVAL, \
            f"{moves}; annotate {APPROVE_ANNOTATION}={APPROVE_WORD} to apply"
    elif unsettled := _unsettled(cfg, out.layout["version"]):
        rb.phase, rb.message = RebalancePhase.SETTLING, f"{moves}; waiting, the job running, for {unsettled}"
    elif stopping := _running(namespace, name):
        rb.phase, rb.message = RebalancePhase.DRAINING, f"{moves}; job suspended, waiting for {stopping}"
    else:
        out.previous_layout, out.layout = out.layout, rb.target
        rb.phase, rb.applied_at, rb.message = RebalancePhase.APPLIED, status.now(), f"{moves} applied; job resumed"
    out.rebalance = rb
    return out


def _approval_used(body: Any, to_layout: int | None) -> None:
    """Removes an `approve` annotation once it approved a plan (or when there was none to approve), so it can
    never approve a plan proposed later."""
    meta = body["metadata"]
    if (meta.get("annotations") or {}).get(APPROVE_ANNOTATION) != APPROVE_WORD:
        return
    kube.annotate_sink(meta["namespace"], meta["name"], {APPROVE_ANNOTATION: None})
    kopf.info(body, reason="RebalanceApproved" if to_layout is not None else "NothingToApprove",
              message=f"the plan to layout v{to_layout} is approved" if to_layout is not None else
              "no rebalance awaits approval; the annotation is removed")


def _unsettled(cfg: SinkConfig, current: int) -> str:
    """Unconfirmed (BEFORE) ranges sent under a layout older than the current one ("" when none). Applying
    keeps the current layout as the previous one, so a range left BEFORE by the drain is re-sent under it
    after the resume; a range under an older layout would no longer be described, so it must be confirmed
    first, by the running job. (Waiting for every BEFORE with the job suspended could never end.)"""
    older = [f"{r.pk.topic}/{r.pk.partition} {r.state.range} (layout v{r.state.layout})"
             for r in open_store(cfg).list_sink(cfg.name)
             if r.state.phase is Phase.BEFORE and r.state.layout != current]
    return f"unconfirmed (BEFORE) ranges under a layout it drops: {', '.join(older[:10])}" if older else ""


def _running(namespace: str, name: str) -> str:
    """What a drain still waits for ("" when done): the SparkApplication to stop, then its pods to be gone (the
    spark-operator reports SUSPENDED as it deletes the driver pod, which still finishes the batch it is in)."""
    app = kube.get_app(namespace, object_name(name))
    state = kube.app_state(app)
    if app is not None and state not in STOPPED_APP_STATES:
        return f"SparkApplication {object_name(name)} to stop (state {state or 'unknown'})"
    if pods := kube.live_pods(namespace, object_name(name)):
        return f"the job's pods to finish the batch they are in: {named(pods)}"
    return ""
