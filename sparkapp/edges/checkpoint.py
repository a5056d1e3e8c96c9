"""Deleting a checkpoint chsink wrote, on any file system: what may go is decided here once, for the operator
(local and mounted paths, with pathlib) and for the cleanup Job it starts for remote ones (s3a://, hdfs://,
through Hadoop's FileSystem in the job's image, with the driver's credentials)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Protocol

from ..config import CHECKPOINT_ENTRIES, CHECKPOINT_MARKER


def is_chsink_entry(name: str) -> bool:
    """An entry chsink or Spark wrote under a checkpoint location (runs of the pipelined path are run-<epoch>)."""
    return name.startswith("run-") or name.lstrip(".") in CHECKPOINT_ENTRIES


class CheckpointFiles(Protocol):
    """The few operations deleting a checkpoint needs, on the location's own file system."""

    def marker(self) -> str | None:
        """The marker file's text, None when there is none."""

    def names(self) -> list[str]:
        """The entries directly under the location."""

    def delete(self, name: str) -> None:
        """Deletes an entry under the location, recursively."""

    def remove_location(self) -> None:
        """Removes the location itself, which is empty."""


def delete_checkpoint(files: CheckpointFiles, location: str, sink: str) -> str:
    """Deletes what chsink wrote under a checkpoint, and only when its marker names this sink: never a directory
    chsink did not claim, nor anything else in it. Returns what happened, for the sink's Event."""
    owner = files.marker()
    if owner is None:
        return f"checkpoint {location} kept: it has no {CHECKPOINT_MARKER} file, so chsink did not create it"
    if owner.strip() != sink:
        return f"checkpoint {location} kept: its {CHECKPOINT_MARKER} names sink {owner.strip()!r}, not {sink!r}"
    for name in files.names():
        if is_chsink_entry(name):
            files.delete(name)
    files.delete(CHECKPOINT_MARKER)
    left = sorted(files.names())
    if left:
        return f"deleted chsink's checkpoint files under {location}; kept what else is there: {left[:10]}"
    files.remove_location()
    return f"deleted checkpoint {location}"


class LocalFiles:
    """A checkpoint on a path this process reaches (local, or a volume mounted into it)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def marker(self) -> str | None:
        marker = self.path / CHECKPOINT_MARKER
        return marker.read_text() if marker.is_file() else None

    def names(self) -> list[str]:
        return [e.name for e in self.path.iterdir()]

    def delete(self, name: str) -> None:
        entry = self.path / name
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        # a file the job wrote through Hadoop's local file system has its checksum beside it; Hadoop deletes both
        (self.path / f".{name}.crc").unlink(missing_ok=True)

    def remove_location(self) -> None:
        self.path.rmdir()
