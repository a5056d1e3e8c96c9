"""State cleanup: rows of topics removed from a sink, and everything of a deleted sink (deletionPolicy)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import kopf

from sparkapp.config import CHECKPOINT_ENTRIES, CHECKPOINT_MARKER, SinkConfig

from . import kube
from .access import open_store, operator_config
from .model import SinkSpec
from .spec import FORCE_DELETE_ANNOTATION, object_name


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


def delete_checkpoint(location: str, sink: str) -> str:
    """Deletes what chsink wrote under a checkpoint the operator can reach (a local or mounted path), and only
    when its marker names this sink: never a directory chsink did not claim, nor anything else in it. Returns
    what happened, for the Event."""
    local = location.removeprefix("file://")
    path = Path(local)
    if not local.startswith("/"):  # s3a://, hdfs://, gs://...: the operator has neither their clients nor keys
        return (f"checkpoint {location} kept: the operator deletes local or mounted paths only; delete it with "
                f"the storage's own tools")
    marker = path / CHECKPOINT_MARKER
    if not marker.is_file():
        return f"checkpoint {location} kept: it has no {CHECKPOINT_MARKER} file, so chsink did not create it"
    owner = marker.read_text().strip()
    if owner != sink:
        return f"checkpoint {location} kept: its {CHECKPOINT_MARKER} names sink {owner!r}, not {sink!r}"
    for entry in path.iterdir():
        name = entry.name.lstrip(".")
        if entry.name.startswith("run-") or name in CHECKPOINT_ENTRIES:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    marker.unlink()
    left = sorted(e.name for e in path.iterdir())
    if left:
        return f"deleted chsink's checkpoint files under {location}; kept what else is there: {left[:10]}"
    path.rmdir()
    return f"deleted checkpoint {location}"


def cleanup(body: Any, namespace: str, name: str, spec: SinkSpec, meta: dict[str, Any]) -> None:
    """The finalizer: with deletionPolicy Delete, stop the job, then delete its state. Raises on failure (the
    caller records it and retries)."""
    if (meta.get("annotations") or {}).get(FORCE_DELETE_ANNOTATION) == "true":
        kopf.warn(body, reason="ForcedDelete", message="cleanup skipped by the force-delete annotation")
        return
    if spec.deletion_policy != "Delete":
        kopf.info(body, reason="Retained", message="deletionPolicy Retain: per-partition state kept")
        return
    kube.delete_app(namespace, object_name(name), wait_s=60)
    cfg = operator_config(namespace, name, spec)
    n = open_store(cfg).delete(cfg.name)
    kopf.info(body, reason="CheckpointCleanup", message=delete_checkpoint(cfg.checkpoint_location, cfg.name))
    kopf.info(body, reason="Cleaned", message=f"deleted {n} partition state row(s) of sink {cfg.name}")
