"""What the operator does to the world: apply rendered objects, patch status, clean up state.

Handlers (handlers.py) stay thin and call these; rendering (render.py) stays pure.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.rest import ApiException

from sparkapp.config import ConfigError
from sparkapp.kafka_io import topic_partitions, watermarks
from sparkapp.runtime import state_store
from sparkapp.state_machine import Phase
from sparkapp.store import StateRow, resume_positions

from . import metrics
from .rebalance import initial_layout, plan, same_shards, shard_label, spec_layout
from .render import GROUP, HASH_ANNOTATION, VERSION, Defaults, object_name, render, secret_env_vars, sink_config

log = logging.getLogger(__name__)
SPARK = ("sparkoperator.k8s.io", "v1beta2", "sparkapplications")
FORCE_DELETE_ANNOTATION = f"{GROUP}/force-delete"
NONCE_ANNOTATION = f"{GROUP}/restart-nonce"
APPROVAL_ANNOTATION = f"{GROUP}/rebalance-approval"  # "required": a plan waits for APPROVE_ANNOTATION
APPROVE_ANNOTATION = f"{GROUP}/approve-rebalance"  # the plan's toLayout, to approve it
STOPPED_APP_STATES = {"SUSPENDED", "COMPLETED", "FAILED", "SUBMISSION_FAILED", "FAILED_SUBMISSION"}


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: str, ok: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    """A metav1.Condition-shaped dict."""
    return {"type": kind, "status": "True" if ok else "False", "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": _now()}


def merge_conditions(old: list[dict[str, Any]] | None, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keeps lastTransitionTime when a condition's status did not change."""
    by_type = {c["type"]: c for c in old or []}
    out = []
    for c in new:
        prev = by_type.get(c["type"])
        if prev and prev.get("status") == c["status"]:
            c = {**c, "lastTransitionTime": prev.get("lastTransitionTime", c["lastTransitionTime"])}
        out.append(c)
    return out


def _get_app(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        app = client.CustomObjectsApi().get_namespaced_custom_object(*SPARK[:2], namespace, SPARK[2], name)
        return app if isinstance(app, dict) else None
    except ApiException as e:
        if e.status == 404:
            return None
        raise


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
    """Creates the SparkApplication, or patches it only when the spec hash changed."""
    api = client.CustomObjectsApi()
    ns, name = app["metadata"]["namespace"], app["metadata"]["name"]
    current = _get_app(ns, name)
    if current is None:
        api.create_namespaced_custom_object(*SPARK[:2], ns, SPARK[2], app)
        return "created"
    if (current["metadata"].get("annotations") or {}).get(HASH_ANNOTATION) == app["metadata"]["annotations"][
            HASH_ANNOTATION]:
        return "unchanged"
    api.patch_namespaced_custom_object(*SPARK[:2], ns, SPARK[2], name,
                                       {"metadata": {"annotations": app["metadata"]["annotations"]},
                                        "spec": app["spec"]})
    return "patched"


def delete_app(namespace: str, name: str, wait_s: float = 0) -> bool:
    """Deletes the SparkApplication; with wait_s, waits (bounded) until it is gone."""
    try:
        client.CustomObjectsApi().delete_namespaced_custom_object(*SPARK[:2], namespace, SPARK[2], name)
    except ApiException as e:
        if e.status != 404:
            raise
        return False
    deadline = time.monotonic() + wait_s
    while wait_s and _get_app(namespace, name) is not None:
        if time.monotonic() > deadline:
            raise kopf.TemporaryError(f"SparkApplication {name} still exists after {wait_s:.0f}s", delay=10)
        time.sleep(0.5)
    return True


def patch_status(namespace: str, name: str, status: dict[str, Any]) -> None:
    client.CustomObjectsApi().patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "clickhousesinks", name, {"status": status})


