"""Kopf handlers for ClickHouseSink: thin wrappers over reconcile, cleanup and status."""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf

from . import cleanup, metrics
from . import reconcile as reconciler
from .spec import GROUP, PLURAL, VERSION, DesiredState, RebalancePhase
from .status import sink_status

STATUS_INTERVAL = float(os.environ.get("CHSINK_STATUS_INTERVAL", "30"))


@kopf.on.login()
def login(**kwargs: Any) -> Any:
    """In-cluster service account, else $KUBECONFIG read now (the client library reads it at import)."""
    from kubernetes import config

    try:  # the actions use the kubernetes client's default configuration
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # type: ignore[no-untyped-call]
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def configure(*, settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 60
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=f"kopf.{GROUP}")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=f"kopf.{GROUP}")


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def reconcile(*, body: Any, namespace: Any, name: Any, spec: Any, meta: Any, status: Any, **_: Any) -> dict[str, str]:
    try:
        changed = reconciler.reconcile(body, namespace, name, dict(spec), dict(meta), dict(status))
    except kopf.PermanentError:
        raise  # counted where it is decided (an invalid spec)
    except Exception as e:
        metrics.RECONCILE_ERRORS.labels(type(e).__name__).inc()
        raise
    return {"sparkApplication": changed}


@kopf.on.delete(GROUP, VERSION, PLURAL)
def finalize(*, body: Any, namespace: Any, name: Any, spec: Any, meta: Any, **_: Any) -> None:
    cleanup.cleanup(body, namespace, name, dict(spec), dict(meta))
    metrics.sink_state(namespace, name, None)


@kopf.timer(GROUP, VERSION, PLURAL, interval=STATUS_INTERVAL, initial_delay=min(5.0, STATUS_INTERVAL),
            idle=None, sharp=True)
def refresh_sink_status(*, body: Any, namespace: Any, name: Any, spec: Any, meta: Any, status: Any,
                        **_: Any) -> None:
    if (spec or {}).get("state", DesiredState.RUNNING) == DesiredState.STOPPED:
        return
    current = dict(status or {})
    if (current.get("rebalance") or {}).get("phase") in (RebalancePhase.SETTLING, RebalancePhase.DRAINING):
        reconciler.reconcile(body, namespace, name, dict(spec), dict(meta), current)
    sink_status(body, namespace, name, dict(spec))
