"""The only writer of status: the ClickHouseSink's status and conditions, and the SinkStatus object.

Everything else hands its findings here, so what `kubectl get chs,sinkstatus` shows is decided in one
place (as the Flink operator's StatusRecorder does).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from typing import Any

import kopf

from sparkapp.core.state_machine import Phase
from sparkapp.edges.kafka import topic_partitions, watermarks
from sparkapp.edges.store import StateRow, resume_positions

from . import kube, metrics
from .access import open_store, operator_config
from .rebalance import shard_label
from .spec import GROUP, PLURAL, STATUS_PLURAL, VERSION, ConditionType, object_name

Condition = dict[str, Any]


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: ConditionType, ok: bool, reason: str, message: str, generation: int) -> Condition:
    """A metav1.Condition-shaped dict."""
    return {"type": str(kind), "status": "True" if ok else "False", "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": now()}


def merge_conditions(old: list[Condition] | None, new: list[Condition]) -> list[Condition]:
    """Keeps lastTransitionTime when a condition's status did not change."""
    by_type = {c["type"]: c for c in old or []}
    out = []
    for c in new:
        prev = by_type.get(c["type"])
        if prev and prev.get("status") == c["status"]:
            c = {**c, "lastTransitionTime": prev.get("lastTransitionTime", c["lastTransitionTime"])}
        out.append(c)
    return out


def patch(namespace: str, name: str, status: dict[str, Any]) -> None:
    """Patches the ClickHouseSink's status (the one place that does)."""
    kube.patch_status((GROUP, VERSION), namespace, PLURAL, name, status)


def stalled_shards(rows: list[StateRow], status: Mapping[str, Any], at: dt.datetime,
                   after_s: float | None = None) -> dict[str, list[str]]:
    """Shard -> partitions unconfirmed (BEFORE) for longer than `after_s` (default $CHSINK_STALL_SECONDS or
    120): a shard that stopped answering, or a job that crashed and has not come back."""
    after_s = float(os.environ.get("CHSINK_STALL_SECONDS", "120")) if after_s is None else after_s
    layouts = {int(lay["version"]): lay for lay in (status.get("layout"), status.get("previousLayout")) if lay}
    out: dict[str, list[str]] = {}
    for r in rows:
        age = (at - r.updated_at.replace(tzinfo=dt.UTC)).total_seconds()
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
    rows = open_store(cfg).list_sink(cfg.name)
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
    status = {"sink": cfg.name, "state": cr_status.get("state") or declared,
              "partitionCount": len(highs), "lag": total_lag, "partitions": partitions}
    if last:
        status["lastCommit"] = last
    obj = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SinkStatus",
           "metadata": {"name": name, "namespace": namespace}, "status": status}
    kopf.adopt(obj, owner=body)
    kube.upsert_status_object((GROUP, VERSION), namespace, STATUS_PLURAL, obj)
    state = kube.app_state(kube.get_app(namespace, object_name(name)))
    stalled = stalled_shards(rows, cr_status, dt.datetime.now(dt.UTC))
    generation = int((body.get("metadata") or {}).get("generation", 0))
    degraded = condition(ConditionType.DEGRADED, True, "ShardStalled", "; ".join(
        f"shard {shard}: {len(ps)} partition(s) unconfirmed: {', '.join(ps[:10])}" for shard, ps in sorted(
            stalled.items())), generation) if stalled else \
        condition(ConditionType.DEGRADED, False, "AsExpected", "", generation)
    metrics.stalled(namespace, name, {shard: len(ps) for shard, ps in stalled.items()})
    update: dict[str, Any] = {"lag": total_lag, "sparkApplication": {"state": state}}
    if stalled or _is_stalled(cr_status):  # set and clear only our own Degraded reason
        update["conditions"] = merge_conditions(cr_status.get("conditions"), [
            c for c in cr_status.get("conditions") or [] if c["type"] != ConditionType.DEGRADED] + [degraded])
    patch(namespace, name, update)
    return status


def _is_stalled(status: Mapping[str, Any]) -> bool:
    return any(c.get("type") == ConditionType.DEGRADED and c.get("reason") == "ShardStalled"
               for c in status.get("conditions") or [])