def reconcile(body: Any, namespace: str, name: str, spec: dict[str, Any], meta: dict[str, Any],
              status: dict[str, Any]) -> str:
    """Brings the SparkApplication and ConfigMap in line with the sink; returns what changed."""
    generation = int(meta.get("generation", 0))
    nonce = (meta.get("annotations") or {}).get(NONCE_ANNOTATION, "")
    state = spec.get("state", "running")
    try:
        sink_config(namespace, name, spec)  # the spec's own shards, as a next layout would run them
        sink_config(namespace, name, spec, status)  # and as the job runs now
        shards = layout_status(namespace, name, spec, meta, status)
        cm, app = render(namespace, name, spec, nonce, Defaults.from_env(), shards,
                         suspend=(shards.get("rebalance") or {}).get("phase") == "Draining")
    except ConfigError as e:
        msg = str(e)
        metrics.RECONCILE_ERRORS.labels("InvalidSpec").inc()
        metrics.sink_state(namespace, name, "Invalid")
        patch_status(namespace, name, {"state": "Invalid", "conditions": merge_conditions(status.get("conditions"), [
            condition("Ready", False, "InvalidSpec", msg, generation),
            condition("Degraded", True, "InvalidSpec", msg, generation)])})
        kopf.warn(body, reason="InvalidSpec", message=msg)
        raise kopf.PermanentError(msg) from None
    obj = object_name(name)
    if state == "stopped":
        changed = "deleted" if delete_app(namespace, obj) else "unchanged"
        phase, ready_reason = "Stopped", "Stopped"
    else:
        kopf.adopt([cm, app], owner=body)
        apply_configmap(cm)
        changed = apply_app(app)
        phase, ready_reason = ("Paused", "Paused") if state == "paused" else ("Running", "Submitted")
    cfg = sink_config(namespace, name, spec, shards)
    removed = sorted(set(filter(None, str(status.get("topics") or "").split(","))) - set(cfg.kafka.topics)) \
        if cfg.kafka.topics and status.get("topics") else []
    if removed:
        clean_removed_topics(body, operator_config(namespace, name, spec, shards), removed)
    current = _get_app(namespace, obj)
    app_state = ((current or {}).get("status") or {}).get("applicationState", {}).get("state", "")
    new_status = {
        "state": phase, "topics": ",".join(cfg.kafka.topics) or cfg.kafka.topic_pattern,
        "shards": len(cfg.clickhouse.endpoints), "observedGeneration": generation, **shards,
        "sparkApplication": {"name": obj, "state": app_state, "specHash": app["metadata"]["annotations"][
            HASH_ANNOTATION] if state != "stopped" else ""},
        "conditions": merge_conditions(status.get("conditions"), [
            condition("Ready", state == "running", ready_reason, f"sink is {phase.lower()}", generation),
            condition("Progressing", changed in ("created", "patched", "deleted"), changed.capitalize(),
                      f"SparkApplication {obj} {changed}", generation),
            condition("Degraded", False, "AsExpected", "", generation)]),
    }
    patch_status(namespace, name, new_status)
    metrics.RECONCILES.labels(changed).inc()
    metrics.sink_state(namespace, name, phase)
    if changed != "unchanged" or status.get("state") != phase:
        kopf.info(body, reason=phase, message=f"SparkApplication {obj} {changed}; sink {phase.lower()}")
    rb, old_rb = shards.get("rebalance") or {}, status.get("rebalance") or {}
    if rb and (rb.get("phase"), rb.get("toLayout")) != (old_rb.get("phase"), old_rb.get("toLayout")):
        kopf.info(body, reason=f"Rebalance{rb['phase']}", message=rb.get("message", ""))
    return changed


