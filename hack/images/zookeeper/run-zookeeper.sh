#!/bin/bash
set -euo pipefail
data=${ZOO_DATA:-/var/lib/zookeeper-data}
mkdir -p "$data" /tmp/zk
printf 'tickTime=500\ndataDir=%s\nclientPort=2181\nadmin.enableServer=false\n4lw.commands.whitelist=ruok,srvr\nmaxSessionTimeout=60000\n' "$data" >/tmp/zk/zoo.cfg
exec /usr/bin/tini -s -- java -Xmx256m -cp "/tmp/zk:/usr/share/java/zookeeper.jar:/usr/share/java/*" \
  org.apache.zookeeper.server.quorum.QuorumPeerMain /tmp/zk/zoo.cfg
