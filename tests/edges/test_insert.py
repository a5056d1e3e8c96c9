"""The insert settings a sink config cannot change, and the error classification, on real ClickHouse errors."""

from __future__ import annotations

from sparkapp.core.blocks import Block
from sparkapp.core.state_machine import OffsetRange
from sparkapp.edges.clickhouse import load_schema
from sparkapp.edges.insert import PINNED, Inserter, is_transient


def test_pinned_insert_settings_win_over_the_sinks(ch_db):
    client, db = ch_db
    client.command("CREATE TABLE t (id UInt64, _offset UInt64) ENGINE = MergeTree ORDER BY id "
                   "SETTINGS non_replicated_deduplication_window = 10")
    user = {"async_insert": 1, "insert_deduplicate": 0, "deduplicate_blocks_in_dependent_materialized_views": 0}
    ins = Inserter(client, load_schema(client, db, "t"), settings=user)
    block = Block(OffsetRange(0, 1), "tok", ("id", "_offset"), ([1, 2], [0, 1]), (0, 1))
    assert {k: ins._settings(block)[k] for k in PINNED} == PINNED
    ins.insert(block)
    ins.insert(block)  # the same token: deduplicated, as insert_deduplicate=1 (not the sink's 0) makes it
    assert client.query("SELECT count() FROM t").result_rows == [(2,)]


def test_retries_follow_the_error_code_not_the_words(ch_db):
    client, _ = ch_db
    errors = {}
    for name, sql in {"missing table": "SELECT * FROM no_such_table_at_all",
                      "parse error quoting a timeout": "SELECT CAST('connection timeout' AS UInt64)"}.items():
        try:
            client.query(sql)
        except Exception as e:
            errors[name] = e
    assert is_transient(errors["missing table"])  # code 60: a shard's table being re-created
    assert not is_transient(errors["parse error quoting a timeout"])
    assert is_transient(ConnectionResetError("Connection reset by peer"))
