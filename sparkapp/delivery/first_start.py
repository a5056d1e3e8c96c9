"""Where a sink without any state starts, and the refusal of a start that would deliver its tables' rows again.

The state store is the truth of what was delivered. A sink with nothing in it is new, or was deleted with its
state and applied again, or had its state reset. The earliest offset is right for the first and, for the others,
delivers every record again: ClickHouse's deduplication window remembers the last blocks' tokens only. So a sink
without state whose tables already hold rows of its topics is refused until the user chooses: `startingOffsets:
latest` or offsets of their own, or `acknowledgeRedelivery: true`. A chosen start is recorded in the state store
before the first batch, so a restart resumes there instead of resolving `latest` again, and the verifier counts
from there.
"""

from __future__ import annotations

import logging

from ..config import ConfigError, SinkConfig
from ..edges.clickhouse import clickhouse_client, rows_of_topic
from ..edges.store import StateStore

log = logging.getLogger(__name__)

Marks = dict[tuple[str, int], tuple[int, int]]  # (topic, partition) -> (first offset Kafka holds, end)


def first_start(cfg: SinkConfig, store: StateStore, partitions: dict[str, int], marks: Marks, epoch: int) -> None:
    """Records the chosen start of a sink without state, or refuses a start that would deliver again."""
    if not store.sink_state(cfg.name).empty:
        return  # the state store says where each partition resumes
    k = cfg.kafka
    if k.starting_offsets == "earliest":
        if not k.acknowledge_redelivery and (held := _rows_there(cfg, partitions)):
            raise ConfigError(
                f"kafka.startingOffsets: sink {cfg.name} has no state, but {held}: it was deleted and re-created, or "
                "its state was reset, and starting from the earliest offset would deliver those rows again. Set "
                "kafka.startingOffsets to latest (start after the newest records) or to {topic: {partition: "
                "offset}}, or set kafka.acknowledgeRedelivery: true to deliver everything again (rows the table's "
                "deduplication window no longer remembers are then duplicated)")
        return
    if k.starting_offsets == "latest":
        positions = {key: end for key, (_, end) in marks.items()}
    else:
        positions = {}
        for t, given in k.starting_offsets.items():
            for p, at in given.items():
                if (t, p) not in marks:
                    raise ConfigError(f"kafka.startingOffsets[{t!r}][{p}]: topic {t} has no partition {p}")
                if at > marks[(t, p)][1]:
                    raise ConfigError(f"kafka.startingOffsets[{t!r}][{p}]: offset {at} is past the partition's end "
                                      f"({marks[(t, p)][1]})")
                positions[(t, p)] = at
    store.record_start(cfg.name, positions, epoch)
    log.info("sink %s starts at %s (kafka.startingOffsets)", cfg.name,
             ", ".join(f"{t}/{p}@{at}" for (t, p), at in sorted(positions.items())))


def _rows_there(cfg: SinkConfig, partitions: dict[str, int]) -> str:
    """Which tables already hold rows of the sink's topics ("" when none); a routed sink's tables are not known
    before its records are, so they go unchecked."""
    ch = cfg.clickhouse
    found = []
    for topic in sorted(partitions):
        table = ch.table_for(topic)
        if table is None:
            continue
        for shard, endpoint in enumerate(ch.endpoints):
            db = ch.shard_database(shard)
            if n := rows_of_topic(clickhouse_client(ch, endpoint), db, table, topic):
                where = f" on shard {shard} ({endpoint})" if len(ch.endpoints) > 1 else ""
                found.append(f"{db}.{table}{where} already holds {n} rows of topic {topic}")
    return "; ".join(found)
