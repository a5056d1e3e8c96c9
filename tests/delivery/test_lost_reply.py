"""Inserts that commit on the server while the client sees an error (a lost reply), on real chdb.

The fault sits between ClickHouse and the writer: the INSERT really runs, then the call raises as a reset
connection would. A blind re-send would store the rows twice wherever deduplication cannot catch it (a
window of 0, a retry that takes the other path and so another block shape). Each case must end with every
offset exactly once, in the table and in an attached materialized view.
"""

from __future__ import annotations

from typing import Any

import pytest

from sparkapp.config import Engine
from sparkapp.core.records import Message
from sparkapp.delivery.context import WriterContext
from sparkapp.delivery.writer import write_lines, write_partition
from sparkapp.edges.clickhouse import load_schema
from sparkapp.edges.insert import Inserter
from sparkapp.edges.store import PartitionKey, StateStore
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from tests.helpers import line_batch, msg

OFFSETS = "_topic String, _partition UInt32, _offset UInt64"


class LostReply:
    """A client whose INSERTs run, then raise as if the connection dropped before the reply (`times` times)."""

    def __init__(self, client: Any, times: int = 1) -> None:
        self._client, self.left = client, times

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _lost(self, result: Any) -> Any:
        if self.left > 0:
            self.left -= 1
            raise ConnectionResetError("Connection reset by peer (the INSERT committed, its reply was lost)")
        return result

    def insert(self, *a: Any, **kw: Any) -> Any:
        return self._lost(self._client.insert(*a, **kw))

    def raw_insert(self, *a: Any, **kw: Any) -> Any:
        return self._lost(self._client.raw_insert(*a, **kw))


class Crash(Exception):
    pass


def crash_after_first_block(step: str) -> None:
    """The writer dies right after its first block committed, before AFTER: the range stays BEFORE."""
    if step == "after_block":
        raise Crash(step)


def setup(client: Any, db: str, columns: str, window: int, mv: bool = False) -> tuple[StateStore, Any]:
    client.command(f"CREATE TABLE ev (id UInt64, pad String, {columns}) ENGINE = MergeTree ORDER BY id "
                   f"SETTINGS non_replicated_deduplication_window = {window}")
    if mv:
        client.command("CREATE TABLE ev_ids (id UInt64) ENGINE = MergeTree ORDER BY id "
                       "SETTINGS non_replicated_deduplication_window = 100")  # a view's target deduplicates itself
        client.command("CREATE MATERIALIZED VIEW ev_mv TO ev_ids AS SELECT id FROM ev")
    store = StateStore(client, "state", Engine.KEEPER_MAP, keeper_path=f"/lost_{db}")
    store.ensure_schema()
    return store, load_schema(client, db, "ev")


def context(client: Any, store: StateStore, schema: Any, fault: Any = None) -> WriterContext:
    return WriterContext("lost", store, Inserter(client, schema, backoff_s=0.01), make_decoder(DecoderSpec(Format.JSON),
                         schema), store.acquire_epoch("lost"), block_offsets=50, fault=fault or (lambda step: None))


def records(n: int, pad: int = 8) -> list[Message]:
    return [msg({"id": i, "pad": "x" * pad}, offset=i, topic="src") for i in range(n)]


def counts(client: Any, table: str = "ev") -> tuple[int, int]:
    [[n, ids]] = client.query(f"SELECT count(), uniqExact(id) FROM {table}").result_rows
    return int(n), int(ids)


@pytest.mark.parametrize("path", ["decode", "lines"])
@pytest.mark.parametrize(("columns", "window", "mv"), [
    (OFFSETS, 0, False),  # no deduplication at all: counting what landed alone must catch it
    (OFFSETS, 100, True),  # counted, and the materialized view gets each row once too
    ("_offset UInt64", 100, True),  # no offset columns: the token and the window must catch the copy, in the view too
], ids=["window0", "offsets-mv", "token-only-mv"])
def test_a_lost_reply_is_not_a_second_insert(ch_db, path, columns, window, mv):
    client, db = ch_db
    store, schema = setup(client, db, columns, window, mv)
    ctx = context(LostReply(client, times=3), store, schema)
    msgs = records(200)
    pk = PartitionKey("lost", "src", 0)
    res = write_partition(ctx, pk, msgs) if path == "decode" else write_lines(ctx, pk, line_batch(msgs, schema.names))
    assert counts(client) == (200, 200)
    if mv:
        assert counts(client, "ev_ids") == (200, 200)
    assert res.inserted_rows <= 200  # rows found landed are not counted as inserted again


