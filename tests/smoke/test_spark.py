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
