"""State cleanup: rows of topics removed from a sink, and everything of a deleted sink (deletionPolicy)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import kopf

from sparkapp.config import SinkConfig

from . import kube, status
from .access import open_store, operator_config
from .spec import FORCE_DELETE_ANNOTATION, ConditionType, object_name


def clean_removed_topics(body: Any, cfg: SinkConfig, topics: list[str]) -> int:
    """Per-partition state cleanup for topics removed from the spec.

    A new epoch is taken first: it fences the running job, which can then neither move nor
    re-create these rows (it fails and is resubmitted with the new config), and only then are the
    rows deleted.
    """
    store = open_store(cfg)
    epoch = store.acquire_epoch(cfg.name, owner="chsink-operator")
    n = store.delete_topics(cfg.name, topics)
    kopf.info(body, reason="TopicsRemoved",
              message=f"fenced the job (epoch {epoch}) and deleted {n} state row(s) of removed topic(s) {topics}")
    return n


def delete_checkpoint(location: str) -> bool:
    """Deletes a checkpoint the operator can reach (a local or mounted path); object stores are left alone."""
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
        kube.delete_app(namespace, object_name(name), wait_s=60)
        cfg = operator_config(namespace, name, spec)
        n = open_store(cfg).delete(cfg.name)
        if delete_checkpoint(cfg.checkpoint_location):
            kopf.info(body, reason="CheckpointDeleted", message=f"deleted checkpoint {cfg.checkpoint_location}")
    except kopf.TemporaryError:
        raise
    except Exception as e:
        msg = f"cleanup failed: {e}; it will be retried. Annotate {FORCE_DELETE_ANNOTATION}=true to release"
        status.patch(namespace, name, {"conditions": [status.condition(ConditionType.DEGRADED, True, "CleanupFailed",
                                                                       msg, int(meta.get("generation", 0)))]})
        kopf.warn(body, reason="CleanupFailed", message=msg)
        raise kopf.TemporaryError(msg, delay=15) from e
    kopf.info(body, reason="Cleaned", message=f"deleted {n} partition state row(s) of sink {cfg.name}")
