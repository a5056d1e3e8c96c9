"""Reconcile: bring the SparkApplication and ConfigMap in line with a ClickHouseSink, and run rebalances.

observe (the applied layout, the application) -> validate (the spec renders a valid config) ->
reconcile (apply, plan or apply a rebalance) -> record (status.py).
"""

from __future__ import annotations

from typing import Any

import kopf

from sparkapp.config import ConfigError, SinkConfig
from sparkapp.core.state_machine import Phase
from sparkapp.edges.kafka import topic_partitions

from . import kube, metrics, status
from .access import open_store, operator_config
from .cleanup import clean_removed_topics
from .rebalance import initial_layout, plan, same_shards, spec_layout
from .render import Defaults, render, sink_config
from .spec import (
    APPROVAL_ANNOTATION,
    APPROVE_ANNOTATION,
    HASH_ANNOTATION,
    NONCE_ANNOTATION,
    STOPPED_APP_STATES,
    ConditionType,
    DesiredState,
    RebalancePhase,
    SinkState,
    object_name,
)


def reconcile(body: Any, namespace: str, name: str, spec: dict[str, Any], meta: dict[str, Any],
              current: dict[str, Any]) -> str:
    """Brings the SparkApplication and ConfigMap in line with the sink; returns what changed."""
    generation = int(meta.get("generation", 0))
    nonce = (meta.get("annotations") or {}).get(NONCE_ANNOTATION, "")
    state = DesiredState(spec.get("state", DesiredState.RUNNING))
    try:
        sink_config(namespace, name, spec)  # the spec's own shards, as a next layout would run them
        sink_config(namespace, name, spec, current)  # and as the job runs now
        shards = layout_status(namespace, name, spec, meta, current)
        draining = (shards.get("rebalance") or {}).get("phase") == RebalancePhase.DRAINING
        cm, app = render(namespace, name, spec, nonce, Defaults.from_env(), shards, suspend=draining)
    except ConfigError as e:
        msg = str(e)
        metrics.RECONCILE_ERRORS.labels("InvalidSpec").inc()
        metrics.sink_state(namespace, name, SinkState.INVALID)
        status.patch(namespace, name, {"state": SinkState.INVALID, "conditions": status.merge_conditions(
            current.get("conditions"), [status.condition(ConditionType.READY, False, "InvalidSpec", msg, generation),
                                        status.condition(ConditionType.DEGRADED, True, "InvalidSpec", msg,
                                                         generation)])})
        kopf.warn(body, reason="InvalidSpec", message=msg)
        raise kopf.PermanentError(msg) from None
    obj = object_name(name)
    if state is DesiredState.STOPPED:
        changed = "deleted" if kube.delete_app(namespace, obj) else "unchanged"
        phase, ready_reason = SinkState.STOPPED, "Stopped"
    else:
        kopf.adopt([cm, app], owner=body)
        kube.apply_configmap(cm)
        changed = kube.apply_app(app)
        phase, ready_reason = (SinkState.PAUSED, "Paused") if state is DesiredState.PAUSED else \
            (SinkState.RUNNING, "Submitted")
    cfg = sink_config(namespace, name, spec, shards)
    removed = sorted(set(filter(None, str(current.get("topics") or "").split(","))) - set(cfg.kafka.topics)) \
        if cfg.kafka.topics and current.get("topics") else []
    if removed:
        clean_removed_topics(body, operator_config(namespace, name, spec, shards), removed)
    app_state = kube.app_state(kube.get_app(namespace, obj))
    status.patch(namespace, name, {
        "state": phase, "topics": ",".join(cfg.kafka.topics) or cfg.kafka.topic_pattern,
        "shards": len(cfg.clickhouse.endpoints), "observedGeneration": generation, **shards,
        "sparkApplication": {"name": obj, "state": app_state, "specHash": app["metadata"]["annotations"][
            HASH_ANNOTATION] if state is not DesiredState.STOPPED else ""},
        "conditions": status.merge_conditions(current.get("conditions"), [
            status.condition(ConditionType.READY, state is DesiredState.RUNNING, ready_reason,
                             f"sink is {phase.lower()}", generation),
            status.condition(ConditionType.PROGRESSING, changed in ("created", "patched", "deleted"),
                             changed.capitalize(), f"SparkApplication {obj} {changed}", generation),
            status.condition(ConditionType.DEGRADED, False, "AsExpected", "", generation)]),
    })
    metrics.RECONCILES.labels(changed).inc()
    metrics.sink_state(namespace, name, phase)
    if changed != "unchanged" or current.get("state") != phase:
        kopf.info(body, reason=phase, message=f"SparkApplication {obj} {changed}; sink {phase.lower()}")
    rb, old_rb = shards.get("rebalance") or {}, current.get("rebalance") or {}
    if rb and (rb.get("phase"), rb.get("toLayout")) != (old_rb.get("phase"), old_rb.get("toLayout")):
        kopf.info(body, reason=f"Rebalance{rb['phase']}", message=rb.get("message", ""))
    return changed


