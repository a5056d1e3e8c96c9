"""The single-node cluster (hack/testbed/node.py) with every image built here, once per session."""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterator

import pytest

from hack.testbed.node import Cluster, cluster
from hack.testbed.process import REPO


def _images(*args: str) -> str:
    # buildah keeps scratch files in TMPDIR, which the session points at a directory it may remove
    env = dict(os.environ, TMPDIR="/var/tmp")
    res = subprocess.run([str(REPO / "hack" / "images.sh"), *args], capture_output=True, text=True, timeout=3600,
                         env=env)
    if res.returncode != 0:
        raise RuntimeError(f"hack/images.sh {' '.join(args)} failed:\n{res.stderr[-4000:]}")
    return res.stdout


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    _images("base")
    with cluster(tmp_path_factory.mktemp("node")) as c:
        print(f"\ncluster started in {c.started_in:.0f}s")
        yield c


@functools.cache
def _image_names() -> tuple[str, ...]:
    return tuple(_images("list").split())


def base_image(name: str) -> str:
    """One of the test bed's images by its short name (python, spark, kafka, clickhouse, ...)."""
    return next(i for i in _image_names() if i.split(":")[0].rsplit("/", 1)[-1] == name)


def project_images() -> list[str]:
    """chsink's own images from its Dockerfile: built again each session (the code changes between runs;
    buildah's layer cache keeps the dependencies)."""
    _images("project")
    return [base_image("chsink-operator"), base_image("chsink-spark")]
