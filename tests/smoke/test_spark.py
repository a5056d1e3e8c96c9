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
