"""The Spark session and the streaming checkpoint: the job's Spark-side setup."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ..config import CHECKPOINT_MARKER, ConfigError, SinkConfig, is_local_path, with_jvm_defaults
from ..edges.checkpoint import is_chsink_entry

log = logging.getLogger("chsink.job")
DIRECT_RESULT_MAX = "64m"
# Spark's own "no limit" for the bytes of an Arrow batch sent to a Python worker (Int.MaxValue); see session_conf
ARROW_BATCH_BYTES_UNBOUNDED = str(2**31 - 1)
# Arrow's allocator (mimalloc) hands memory back to the system 1 s after it is freed, less than a batch takes. A
# batch's lines, and the copy a window's sifting makes without its bad records, are each some 15 MB per partition:
# every batch then got them as fresh pages, faulted in one by one, up to 40 ms for a copy that takes 2.5 on pages
# kept. Kept for 10 s, the next batch reuses them; a job left idle still gives them back.
ARROW_ALLOCATOR_ENV = {"MIMALLOC_PURGE_DELAY": "10000"}
CHECKPOINT_FILE_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
FILE_SYSTEM_CHECKPOINTS = "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager"


def keep_arrow_memory() -> None:
    """Sets ARROW_ALLOCATOR_ENV in this process unless its environment says otherwise. mimalloc reads its options
    once, when pyarrow loads: this must run first (the driver's `main` does; the executors' Python workers get
    it from `spark.executorEnv`, see session_conf)."""
    for k, v in ARROW_ALLOCATOR_ENV.items():
        os.environ.setdefault(k, v)


def session_conf(cfg: SinkConfig) -> dict[str, str]:
    """The Spark conf the job runs with; ConfigError when Spark's Kafka connector cannot be found."""
    conf = with_jvm_defaults(cfg.spark_conf)
    if conf.get("spark.speculation", "false").lower() != "false":
        log.warning("spark.speculation=true ignored: a speculative task would write a partition twice")
    conf["spark.speculation"] = "false"
    conf.setdefault("spark.sql.session.timeZone", "UTC")
    conf.setdefault("spark.ui.showConsoleProgress", "false")
    # Spark's and the Kafka client's INFO lines (a few per task and per seek) would each be built, the Kafka
    # client's with a stack walk for its location, and then dropped by the console's WARN threshold: CPU the
    # driver JVM spends per batch for nothing. `sparkConf` can set it back to INFO.
    conf.setdefault("spark.log.level", "WARN")
    # On the driver path each task's result is a Kafka partition's share of the batch as Arrow, ~10 MB. Above
    # Spark's default of 1 MB a result is stored in the executor's block manager and fetched back from it, even
    # where the executor is the driver's own JVM (local mode): one more copy of every row and more garbage. Up
    # to this size it goes to the driver with the task's status instead, well under the RPC message limit
    # (`spark.rpc.message.maxSize`, 128 MB, which Spark also bounds it by).
    conf.setdefault("spark.task.maxDirectResultSize", DIRECT_RESULT_MAX)
    # On the executor path Spark hands each task's rows to the Python worker in Arrow batches. Under any byte
    # limit but Int.MaxValue (Spark 4's default is 256 MB) it measures the batch being built after every row,
    # every column's buffers: 0.4 of the JVM's 4.5 µs per row on the HTTP path (docs/configuration.md). The
    # row limit (`spark.sql.execution.arrow.maxRecordsPerBatch`, 10,000) still closes each batch, and the worker
    # holds all of its task's batches anyway, so the byte limit bounded nothing the task's data does not.
    conf.setdefault("spark.sql.execution.arrow.maxBytesPerBatch", ARROW_BATCH_BYTES_UNBOUNDED)
    # A checkpoint on the local file system: Spark's default manager goes through Hadoop's FileContext, which,
    # without Hadoop's native library (Spark ships none), starts a `readlink` process for each file it looks at
    # and a `chmod` for each it writes: some 19 processes per batch, each forked from the driver JVM, tens of ms
    # per batch. Through the FileSystem API it renames in Java and starts about 4. rename(2) on one local file system
    # is as atomic as FileContext's; other file systems keep Spark's choice.
    if is_local_path(cfg.checkpoint_location, conf.get("spark.hadoop.fs.defaultFS", "file:///")):
        conf.setdefault(CHECKPOINT_FILE_MANAGER, FILE_SYSTEM_CHECKPOINTS)
    # the allocator of the executors' Python workers (their pyarrow loads in them), as the driver has it
    for k, v in ARROW_ALLOCATOR_ENV.items():
        conf.setdefault(f"spark.executorEnv.{k}", os.environ.get(k, v))
    if not os.environ.get("SPARK_ENV_LOADED") and "spark.jars" not in conf:  # launched by spark-submit: its job
        jars = kafka_connector_jars(conf)
        if jars:
            conf["spark.jars"] = ",".join(jars)
    return conf


