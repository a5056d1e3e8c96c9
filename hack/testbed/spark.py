"""A local Spark session with the spark-sql-kafka connector from the cache on its classpath."""

from __future__ import annotations

from typing import Any

from .process import cached


def connector_jars() -> list[str]:
    import pyspark

    return sorted(str(p) for p in cached(f"spark-kafka-{pyspark.__version__}").glob("*.jar"))


def spark_session(app: str = "chsink-tests", master: str = "local[2]") -> Any:
    from pyspark.sql import SparkSession

    from sparkapp.spark.session import local_driver_conf

    builder = SparkSession.builder.master(master).appName(app)
    for k, v in local_driver_conf(master, {}).items():  # the job's own rule: the node tests' bridge comes and goes
        builder = builder.config(k, v)
    return (
        builder
        .config("spark.jars", ",".join(connector_jars()))
        .config("spark.ui.enabled", "false")
        .config("spark.speculation", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
