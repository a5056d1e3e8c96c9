# syntax=docker/dockerfile:1
# Two targets: `operator` (slim Python, non-root) and `sparkapp` (the official Spark image matching
# pyspark, with the spark-sql-kafka jars baked in). Build: docker build --target sparkapp -t chsink-spark .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG SPARK_IMAGE=spark:4.0.0-scala2.13-java17-python3-ubuntu
ARG MAVEN_IMAGE=maven:3.9-eclipse-temurin-17

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
RUN pip install --no-cache-dir uv==0.13.9
COPY pyproject.toml uv.lock README.md ./
COPY sparkapp sparkapp
COPY sinkoperator sinkoperator
RUN uv build --wheel -o /dist \
 && uv export --frozen --no-dev --no-hashes --no-emit-project --format requirements-txt -o /dist/requirements.txt \
 && grep -v '^pyspark==' /dist/requirements.txt > /dist/requirements-spark.txt

FROM ${MAVEN_IMAGE} AS jars
COPY hack/maven-settings.xml /settings.xml
RUN for a in org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0 \
             org.apache.spark:spark-token-provider-kafka-0-10_2.13:4.0.0 \
             org.apache.kafka:kafka-clients:3.9.0 org.apache.commons:commons-pool2:2.12.0; do \
      mvn -q -B -s /settings.xml dependency:copy -Dartifact="$a" -DoutputDirectory=/jars || exit 1; \
    done

FROM ${PYTHON_IMAGE} AS operator
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin chsink
COPY --from=wheel /dist /tmp/dist
RUN pip install --no-cache-dir -r /tmp/dist/requirements.txt \
 && pip install --no-cache-dir --no-deps /tmp/dist/*.whl \
 && rm -rf /tmp/dist
USER 10001
ENTRYPOINT ["python", "-m", "sinkoperator"]

FROM ${SPARK_IMAGE} AS sparkapp
USER 0
COPY --from=jars /jars/ /opt/spark/jars/
COPY --from=wheel /dist /tmp/dist
RUN pip install --no-cache-dir -r /tmp/dist/requirements-spark.txt \
 && pip install --no-cache-dir --no-deps /tmp/dist/*.whl \
 && rm -rf /tmp/dist \
 && mkdir -p /opt/chsink \
 && printf 'import sys\nfrom sparkapp.__main__ import main\nsys.exit(main())\n' > /opt/chsink/main.py
# the SparkApplication's mainApplicationFile: local:///opt/chsink/main.py run --config /etc/chsink/sink.yaml
USER 185
