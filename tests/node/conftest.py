"""The single-node cluster (hack/testbed/node.py) with every image built here, once per session."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.testbed.node import BRIDGE, NODE_IP, Cluster, cluster
from hack.testbed.process import REPO, await_provisioning


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
    await_provisioning()  # `make test` builds the node's parts and images in the background
    _images("base")
    workdir = tmp_path_factory.mktemp("node")
    with cluster(workdir) as c:
        print(f"\ncluster started in {c.started_in:.0f}s")
        t0 = time.monotonic()
        # every image the tests run, in one load: the layers they share are copied once
        c.load([*(base_image(n) for n in ("python", "zookeeper", "kafka", "clickhouse", "spark-operator")),
                *project_images()])
        print(f"images loaded in {time.monotonic() - t0:.0f}s")
        yield c
    # Teardown leaves the machine as it found it: no mounts, chains, address, bridge or processes of the node.
    assert str(workdir) not in Path("/proc/mounts").read_text()
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    assert not re.search(r"^:(KUBE|CNI)-", rules, re.M), rules
    links = subprocess.run(["ip", "addr"], capture_output=True, text=True).stdout
    assert NODE_IP not in links and BRIDGE not in links, links
    procs = subprocess.run(["pgrep", "-f", str(workdir)], capture_output=True, text=True).stdout
    assert not procs.strip(), procs


@functools.cache
def _image_names() -> tuple[str, ...]:
    return tuple(_images("list").split())


def base_image(name: str) -> str:
    """One of the test bed's images by its short name (python, spark, kafka, clickhouse, ...)."""
    return next(i for i in _image_names() if i.split(":")[0].rsplit("/", 1)[-1] == name)


@functools.cache
def project_images() -> tuple[str, str]:
    """chsink's own images from its Dockerfile: built again each session (the code changes between runs;
    buildah's layer cache keeps the dependencies)."""
    _images("project")
    return base_image("chsink-operator"), base_image("chsink-spark")