def test_a_fast_path_insert_retried_on_the_decoding_path_is_the_same_insert(ch_db):
    """The first attempt sends a window as JSON lines (one block), commits, and the writer dies before AFTER;
    the retry decodes the records in Python. Without offset columns only the token can catch the copy, so
    the decoded window must go out as the same single block under the same token (large rows would make the
    client cut it into several)."""
    client, db = ch_db
    store, schema = setup(client, db, "_offset UInt64", 100)
    msgs = records(150, pad=100_000)
    pk = PartitionKey("lost", "src", 0)
    with pytest.raises(Crash):
        write_lines(context(client, store, schema, crash_after_first_block), pk, line_batch(msgs, schema.names))
    assert counts(client) == (50, 50)
    write_partition(context(client, store, schema), pk, msgs)  # the retry: decoding path, same windows
    assert counts(client) == (150, 150)


def test_tables_whose_retries_could_not_be_recognised_are_refused(ch_db):
    from sparkapp.edges.clickhouse import unsafe_target

    client, db = ch_db
    client.command("CREATE TABLE bare (id UInt64) ENGINE = MergeTree ORDER BY id")
    client.command("CREATE TABLE nul (id UInt64, _topic String, _partition UInt32, _offset UInt64) ENGINE = Null")
    client.command(f"CREATE TABLE src ({OFFSETS}) ENGINE = MergeTree ORDER BY _offset "
                   "SETTINGS non_replicated_deduplication_window = 100")
    client.command("CREATE TABLE agg (n UInt64) ENGINE = MergeTree ORDER BY n")
    client.command("CREATE MATERIALIZED VIEW src_mv TO agg AS SELECT _offset AS n FROM src")
    client.command(f"CREATE TABLE zero ({OFFSETS}) ENGINE = MergeTree ORDER BY _offset")
    client.command(f"CREATE TABLE ok ({OFFSETS}) ENGINE = MergeTree ORDER BY _offset "
                   "SETTINGS non_replicated_deduplication_window = 100")
    why = {t: unsafe_target(client, load_schema(client, db, t)) for t in ("bare", "nul", "src", "zero", "ok")}
    assert "deduplication window of 0: a retried insert (a lost reply, a crash) could not" in (why["bare"] or "")
    # counting what landed catches a lost reply, but not a stale writer's block arriving after the count
    assert "deduplication window of 0: a stale writer" in (why["zero"] or "")
    assert "has engine Null" in (why["nul"] or "")
    assert f"materialized view target `{db}`.`agg`" in (why["src"] or "")
    assert why["ok"] is None


def test_a_range_retried_after_a_redeploy_with_another_block_size_is_cut_as_first_recorded(ch_db):
    """A BEFORE range is re-sent in the windows its state row recorded, not those of the current config: a
    redeploy with another blockOffsets (and another path) must still produce the same windows and tokens."""
    client, db = ch_db
    store, schema = setup(client, db, "_offset UInt64", 100)
    msgs = records(150)
    pk = PartitionKey("lost", "src", 0)
    with pytest.raises(Crash):
        write_lines(context(client, store, schema, crash_after_first_block), pk, line_batch(msgs, schema.names))
    assert store.get(pk).block_offsets == 50
    redeployed = context(client, store, schema)
    redeployed.block_offsets = 70
    write_partition(redeployed, pk, msgs)
    assert counts(client) == (150, 150)


def test_a_view_whose_insert_failed_after_the_source_committed_catches_up_on_retry(ch_db):
    """ClickHouse writes the source part, then each view; a view failing leaves the source committed and
    the view without the rows. The retry finds every row landed in the source: skipping would leave the
    view short for good. The identical block under its token is dropped by the source and reaches the view."""
    client, db = ch_db
    store, schema = setup(client, db, OFFSETS, 100)
    client.command("CREATE TABLE flag (down UInt8) ENGINE = MergeTree ORDER BY down")
    client.command("CREATE TABLE ev_ids (id UInt64) ENGINE = MergeTree ORDER BY id "
                   "SETTINGS non_replicated_deduplication_window = 100")
    client.command("CREATE MATERIALIZED VIEW ev_mv TO ev_ids AS SELECT id FROM ev "
                   "WHERE throwIf((SELECT count() FROM flag) > 0, 'view target unavailable') = 0")
    client.command("INSERT INTO flag VALUES (1)")
    msgs = records(120)
    pk = PartitionKey("lost", "src", 0)
    with pytest.raises(Exception, match="view target unavailable"):
        write_partition(context(client, store, schema), pk, msgs)
    assert counts(client) == (50, 50) and counts(client, "ev_ids") == (0, 0)  # the first window's source part
    client.command("TRUNCATE TABLE flag")
    write_partition(context(client, store, schema), pk, msgs)
    assert counts(client) == (120, 120)
    assert counts(client, "ev_ids") == (120, 120)
