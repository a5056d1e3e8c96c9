"""The rows the job hands its writer are Spark's Kafka source's own: no projection between the source and the Arrow
writer (a select that only reorders the columns put one there, copying every row and its value once more), and
every column the writer reads, with and without the records' headers (a real broker, Spark's own source)."""

from __future__ import annotations

from confluent_kafka import Producer

from sparkapp.config import KafkaConfig
from sparkapp.spark.job import KAFKA_COLUMNS, kafka_rows


def _plan(df):
    return df._jdf.queryExecution().executedPlan().toString()


def test_the_writer_gets_the_sources_rows_without_a_projection(spark, kafka, topic):
    name = topic(2)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(10):
        p.produce(name, f'{{"id": {i}}}'.encode(), key=str(i).encode(), partition=i % 2, headers=[("h", b"v")])
    assert p.flush(30) == 0
    for headers in (False, True):
        source = (spark.read.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap)
                  .option("subscribe", name).option("includeHeaders", str(headers).lower()).load())
        # what the job did before: a select in its own column order, which Spark runs as a projection
        assert "Project" in _plan(source.selectExpr(*sorted(source.columns)))
        rows = kafka_rows(source, headers)
        assert "Project" not in _plan(rows), _plan(rows)
        tbl = rows.toArrow()
        assert set(tbl.column_names) == {*KAFKA_COLUMNS, *(["headers"] if headers else [])}
        assert tbl.num_rows == 10 and sorted(tbl.column("value").to_pylist()) == sorted(
            f'{{"id": {i}}}'.encode() for i in range(10))
    # a source with a column more (or a future Spark's) still gets the writer only its columns
    wider = kafka_rows(source.withColumn("extra", source["offset"]), False)
    assert sorted(wider.columns) == sorted(KAFKA_COLUMNS)


def test_the_source_fetches_in_large_chunks_and_waits_briefly_at_the_end_of_the_log_unless_told_otherwise():
    """Spark's consumers read with the job's fetch defaults: large fetches, and a short wait where the broker has
    nothing newer (its default of 500 ms added about 1.5 s to a batch that reads to the end of the log, see
    bench/HISTORY.md); `sourceOptions` win over them, and never over read_committed."""
    base = {"bootstrapServers": "127.0.0.1:9", "topics": ["t"]}
    got = KafkaConfig(**base).spark_options()
    assert got["kafka.fetch.max.wait.ms"] == "50" and got["kafka.max.partition.fetch.bytes"] == str(16 << 20)
    assert got["kafka.isolation.level"] == "read_committed"
    asked = KafkaConfig(**base, sourceOptions={"kafka.fetch.max.wait.ms": "500"}).spark_options()
    assert asked["kafka.fetch.max.wait.ms"] == "500"
