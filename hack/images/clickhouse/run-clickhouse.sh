#!/bin/bash
# Writes config.xml (ports 8123/9000 on all of the pod's addresses, ZooKeeper from CLICKHOUSE_ZOOKEEPER=host:port)
# and starts the server. The pod network is the test bed's own bridge; `default` has no password.
set -euo pipefail
dir=${CLICKHOUSE_DIR:-/var/lib/clickhouse}
mkdir -p "$dir"
zk=""
if [ -n "${CLICKHOUSE_ZOOKEEPER:-}" ]; then
  zk="<zookeeper><node><host>${CLICKHOUSE_ZOOKEEPER%:*}</host><port>${CLICKHOUSE_ZOOKEEPER##*:}</port></node>"
  zk+="<sessions_path>/clickhouse/sessions-$(hostname)</sessions_path></zookeeper>"
  zk+="<keeper_map_path_prefix>/chsink_keeper_map</keeper_map_path_prefix>"
fi
cat >"$dir/config.xml" <<XML
<clickhouse><listen_host>0.0.0.0</listen_host><http_port>8123</http_port><tcp_port>9000</tcp_port>$zk</clickhouse>
XML
exec python3 /opt/clickhouse/chserver.py "$dir"
