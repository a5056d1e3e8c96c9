"""The Spark session and the streaming checkpoint: the job's Spark-side setup."""

from __future__ import annotations

import logging
import os
from typing import Any

from ..config import SinkConfig

log = logging.getLogger("chsink.job")


def build_session(cfg: SinkConfig) -> Any:
    from pyspark.sql import SparkSession

    conf = dict(cfg.spark_conf)
    if conf.get("spark.speculation", "false").lower() != "false":
        log.warning("spark.speculation=true ignored: a speculative task would write a partition twice")
    conf["spark.speculation"] = "false"
    conf.setdefault("spark.sql.session.timeZone", "UTC")
    conf.setdefault("spark.ui.showConsoleProgress", "false")
    builder = SparkSession.builder.appName(f"chsink-{cfg.name}")
    if not os.environ.get("SPARK_ENV_LOADED") and "spark.master" not in conf:
        builder = builder.master(os.environ.get("CHSINK_SPARK_MASTER", "local[2]"))
    jars = os.environ.get("CHSINK_SPARK_JARS")
    if jars and "spark.jars" not in conf:
        conf["spark.jars"] = jars
    for k, v in conf.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


_SPARK_CHECKPOINT_ENTRIES = {"offsets", "commits", "metadata", "sources", "state", "metadata.crc"}


def fresh_checkpoint(spark: Any, location: str, epoch: int) -> str:
    """A new checkpoint directory for this run (`<location>/run-<epoch>`); older runs' are deleted.

    On the pipelined driver path Spark commits a batch before chsink has written it, so a checkpoint
    may be ahead of the data: every run starts from the state store instead, in a fresh directory.
    """
    jvm = spark._jvm
    base = jvm.org.apache.hadoop.fs.Path(location.rstrip("/"))
    fs = base.getFileSystem(spark._jsc.hadoopConfiguration())
    if fs.exists(base):
        for st in fs.listStatus(base):  # older runs', or a checkpoint of a non-pipelined run; nothing else
            name = st.getPath().getName()
            if name.startswith("run-") or name.lstrip(".") in _SPARK_CHECKPOINT_ENTRIES:
                fs.delete(st.getPath(), True)
    return f"{location.rstrip('/')}/run-{epoch}"


def checkpoint_exists(spark: Any, location: str) -> bool:
    """True when the checkpoint has committed offsets (any Hadoop filesystem: local, s3a, hdfs...)."""
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(location.rstrip("/") + "/offsets")
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    return bool(fs.exists(path)) and len(fs.listStatus(path)) > 0
