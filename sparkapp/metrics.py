"""The job's Prometheus metrics (served by the driver with `run --metrics-port`).

Counted on the driver from each batch's per-partition results, whether the partitions were written
on the driver (chdb) or by executor tasks (HTTP), so one scrape target covers the whole job.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import Counter, Gauge, Histogram

from .delivery.context import PartitionOutcome
from .edges.prometheus import set_per_shard

ROWS_IN = Counter("chsink_rows_in_total", "Kafka records read", ["sink"])
ROWS_INSERTED = Counter("chsink_rows_inserted_total", "Rows inserted into ClickHouse", ["sink"])
ROWS_DEAD = Counter("chsink_rows_dead_lettered_total", "Records sent to the dead-letter topic", ["sink"])
INSERTS = Counter("chsink_inserts_total", "INSERT statements (blocks) sent", ["sink"])
RETRIES = Counter("chsink_retried_ranges_total", "Unconfirmed (BEFORE) ranges re-sent under their dedup tokens",
                  ["sink"])
FENCED = Counter("chsink_fenced_total", "Attempts refused because a newer writer run owns the sink", ["sink"])
LAG = Gauge("chsink_partition_lag", "Records in Kafka not yet delivered", ["sink", "topic", "partition"])
BATCH_SECONDS = Histogram("chsink_batch_duration_seconds", "Time to deliver one micro-batch", ["sink"],
                          buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120))
STALLED = Gauge("chsink_shard_stalled_partitions",
                "Partitions waiting (BEFORE) for an unavailable shard, as of the last batch", ["sink", "shard"])
NAMES = ("chsink_rows_in_total", "chsink_rows_inserted_total", "chsink_rows_dead_lettered_total",
         "chsink_inserts_total", "chsink_retried_ranges_total", "chsink_fenced_total", "chsink_partition_lag",
         "chsink_batch_duration_seconds", "chsink_shard_stalled_partitions")


def batch_done(sink: str, results: Sequence[PartitionOutcome], seconds: float) -> None:
    for r in results:
        ROWS_IN.labels(sink).inc(r["rows"])
        ROWS_INSERTED.labels(sink).inc(r["inserted"])
        ROWS_DEAD.labels(sink).inc(r["dead"])
        INSERTS.labels(sink).inc(r["inserts"])
        RETRIES.labels(sink).inc(r["retried"])
    BATCH_SECONDS.labels(sink).observe(seconds)
    stalled: dict[str, int] = {}
    for r in results:
        if r["stalled"]:
            stalled[r["stalled"]] = stalled.get(r["stalled"], 0) + 1
    set_per_shard(STALLED, (sink,), stalled)


def lag(sink: str, per_partition: dict[tuple[str, int], int]) -> None:
    for (topic, partition), n in per_partition.items():
        LAG.labels(sink, topic, str(partition)).set(n)
