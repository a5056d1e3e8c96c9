# syntax=docker/dockerfile:1
# Two targets: `operator` (slim Python, non-root) and `sparkapp` (a Spark image matching pyspark, with the
# spark-sql-kafka and S3A jars baked in). Build: docker build --target sparkapp -t chsink-spark .
# The bases are build args: the defaults are the official images; the test bed builds on its own local ones
# (hack/images.sh), the same way.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG SPARK_IMAGE=spark:4.0.0-scala2.13-java17-python3-ubuntu

FROM ${PYTHON_IMAGE} AS requirements
WORKDIR /src
# uv trusts the system certificates, as pip does (a build machine may reach PyPI through its own CA)
ENV UV_NATIVE_TLS=1
RUN pip install --no-cache-dir uv==0.13.9
COPY pyproject.toml uv.lock ./
RUN mkdir -p /dist \
 && uv export --frozen --no-dev --no-hashes --no-emit-project --format requirements-txt -o /dist/requirements.txt \
 && grep -v '^pyspark==' /dist/requirements.txt > /dist/requirements-spark.txt \
 && grep -vE '^(pyspark|py4j|chdb|chdb-core|pyarrow|pandas|numpy|fastavro|grpcio|grpcio-tools)==' /dist/requirements.txt \
      > /dist/requirements-operator.txt

FROM requirements AS wheel
COPY README.md ./
COPY sparkapp sparkapp
COPY sinkoperator sinkoperator
RUN uv build --wheel -o /dist/wheel

# Spark's Kafka source and what it needs beyond Spark's own jars, straight from Maven Central; and S3A for a
# checkpoint on S3: hadoop-aws at the version of Spark's own Hadoop (hadoop-client-api 3.4.1) with the AWS SDK
# bundle its POM names (hadoop-project 3.4.1: aws-java-sdk-v2.version 2.24.6; 558 MB, shaded, as Hadoop ships it).
FROM ${PYTHON_IMAGE} AS jars
WORKDIR /jars
RUN python -c "import sys, urllib.request as u; [u.urlretrieve('https://repo.maven.apache.org/maven2/' + g.replace('.', '/') + f'/{a}/{v}/{a}-{v}.jar', f'{a}-{v}.jar') for g, a, v in (c.split(':') for c in sys.argv[1:])]" \
      org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0 org.apache.spark:spark-token-provider-kafka-0-10_2.13:4.0.0 \
      org.apache.kafka:kafka-clients:3.9.0 org.apache.commons:commons-pool2:2.12.0 \
      org.apache.hadoop:hadoop-aws:3.4.1 software.amazon.awssdk:bundle:2.24.6

# The operator never runs the writer: Spark, chdb and the Arrow stack (about 1.4 GB) stay out of its image.
FROM ${PYTHON_IMAGE} AS operator
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin chsink
COPY --from=requirements /dist/requirements-operator.txt /tmp/requirements.txt
RUN pip install --no-cache-dir -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY --from=wheel /dist/wheel /tmp/wheel
RUN pip install --no-cache-dir --no-deps /tmp/wheel/*.whl && rm -rf /tmp/wheel
USER 10001
ENTRYPOINT ["python", "-m", "sinkoperator"]

FROM ${SPARK_IMAGE} AS sparkapp
USER 0
COPY --from=jars /jars/ /opt/spark/jars/
COPY --from=requirements /dist/requirements-spark.txt /tmp/requirements.txt
RUN pip install --no-cache-dir -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY --from=wheel /dist/wheel /tmp/wheel
RUN pip install --no-cache-dir --no-deps /tmp/wheel/*.whl \
 && rm -rf /tmp/wheel \
 && mkdir -p /opt/chsink \
 && printf 'import sys\nfrom sparkapp.__main__ import main\nsys.exit(main())\n' > /opt/chsink/main.py
# Spark and the Kafka client at WARN in the driver and every executor (see the file)
COPY sparkapp/spark/log4j2.properties /opt/chsink/log4j2.properties
ENV LOG4J_CONFIGURATION_FILE=/opt/chsink/log4j2.properties
# the SparkApplication's mainApplicationFile: local:///opt/chsink/main.py run --config /etc/chsink/sink.yaml
USER 185