def layout_status(namespace: str, name: str, spec: dict[str, Any], meta: dict[str, Any],
                  status: dict[str, Any]) -> dict[str, Any]:
    """status.layout, previousLayout and rebalance after this reconcile: plans a rebalance when the spec's
    shards differ from the applied layout, and applies it once the drained job left every affected
    partition AFTER."""
    out = {k: status[k] for k in ("layout", "previousLayout", "rebalance") if status.get(k)}
    if "layout" not in out:
        out["layout"] = initial_layout(spec)
        return out
    want, rb = spec_layout(spec), dict(out.get("rebalance") or {})
    pending = rb.get("phase") in ("AwaitingApproval", "Draining")
    if same_shards(out["layout"], want):
        if pending:
            out["rebalance"] = {**rb, "phase": "Cancelled", "message": "the spec's shards match the applied layout"}
        return out
    cfg = operator_config(namespace, name, spec, out)
    if not (pending and same_shards(rb["target"], want)):  # a new plan (or the spec changed again)
        rows = _store(cfg).list_sink(cfg.name)
        parts = [(t, p) for t, n in topic_partitions(cfg.kafka).items() for p in range(n)]
        stored = {(r.pk.topic, r.pk.partition): (r.state.layout, r.shard) for r in rows}
        new = plan(out["layout"], want, parts, stored)
        rb = {"fromLayout": out["layout"]["version"], "toLayout": new["target"]["version"], "target": new["target"],
              "plan": new["moves"], "affected": new["affected"], "proposedAt": _now()}
    annotations = meta.get("annotations") or {}
    approved = annotations.get(APPROVAL_ANNOTATION) != "required" or \
        annotations.get(APPROVE_ANNOTATION) == str(rb["toLayout"])
    moves = f"{len(rb['plan'])} partition move(s) from layout v{rb['fromLayout']} to v{rb['toLayout']}"
    if not approved:
        rb.update(phase="AwaitingApproval", message=f"{moves}; annotate {APPROVE_ANNOTATION}={rb['toLayout']} to apply")
    else:
        waiting = _drain_blockers(namespace, name, cfg, rb["affected"])
        if waiting:
            rb.update(phase="Draining", message=f"{moves}; job suspended, waiting for {waiting}")
        else:
            out["previousLayout"], out["layout"] = out["layout"], rb["target"]
            rb.update(phase="Applied", appliedAt=_now(), message=f"{moves} applied; job resumed")
    out["rebalance"] = rb
    return out


def _drain_blockers(namespace: str, name: str, cfg: Any, affected: list[str]) -> str:
    """What a drain still waits for ("" when done): the job to stop, then affected partitions BEFORE."""
    app = _get_app(namespace, object_name(name))
    state = ((app or {}).get("status") or {}).get("applicationState", {}).get("state", "")
    if app is not None and state not in STOPPED_APP_STATES:
        return f"SparkApplication {object_name(name)} to stop (state {state or 'unknown'})"
    want = set(affected)
    before = [f"{r.pk.topic}/{r.pk.partition} {r.state.range}" for r in _store(cfg).list_sink(cfg.name)
              if f"{r.pk.topic}/{r.pk.partition}" in want and r.state.phase is Phase.BEFORE]
    return f"unconfirmed (BEFORE) ranges: {', '.join(before[:10])}" if before else ""


def secret_values(namespace: str, spec: dict[str, Any]) -> dict[str, str]:
    """The values the job gets from Secrets (env name -> value), read with `get` on exactly those Secrets."""
    import base64

    core = client.CoreV1Api()
    secrets: dict[str, dict[str, Any]] = {}
    out: dict[str, str] = {}
    for var in secret_env_vars(spec):
        ref = var["valueFrom"]["secretKeyRef"]
        if ref["name"] not in secrets:
            try:
                secrets[ref["name"]] = core.read_namespaced_secret(ref["name"], namespace).data or {}
            except ApiException as e:
                raise kopf.TemporaryError(f"cannot read Secret {namespace}/{ref['name']} named by the sink: "
                                          f"{e.status} {e.reason}", delay=30) from None
        data = secrets[ref["name"]]
        if ref["key"] not in data:
            raise kopf.TemporaryError(f"Secret {namespace}/{ref['name']} has no key {ref['key']!r} "
                                      f"(needed for {var['name']})", delay=30)
        out[var["name"]] = base64.b64decode(data[ref["key"]]).decode()
    return out


