"""The job's Spark session: Spark's and the Kafka client's INFO logging off unless the user's sparkConf asks for it
(each INFO line is built, and the Kafka client's located by a stack walk, before the console drops it)."""

from __future__ import annotations

import json
import subprocess
import sys

from hack.testbed.process import REPO

_PROBE = """
import json, sys
from sparkapp.config import SinkConfig
from sparkapp.spark.session import build_session, session_conf
levels = []
for extra in ({}, {"spark.log.level": "INFO"}):
    cfg = SinkConfig.model_validate({"name": "s", "kafka": {"bootstrapServers": "127.0.0.1:9", "topics": ["t"]},
        "clickhouse": {"endpoints": ["chdb:///tmp/unused"], "database": "d", "tables": {"t": "t"}},
        "checkpointLocation": "/tmp/unused", "sparkConf": extra})
    spark = build_session(cfg, session_conf(cfg))
    jvm = spark.sparkContext._jvm
    levels.append({name: str(jvm.org.apache.logging.log4j.LogManager.getLogger(name).getLevel())
                   for name in ("", "org.apache.kafka.clients.consumer.internals.SubscriptionState")})
    spark.stop()
print("LEVELS " + json.dumps(levels))
"""


def test_spark_and_kafka_client_log_at_warn_unless_spark_conf_says_otherwise():
    res = subprocess.run([sys.executable, "-c", _PROBE], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(x for x in res.stdout.splitlines() if x.startswith("LEVELS "))
    default, asked = json.loads(line[len("LEVELS "):])
    assert set(default.values()) == {"WARN"}, default  # the root and a Kafka client logger that logs every seek
    assert set(asked.values()) == {"INFO"}, asked