def layout_status(namespace: str, name: str, spec: dict[str, Any], meta: dict[str, Any],
                  current: dict[str, Any]) -> dict[str, Any]:
    """status.layout, previousLayout and rebalance after this reconcile: plans a rebalance when the spec's
    shards differ from the applied layout, and applies it once the suspended job has stopped (a range it left
    BEFORE is re-sent under the layout it was sent under, kept as the previous one)."""
    out = {k: current[k] for k in ("layout", "previousLayout", "rebalance") if current.get(k)}
    if "layout" not in out:
        out["layout"] = initial_layout(spec)
        return out
    want, rb = spec_layout(spec), dict(out.get("rebalance") or {})
    pending = rb.get("phase") in (RebalancePhase.AWAITING_APPROVAL, RebalancePhase.SETTLING, RebalancePhase.DRAINING)
    if same_shards(out["layout"], want):
        if pending:
            out["rebalance"] = {**rb, "phase": RebalancePhase.CANCELLED,
                                "message": "the spec's shards match the applied layout"}
        return out
    cfg = operator_config(namespace, name, spec, out)
    if not (pending and same_shards(rb["target"], want)):  # a new plan (or the spec changed again)
        rows = open_store(cfg).list_sink(cfg.name)
        parts = [(t, p) for t, n in topic_partitions(cfg.kafka).items() for p in range(n)]
        stored = {(r.pk.topic, r.pk.partition): (r.state.layout, r.shard) for r in rows}
        new = plan(out["layout"], want, parts, stored)
        rb = {"fromLayout": out["layout"]["version"], "toLayout": new["target"]["version"], "target": new["target"],
              "plan": new["moves"], "affected": new["affected"], "proposedAt": status.now()}
    annotations = meta.get("annotations") or {}
    approved = annotations.get(APPROVAL_ANNOTATION) != "required" or \
        annotations.get(APPROVE_ANNOTATION) == str(rb["toLayout"])
    moves = f"{len(rb['plan'])} partition move(s) from layout v{rb['fromLayout']} to v{rb['toLayout']}"
    if not approved:
        rb.update(phase=RebalancePhase.AWAITING_APPROVAL,
                  message=f"{moves}; annotate {APPROVE_ANNOTATION}={rb['toLayout']} to apply")
    elif unsettled := _unsettled(cfg, out["layout"]["version"]):
        rb.update(phase=RebalancePhase.SETTLING, message=f"{moves}; waiting, the job running, for {unsettled}")
    elif stopping := _running(namespace, name):
        rb.update(phase=RebalancePhase.DRAINING, message=f"{moves}; job suspended, waiting for {stopping}")
    else:
        out["previousLayout"], out["layout"] = out["layout"], rb["target"]
        rb.update(phase=RebalancePhase.APPLIED, appliedAt=status.now(), message=f"{moves} applied; job resumed")
    out["rebalance"] = rb
    return out


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
    """What a drain still waits for ("" when done): the SparkApplication to stop."""
    app = kube.get_app(namespace, object_name(name))
    state = kube.app_state(app)
    if app is not None and state not in STOPPED_APP_STATES:
        return f"SparkApplication {object_name(name)} to stop (state {state or 'unknown'})"
    return ""
