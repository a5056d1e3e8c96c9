"""chsink's images, built from its own Dockerfile on the local bases, run on the node: the operator's entry
point and the Spark image's driver/executor entrypoint with pyspark, Java and the Kafka connector."""

from __future__ import annotations

from hack.testbed.node import Cluster

from .conftest import project_images


def _run(node: Cluster, name: str, image: str, *command: str) -> str:
    phase, out = node.run_pod(name, image, *command)
    assert phase == "Succeeded", out
    return out


def test_the_projects_images_build_from_its_dockerfile_and_run_on_the_node(node: Cluster) -> None:
    operator, spark = project_images()
    node.load([operator, spark])
    assert "usage" in _run(node, "operator-help", operator, "python", "-m", "sinkoperator", "--help").lower()
    # the operator's image is slim: none of the writer's heavy packages (tests/packaging/test_operator_deps.py)
    heavy = ("pyspark", "chdb", "pyarrow", "pandas")
    probe = f"import importlib.util as u, sinkoperator.handlers; print([m for m in {heavy!r} if u.find_spec(m)])"
    assert "[]" in _run(node, "operator-slim", operator, "python", "-c", probe).splitlines()
    out = _run(node, "spark-check", spark, "/opt/entrypoint.sh", "bash", "-c",
               "python3 /opt/chsink/main.py --help && java -version 2>&1 && ls /opt/spark/jars | grep -c kafka "
               "&& $SPARK_HOME/bin/spark-submit --version 2>&1 | grep -o 'version 4.0.0' | head -1")
    assert "verify" in out and "openjdk version \"17" in out and "version 4.0.0" in out, out
    # S3A for a checkpoint on S3: the file system and its AWS SDK client come up together (no bucket is probed)
    s3a = ("from pyspark.sql import SparkSession as S; s = S.builder.master('local[1]')"
           ".config('spark.hadoop.fs.s3a.endpoint', 'http://127.0.0.1:1')"
           ".config('spark.hadoop.fs.s3a.endpoint.region', 'us-east-1').getOrCreate(); j = s._jvm; "
           "fs = j.org.apache.hadoop.fs.FileSystem.get(j.java.net.URI('s3a://checkpoints/'), "
           "s._jsc.hadoopConfiguration()); print('s3a:', fs.getClass().getName())")
    out = _run(node, "spark-s3a", spark, "/opt/entrypoint.sh", "bash", "-c",
               f"AWS_ACCESS_KEY_ID=a AWS_SECRET_ACCESS_KEY=b python3 -c \"{s3a}\" 2>&1")
    assert "s3a: org.apache.hadoop.fs.s3a.S3AFileSystem" in out, out
