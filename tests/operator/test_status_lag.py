"""The lag the operator publishes counts from where each partition resumes, as the job does."""

from __future__ import annotations

from confluent_kafka import Producer

from sinkoperator.model import SinkStatus
from sinkoperator.status import progress
from sparkapp.config import parse_config
from sparkapp.core.state_machine import OffsetRange
from sparkapp.edges.store import PartitionKey, state_store


def test_a_routed_tables_lag_counts_from_its_partitions_read_through(ch_db, ch_dsn, chdb_config, kafka, topic):
    """A table that gets no records is not behind: once the partition is read through, neither the sink's lag
    nor that table's counts the records the other tables took since its last range."""
    client, db = ch_db
    src = topic(1)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for _ in range(10):
        p.produce(src, b"{}", partition=0)
    assert p.flush(30) == 0
    cfg = parse_config({
        "name": f"lag-{db}", "kafka": {"bootstrapServers": kafka.bootstrap, "topics": [src]},
        "clickhouse": {"endpoints": [ch_dsn], "database": db, "tables": {"*": "busy"}, "tableField": "table",
                       "chdbConfigFile": str(chdb_config)},
        "state": {"keeperPath": f"/lag_{db}"}, "checkpointLocation": "/unused"})
    store = state_store(cfg, client)
    store.ensure_schema()
    epoch = store.acquire_epoch(cfg.name)
    for table, rng in (("quiet", OffsetRange(0, 0)), ("busy", OffsetRange(1, 9))):
        pk = PartitionKey(cfg.name, src, 0, table)
        store.begin(pk, rng, epoch)
        store.commit(pk, rng, epoch)

    def lags() -> tuple[int, dict[str, int]]:
        got = progress("ns", "lag", cfg, store, SinkStatus())
        return got.lag, {p["table"]: p["lag"] for p in got.partitions["partitions"]}

    assert lags() == (9, {"quiet": 9, "busy": 0})  # the quiet table holds the partition at offset 1
    store.record_read_through(cfg.name, {(src, 0): 10}, epoch)
    assert lags() == (0, {"quiet": 0, "busy": 0})
