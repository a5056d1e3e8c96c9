"""The only writer of status: the ClickHouseSink's status, conditions and Events, and the SinkStatus object.

Everything else hands its findings here, so what `kubectl get chs,sinkstatus` shows is decided in one place
(as the Flink operator's StatusRecorder does). Events are posted on transitions only (a state change, a new
Degraded reason, a recovery), so a problem that lasts does not post a Warning on every retry.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from sparkapp.config import SinkConfig
from sparkapp.core.state_machine import Phase
from sparkapp.edges.kafka import all_watermarks, topic_partitions
from sparkapp.edges.store import StateRow, StateStore

from . import kube, metrics
from .lifecycle import Observed, Problem, conditions, keep_transition_times
from .model import SinkStatus
from .rebalance import shard_label
from .spec import GROUP, PLURAL, STATUS_PLURAL, VERSION, ConditionType, Reason, SinkState, VerifyResult

_BAD_STATES = {SinkState.FAILED, SinkState.INVALID}


_STAMP = "%Y-%m-%dT%H:%M:%SZ"  # every time the status shows, in one format


def stamp(at: dt.datetime) -> str:
    return at.strftime(_STAMP)


def parse_stamp(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, _STAMP).replace(tzinfo=dt.UTC)


def now() -> str:
    return stamp(dt.datetime.now(dt.UTC))


def merge_patch(was: Mapping[str, Any], now: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `was` into `now`: what changed, and null for every key `now`
    leaves out, at any depth. Without the nulls a field the new status drops (a verification whose spec.verify
    was removed, a new plan's approvedAt) would stick. Only what changed is sent, so a reconcile that read the
    status before someone cleared it does not write the old status back: the next one restores it, and says so."""
    out: dict[str, Any] = {key: None for key in was if key not in now}
    for key, value in now.items():
        before = was.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            if inner := merge_patch(before, value):
                out[key] = inner
        elif key not in was or value != before:
            out[key] = value
    return out


def record(body: Any, old: SinkStatus, new: SinkStatus, observed: Observed, generation: int,
           progress: Progress | None = None) -> SinkStatus:
    """Writes the sink's status: `new`'s fields, with the state and conditions `observed` implies, and the
    SinkStatus object with the same state; posts the Events of what changed."""
    state, conds = conditions(observed, generation, now())
    new = new.model_copy(update={"state": state, "observed_generation": generation,
                                 "conditions": keep_transition_times(old.conditions, conds)})
    meta = body.get("metadata") or {}
    if patch := merge_patch(old.stored(), new.dump()):
        kube.patch_status((GROUP, VERSION), meta["namespace"], PLURAL, meta["name"], patch)
    if progress is not None:
        obj = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SinkStatus",
               "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
               "status": {**progress.partitions, "state": str(state)}}
        kopf.adopt(obj, owner=body)
        kube.upsert_status_object((GROUP, VERSION), meta["namespace"], STATUS_PLURAL, obj)
    metrics.sink_state(meta["namespace"], meta["name"], state)
    ready = new.condition(ConditionType.READY)
    metrics.sink_health(meta["namespace"], meta["name"], metrics.SinkHealth(
        str(state), bool(ready and ready.true), progress.lag if progress else None,
        progress.topic_lag if progress else {}, progress.last_commit if progress else None,
        str(new.rebalance.phase) if new.rebalance else None), dt.datetime.now(dt.UTC).timestamp())
    if (v := new.verification) is not None and v.result is not None:
        metrics.verification(meta["namespace"], meta["name"], v.result is VerifyResult.OK, v.anomalies, v.offsets,
                             parse_stamp(v.finished_at).timestamp())
    failed = new.spark_application.last_failure
    metrics.job_trouble(meta["namespace"], meta["name"],
                        int(failed is not None and failed != old.spark_application.last_failure),
                        len(_newly_lost(old, new)))
    _events(body, old, new)
    return new


def _newly_lost(old: SinkStatus, new: SinkStatus) -> list[str]:
    return sorted(set(new.spark_application.lost_executors) - set(old.spark_application.lost_executors))


