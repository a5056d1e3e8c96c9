"""What the spark-operator must do for a sink, checked from what the cluster shows. Each missing piece otherwise
looks like a job that is slow to start, or one that ignores its spec:

- too old: its SparkApplication CRD has no spec.suspend (added in v2.4.0), so the API server prunes the field and
  neither `spec.state: paused` nor a rebalance's drain stops the job;
- not watching the sink's namespace: the application never gets a state (its chart's spark.jobNamespaces);
- no mutating webhook: the driver runs without the sink's ConfigMap, Secret env and metrics port.

Each is a Degraded reason that never blocks the rollout: the job is still submitted, and the condition clears
once the spark-operator is fixed.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Sequence
from typing import Any

from . import kube
from .lifecycle import Problem
from .spec import Reason, object_name

MIN_VERSION = "v2.4.0"  # the first with spec.suspend
_UPGRADE = ("helm upgrade spark-operator spark-operator/spark-operator -n spark-operator --reuse-values "
            f"--version {MIN_VERSION.lstrip('v')} (or newer)")

_crd_seen: tuple[float, frozenset[str] | None] = (float("-inf"), None)


def check(namespace: str, name: str, app: dict[str, Any] | None, pods: Sequence[kube.Pod],
          now: dt.datetime) -> Problem | None:
    """The first thing the spark-operator does not do for this sink, or None."""
    return too_old() or (not_watching(namespace, app, now) if app is not None else None) or \
        webhook_missing(name, pods)


def too_old() -> Problem | None:
    fields = _spec_fields()
    if fields is None or "suspend" in fields:  # unknown (no CRD, or no right to read it): nothing to say
        return None
    return Problem(Reason.SPARK_OPERATOR_TOO_OLD, "the installed SparkApplication CRD has no spec.suspend, so "
                   "spec.state paused and rebalances cannot stop the job (the API server drops the field): "
                   f"upgrade the spark-operator to {MIN_VERSION} or newer and apply its CRDs, which helm does "
                   f"not upgrade: {_UPGRADE}")


def _spec_fields() -> frozenset[str] | None:
    """The CRD's spec fields, read once a minute ($CHSINK_CRD_CHECK_SECONDS): it changes only with an upgrade."""
    global _crd_seen
    at, fields = _crd_seen
    if time.monotonic() - at >= float(os.environ.get("CHSINK_CRD_CHECK_SECONDS", "60")):
        fields = kube.spark_app_spec_fields()
        _crd_seen = (time.monotonic(), fields)
    return fields


def not_watching(namespace: str, app: dict[str, Any], now: dt.datetime) -> Problem | None:
    """An application the spark-operator never gave a state, $CHSINK_SPARK_PICKUP_SECONDS (60) after its
    creation: it takes one within a second when it watches the namespace."""
    if kube.app_state(app):
        return None
    created = dt.datetime.fromisoformat(str(app["metadata"]["creationTimestamp"]).replace("Z", "+00:00"))
    waited = (now - created).total_seconds()
    if waited < float(os.environ.get("CHSINK_SPARK_PICKUP_SECONDS", "60")):
        return None
    return Problem(Reason.SPARK_OPERATOR_NOT_WATCHING,
                   f"the spark-operator has not picked up SparkApplication {app['metadata']['name']} in "
                   f"{waited:.0f}s: it watches only the namespaces of its chart's spark.jobNamespaces (default: "
                   f"default); add {namespace}: helm upgrade spark-operator spark-operator/spark-operator -n "
                   f"spark-operator --reuse-values --set 'spark.jobNamespaces={{default,{namespace}}}'")


def webhook_missing(name: str, pods: Sequence[kube.Pod]) -> Problem | None:
    """A driver pod without the sink's ConfigMap: only the spark-operator's mutating webhook mounts it."""
    bare = [p.name for p in pods if p.role == "driver" and p.live and object_name(name) not in p.config_maps]
    if not bare:
        return None
    return Problem(Reason.SPARK_OPERATOR_WEBHOOK_MISSING,
                   f"driver pod {bare[0]} runs without ConfigMap {object_name(name)}: the spark-operator's mutating "
                   "webhook did not mutate it, so the job has no config, Secret env or metrics port; install the "
                   "spark-operator with webhook.enable=true and check its MutatingWebhookConfiguration and "
                   "webhook pod (with webhook.failurePolicy Ignore its failures go unseen)")
