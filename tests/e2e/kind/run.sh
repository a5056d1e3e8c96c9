#!/usr/bin/env bash
# End-to-end on a throw-away kind cluster (needs Docker, kind, kubectl and helm; not runnable on the CI
# machines, which have no Docker engine). Builds both images, installs the spark-operator, Kafka,
# ClickHouse with Keeper and our chart, applies a sink, produces N events, runs the verifier, tears down.
#   tests/e2e/kind/run.sh            # N=100000
#   KEEP=1 N=1000000 tests/e2e/kind/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
cluster=${CLUSTER:-chsink-e2e}
n=${N:-100000}
spark_operator_version=$(grep '^SPARK_OPERATOR_VERSION=' "$repo/hack/versions.env" | cut -d= -f2 | tr -d v)

for tool in docker kind kubectl helm; do  # PATH as given
  command -v "$tool" >/dev/null || { echo "run.sh: $tool is required" >&2; exit 2; }
done
teardown() { [ "${KEEP:-0}" = 1 ] || kind delete cluster --name "$cluster"; }
trap teardown EXIT

step() { printf '\n== %s\n' "$*"; }
step "kind cluster $cluster"
kind create cluster --name "$cluster" --wait 120s

step "images"
docker build --target operator -t chsink-operator:e2e "$repo"
docker build --target sparkapp -t chsink-spark:e2e "$repo"
kind load docker-image --name "$cluster" chsink-operator:e2e chsink-spark:e2e

step "spark-operator $spark_operator_version"
helm repo add spark-operator https://kubeflow.github.io/spark-operator >/dev/null
helm upgrade --install spark-operator spark-operator/spark-operator --version "$spark_operator_version" \
  -n spark-operator --create-namespace --set 'spark.jobNamespaces={data}' --wait

step "Kafka and ClickHouse"
kubectl apply -f "$here/infra.yaml"
kubectl -n data rollout status statefulset/kafka --timeout=300s
kubectl -n data rollout status statefulset/clickhouse --timeout=300s
for t in events:8 events-dlq:1; do
  kubectl -n data exec kafka-0 -- /opt/kafka/bin/kafka-topics.sh --bootstrap-server localhost:9092 \
    --create --if-not-exists --topic "${t%%:*}" --partitions "${t##*:}"
done

step "chsink chart"
helm upgrade --install chsink "$repo/charts/chsink" -n chsink-system --create-namespace \
  --set image.repository=chsink-operator --set image.tag=e2e --set image.pullPolicy=Never \
  --set spark.image=chsink-spark:e2e --set 'watchNamespaces={data}' --wait

step "sink and $n events"
kubectl apply -f "$here/sink.yaml"
kubectl -n data exec -i kafka-0 -- bash -c "seq 1 $n | awk '{printf \"{\\\"id\\\":%d,\\\"ts\\\":\\\"2026-01-01 00:00:00.000\\\",\\\"user\\\":\\\"u%d\\\",\\\"amount\\\":\\\"%d.5\\\"}\\n\", \$1, \$1 % 100, \$1}' \
  | /opt/kafka/bin/kafka-console-producer.sh --bootstrap-server localhost:9092 --topic events"

step "waiting for the sink to catch up"
for _ in $(seq 1 120); do
  lag=$(kubectl -n data get sinkstatus events -o jsonpath='{.status.lag}' 2>/dev/null || true)
  echo "lag=${lag:-?}"
  [ "${lag:-x}" = 0 ] && break
  sleep 10
done

step "verifier"
kubectl -n data run chsink-verify --rm -i --restart=Never --image=chsink-spark:e2e --image-pull-policy=Never \
  --overrides='{"spec":{"volumes":[{"name":"c","configMap":{"name":"chsink-events"}}],"containers":[{"name":"v","image":"chsink-spark:e2e","imagePullPolicy":"Never","command":["python3","/opt/chsink/main.py","verify","--config","/etc/chsink/sink.yaml"],"volumeMounts":[{"name":"c","mountPath":"/etc/chsink"}]}]}}'
echo "kind e2e: OK"
