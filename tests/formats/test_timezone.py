"""Date-times without a zone in the record mean the column's zone, or when the column names none, the zone
ClickHouse itself reads them in (`timezone()`: the session's, else the server's). Both paths store the same
instant on a session that is not UTC, also for a column's DEFAULT (real chdb)."""

from __future__ import annotations

import json

import clickhouse_connect
import pytest

from sparkapp.core.blocks import LineBlock, build_blocks
from sparkapp.core.records import Message
from sparkapp.core.state_machine import OffsetRange
from sparkapp.edges.clickhouse import load_schema
from sparkapp.edges.insert import Inserter
from sparkapp.formats.jsoneachrow import build_lines
from sparkapp.formats.registry import DecoderSpec, make_decoder
from sparkapp.formats.rows import decode_batch
from tests.helpers import messages_table

COLUMNS = ("a DateTime, b DateTime64(3), c Nullable(DateTime64(6)), d Array(DateTime), "
           "t Tuple(x DateTime64(3)), z DateTime('UTC'), y DateTime64(3, 'America/New_York'), "
           "e DateTime DEFAULT toDateTime('2020-01-01 00:00:00'), f DateTime64(3) DEFAULT '2020-02-03 04:05:06.7'")
RECORDS = [
    {"a": "2020-01-01 10:00:00", "b": "2020-01-01 10:00:00.5", "c": "2021-06-30T23:59:59.123456",
     "d": ["2020-01-01 00:00:00", "2020-07-01 12:00:00"], "t": {"x": "2020-03-01 01:02:03.004"},
     "z": "2020-01-01 10:00:00", "y": "2020-07-01 10:00:00.25"},
    {"a": "2020-01-01T10:00:00+02:00", "b": "2020-01-01T10:00:00Z", "c": None, "d": [], "t": {"x": 1600000000},
     "z": 1577872800, "y": "2020-07-01T10:00:00.25+00:00"},
]
READ = ("SELECT n, toUnixTimestamp(a), toUnixTimestamp64Micro(b), toUnixTimestamp64Micro(c), "
        "arrayMap(x -> toUnixTimestamp(x), d), toUnixTimestamp64Micro(t.x), toUnixTimestamp(z), "
        "toUnixTimestamp64Micro(y), toUnixTimestamp(e), toUnixTimestamp64Milli(f) FROM {t} WHERE n % 2 = {side} ORDER BY n")


@pytest.mark.parametrize("zone", ["Asia/Kolkata", "America/New_York"])
def test_naive_date_times_mean_the_sessions_zone_on_both_paths(ch_dsn, chdb_config, ch_db, zone):
    _, db = ch_db
    client = clickhouse_connect.get_client(dsn=ch_dsn, chdb_options={"config-file": str(chdb_config)},
                                           settings={"session_timezone": zone})
    client.database = db
    client.command(f"CREATE TABLE tz (n UInt64, {COLUMNS}) ENGINE = MergeTree ORDER BY n")
    schema = load_schema(client, db, "tz")
    inserter = Inserter(client, schema, retries=0)
    fast = [Message("t", 0, 2 * i + 1, json.dumps({"n": 2 * i + 1, **r}).encode()) for i, r in enumerate(RECORDS)]
    lines = build_lines(messages_table(fast), schema.names, 1 << 20)
    inserter.insert(LineBlock(OffsetRange(1, 3), "fast", (1, 3), lines))
    slow = [Message("t", 0, 2 * i, json.dumps({"n": 2 * i, **r}).encode()) for i, r in enumerate(RECORDS)]
    rows, dead = decode_batch(make_decoder(DecoderSpec(), schema), slow)
    assert dead == []
    for block in build_blocks(OffsetRange(0, 2), rows, schema.names, 10, lambda w: "slow"):
        inserter.insert(block)
    parsed = [r[1:] for r in client.query(READ.format(t="tz", side=1)).result_rows]
    decoded = [r[1:] for r in client.query(READ.format(t="tz", side=0)).result_rows]
    assert decoded == parsed
    assert parsed[0][0] == client.query("SELECT toUnixTimestamp(toDateTime('2020-01-01 10:00:00'))").result_rows[0][0]