def operator_config(namespace: str, name: str, spec: dict[str, Any], status: dict[str, Any] | None = None) -> Any:
    """The sink's config with its Secrets bound in memory, for the operator's own state-store and Kafka calls."""
    cfg = sink_config(namespace, name, spec, status)
    values = secret_values(namespace, spec)
    for ref in (cfg.clickhouse.password, *cfg.kafka.secret_options.values()):
        if ref is not None and ref.env in values:
            ref.bind(values[ref.env])
    return cfg


def _store(cfg: Any) -> Any:
    from sparkapp.clients import clickhouse_client

    store = state_store(cfg, clickhouse_client(cfg.clickhouse))
    store.ensure_schema()
    return store


def clean_removed_topics(body: Any, cfg: Any, topics: list[str]) -> int:
    """Per-partition state cleanup for topics removed from the spec.

    A new epoch is taken first: it fences the running job, which can then neither move nor
    re-create these rows (it fails and is resubmitted with the new config), and only then are the
    rows deleted.
    """
    store = _store(cfg)
    epoch = store.acquire_epoch(cfg.name, owner="chsink-operator")
    n = store.delete_topics(cfg.name, topics)
    kopf.info(body, reason="TopicsRemoved",
              message=f"fenced the job (epoch {epoch}) and deleted {n} state row(s) of removed topic(s) {topics}")
    return int(n)


def delete_checkpoint(location: str) -> bool:
    """Deletes a checkpoint the operator can reach (a local or mounted path); object stores are left alone."""
    import shutil
    from pathlib import Path

    path = location.removeprefix("file://")
    if not path.startswith("/") or not Path(path).exists():
        return False
    shutil.rmtree(path)
    return True


def cleanup(body: Any, namespace: str, name: str, spec: dict[str, Any], meta: dict[str, Any]) -> None:
    """The finalizer: with deletionPolicy Delete, stop the job, then delete its state."""
    if (meta.get("annotations") or {}).get(FORCE_DELETE_ANNOTATION) == "true":
        kopf.warn(body, reason="ForcedDelete", message="cleanup skipped by the force-delete annotation")
        return
    if spec.get("deletionPolicy", "Retain") != "Delete":
        kopf.info(body, reason="Retained", message="deletionPolicy Retain: per-partition state kept")
        return
    try:
        delete_app(namespace, object_name(name), wait_s=60)
        cfg = operator_config(namespace, name, spec)
        n = _store(cfg).delete(cfg.name)
        if delete_checkpoint(cfg.checkpoint_location):
            kopf.info(body, reason="CheckpointDeleted", message=f"deleted checkpoint {cfg.checkpoint_location}")
    except kopf.TemporaryError:
        raise
    except Exception as e:
        msg = f"cleanup failed: {e}; it will be retried. Annotate {FORCE_DELETE_ANNOTATION}=true to release"
        patch_status(namespace, name, {"conditions": [condition("Degraded", True, "CleanupFailed", msg,
                                                                 int(meta.get("generation", 0)))]})
        kopf.warn(body, reason="CleanupFailed", message=msg)
        raise kopf.TemporaryError(msg, delay=15) from e
    kopf.info(body, reason="Cleaned", message=f"deleted {n} partition state row(s) of sink {cfg.name}")


