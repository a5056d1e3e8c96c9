"""State cleanup: rows of topics removed from a sink, and everything of a deleted sink (deletionPolicy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kopf

from sparkapp.config import SinkConfig, is_local_path
from sparkapp.edges import checkpoint as checkpoint_files
from sparkapp.edges.verified import VerifiedStore

from . import kube
from .access import open_store, operator_config
from .model import SinkSpec
from .render import Defaults, checkpoint_job, checkpoint_job_name
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


class CleanupPending(Exception):  # not an error: the finalizer looks again shortly
    """The cleanup Job of a remote checkpoint has not finished yet."""


def delete_checkpoint(location: str, sink: str) -> str:
    """Deletes what chsink wrote under a checkpoint the operator's pod reaches (a local or mounted path) as
    edges.checkpoint decides. Returns what happened, for the Event."""
    local = location.removeprefix("file://")
    if not local.startswith("/"):  # remote, or local to Hadoop but relative to the driver's working directory
        return f"checkpoint {location} is not an absolute local path, the only kind the operator's pod reaches"
    return checkpoint_files.delete_checkpoint(checkpoint_files.LocalFiles(Path(local)), location, sink)


def delete_remote_checkpoint(namespace: str, name: str, spec: SinkSpec, sink: str) -> tuple[bool, str]:
    """A checkpoint on s3a://, hdfs:// or another remote file system goes through a Job in the sink's namespace,
    with the job's image and the driver's credentials (render.checkpoint_job). (deleted or kept as the marker
    allows, what happened) once the Job is done; CleanupPending until then."""
    job = checkpoint_job_name(name)
    run = kube.job_run(namespace, job)
    if run is None:
        kube.create_job(checkpoint_job(namespace, name, spec, sink, Defaults.from_env()))
        raise CleanupPending(f"deleting checkpoint {spec.checkpoint_location}: Job {job} started")
    if not run.done:
        raise CleanupPending(f"deleting checkpoint {spec.checkpoint_location}: Job {job} runs")
    kube.delete_job(namespace, job)
    if run.succeeded:
        return True, run.message or f"deleted checkpoint {spec.checkpoint_location}"
    return False, (f"checkpoint {spec.checkpoint_location} kept: Job {job} failed: "
                   f"{run.message or 'it left no message'}; delete it with the storage's own tools")


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
    # the checkpoint first: a retry after it finds the Job gone and the state rows still there, never the reverse
    if is_local_path(cfg.checkpoint_location, spec.spark.spark_conf.get("spark.hadoop.fs.defaultFS", "file:///")):
        done, checkpoint = True, delete_checkpoint(cfg.checkpoint_location, cfg.name)
    else:
        done, checkpoint = delete_remote_checkpoint(namespace, name, spec, cfg.name)
    store = open_store(cfg)
    n = store.delete(cfg.name)
    VerifiedStore(store).delete(cfg.name)
    (kopf.info if done else kopf.warn)(body, reason="CheckpointCleanup", message=checkpoint)
    kopf.info(body, reason="Cleaned", message=f"deleted {n} partition state row(s) of sink {cfg.name}")
