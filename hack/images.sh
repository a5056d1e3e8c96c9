#!/usr/bin/env bash
# Builds the test bed's container images here: nothing can be pulled from a registry and no Docker engine runs,
# so a Debian root made by mmdebstrap is the base and buildah (Debian's) builds Containerfiles, including the
# project's own Dockerfile, into its store under the cache.
# Usage: hack/images.sh base      the test bed's images (keyed by hack/images/ and the pinned versions)
#        hack/images.sh project   chsink's `operator` and `sparkapp` targets of ./Dockerfile on those bases
#        hack/images.sh list      the images a node loads
set -euo pipefail
LOG_TAG=images
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
repo=$(cd "$here/.." && pwd)
BUILDAH=(buildah --root "$CACHE/buildah/root" --runroot "$CACHE/buildah/run" --storage-driver overlay)
PYSPARK_VERSION=$(grep -oE 'pyspark==[0-9.]+' "$repo/uv.lock" | head -1 | cut -d= -f3 || true)
PYSPARK_VERSION=${PYSPARK_VERSION:-4.0.0}
CHDB_VERSION=4.4.0
K8S_MOD=$(go env GOMODCACHE)/k8s.io/kubernetes@$K8S_VERSION

# The key of the base images: what they are built from. The versions of parts no image holds (the benchmark's
# peers, the tests' schema registry, the node's S3 server, mounted from the cache) are left out: a bump of one of
# them rebuilds nothing.
base_key() {
  (cd "$here" && find images images.sh -type f | sort | xargs sha256sum
   grep -vE '^(CLICKHOUSE_KAFKA_CONNECT|CLICKHOUSE_DRIVER|CLICKHOUSE_SINKER|APICURIO|S3PROXY)_VERSION=|^#' versions.env
   echo "$PYSPARK_VERSION $CHDB_VERSION") | sha256sum | cut -c1-12
}

BUILT=()  # the tags bud built, in order: the base images' list
bud() { # bud TAG CONTEXT [ARGS...]
  local tag=$1 ctx=$2; shift 2
  local t0=$SECONDS
  "${BUILDAH[@]}" bud --isolation chroot --layers -q -t "$tag" "$@" "$ctx" >/dev/null
  BUILT+=("$tag")
  log "$tag: built in $((SECONDS - t0))s"
}

# The Debian root every image builds on. The build machine's own CA certificates go in (this one reaches
# registries through a TLS-intercepting proxy), so pip and Maven downloads in later steps verify.
python_base() {
  if "${BUILDAH[@]}" inspect --type image chsink.local/python:3.11-bookworm >/dev/null 2>&1; then return 0; fi
  local tar; tar=$(mktemp -d)/root.tar
  local t0=$SECONDS
  mmdebstrap --quiet --variant=minbase --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --include=ca-certificates,passwd,procps,python3,python3-pip,python3-venv,python-is-python3 \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
    --customize-hook='cp /usr/local/share/ca-certificates/*.crt "$1"/usr/local/share/ca-certificates/ 2>/dev/null || true' \
    --customize-hook='chroot "$1" update-ca-certificates >/dev/null' \
    --customize-hook='printf "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n" >"$1"/etc/pip.conf' \
    bookworm "$tar" http://deb.debian.org/debian
  local c; c=$("${BUILDAH[@]}" from scratch)
  "${BUILDAH[@]}" add "$c" "$tar" / >/dev/null
  "${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 "$c"
  "${BUILDAH[@]}" commit -q "$c" chsink.local/python:3.11-bookworm >/dev/null
  "${BUILDAH[@]}" rm "$c" >/dev/null
  rm -rf "$(dirname "$tar")"
  log "chsink.local/python:3.11-bookworm: mmdebstrap + import in $((SECONDS - t0))s"
}

