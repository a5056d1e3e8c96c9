"""Kopf handlers for ClickHouseSink: thin wrappers over reconcile and cleanup.

A change and every status tick run the same reconcile (reconcile.py). A wrong spec is a permanent failure for
kopf (only a change helps, and a change is handled at once); anything else is retried after a short delay.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf

from sparkapp.config import ConfigError

from . import cleanup, kube, leader, metrics, problems
from . import reconcile as reconciler
from . import status as recorder
from .lifecycle import Observed, Problem
from .model import SinkSpec, SinkStatus
from .spec import FORCE_DELETE_ANNOTATION, GROUP, PLURAL, VERSION, Reason

STATUS_INTERVAL = float(os.environ.get("CHSINK_STATUS_INTERVAL", "30"))
RETRY_DELAY = float(os.environ.get("CHSINK_RETRY_DELAY", "10"))
CLEANUP_POLL_S = 3.0  # how often a deletion looks at its checkpoint cleanup Job


@kopf.on.login()
def login(**kwargs: Any) -> Any:
    """In-cluster service account, else $KUBECONFIG read now (the client library reads it at import)."""
    kube.load_config()  # the actions use the kubernetes client's default configuration
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def configure(*, settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.INFO
    # only the Events we post (one Warning per problem, one Normal on recovery): kopf's own log lines
    # ("Handler 'reconcile' failed temporarily" on each retry, "Handler succeeded" on each change) stay in the log
    settings.posting.loggers = False
    settings.watching.server_timeout = 60
    # a deletion waits for the refresh timer to exit, re-checked every cancellation_polling seconds: kopf's 60 s
    # default held each `kubectl delete` a minute after its cleanup had finished
    settings.background.cancellation_polling = 1.0
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=f"kopf.{GROUP}")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=f"kopf.{GROUP}")


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def reconcile(*, namespace: Any, name: Any, **_: Any) -> dict[str, str]:
    leader.fence()
    out = reconciler.reconcile(namespace, name)
    if out is not None and out.problem is not None:
        if out.problem.permanent:
            raise kopf.PermanentError(out.problem.message)
        raise kopf.TemporaryError(out.problem.message, delay=RETRY_DELAY)
    return {"sparkApplication": out.changed if out else "gone"}


@kopf.timer(GROUP, VERSION, PLURAL, interval=STATUS_INTERVAL, initial_delay=min(5.0, STATUS_INTERVAL),
            idle=None, sharp=True)
def refresh(*, namespace: Any, name: Any, meta: Any, **_: Any) -> None:
    """The job's state, lag and stalls, and a retry of whatever failed; its findings are in the status."""
    if meta.get("deletionTimestamp"):
        return
    leader.fence()
    reconciler.reconcile(namespace, name)


@kopf.on.delete(GROUP, VERSION, PLURAL)
def finalize(*, body: Any, namespace: Any, name: Any, spec: Any, meta: Any, status: Any, **_: Any) -> None:
    leader.fence()
    try:
        sink = SinkSpec.parse(spec, name)
    except ConfigError as e:
        kopf.warn(body, reason="CleanupSkipped", message=f"the spec is invalid, so its state cannot be found: {e}")
        return
    with reconciler.lock(namespace, name):  # a reconcile begun before the deletion ends first
        try:
            cleanup.cleanup(body, namespace, name, sink, dict(meta))
        except cleanup.CleanupPending as e:  # the checkpoint's cleanup Job runs: not a failure, looked at again soon
            old = SinkStatus.of((kube.get_sink(namespace, name) or {}).get("status"))
            recorder.record(body, old, old, Observed(sink.state, None, app_message=str(e), deleting=True),
                            int(meta.get("generation", 0)))
            raise kopf.TemporaryError(str(e), delay=CLEANUP_POLL_S) from None
        except Exception as e:
            msg = f"{problems.classify(e).message}; retried. Annotate {FORCE_DELETE_ANNOTATION}=true to release it"
            old = SinkStatus.of((kube.get_sink(namespace, name) or {}).get("status"))  # as the last try wrote it
            recorder.record(body, old, old, Observed(sink.state, None, problem=Problem(Reason.CLEANUP_FAILED, msg),
                                                     deleting=True), int(meta.get("generation", 0)))
            raise kopf.TemporaryError(msg, delay=RETRY_DELAY) from e
    metrics.sink_state(namespace, name, None)
    reconciler.forget(namespace, name)