def stalled_shards(rows: list[StateRow], status: dict[str, Any], now: dt.datetime,
                   after_s: float | None = None) -> dict[str, list[str]]:
    """Shard -> partitions unconfirmed (BEFORE) for longer than `after_s` (default $CHSINK_STALL_SECONDS or
    120): a shard that stopped answering, or a job that crashed and has not come back."""
    import os

    after_s = float(os.environ.get("CHSINK_STALL_SECONDS", "120")) if after_s is None else after_s
    layouts = {int(lay["version"]): lay for lay in (status.get("layout"), status.get("previousLayout")) if lay}
    out: dict[str, list[str]] = {}
    for r in rows:
        age = (now - r.updated_at.replace(tzinfo=dt.UTC)).total_seconds()
        if r.state.phase is Phase.BEFORE and age > after_s:
            lay = layouts.get(r.state.layout)
            label = shard_label(lay, r.shard) if lay and r.shard < len(lay["endpoints"]) else \
                f"{r.shard} (layout v{r.state.layout})"
            out.setdefault(label, []).append(f"{r.pk.topic}/{r.pk.partition} ({age:.0f}s)")
    return out


def sink_status(body: Any, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Refreshes the SinkStatus object: state rows from the store, lag from Kafka high watermarks."""
    cr_status = dict(body.get("status") or {})
    cfg = operator_config(namespace, name, spec, cr_status)
    rows = _store(cfg).list_sink(cfg.name)
    parts = topic_partitions(cfg.kafka)
    partitions: list[dict[str, Any]] = []
    done = resume_positions(rows)
    highs = {(t, p): watermarks(cfg.kafka, t, p)[1] for t, n in parts.items() for p in range(n)}
    total_lag = sum(max(0, high - done.get(tp, 0)) for tp, high in highs.items())
    for r in rows:
        s = r.state
        high = highs.get((r.pk.topic, r.pk.partition), 0)
        partitions.append({"topic": r.pk.topic, "partition": r.pk.partition, "table": r.pk.table,
                           "minOffset": s.range.min, "maxOffset": s.range.max, "phase": s.phase.value,
                           "epoch": s.epoch, "lastCommit": r.updated_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                           "highWatermark": high, "lag": max(0, high - s.resume_offset), "shard": r.shard})
    last = max((str(p["lastCommit"]) for p in partitions), default=None)
    declared = str(spec.get("state", "running")).capitalize()
    status = {"sink": cfg.name, "state": (body.get("status") or {}).get("state") or declared,
              "partitionCount": len(highs), "lag": total_lag, "partitions": partitions}
    if last:
        status["lastCommit"] = last
    obj = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SinkStatus",
           "metadata": {"name": name, "namespace": namespace}, "status": status}
    kopf.adopt(obj, owner=body)
    api = client.CustomObjectsApi()
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, "sinkstatuses", obj)
    except ApiException as e:
        if e.status != 409:
            raise
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, "sinkstatuses", name, {"status": status})
    app = _get_app(namespace, object_name(name))
    app_state = ((app or {}).get("status") or {}).get("applicationState", {}).get("state", "")
    stalled = stalled_shards(rows, cr_status, dt.datetime.now(dt.UTC))
    generation = int((body.get("metadata") or {}).get("generation", 0))
    degraded = condition("Degraded", True, "ShardStalled", "; ".join(
        f"shard {shard}: {len(ps)} partition(s) unconfirmed: {', '.join(ps[:10])}" for shard, ps in sorted(
            stalled.items())), generation) if stalled else condition("Degraded", False, "AsExpected", "", generation)
    metrics.stalled(namespace, name, {shard: len(ps) for shard, ps in stalled.items()})
    patch = {"lag": total_lag, "sparkApplication": {"state": app_state}}
    if (stalled or _is_stalled(cr_status)):  # set and clear only our own Degraded reason
        patch["conditions"] = merge_conditions(cr_status.get("conditions"), [
            c for c in cr_status.get("conditions") or [] if c["type"] != "Degraded"] + [degraded])
    patch_status(namespace, name, patch)
    return status


def _is_stalled(status: dict[str, Any]) -> bool:
    return any(c.get("type") == "Degraded" and c.get("reason") == "ShardStalled"
               for c in status.get("conditions") or [])
