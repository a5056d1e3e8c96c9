#!/bin/bash
# The two modes Spark's Kubernetes backend starts its pods in, as Spark's official image runs them:
#   driver ARGS...  spark-submit in client mode bound to the pod's address (the pod is the cluster-mode driver);
#   executor        the KubernetesExecutorBackend, configured by the SPARK_* variables the driver sets.
# Anything else runs as a command.
set -eo pipefail

# A uid without a passwd entry (OpenShift-style) breaks Hadoop's user lookup: give it one.
if ! getent passwd "$(id -u)" >/dev/null 2>&1 && [ -w /etc/passwd ]; then
  echo "spark:x:$(id -u):$(id -g):spark:${SPARK_HOME}:/bin/false" >>/etc/passwd
fi

SPARK_CLASSPATH="${SPARK_CLASSPATH:+$SPARK_CLASSPATH:}${SPARK_HOME}/jars/*"
# The driver passes executor JVM options as SPARK_JAVA_OPT_0..N.
mapfile -t SPARK_EXECUTOR_JAVA_OPTS < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
[ -n "${PYSPARK_PYTHON:-}" ] && export PYSPARK_PYTHON
[ -n "${PYSPARK_DRIVER_PYTHON:-}" ] && export PYSPARK_DRIVER_PYTHON

case "${1:-}" in
  driver)
    shift
    CMD=("$SPARK_HOME/bin/spark-submit"
         --conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS"
         --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=$SPARK_DRIVER_BIND_ADDRESS"
         --deploy-mode client "$@")
    ;;
  executor)
    shift
    CMD=("$JAVA_HOME/bin/java" "${SPARK_EXECUTOR_JAVA_OPTS[@]}"
         "-Xms$SPARK_EXECUTOR_MEMORY" "-Xmx$SPARK_EXECUTOR_MEMORY"
         -cp "$SPARK_CLASSPATH"
         org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend
         --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID"
         --cores "$SPARK_EXECUTOR_CORES" --app-id "$SPARK_APPLICATION_ID"
         --hostname "$SPARK_EXECUTOR_POD_IP" --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}"
         --podName "$SPARK_EXECUTOR_POD_NAME")
    ;;
  *)
    CMD=("$@")
    ;;
esac
exec /usr/bin/tini -s -- "${CMD[@]}"