# A local-mode driver's executors are threads of its own JVM: nothing dials it from elsewhere. Left to choose, Spark
# takes the last non-loopback interface's address when the host name resolves to loopback, and one that goes away
# before the bind (a CNI bridge, a VPN link) fails the start: "Cannot assign requested address ... after 16 retries".
LOCAL_DRIVER_ADDRESS = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}


def local_driver_conf(master: str, conf: dict[str, str]) -> dict[str, str]:
    """`conf` with LOCAL_DRIVER_ADDRESS under it when `master` is local; `conf` wins where it sets either."""
    return {**LOCAL_DRIVER_ADDRESS, **conf} if master.startswith("local") else conf


def build_session(cfg: SinkConfig, conf: dict[str, str]) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"chsink-{cfg.name}")
    if not os.environ.get("SPARK_ENV_LOADED"):  # not launched by spark-submit: this process picks the master
        master = conf.get("spark.master") or os.environ.get("CHSINK_SPARK_MASTER", "local[2]")
        builder = builder.master(master)
        conf = local_driver_conf(master, conf)
    for k, v in conf.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


def kafka_connector_jars(conf: dict[str, str]) -> list[str]:
    """The jars that give Spark its `kafka` source when the job runs outside spark-submit: $CHSINK_SPARK_JARS,
    else what `make setup` caches; none when Spark already has them (its jars folder, spark.jars.packages).
    ConfigError, in one line, when they are nowhere."""
    import pyspark

    if os.environ.get("CHSINK_SPARK_JARS"):
        return [j for j in os.environ["CHSINK_SPARK_JARS"].split(",") if j]
    if "spark.jars.packages" in conf:
        return []
    homes = [Path(pyspark.__file__).parent] + ([Path(os.environ["SPARK_HOME"])] if os.environ.get("SPARK_HOME") else [])
    if any(next((h / "jars").glob("spark-sql-kafka-0-10_*.jar"), None) for h in homes):
        return []
    cache_root = Path(os.environ.get("CHSINK_CACHE") or Path.home() / ".cache" / "chsink")
    cache = cache_root / f"spark-kafka-{pyspark.__version__}"
    jars = sorted(str(j) for j in cache.glob("*.jar"))
    if not jars:
        raise ConfigError(
            f"Spark's Kafka connector (spark-sql-kafka-0-10 {pyspark.__version__}) is not installed: run `make setup` "
            f"(it caches the jars in {cache}), or set CHSINK_SPARK_JARS=<jar,...>, or sparkConf "
            f"spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}")
    return jars


def mark_checkpoint(spark: Any, location: str, sink: str) -> None:
    """Claims the checkpoint location for this sink (CHECKPOINT_MARKER); refuses one another sink claimed, since
    two sinks in one checkpoint would resume from each other's offsets."""
    jvm = spark._jvm
    marker = jvm.org.apache.hadoop.fs.Path(location.rstrip("/") + "/" + CHECKPOINT_MARKER)
    fs = marker.getFileSystem(spark._jsc.hadoopConfiguration())
    if fs.exists(marker):
        stream = fs.open(marker)
        try:
            owner = bytes(stream.readAllBytes()).decode().strip()
        finally:
            stream.close()
        if owner != sink:
            raise ConfigError(f"checkpointLocation {location} belongs to sink {owner!r} (its {CHECKPOINT_MARKER} "
                              f"file); give sink {sink!r} a location of its own")
        return
    out = fs.create(marker, True)
    try:
        out.write(bytearray(sink.encode()))
    finally:
        out.close()


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
            if is_chsink_entry(name):
                fs.delete(st.getPath(), True)
    return f"{location.rstrip('/')}/run-{epoch}"


def checkpoint_exists(spark: Any, location: str) -> bool:
    """True when the checkpoint has committed offsets (any Hadoop filesystem: local, s3a, hdfs...)."""
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(location.rstrip("/") + "/offsets")
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    return bool(fs.exists(path)) and len(fs.listStatus(path)) > 0
