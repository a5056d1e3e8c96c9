"""Spark with the real spark-sql-kafka connector reads the right count per partition."""

from confluent_kafka import Producer


def test_spark_reads_kafka(spark, kafka, topic):
    name = topic(3)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    counts = {0: 10, 1: 25, 2: 40}
    for p, n in counts.items():
        for i in range(n):
            producer.produce(name, value=f"{p}-{i}".encode(), partition=p)
    assert producer.flush(30) == 0

    df = (spark.read.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap)
          .option("subscribe", name).option("startingOffsets", "earliest").load())
    got = {r["partition"]: r["count"] for r in df.groupBy("partition").count().collect()}
    assert got == counts


def test_the_tests_drivers_compile_with_c1_alone_and_the_demos_do_not(spark, tmp_path):
    """SHORT_LIVED_JIT reaches the driver JVM through SPARK_SUBMIT_OPTS (tests/conftest.py); the demo's
    environment (hack/demo.py) leaves the JVM's defaults."""
    from hack.testbed.process import SHORT_LIVED_JIT, scratch_env

    args = list(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert SHORT_LIVED_JIT in args, args
    assert SHORT_LIVED_JIT not in scratch_env(tmp_path)["SPARK_SUBMIT_OPTS"]


def test_the_tests_drivers_load_sparks_classes_from_the_test_beds_archive(tmp_path):
    """A driver started with the tests' own SPARK_SUBMIT_OPTS (tests/conftest.py) takes Spark's classes from the
    archive hack/provision.sh made (`spark-cds`, hack/testbed/cds.py), not from pyspark's jars: an archive the JVM
    refused (another class path or JDK), or one without Spark's classes, would give none. The demo's environment
    leaves it out."""
    import os
    import subprocess
    import sys

    from hack.testbed.cds import spark_archive
    from hack.testbed.process import scratch_env

    assert spark_archive().exists(), "hack/provision.sh spark-cds made no archive"
    log = tmp_path / "class-load.log"
    env = dict(os.environ, SPARK_SUBMIT_OPTS=f"{os.environ['SPARK_SUBMIT_OPTS']} -Xlog:class+load=info:file={log}")
    code = ("from pyspark.sql import SparkSession; s = SparkSession.builder.master('local[1]')"
            ".config('spark.ui.enabled', 'false').getOrCreate(); s.range(3).count(); s.stop()")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, timeout=180)
    # a lambda's class is made at run time, never archived
    loaded = [line for line in log.read_text().splitlines() if "] org.apache.spark." in line and "$$Lambda" not in line]
    shared = [line for line in loaded if line.endswith("source: shared objects file (top)")]
    assert len(shared) > 0.9 * len(loaded) > 500, (len(shared), len(loaded), loaded[:3])
    assert "SharedArchiveFile" not in scratch_env(tmp_path)["SPARK_SUBMIT_OPTS"]


def test_a_local_jobs_driver_binds_loopback_not_an_interface_that_may_go_away(tmp_path):
    """The job's local driver takes 127.0.0.1 even though this host has other interfaces: Spark's own choice was the
    last non-loopback one, the node tests' CNI bridge while it existed, and a job started as it was removed failed
    ("Cannot assign requested address: Service 'sparkDriver' failed after 16 retries")."""
    import os
    import subprocess
    import sys

    from hack.testbed.process import REPO, scratch_env

    code = ("from sparkapp.spark.session import build_session\n"
            "from types import SimpleNamespace\n"
            "s = build_session(SimpleNamespace(name='bind'), {'spark.ui.enabled': 'false'})\n"
            "c = s.sparkContext.getConf()\n"
            "print(c.get('spark.driver.host'), c.get('spark.driver.bindAddress'))\n"
            "s.stop()\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, **scratch_env(tmp_path, short_lived=True)}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["127.0.0.1", "127.0.0.1"], out.stdout
