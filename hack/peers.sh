#!/usr/bin/env bash
# Builds the peers `make bench` compares chsink with, into ~/.cache/chsink/<peer>-<version>:
#   kafka-connect: Apache Kafka Connect $KAFKA_VERSION (Maven Central) with the ClickHouse Kafka Connect sink;
#   sinker:        clickhouse_sinker (Go).
# Neither sink is published where this machine can fetch it: the Kafka Connect sink is not on Maven Central
# (only on GitHub releases and Confluent Hub), and the Go module proxy refuses clickhouse_sinker (403). Each is
# tried from its registry first; failing that, it is built from a source checkout named by
# CHSINK_PEER_SRC_KAFKA_CONNECT / CHSINK_PEER_SRC_SINKER (a git work tree or an exported snapshot).
# Usage: hack/peers.sh [kafka-connect] [sinker]   (default: both; a peer that cannot be had is reported, not fatal)
set -uo pipefail
LOG_TAG=peers
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

connect_sink() {
  local ver=$CLICKHOUSE_KAFKA_CONNECT_VERSION dest="$CACHE/kafka-connect-$KAFKA_VERSION-ch-$CLICKHOUSE_KAFKA_CONNECT_VERSION"
  [ -e "$dest" ] && { log "kafka-connect + ClickHouse sink $ver: cached ($dest)"; return 0; }
  local t0=$SECONDS work; work=$(mktemp -d)
  maven_copy "$work/runtime" "org.apache.kafka:connect-runtime:$KAFKA_VERSION" "org.apache.kafka:connect-json:$KAFKA_VERSION" \
    "org.slf4j:slf4j-api:2.0.17" "org.slf4j:slf4j-reload4j:2.0.17" || return 1
  mkdir -p "$work/plugin/lib"
  if maven_copy "$work/plugin/lib" "com.clickhouse.kafka:clickhouse-kafka-connect:${ver#v}" 2>"$work/central.err"; then
    log "ClickHouse Kafka Connect sink $ver from Maven Central"
  else
    local src=${CHSINK_PEER_SRC_KAFKA_CONNECT:-}
    if [ -z "$src" ] || [ ! -d "$src/src/main/java" ]; then
      log "ClickHouse Kafka Connect sink $ver: not on Maven Central (mvn dependency:copy-dependencies" \
          "com.clickhouse.kafka:clickhouse-kafka-connect:${ver#v}: $(grep -m1 -o 'Could not [^:]*' "$work/central.err" || echo failed))," \
          "and CHSINK_PEER_SRC_KAFKA_CONNECT names no source checkout"
      return 1
    fi
    log "ClickHouse Kafka Connect sink $ver: building from $src"
    local d="$CLICKHOUSE_DRIVER_VERSION"
    rm -rf "$work/plugin/lib"
    maven_copy "$work/plugin/lib" "com.clickhouse:clickhouse-client:$d" "com.clickhouse:clickhouse-http-client:$d" \
      "com.clickhouse:clickhouse-data:$d" "com.clickhouse:client-v2:$d" "com.google.code.gson:gson:2.13.1" \
      "org.apache.httpcomponents.client5:httpclient5:5.5.1" "com.fasterxml.jackson.core:jackson-databind:2.21.5" || return 1
    # compiled as its own build does, against connect-api 2.7 (it overrides methods Kafka 4 dropped); run on $KAFKA_VERSION
    maven_copy "$work/compile" "org.apache.kafka:connect-api:2.7.0" "org.projectlombok:lombok:1.18.46" || return 1
    mkdir -p "$work/gen/com/clickhouse/kafka/connect/sink" "$work/classes"
    printf 'package com.clickhouse.kafka.connect.sink;\npublic final class Version {\n  public static final String ARTIFACT_VERSION = "%s";\n  private Version() {}\n}\n' \
      "${ver#v}" >"$work/gen/com/clickhouse/kafka/connect/sink/Version.java"
    local cp; cp=$(find "$work/plugin/lib" "$work/compile" -name '*.jar' | tr '\n' ':')
    find "$src/src/main/java" "$work/gen" -name '*.java' >"$work/sources"
    javac -nowarn -encoding UTF-8 --release 17 -proc:full -processorpath "$(find "$work/compile" -name 'lombok-*.jar')" \
      -cp "$cp" -d "$work/classes" @"$work/sources" >"$work/javac.log" 2>&1 || { tail -30 "$work/javac.log" >&2; return 1; }
    cp -r "$src/src/main/resources/." "$work/classes/"
    # one shaded jar with the connector's manifest, as its release archive ships it: the connector reports
    # the Implementation-Version of the jar holding the ClickHouse client as its own version, and Kafka 4
    # refuses the client jar's own ("clickhouse-client 0.9.5 (revision: ...)") as a version
    mkdir -p "$work/shade"
    local j
    for j in "$work/plugin/lib"/*.jar; do
      case $(basename "$j") in kafka-clients-*|slf4j-*) continue ;; esac  # the runtime's own
      (cd "$work/shade" && unzip -qo "$j" -x 'META-INF/*.SF' 'META-INF/*.RSA' 'META-INF/*.DSA' 'META-INF/MANIFEST.MF' 'module-info.class')
    done
    cp -r "$work/classes/." "$work/shade/"
    printf 'Implementation-Title: ClickHouse-Kafka-Connect\nImplementation-Version: %s\n' "$ver" >"$work/manifest"
    rm -rf "$work/plugin/lib" && mkdir -p "$work/plugin/lib"
    (cd "$work/shade" && jar cfm "$work/plugin/lib/clickhouse-kafka-connect-$ver-confluent.jar" "$work/manifest" .)
  fi
  mkdir -p "$dest.tmp" && mv "$work/runtime" "$dest.tmp/libs" && mv "$work/plugin" "$dest.tmp/plugins"
  mv "$dest.tmp" "$dest" && rm -rf "$work"
  log "kafka-connect + ClickHouse sink $ver: done in $((SECONDS - t0))s ($dest)"
}

sinker() {
  local ver=$CLICKHOUSE_SINKER_VERSION dest="$CACHE/clickhouse_sinker-$CLICKHOUSE_SINKER_VERSION"
  [ -e "$dest" ] && { log "clickhouse_sinker $ver: cached ($dest)"; return 0; }
  local t0=$SECONDS work; work=$(mktemp -d)
  mkdir -p "$dest.tmp"
  if GOBIN="$dest.tmp" CGO_ENABLED=0 go install -trimpath -ldflags='-s -w' \
      "github.com/housepower/clickhouse_sinker/cmd/clickhouse_sinker@$ver" 2>"$work/go.err"; then
    log "clickhouse_sinker $ver from the Go module proxy"
  else
    local src=${CHSINK_PEER_SRC_SINKER:-}
    if [ -z "$src" ] || [ ! -f "$src/go.mod" ]; then
      log "clickhouse_sinker $ver: go install github.com/housepower/clickhouse_sinker/cmd/clickhouse_sinker@$ver:" \
          "$(tail -1 "$work/go.err"), and CHSINK_PEER_SRC_SINKER names no source checkout"
      rm -rf "$dest.tmp" "$work"
      return 1
    fi
    log "clickhouse_sinker $ver: building from $src (its dependencies from the Go module proxy)"
    (cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$dest.tmp/clickhouse_sinker" ./cmd/clickhouse_sinker) \
      || { rm -rf "$dest.tmp"; return 1; }
  fi
  mv "$dest.tmp" "$dest" && rm -rf "$work"
  log "clickhouse_sinker $ver: done in $((SECONDS - t0))s ($dest)"
}

parts=("$@"); [ ${#parts[@]} -eq 0 ] && parts=(kafka-connect sinker)
for p in "${parts[@]}"; do
  case $p in
    kafka-connect) connect_sink || log "kafka-connect: not available; the bench reports it as such" ;;
    sinker) sinker || log "sinker: not available; the bench reports it as such" ;;
    *) echo "unknown peer: $p" >&2; exit 2 ;;
  esac
done