def _events(body: Any, old: SinkStatus, new: SinkStatus) -> None:
    was, now_ = old.condition(ConditionType.DEGRADED), new.condition(ConditionType.DEGRADED)
    assert now_ is not None and new.state is not None
    # a lasting problem is one Warning, however often it is retried; another one (or the spec's next
    # mistake) is a new Warning
    if now_.true and (was is None or not was.true or was.reason != now_.reason or
                      (now_.reason == Reason.INVALID_SPEC and was.message != now_.message and
                       was.observed_generation != now_.observed_generation)):
        kopf.warn(body, reason=now_.reason, message=now_.message)
    elif not now_.true and was is not None and was.true:
        kopf.info(body, reason="Recovered", message=f"no longer degraded ({was.reason})")
    if lost := _newly_lost(old, new):  # Spark replaces them: nothing is degraded, but it should be seen
        kopf.warn(body, reason=Reason.EXECUTOR_LOST, message=f"executor pod(s) {', '.join(lost)} lost; Spark starts "
                  "replacements and retries their tasks (the state store keeps delivery exactly-once)")
    if new.state != old.state:
        ready = new.condition(ConditionType.READY)
        text = f"sink {new.state.lower()}" + (f": {ready.message}" if ready and ready.message else "")
        (kopf.warn if new.state in _BAD_STATES else kopf.info)(body, reason=str(new.state), message=text)


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


@dataclass(frozen=True)
class Progress:
    """What the store and Kafka say: the SinkStatus object's body (without the state), the total lag, a stall (a
    Problem) if any, the lag per topic and when the last block was committed (epoch seconds)."""

    partitions: dict[str, Any]
    lag: int
    stall: Problem | None
    topic_lag: dict[str, int]
    last_commit: float | None


def progress(namespace: str, name: str, cfg: SinkConfig, store: StateStore, cr_status: SinkStatus) -> Progress:
    """Per-partition state rows from the store, lag from Kafka high watermarks, and unconfirmed ranges."""
    state = store.sink_state(cfg.name)
    rows = state.rows
    parts = topic_partitions(cfg.kafka)
    partitions: list[dict[str, Any]] = []
    done = state.resume()
    highs = {tp: high for tp, (_, high) in all_watermarks(cfg.kafka, parts).items()}
    topic_lag: dict[str, int] = {}
    for (t, part), high in highs.items():
        topic_lag[t] = topic_lag.get(t, 0) + max(0, high - done.get((t, part), 0))
    total_lag = sum(topic_lag.values())
    for r in rows:
        s = r.state
        high = highs.get((r.pk.topic, r.pk.partition), 0)
        partitions.append({"topic": r.pk.topic, "partition": r.pk.partition, "table": r.pk.table,
                           "minOffset": s.range.min, "maxOffset": s.range.max, "phase": s.phase.value,
                           "epoch": s.epoch, "lastCommit": stamp(r.updated_at),
                           "highWatermark": high, "lag": max(0, high - state.table_resume(r)), "shard": r.shard})
    last = max((str(p["lastCommit"]) for p in partitions), default=None)
    body: dict[str, Any] = {"sink": cfg.name, "partitionCount": len(highs), "lag": total_lag,
                            "partitions": partitions}
    if last:
        body["lastCommit"] = last
    layouts = cr_status.model_dump(by_alias=True, include={"layout", "previous_layout"}, exclude_none=True)
    stalled = stalled_shards(rows, layouts, dt.datetime.now(dt.UTC))
    metrics.stalled(namespace, name, {shard: len(ps) for shard, ps in stalled.items()})
    stall = Problem(Reason.SHARD_STALLED, "; ".join(
        f"shard {shard}: {len(ps)} partition(s) unconfirmed: {', '.join(ps[:10])}"
        for shard, ps in sorted(stalled.items()))) if stalled else None
    newest = max((r.updated_at for r in rows), default=None)
    return Progress(body, total_lag, stall, topic_lag, newest.timestamp() if newest else None)
