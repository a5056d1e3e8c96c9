"""The insert settings a sink config cannot change, and the error classification, on real ClickHouse errors."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from sparkapp.core.blocks import Block, LineBlock
from sparkapp.core.state_machine import OffsetRange
from sparkapp.delivery.sift import without
from sparkapp.edges.clickhouse import load_schema
from sparkapp.edges.errors import is_transient
from sparkapp.edges.insert import PINNED, Inserter, InsertError


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


@pytest.mark.parametrize("token", ["tok", ""])
def test_json_lines_are_parsed_alike_with_a_token_or_without(ch_db, token):
    """ClickHouse parses a window's lines under the same strict settings whether the block carries a token or goes
    out at least once (`state.enabled: false`): under ClickHouse's defaults a number in a String column would be
    stored as its text and `true` in an Int64 as 1, values the decoder dead-letters, and the parse would run on
    threads of its own. Each line is refused alike, and so takes the decoder on either path."""
    import pyarrow as pa

    client, db = ch_db
    client.command("CREATE TABLE t (s String, n Int64, _offset UInt64) ENGINE = MergeTree ORDER BY n "
                   "SETTINGS non_replicated_deduplication_window = 10")
    ins = Inserter(client, load_schema(client, db, "t"), retries=0)
    settings = ins._settings(LineBlock(OffsetRange(0, 0), token, (0,), pa.array(['{"s": "a", "n": 1}\n'])))
    assert {k: settings[k] for k in ins.line_settings} == ins.line_settings
    for line in ('{"s": 123, "n": 1}\n', '{"s": "a", "n": true}\n'):
        with pytest.raises(InsertError):
            ins.insert(LineBlock(OffsetRange(0, 0), token, (0,), pa.array([line], pa.string())))
    assert client.query("SELECT count() FROM t").result_rows == [(0,)]


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


def _client(where: str, name: str, ch_db: Any, request: Any) -> tuple[Any, str]:
    """A client and a database of its own: the embedded engine's, or one on the session's server (over HTTP)."""
    import os

    import clickhouse_connect

    if where == "chdb":
        return ch_db
    client = clickhouse_connect.get_client(dsn=request.getfixturevalue("clickhouse_server").dsn)
    db = f"{name}_{os.getpid()}"
    client.command(f"CREATE DATABASE IF NOT EXISTS {db}")
    client.database = db
    return client, db


@pytest.mark.parametrize("where", ["chdb", "server"])
def test_refused_names_exactly_the_lines_clickhouse_cannot_parse(where, ch_db, request):
    """One read with errors skipped tells the bad lines apart, on the embedded engine and over HTTP, whatever
    quotes, backslashes or newlines the good lines hold."""
    import json

    import pyarrow as pa

    client, db = _client(where, "refused", ch_db, request)
    client.command(f"CREATE TABLE IF NOT EXISTS {db}.r (id UInt64, note String, e Enum8('a''b' = 1, 'c' = 2), "
                   "_offset UInt64) ENGINE = MergeTree ORDER BY id")
    ins = Inserter(client, load_schema(client, db, "r"))
    good = [{"id": i, "note": n, "e": "a'b"} for i, n in enumerate(["it's", 'say "hi"', "back\\slash", "line\nbreak",
                                                                    "ünï ✓", "'); DROP TABLE r; --"])]
    bad = {2: {"id": "x"}, 5: {"id": 1, "e": "zzz"}, 7: {"id": -1}}
    records = list(good)
    for i, r in sorted(bad.items()):
        records.insert(i, r)
    lines = pa.array([json.dumps(r, ensure_ascii=False) + "\n" for r in records], pa.string())
    assert ins.refused(lines) == sorted(bad)
    assert ins.refused(pa.array([json.dumps(g) + "\n" for g in good], pa.string())) == []
    assert client.query(f"SELECT count() FROM {db}.r").result_rows == [(0,)], "nothing is written"


@pytest.mark.parametrize("where", ["chdb", "server"])
def test_a_window_in_pieces_is_one_insert_of_exactly_its_lines(where, ch_db, request):
    """A window without its bad lines goes out as what is left of its buffer, piece after piece, in one insert under
    one token (sent again, it is deduplicated), on the embedded engine and over HTTP. The refusal search and a
    retry that sends only the rows that did not land read the pieces too."""
    import json

    import pyarrow as pa

    client, db = _client(where, "pieces", ch_db, request)
    notes = ["plain", "it's", "back\\slash", "ünï ✓", "line\nbreak"]
    records = [{"id": i, "note": notes[i % len(notes)], "_topic": "t", "_partition": 0, "_offset": 100 + i}
               for i in range(30)]
    records[11]["id"] = "eleven"  # a line ClickHouse refuses
    window = pa.array(["{}\n", *(json.dumps(r, ensure_ascii=False) + "\n" for r in records)], pa.string()).slice(1)
    offsets, lines = without(tuple(range(100, 130)), window, [0, 4, 5, 17, 29])
    assert len(LineBlock(OffsetRange(100, 129), "", offsets, lines).payload) > 1, "the lines are in pieces"
    inserters = {}
    for t in ("once", "recovered"):
        client.command(f"DROP TABLE IF EXISTS {db}.{t}")
        client.command(f"CREATE TABLE {db}.{t} (id UInt64, note String, _topic String, _partition UInt32, "
                       "_offset UInt64) ENGINE = MergeTree ORDER BY _offset "
                       "SETTINGS non_replicated_deduplication_window = 100")
        inserters[t] = Inserter(client, load_schema(client, db, t))
    assert [offsets[i] for i in inserters["once"].refused(lines)] == [111]
    offsets, lines = without(offsets, lines, inserters["once"].refused(lines))
    block = LineBlock(OffsetRange(100, 129), "pieces-token", offsets, lines)
    for _ in range(2):
        inserters["once"].insert(block)
    # what a lost reply left landed, then the retry
    inserters["recovered"].insert(replace(block, token="an earlier attempt's", offsets=offsets[::2],
                                          lines=lines.take(list(range(0, len(lines), 2)))))
    assert inserters["recovered"].retry(block, "t", 0) == len(offsets) // 2
    expected = [(r["id"], r["note"], r["_offset"]) for r in records if r["_offset"] in offsets]
    for t in ("once", "recovered"):
        assert client.query(f"SELECT id, note, _offset FROM {db}.{t} ORDER BY _offset").result_rows == expected, t


def test_a_request_the_client_gave_up_on_does_not_lock_out_the_next(clickhouse_server):
    """A shard that hung and resumed runs the requests a timed-out client left behind, lost replies among
    them. The next request on the same client (an insert's retry, a recovery count) must still go through: a
    client that tied its requests to one ClickHouse session was refused while the old one ran (code 373,
    SESSION_IS_LOCKED, not transient), and the job died instead of retrying."""
    import os

    from clickhouse_connect.driver.exceptions import OperationalError

    from sparkapp.config import ClickHouseConfig
    from sparkapp.edges.clickhouse import clickhouse_client

    db = f"gave_up_{os.getpid()}"
    cfg = ClickHouseConfig.model_validate({"endpoints": [clickhouse_server.dsn], "database": db,
                                           "tables": {"*": "t"}, "requestTimeoutSeconds": 1})
    client = clickhouse_client(cfg)
    client.command("CREATE TABLE IF NOT EXISTS t (id UInt64, _offset UInt64) ENGINE = MergeTree ORDER BY id "
                   "SETTINGS non_replicated_deduplication_window = 10")
    ins = Inserter(client, load_schema(client, db, "t"), retries=0)
    with pytest.raises(OperationalError):
        client.query("SELECT sleep(2.5)")  # the reply does not come in time; the server goes on running it
    ins.insert(Block(OffsetRange(0, 1), "tok", ("id", "_offset"), ([1, 2], [0, 1]), (0, 1)))
    assert client.query("SELECT count() FROM t").result_rows == [(2,)]
