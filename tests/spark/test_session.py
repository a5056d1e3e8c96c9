"""The job's Spark session: Spark's and the Kafka client's INFO logging off unless the user's sparkConf asks for it
(each INFO line is built, and the Kafka client's located by a stack walk, before the console drops it), its
driver JVM on the throughput collector unless the user's sparkConf names another, and a task's result of a few
MB (a Kafka partition's share of a micro-batch as Arrow) handed to the driver directly, not stored in the block
manager and fetched back from it, unless the user's sparkConf bounds it; and the Arrow batches the executors hand their
Python workers bounded by rows only, unless the user's sparkConf bounds their bytes (under a byte limit Spark measures
the batch after every row)."""

from __future__ import annotations

import json
import subprocess
import sys

from hack.testbed.process import REPO

_PROBE = """
import json, sys
from sparkapp.config import SinkConfig
from sparkapp.spark.session import build_session, session_conf
cfg = SinkConfig.model_validate({"name": "s", "kafka": {"bootstrapServers": "127.0.0.1:9", "topics": ["t"]},
    "clickhouse": {"endpoints": ["chdb:///tmp/unused"], "database": "d", "tables": {"t": "t"}},
    "checkpointLocation": "/tmp/unused", "sparkConf": json.loads(sys.argv[1])})
spark = build_session(cfg, session_conf(cfg))
jvm = spark.sparkContext._jvm
levels = {name: str(jvm.org.apache.logging.log4j.LogManager.getLogger(name).getLevel())
          for name in ("", "org.apache.kafka.clients.consumer.internals.SubscriptionState")}
arrow_batch_bytes = int(spark._jsparkSession.sessionState().conf().arrowMaxBytesPerBatch())
collectors = sorted(str(b.getName()) for b in jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans())
# two tasks of ~3 MB of Arrow each, as toArrow hands a micro-batch to the driver; the executor says how each
# result went (at INFO, on stderr)
jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
    "org.apache.spark.executor.Executor", jvm.org.apache.logging.log4j.Level.INFO)
rows = spark.range(0, 4, 1, 2).selectExpr("repeat('x', 1500000) AS v").toArrow().num_rows
spark.stop()
print("JVM " + json.dumps({"levels": levels, "collectors": collectors, "rows": rows,
                          "arrow_batch_bytes": arrow_batch_bytes}))
"""


def _driver_jvm(spark_conf: dict[str, str]) -> dict[str, object]:
    """The job's session built in a Python process of its own (one JVM per process: its options apply once)."""
    res = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(spark_conf)], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(x for x in res.stdout.splitlines() if x.startswith("JVM "))
    out: dict[str, object] = json.loads(line[len("JVM "):])
    sent = [x for x in res.stderr.splitlines() if "bytes result sent" in x]
    assert out["rows"] == 4 and len(sent) == 2, res.stderr[-3000:]
    out["results_via_block_manager"] = sum("via BlockManager" in x for x in sent)
    return out


def test_spark_and_kafka_client_log_at_warn_and_the_driver_jvm_runs_parallel_gc_unless_spark_conf_says_otherwise():
    default = _driver_jvm({})
    assert set(default["levels"].values()) == {"WARN"}, default  # the root and a Kafka client logger that logs every seek
    assert default["collectors"] == ["PS MarkSweep", "PS Scavenge"], default  # the throughput collector's two
    assert default["results_via_block_manager"] == 0, default  # Spark's default (1 MB) sends both through it
    # Int.MaxValue exactly: the value for which Spark skips measuring the Arrow batch after each row it adds
    assert default["arrow_batch_bytes"] == 2**31 - 1, default
    asked = _driver_jvm({"spark.log.level": "INFO", "spark.driver.extraJavaOptions": "-XX:+UseSerialGC",
                         "spark.task.maxDirectResultSize": "1m", "spark.sql.execution.arrow.maxBytesPerBatch": "64m"})
    assert set(asked["levels"].values()) == {"INFO"}, asked
    assert asked["collectors"] == ["Copy", "MarkSweepCompact"], asked  # the user's collector, alone
    assert asked["results_via_block_manager"] == 2, asked  # the user's bound, kept
    assert asked["arrow_batch_bytes"] == 64 << 20, asked