base() {
  local dest; dest="$CACHE/images-$(base_key)"
  if [ -e "$dest/images.txt" ]; then log "base images: cached ($dest)"; return 0; fi
  local t0=$SECONDS ctx
  python_base
  ctx=$(mktemp -d)
  gcc -static -Os -DVERSION=3.10 -o "$ctx/pause" "$K8S_MOD/build/pause/linux/pause.c"
  cp "$here/images/pause/Containerfile" "$ctx/"
  bud chsink.local/pause:3.10 "$ctx"
  rm -rf "$ctx"; ctx=$(mktemp -d)
  cp "$CACHE/k8s-$K8S_VERSION-$K8S_BUILD/bin/kubectl" "$here/images/kubectl/Containerfile" "$ctx/"
  bud "chsink.local/kubectl:$K8S_VERSION" "$ctx"
  rm -rf "$ctx"; ctx=$(mktemp -d)
  cp "$CACHE/coredns-$COREDNS_VERSION/bin/coredns" "$here/images/coredns/Containerfile" "$ctx/"
  bud "chsink.local/coredns:$COREDNS_VERSION" "$ctx"
  rm -rf "$ctx"
  bud "chsink.local/spark:$PYSPARK_VERSION" "$here/images/spark" --build-arg "PYSPARK_VERSION=$PYSPARK_VERSION"
  ctx=$(mktemp -d)
  cp -r "$CACHE/spark-operator-$SPARK_OPERATOR_VERSION"/{bin,entrypoint.sh} "$here/images/spark-operator/Containerfile" "$ctx/"
  bud "chsink.local/spark-operator:$SPARK_OPERATOR_VERSION" "$ctx" --build-arg "BASE=chsink.local/spark:$PYSPARK_VERSION"
  rm -rf "$ctx"; ctx=$(mktemp -d)
  cp -r "$here/images/kafka/." "$ctx/" && cp -r "$CACHE/kafka-$KAFKA_VERSION-r2" "$ctx/libs"
  bud "chsink.local/kafka:$KAFKA_VERSION" "$ctx" --build-arg "BASE=chsink.local/spark:$PYSPARK_VERSION"
  rm -rf "$ctx"
  bud chsink.local/zookeeper:bookworm "$here/images/zookeeper" --build-arg "BASE=chsink.local/spark:$PYSPARK_VERSION"
  ctx=$(mktemp -d)
  cp -r "$here/images/clickhouse/." "$ctx/" && cp "$here/testbed/chserver.py" "$ctx/"
  bud "chsink.local/clickhouse:chdb-$CHDB_VERSION" "$ctx" --build-arg "CHDB_VERSION=$CHDB_VERSION"
  rm -rf "$ctx"
  mkdir -p "$dest.tmp"
  printf '%s\n' chsink.local/python:3.11-bookworm "${BUILT[@]}" >"$dest.tmp/images.txt"
  rm -rf "$dest"; mv "$dest.tmp" "$dest"
  log "base images built in $((SECONDS - t0))s"
}

# The project's images, from its own Dockerfile with the local bases as build args.
PROJECT_IMAGES=(chsink.local/chsink-operator:dev chsink.local/chsink-spark:dev)
project() {
  bud "${PROJECT_IMAGES[0]}" "$repo" -f "$repo/Dockerfile" --target operator \
    --build-arg PYTHON_IMAGE=chsink.local/python:3.11-bookworm
  bud "${PROJECT_IMAGES[1]}" "$repo" -f "$repo/Dockerfile" --target sparkapp \
    --build-arg PYTHON_IMAGE=chsink.local/python:3.11-bookworm --build-arg "SPARK_IMAGE=chsink.local/spark:$PYSPARK_VERSION"
}

case ${1:-} in
  base) base ;;
  list) sort -u "$CACHE/images-$(base_key)/images.txt" <(printf '%s\n' "${PROJECT_IMAGES[@]}") ;;
  project) project ;;
  *) echo "usage: $0 base|project" >&2; exit 2 ;;
esac
