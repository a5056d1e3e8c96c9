"""A class-data-sharing archive of Spark's classes for the tests' Spark drivers.

A test run starts a Spark driver JVM for every job run, well over a hundred of them, and each spent 10-15 s of CPU
before its first batch, most of it loading and verifying the same few thousand classes from pyspark's jars. The
JVM can map those classes, already parsed and verified, from an archive it dumped at the exit of an earlier run
(`-XX:ArchiveClassesAtExit`, then `-XX:SharedArchiveFile`): on this machine a session's start and first queries
took 5 s of the JVM's CPU instead of 11-15. What the job does is the same; only where its classes come from
changes.

The JVM refuses an archive whose class path or JDK differ from the ones it was dumped with (it warns and goes on
without it), so the archive is keyed by both: pyspark's install path, version and its jars' mtimes, and the JVM's
own library.
Usage: `python -m hack.testbed.cds` makes it once (hack/provision.sh `spark-cds`); `--workload` is the run it is
dumped from.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .process import SHORT_LIVED_JIT, TestbedError, cache_dir, scratch_env


def _jvm_library() -> Path:
    """The libjvm.so of the `java` pyspark launches (JAVA_HOME's, else the one on PATH)."""
    home = os.environ.get("JAVA_HOME")
    java = Path(home, "bin", "java") if home else Path(shutil.which("java") or "java")
    [lib] = list(java.resolve().parents[1].glob("lib/server/libjvm.so")) or [java]
    return lib


def spark_archive() -> Path:
    """Where the archive for this pyspark and this JVM lives (it may not exist yet)."""
    import pyspark

    lib = _jvm_library()
    stat = lib.stat() if lib.exists() else None
    # the JVM refuses an archive whose classpath jars changed since the dump, silently: a venv installed again
    # at the same path (a second clean clone) gets jars with other mtimes, so they are in the key too
    jars = max((j.stat().st_mtime_ns for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")), default=0)
    key = f"{Path(pyspark.__file__).parent}|{jars}|{lib}|{stat and (stat.st_size, stat.st_mtime_ns)}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_dir() / f"spark-cds-{pyspark.__version__}-{digest}.jsa"


def archive_option() -> str:
    """The driver JVM's option that maps the archive, or nothing while there is none: a missing archive would
    also turn off the JDK's own base archive."""
    path = spark_archive()
    return f" -XX:SharedArchiveFile={path}" if path.exists() else ""


def ensure_spark_archive(timeout: float = 600) -> Path:
    """Dumps the archive unless it exists; one process at a time (a lock beside it)."""
    path = spark_archive()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return path
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        scratch = path.parent / "spark-cds-scratch"
        env = {**os.environ, **scratch_env(scratch)}
        env["SPARK_SUBMIT_OPTS"] += f" {SHORT_LIVED_JIT} -XX:ArchiveClassesAtExit={tmp}"
        res = subprocess.run([sys.executable, "-m", "hack.testbed.cds", "--workload"], env=env, capture_output=True,
                             text=True, timeout=timeout)
        shutil.rmtree(scratch, ignore_errors=True)
        if res.returncode != 0 or not tmp.exists():
            raise TestbedError(f"dumping Spark's class archive failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
        tmp.rename(path)
        return path


def _workload() -> None:
    """What a job's driver loads: a session with the Kafka connector and the job's collector, a Kafka stream's
    plan, a streaming query whose batches reach Python through Arrow, and a batch read of its output."""
    import tempfile
    import time

    from pyspark.sql import SparkSession

    from sparkapp.config import with_jvm_defaults

    from .spark import connector_jars

    builder = SparkSession.builder.master("local[2]").appName("chsink-cds")
    conf = with_jvm_defaults({"spark.jars": ",".join(connector_jars()), "spark.ui.enabled": "false",
                              "spark.sql.shuffle.partitions": "2", "spark.sql.session.timeZone": "UTC"})
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    (spark.readStream.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9").option("subscribe", "t")
     .load().selectExpr("CAST(value AS STRING)", "partition", "offset"))
    seen: list[int] = []

    def batch(df, batch_id):  # type: ignore[no-untyped-def]
        seen.append(df.toArrow().num_rows)

    with tempfile.TemporaryDirectory() as work:
        query = (spark.readStream.format("rate").option("rowsPerSecond", 1000).load()
                 .selectExpr("value", "CAST(timestamp AS STRING) AS ts").writeStream.foreachBatch(batch)
                 .option("checkpointLocation", f"{work}/checkpoint").trigger(processingTime="500 milliseconds")
                 .start())
        while len(seen) < 3:
            time.sleep(0.5)
        query.stop()
        spark.createDataFrame([(1, "a")], ["x", "y"]).write.parquet(f"{work}/out")
        spark.read.parquet(f"{work}/out").groupBy("y").count().collect()
    spark.stop()


if __name__ == "__main__":
    if sys.argv[1:] == ["--workload"]:
        _workload()
    else:
        print(ensure_spark_archive())
