"""A sink without state whose table already holds rows of its topics (deleted with its state and re-created, or
reset) is refused rather than delivering them again, and starts where it is told, on real Kafka and chdb.

The job's preflight is run as a run begins (`SinkJob.preflight`), without Spark: it decides where the stream
starts."""

from __future__ import annotations

from typing import Any

import pytest

from sparkapp.config import ConfigError, SinkConfig, parse_config
from sparkapp.spark.job import SinkJob
from sparkapp.verify import verify
from tests.test_verify import produce_ids

TABLE = ("CREATE TABLE `{db}`.ev (id UInt64, _topic String, _partition UInt32, _offset UInt64) "
         "ENGINE = MergeTree ORDER BY _offset SETTINGS non_replicated_deduplication_window = 1000")


@pytest.fixture
def recreated(ch_db, ch_dsn, chdb_config, kafka, topic) -> Any:
    """50 records, all in the table (an earlier sink's delivery), and no state for the sink."""
    client, db = ch_db
    src = topic(1)
    produce_ids(kafka, src, 50)
    client.command(TABLE.format(db=db))
    client.insert("ev", [[i, src, 0, i] for i in range(50)], column_names=["id", "_topic", "_partition", "_offset"])

    def cfg(name: str = "again", **kafka_over: Any) -> SinkConfig:
        return parse_config({
            "name": f"{name}-{db}", "kafka": {"bootstrapServers": kafka.bootstrap, "topics": [src], **kafka_over},
            "clickhouse": {"endpoints": [ch_dsn], "database": db, "tables": {src: "ev"},
                           "chdbConfigFile": str(chdb_config)},
            "state": {"keeperPath": f"/first_start_{db}"}, "checkpointLocation": "/unused"})

    return {"cfg": cfg, "src": src, "db": db, "client": client, "kafka": kafka}


def starting(cfg: SinkConfig) -> dict[str, dict[str, int]]:
    job = SinkJob(cfg)
    job.preflight()
    return job.starting


def test_a_recreated_sink_is_refused_naming_the_choice(recreated):
    r = recreated
    with pytest.raises(ConfigError) as e:
        starting(r["cfg"]())
    msg = str(e.value)
    assert msg.startswith("kafka.startingOffsets: ") and f"{r['db']}.ev already holds 50 rows of topic {r['src']}" \
        in msg and "latest" in msg and "acknowledgeRedelivery" in msg, msg
    with pytest.raises(ConfigError):  # earliest, said outright, is the same choice
        starting(r["cfg"](startingOffsets="earliest"))


def test_the_refusal_of_a_sharded_sink_names_the_shard_that_holds_the_rows(recreated):
    """Two shards (here two databases of one server): only the one holding rows is named, with its endpoint."""
    r = recreated
    empty = f"{r['db']}_second"
    r["client"].command(f"CREATE DATABASE IF NOT EXISTS `{empty}`")
    r["client"].command(TABLE.format(db=empty))
    cfg = r["cfg"]()
    endpoint = cfg.clickhouse.endpoints[0]
    data = cfg.model_dump(by_alias=True, exclude_none=True, mode="json")
    data["clickhouse"] |= {"endpoints": [endpoint, endpoint], "shardDatabases": [r["db"], empty]}
    with pytest.raises(ConfigError) as e:
        starting(parse_config(data))
    msg = str(e.value)
    assert f"{r['db']}.ev on shard 0 ({endpoint}) already holds 50 rows" in msg and "shard 1" not in msg, msg


def test_latest_starts_after_the_newest_record_and_a_restart_resumes_there_not_at_the_new_latest(recreated):
    r = recreated
    assert starting(r["cfg"](startingOffsets="latest")) == {r["src"]: {"0": 50}}
    produce_ids(r["kafka"], r["src"], 10)  # arrive before the first batch
    # a restart before any batch, the setting gone: the recorded start, neither refused nor the new end
    assert starting(r["cfg"]()) == {r["src"]: {"0": 50}}
    [part] = verify(r["cfg"]()).partitions
    assert (part.low, part.gaps, part.duplicates, part.clickhouse) == (50, [], [], 0), part


def test_earliest_with_the_acknowledgement_and_given_offsets_start_where_told(recreated):
    r = recreated
    assert starting(r["cfg"]("ack", acknowledgeRedelivery=True)) == {r["src"]: {"0": -2}}
    assert starting(r["cfg"]("given", startingOffsets={r["src"]: {0: 7}})) == {r["src"]: {"0": 7}}
    with pytest.raises(ConfigError, match=r"startingOffsets\[.*\]\[0\]: offset 99 is past the partition's end \(50\)"):
        starting(r["cfg"]("past", startingOffsets={r["src"]: {0: 99}}))


def test_a_new_sink_on_an_empty_table_starts_at_the_earliest(recreated):
    r = recreated
    r["client"].command(f"TRUNCATE TABLE `{r['db']}`.ev")
    assert starting(r["cfg"]("new")) == {r["src"]: {"0": -2}}
