#!/bin/bash
# A one-node KRaft broker: formats its log dir once, then runs. KAFKA_ADVERTISED is host:port clients use.
set -euo pipefail
data=${KAFKA_DATA:-/var/lib/kafka}
mkdir -p "$data"
cat >/tmp/server.properties <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:9093
listeners=PLAINTEXT://0.0.0.0:9092,CONTROLLER://127.0.0.1:9093
advertised.listeners=PLAINTEXT://${KAFKA_ADVERTISED:?}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$data
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
cp="/opt/kafka/libs/*"
[ -e "$data/meta.properties" ] || java -cp "$cp" kafka.tools.StorageTool format --cluster-id=Y2hzaW5rLXRlc3RiZWQtMQ -c /tmp/server.properties
exec /usr/bin/tini -s -- java -Xmx512m -cp "$cp" kafka.Kafka /tmp/server.properties
