"""A column whose DEFAULT ClickHouse computes anew at each insert (now64(), rand64(), generateUUIDv4()), on both
paths: a record without the field gets the value ClickHouse computes when its block is inserted, as ClickHouse
does for a JSON line without the field; never one value computed once when the sink read the table, which
stamped every row of a run with the run's start."""

from __future__ import annotations

import json
import time

import pytest

from sparkapp.core.records import Message
from sparkapp.delivery.writer import write_lines, write_partition
from sparkapp.edges.store import PartitionKey
from tests.helpers import line_batch

from .test_fast_path import make_ctx

COLUMNS = ("id UInt64, at DateTime64(3, 'UTC') DEFAULT now64(3), r UInt64 DEFAULT rand64(), "
           "u UUID DEFAULT generateUUIDv4(), k String DEFAULT 'fixed', _topic String, _partition UInt32, _offset UInt64")
GIVEN = {"at": "2001-02-03 04:05:06.789", "r": 7, "u": "00000000-0000-0000-0000-000000000001", "k": "given"}
GIVEN_AT_MS = 981173106789


def _messages(first: int, n: int, given_every: int) -> list[Message]:
    return [Message("src", 0, o, json.dumps({"id": o, **(GIVEN if given_every and o % given_every == 0 else {})})
                    .encode()) for o in range(first, first + n)]


def _now_ms(client) -> int:
    return int(client.query("SELECT toUnixTimestamp64Milli(now64(3))").result_rows[0][0])


@pytest.mark.parametrize("path", ["decoder", "lines"])
def test_defaults_clickhouse_computes_at_insert_are_computed_at_each_insert(ch_db, path):
    client, db = ch_db
    table = f"at_insert_{path}"
    client.command(f"CREATE TABLE {table} ({COLUMNS}) ENGINE = MergeTree ORDER BY _offset")
    ctx = make_ctx(client, db, table, sink=table)  # the sink reads the table now, well before it inserts
    pk = PartitionKey(table, "src", 0)

    def write(msgs: list[Message]) -> None:
        if path == "lines":
            write_lines(ctx, pk, line_batch(msgs, ctx.inserter.schema.names))
        else:
            write_partition(ctx, pk, msgs)

    time.sleep(1.1)
    t0 = _now_ms(client)
    write(_messages(0, 80, given_every=4))  # two blocks, each mixing records with and without the fields
    time.sleep(1.1)
    t1 = _now_ms(client)
    write(_messages(80, 80, given_every=0))  # two blocks without the fields at all
    rows = client.query(f"SELECT _offset, toUnixTimestamp64Milli(at), r, toString(u), k FROM {table} "
                        "ORDER BY _offset").result_rows
    assert len(rows) == 160
    given = [r for r in rows if r[0] < 80 and r[0] % 4 == 0]
    assert {tuple(r[1:]) for r in given} == {(GIVEN_AT_MS, 7, GIVEN["u"], "given")}, "a value given is kept"
    computed = [r for r in rows if r not in given]
    assert all(r[4] == "fixed" for r in computed), "a constant DEFAULT as before"
    late = [r for r in computed if r[1] < (t0 if r[0] < 80 else t1)]
    assert not late, f"DEFAULT now64(3) computed before the row's insert (when the sink read the table): {late[:3]}"
    assert len({r[2] for r in computed}) == len(computed), "DEFAULT rand64() computed once for many rows"
    assert len({r[3] for r in computed}) == len(computed), "DEFAULT generateUUIDv4() computed once for many rows"


def test_a_sharding_key_clickhouse_computes_at_insert_is_refused(ch_db):
    """Rows routed by a column whose DEFAULT is computed at each insert would have no shard of their own: a
    retry would send a record without the field to another shard than its first attempt."""
    from sparkapp.config import ConfigError, Engine, parse_config
    from sparkapp.delivery.runtime import Runtime
    from sparkapp.edges.store import StateStore

    client, db = ch_db
    client.command("CREATE TABLE keyed (id UInt64, k UInt64 DEFAULT rand64(), _topic String, _partition UInt32, "
                   "_offset UInt64) ENGINE = MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 10")
    cfg = parse_config({"name": "keyed", "kafka": {"bootstrapServers": "127.0.0.1:1", "topics": ["a"]},
                        "clickhouse": {"endpoints": ["chdb:///unused"], "database": db, "tables": {"a": "keyed"}},
                        "sharding": {"policy": "key", "key": "k"}, "checkpointLocation": "/tmp/unused"}, "test")
    rt = Runtime(cfg, 1, client, StateStore(client, "state", Engine.KEEPER_MAP, keeper_path=f"/keyed_{db}"), None)
    with pytest.raises(ConfigError, match=r"sharding.key: column 'k' .*rand64\(\)"):
        rt.process("a", 0, [Message("a", 0, 0, b'{"id": 1}')])


def test_a_default_that_reads_other_columns_is_refused_naming_the_column(ch_db):
    from sparkapp.edges.clickhouse import load_schema
    from sparkapp.formats.schema import SchemaError

    client, db = ch_db
    client.command("CREATE TABLE derived (a UInt64, b UInt64 DEFAULT a + 1, _offset UInt64) ENGINE = MergeTree "
                   "ORDER BY a")
    with pytest.raises(SchemaError, match=r"column `b` .* DEFAULT that depends on other columns \(a \+ 1\)"):
        load_schema(client, db, "derived")
