"""Schema evolution under crashes (real chdb + ZooKeeper): fields that appear mid-stream become Nullable
columns, added before the block that needs them; a crash between the ALTER and the insert, or anywhere else,
leaves every record once with every value; a fenced writer alters nothing."""

from __future__ import annotations

import random
from typing import Any

import pytest

from sparkapp.config import Engine
from sparkapp.core.records import Message
from sparkapp.delivery.context import WriterContext
from sparkapp.delivery.evolve import add_columns
from sparkapp.delivery.writer import write_partition
from sparkapp.edges.clickhouse import load_schema
from sparkapp.edges.insert import Inserter
from sparkapp.edges.store import FencedError, PartitionKey, StateStore
from sparkapp.formats.json import read_json
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from tests.helpers import msg

SINK = "evolve-sink"
STEPS = ("after_alter", "after_begin", "after_block", "after_insert", "after_commit")


class Crash(Exception):
    pass


def record(i: int) -> dict[str, Any]:
    """Fields come as the producer's schema grows: country at 50, score at 120 (ints and fractions), flag at 200."""
    r: dict[str, Any] = {"id": i}
    if i >= 50:
        r["country"] = f"c{i % 7}"
    if i >= 120:
        r["score"] = i if i % 2 else i + 0.5
    if i >= 200:
        r["flag"] = i % 3 == 0
    return r


LOG = [msg(record(i), offset=i, topic="src") for i in range(300)]


def context(client: Any, db: str, store: StateStore, epoch: int, fault: Any) -> WriterContext:
    schema = load_schema(client, db, "ev")
    return WriterContext(SINK, store, Inserter(client, schema), make_decoder(DecoderSpec(Format.JSON), schema), epoch,
                         block_offsets=10, fault=fault, refetch=lambda t, p, r: [m for m in LOG if m.offset in r])


@pytest.fixture
def table(ch_db):
    client, db = ch_db
    client.command("CREATE TABLE ev (id UInt64, _topic String, _partition UInt32, _offset UInt64) ENGINE = MergeTree "
                   "ORDER BY _offset SETTINGS non_replicated_deduplication_window = 10000")
    store = StateStore(client, "state", Engine.KEEPER_MAP, keeper_path=f"/evolve_{db}")
    store.ensure_schema()
    return client, db, store


def read_value(m: Message) -> dict:
    return read_json(m.value or b"null")


def test_columns_appear_before_their_blocks_and_crashes_lose_nothing(table):
    client, db, store = table
    log = LOG
    pk = PartitionKey(SINK, "src", 0)
    rng = random.Random(5)
    crashes: dict[str, int] = {}
    for run in range(200):
        crash_at = rng.choice(STEPS[1:]) if run < 60 else None
        countdown = rng.randrange(1, 4)

        def fault(step: str, crash_at: str | None = crash_at) -> None:
            """Every ALTER is followed by a crash (before its first insert), and each crashing run also dies
            at a random later step."""
            nonlocal countdown
            if (step == "after_alter" and crash_at is not None) or (step == crash_at and (countdown := countdown - 1) == 0):
                crashes[step] = crashes.get(step, 0) + 1
                raise Crash(step)

        epoch = store.acquire_epoch(SINK)
        ctx = context(client, db, store, epoch, fault)
        known: set[str] = set()  # a new run starts with nothing tried, as a restarted job does
        row = store.get(pk)
        pos = 0 if row is None else row.state.resume_offset
        try:
            while pos < len(log):
                batch = log[pos:pos + rng.randrange(5, 40)]
                if add_columns(ctx, pk, batch, read_value, lambda: [(client, db)], known):
                    ctx = context(client, db, store, epoch, fault)  # the table as it is now
                write_partition(ctx, pk, batch)
                pos += len(batch)
        except Crash:
            continue
        break
    assert crashes.get("after_alter") == 3 and len(crashes) == len(STEPS), crashes
    columns = client.query("SELECT name, type FROM system.columns WHERE database = currentDatabase() AND table = 'ev' "
                           "ORDER BY position").result_rows
    assert [tuple(c) for c in columns][4:] == [("country", "Nullable(String)"), ("score", "Nullable(Float64)"),
                                               ("flag", "Nullable(Bool)")]
    got = client.query("SELECT id, _offset, country, score, flag FROM ev ORDER BY _offset").result_rows
    want = [(i, i, r.get("country"), None if "score" not in r else float(r["score"]), r.get("flag"))
            for i, r in ((i, record(i)) for i in range(300))]
    assert [tuple(g) for g in got] == want, "every record once, every value as produced"


def test_a_fenced_writer_adds_no_column(table):
    client, db, store = table
    stale = context(client, db, store, store.acquire_epoch(SINK), lambda step: None)
    store.acquire_epoch(SINK)  # a newer run took over
    pk = PartitionKey(SINK, "src", 0)
    with pytest.raises(FencedError):
        add_columns(stale, pk, [msg({"id": 1, "late": "x"})], read_value, lambda: [(client, db)], set())
    assert "late" not in load_schema(client, db, "ev").names
