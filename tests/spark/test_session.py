"""The job's Spark session: Spark's and the Kafka client's INFO logging off unless the user's sparkConf asks for it
(each INFO line is built, and the Kafka client's located by a stack walk, before the console drops it), its
driver JVM on the throughput collector unless the user's sparkConf names another, and a task's result of a few
MB (a Kafka partition's share of a micro-batch as Arrow) handed to the driver directly, not stored in the block
manager and fetched back from it, unless the user's sparkConf bounds it; and the Arrow batches the executors hand their
Python workers bounded by rows only, unless the user's sparkConf bounds their bytes (under a byte limit Spark measures
the batch after every row); and Arrow's allocator in every Python process of the job, the driver's and the executors'
workers, keeping freed memory for 10 s instead of 1 s, unless the environment or sparkConf says otherwise (each
batch's lines would otherwise come back as fresh pages to fault in)."""

from __future__ import annotations

import json
import subprocess
import sys

from hack.testbed.process import REPO
from tests.helpers import mimalloc_verbose_env, sink_config

_PROBE = """
import json, sys
from sparkapp.config import SinkConfig
from sparkapp.spark.session import build_session, session_conf
cfg = SinkConfig.model_validate(json.loads(sys.argv[1]))
spark = build_session(cfg, session_conf(cfg))
jvm = spark.sparkContext._jvm
levels = {name: str(jvm.org.apache.logging.log4j.LogManager.getLogger(name).getLevel())
          for name in ("", "org.apache.kafka.clients.consumer.internals.SubscriptionState")}
arrow_batch_bytes = int(spark._jsparkSession.sessionState().conf().arrowMaxBytesPerBatch())
collectors = sorted(str(b.getName()) for b in jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans())
def purge_delay(batches):
    import os
    import pyarrow as pa
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"v": os.environ.get("MIMALLOC_PURGE_DELAY", "")}])

# what the executors' Python workers were started with
workers = sorted({r.v for r in spark.range(0, 2, 1, 2).mapInArrow(purge_delay, "v string").collect()})
# two tasks of ~3 MB of Arrow each, as toArrow hands a micro-batch to the driver; the executor says how each
# result went (at INFO, on stderr)
jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
    "org.apache.spark.executor.Executor", jvm.org.apache.logging.log4j.Level.INFO)
rows = spark.range(0, 4, 1, 2).selectExpr("repeat('x', 1500000) AS v").toArrow().num_rows
spark.stop()
print("JVM " + json.dumps({"levels": levels, "collectors": collectors, "rows": rows,
                          "arrow_batch_bytes": arrow_batch_bytes, "workers_purge_delay": workers}))
"""
# the job's entry point, then pyarrow loaded as the job loads it: after `main` ran (here with a config that is not
# there, exit 2); mimalloc prints its options as it starts (MIMALLOC_VERBOSE)
_MAIN_THEN_ARROW = """
import sys
from sparkapp.__main__ import main
assert main(["verify", "--config", "/nonexistent/sink.yaml"]) == 2
import pyarrow as pa
pa.array(range(1000))
"""


def _mimalloc_option(stderr: str, name: str) -> list[str]:
    return [x.split(":", 1)[1].strip() for x in stderr.splitlines() if x.startswith(f"option '{name}':")]


def _driver_jvm(spark_conf: dict[str, str], env: dict[str, str] | None = None) -> dict[str, object]:
    """The job's session built in a Python process of its own (one JVM per process: its options apply once)."""
    res = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(sink_config(spark_conf=spark_conf))], cwd=REPO, capture_output=True,
                         text=True, timeout=300, env=mimalloc_verbose_env(env))
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(x for x in res.stdout.splitlines() if x.startswith("JVM "))
    out: dict[str, object] = json.loads(line[len("JVM "):])
    sent = [x for x in res.stderr.splitlines() if "bytes result sent" in x]
    assert out["rows"] == 4 and len(sent) == 2, res.stderr[-3000:]
    out["results_via_block_manager"] = sum("via BlockManager" in x for x in sent)
    # what mimalloc itself read, in each Python process that loaded pyarrow: this one (which ran no `main`, so
    # mimalloc's own default) and the workers
    out["mimalloc_purge_delay"] = sorted(set(_mimalloc_option(res.stderr, "purge_delay")))
    return out


def test_spark_and_kafka_client_log_at_warn_and_the_driver_jvm_runs_parallel_gc_unless_spark_conf_says_otherwise():
    default = _driver_jvm({})
    assert set(default["levels"].values()) == {"WARN"}, default  # the root and a Kafka client logger that logs every seek
    assert default["collectors"] == ["PS MarkSweep", "PS Scavenge"], default  # the throughput collector's two
    assert default["results_via_block_manager"] == 0, default  # Spark's default (1 MB) sends both through it
    # Int.MaxValue exactly: the value for which Spark skips measuring the Arrow batch after each row it adds
    assert default["arrow_batch_bytes"] == 2**31 - 1, default
    assert default["workers_purge_delay"] == ["10000"], default
    assert "10000" in default["mimalloc_purge_delay"], default  # mimalloc in the workers took it
    asked = _driver_jvm({"spark.log.level": "INFO", "spark.driver.extraJavaOptions": "-XX:+UseSerialGC",
                         "spark.task.maxDirectResultSize": "1m", "spark.sql.execution.arrow.maxBytesPerBatch": "64m",
                         "spark.executorEnv.MIMALLOC_PURGE_DELAY": "20"})
    assert set(asked["levels"].values()) == {"INFO"}, asked
    assert asked["collectors"] == ["Copy", "MarkSweepCompact"], asked  # the user's collector, alone
    assert asked["results_via_block_manager"] == 2, asked  # the user's bound, kept
    assert asked["arrow_batch_bytes"] == 64 << 20, asked
    assert asked["workers_purge_delay"] == ["20"], asked
    assert "10000" not in asked["mimalloc_purge_delay"], asked
    # the driver's environment (as the driver's `main` leaves it) goes to the workers unless sparkConf says otherwise
    driven = _driver_jvm({}, {"MIMALLOC_PURGE_DELAY": "50"})
    assert driven["workers_purge_delay"] == ["50"] and driven["mimalloc_purge_delay"] == ["50"], driven


def test_the_drivers_arrow_allocator_keeps_freed_memory_unless_the_environment_says_otherwise():
    def purge_delay(extra: dict[str, str]) -> list[str]:
        res = subprocess.run([sys.executable, "-c", _MAIN_THEN_ARROW], cwd=REPO, capture_output=True, text=True,
                             timeout=120, env=mimalloc_verbose_env(extra))
        assert res.returncode == 0, res.stderr[-3000:]
        return _mimalloc_option(res.stderr, "purge_delay")

    assert purge_delay({}) == ["10000"]  # set by `main` before pyarrow loaded: nothing the job imports loads it first
    assert purge_delay({"MIMALLOC_PURGE_DELAY": "50"}) == ["50"]
