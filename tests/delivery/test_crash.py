"""Crash injection at every step boundary, over many random runs and batch cuts (real chdb + ZooKeeper).

Each run is a writer restart: a new epoch, a start offset taken from the state store (sometimes
replaying further back, sometimes starting inside an unconfirmed range), random batch sizes, and a
crash at a random step. The invariant after a final clean run: every offset is in the table once.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from sparkapp.config import Engine
from sparkapp.core.records import Message
from sparkapp.core.state_machine import OffsetRange, Phase
from sparkapp.delivery.context import WriterContext
from sparkapp.delivery.writer import STEPS, Waiting, write_lines, write_lines_many, write_partition
from sparkapp.edges.clickhouse import load_schema
from sparkapp.edges.dlq import HEADER_OFFSET, HEADER_PARTITION, KafkaDeadLetterSink
from sparkapp.edges.insert import Inserter
from sparkapp.edges.store import Begin, PartitionKey, StateStore
from sparkapp.formats.record_key import KeyFormat
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from tests.helpers import compile_proto, line_batch, msg, proto_message, read_dlq

# crashed runs per case: each of the 8 step boundaries about twice in each of the cases below (the loop goes on
# until every one has been crashed at least once)
CRASH_RUNS_PER_CASE = 16
# the record's metadata too (key, headers, timestamp type), compared value for value at the end
METADATA = ("_topic String, _partition UInt32, _offset UInt64, _key Nullable(String), _headers Map(String, String), "
            "_timestamp_type Enum8('CreateTime' = 0, 'LogAppendTime' = 1)")
VARIANTS = {
    # name: (table columns beyond id, dedup window)
    "token-only": ("_offset UInt64", 10_000),
    "token+recount": (METADATA, 10_000),
    "window-expired": (METADATA, 0),
}


BAD = (b"{broken", b'{"id": "not a number"}')  # the second is a JSON object only ClickHouse rejects
BAD_KEY = b'{"id": 1'  # an upsert's key that is no JSON: the record is dead-lettered, its value good


def is_bad(m: Message) -> bool:
    return m.value in BAD or m.key == BAD_KEY


HEADERS = (lambda i: (), lambda i: (("trace", b"t%d" % i),),
           lambda i: (("trace", b"old"), ("trace", b"t%d" % i), ("bin", b"\xff"), ("n", b"")))


def expected_metadata(i: int) -> tuple[str | None, dict[str, str], str]:
    """What the table holds for the i-th record of a stream: its key, headers and timestamp type."""
    headers = {k: v.decode("utf-8", errors="replace") for k, v in HEADERS[i % len(HEADERS)](i)}
    return (f"k{i}" if i % 2 else None), headers, ("LogAppendTime" if i % 3 == 0 else "CreateTime")


class Crash(Exception):
    pass


class Done(Exception):
    """A run of the `many` path ended without a crash."""


def change(i: int, row: dict[str, int]) -> dict[str, object] | None:
    """The i-th record of a Debezium change stream (wrapped by the JSON converter every 5th time): creates,
    updates and snapshot reads, a delete every 7th record and its tombstone (None) right after it."""
    if i % 7 == 0 and i:
        return None  # the tombstone of the delete before it
    op = "d" if i % 7 == 6 else "cru"[i % 3]
    event = {"op": op, "before": row if op in "ud" else None, "after": None if op == "d" else row, "ts_ms": i}
    return {"schema": {}, "payload": event} if i % 5 == 0 else event


def upsert_key(i: int, row: dict[str, int]) -> bytes:
    """The i-th record's key in an upsert stream: a JSON object naming its row, wrapped by Kafka Connect's JSON
    converter every 4th time."""
    return json.dumps({"schema": {}, "payload": row} if i % 4 == 0 else row).encode()


PROTO = 'syntax = "proto3"; package crash; message Row { uint32 id = 1; string note = 2; }'
CONFLUENT_FRAME = b"\x00\x00\x00\x00\x07\x00"  # magic byte, schema id 7, message indexes [0]


def proto_value(i: int, row: dict[str, int], descriptor_set: str) -> bytes:
    """The i-th record of a Protobuf stream, in Confluent's wire format every 3rd time (the id 0 is no bytes)."""
    value = proto_message(descriptor_set, "crash.Row", {**row, "note": f"n{i}"})
    return CONFLUENT_FRAME + value if i % 3 == 0 else value


def mixed(i: int) -> dict[str, object]:
    """The i-th record's Dynamic and Variant values: a number, text, a list or an object, by turns."""
    return {"v": [i, f"s{i}", [i, i + 1], {"n": i}][i % 4], "w": i if i % 2 else f"w{i}"}


def stream(rng: random.Random, topic: str, partition: int, n: int, mode: str = "plain",
           descriptor_set: str = "") -> list[Message]:
    """n messages with random offset gaps, as compaction or transaction markers leave them (`cdc`: as change
    events; `upsert`: rows keyed by JSON keys, a tombstone every 7th record, the row's id in the key alone;
    `protobuf`: Protobuf messages)."""
    out, off = [], rng.randrange(0, 5)
    for i in range(n):
        row = {"id": partition * 100_000 + i}
        key = b"k%d" % i if i % 2 else None
        if mode == "upsert":
            value, key = (None if i % 7 == 0 and i else {"v": i}), upsert_key(i, row)
            if rng.random() < 0.04:
                value, key = rng.choice([(b"{broken", key), (value, BAD_KEY)])
        elif mode == "protobuf":
            value = rng.choice(BAD) if rng.random() < 0.04 else proto_value(i, row, descriptor_set)
        elif mode == "mixed":
            value = rng.choice(BAD) if rng.random() < 0.04 else {**row, **mixed(i)}
        else:
            value = rng.choice(BAD) if rng.random() < 0.04 else change(i, row) if mode == "cdc" else row
        out.append(msg(value, offset=off, topic=topic, partition=partition, key=key,
                       headers=HEADERS[i % len(HEADERS)](i), timestamp_type=int(i % 3 == 0)))
        off += 1 if rng.random() < 0.8 else rng.randrange(2, 6)
    return out


def start_offset(rng: random.Random, store: StateStore, pk: PartitionKey, log: list[Message]) -> int:
    row = store.get(pk)
    if row is None:
        return log[0].offset
    s = row.state
    base = s.resume_offset
    roll = rng.random()
    if roll < 0.2:  # replay from further back (a lost checkpoint)
        return max(log[0].offset, base - rng.randrange(1, 40))
    if roll < 0.3 and s.phase is Phase.BEFORE:  # start inside the unconfirmed range
        return rng.randrange(s.range.min, s.range.max + 1)
    return base


# (seed, variant) pairs: the shared transitions (seed 4) are crashed against tokens alone and recounting
# alone; an upsert stream (seed 6), a Protobuf one (seed 7) and Dynamic and Variant columns (seed 8) differ from
# the others in their decoder alone: crashed once each, recounted
CASES = [(seed, v) for seed in (1, 2, 3, 4, 5) for v in VARIANTS if (seed, v) != (4, "token+recount")] + \
    [(6, "window-expired"), (7, "token+recount"), (8, "token+recount")] + \
    [(seed, v) for seed in (9, 10) for v in ("token-only", "window-expired")]


@pytest.mark.parametrize(("seed", "variant"), CASES)
def test_crash_at_every_step_boundary(ch_db, kafka, topic, variant, seed, tmp_path):
    """Seed 1 takes the decoding path, seed 2 the fast path (ClickHouse parses, bad records sifted out), seed 3
    either, batch by batch: a retry of a range often takes the other path, and must send the same blocks.
    Seed 4 writes both partitions' batches together, their transitions shared (write_lines_many), as executors
    do; seed 9 as the driver does, each range's AFTER left to its partition's next BEFORE (Waiting) and written
    only when a run ends cleanly, some runs taking the decoding path partition by partition instead; seed 10 as
    executor tasks do, each round's ranges handed to the next round by the driver, which confirms those of
    partitions without records, and a crashed round retried half the time in the same run with the same hand-over
    (as Spark retries a task) instead of ending the run. Seed 5 is a Debezium change stream (deletes, tombstones) on the decoding path, as the job
    takes it; seed 6 an upsert stream (ids from JSON keys, tombstones as deletes, bad keys dead-lettered); seed 7
    a Protobuf stream (some in Confluent's wire format, bad values dead-lettered), its notes compared too; seed 8
    a Dynamic and a Variant column taking values of every kind, each value compared with its type."""
    path = {1: "decode", 2: "lines", 4: "many", 5: "decode", 6: "decode", 7: "decode", 8: "decode",
            9: "waiting", 10: "handed"}.get(seed, "either")
    mode = {5: "cdc", 6: "upsert", 7: "protobuf", 8: "mixed"}.get(seed, "plain")
    descriptor_set = compile_proto(PROTO, tmp_path, "crash.proto") if mode == "protobuf" else ""
    client, db = ch_db
    dlq_topic = topic(1)
    cols, window = VARIANTS[variant]
    if mode in ("cdc", "upsert"):
        cols += ", _op LowCardinality(String), _deleted UInt8"
    if mode == "protobuf":
        cols += ", note String"
    if mode == "mixed":
        cols += ", v Dynamic, w Variant(Int64, String)"
    client.command(f"CREATE TABLE ev (id UInt32, {cols}) ENGINE = MergeTree ORDER BY _offset "
                   f"SETTINGS non_replicated_deduplication_window = {window}")
    schema = load_schema(client, db, "ev")
    names = schema.names
    store = StateStore(client, "state", Engine.KEEPER_MAP, keeper_path=f"/crash_{db}")
    store.ensure_schema()
    rng = random.Random(seed * 1000 + len(variant))
    # a retried round goes on with its run: that path needs a longer stream for as many crashes
    logs = {p: stream(rng, "src", p, 1600 if path == "handed" else 800, mode, descriptor_set) for p in (0, 1)}

    def refetch(topic: str, partition: int, r: OffsetRange) -> list[Message]:
        return [m for m in logs[partition] if m.offset in r]

    spec = DecoderSpec(Format.PROTOBUF if mode == "protobuf" else Format.JSON,
                       envelope={"cdc": "debezium"}.get(mode, mode if mode == "upsert" else "none"),
                       key_format=KeyFormat.JSON if mode == "upsert" else KeyFormat.NONE,
                       protobuf_descriptor_set=descriptor_set or None,
                       protobuf_message="crash.Row" if descriptor_set else None)
    dlq = KafkaDeadLetterSink(dlq_topic, {"bootstrap.servers": kafka.bootstrap})
    crashes: dict[str, int] = {}
    runs = 0
    def crashing() -> bool:
        return runs < CRASH_RUNS_PER_CASE or len(crashes) < len(STEPS)

    while crashing() or not done(store, logs):
        assert not (crashing() and done(store, logs)), f"stream exhausted before every step crashed: {crashes}"
        crash_at = None
        if crashing():  # the least-crashed step boundary, so that every one is covered
            least = min(crashes.get(s, 0) for s in STEPS)
            crash_at = rng.choice([s for s in STEPS if crashes.get(s, 0) == least])
            runs += 1
        countdown = rng.randrange(1, 4)

        def fault(step: str, crash_at: str | None = crash_at) -> None:
            nonlocal countdown
            if step == crash_at:
                countdown -= 1
                if countdown == 0:
                    crashes[step] = crashes.get(step, 0) + 1
                    raise Crash(step)

        ctx = WriterContext("crash-sink", store, Inserter(client, schema), make_decoder(spec, schema),
                            store.acquire_epoch("crash-sink"), block_offsets=5,
                            refetch=refetch, fault=fault, dlq=dlq)
        try:
            if path in ("many", "handed") or (path == "waiting" and rng.random() < 0.75):
                waiting = Waiting(store, ctx.epoch) if path == "waiting" else None
                _write_together(ctx, store, logs, names, rng, crash_at, waiting, handed=path == "handed")
                if waiting is not None:  # a run that ends cleanly confirms what waits
                    waiting.flush()
                raise Done
            for p, log in logs.items():
                pk = PartitionKey("crash-sink", "src", p)
                start = start_offset(rng, store, pk, log)
                pos = next((i for i, m in enumerate(log) if m.offset >= start), len(log))
                row = store.get(pk)
                # a replayed first batch reaches into the stored range (wholly below it is irrecoverable)
                reach = 0 if row is None else next(i for i, m in enumerate(log) if m.offset >= row.state.range.min)
                first = True
                budget = rng.randrange(1, 6) if crash_at else 10**9  # a run may also end cleanly mid-stream
                while pos < len(log) and budget > 0:
                    budget -= 1
                    n = rng.randrange(1, 30)
                    if first:
                        n, first = max(n, reach - pos + 1), False
                    batch = log[pos:pos + n]
                    fast = path == "lines" or (path == "either" and rng.random() < 0.5)
                    if fast:  # the fast path; non-objects are decoded, lines ClickHouse refuses too
                        write_lines(ctx, pk, line_batch(batch, names))
                    else:
                        write_partition(ctx, pk, batch)
                    pos += n
        except Crash:
            continue
        except Done:
            pass
        assert crash_at or done(store, logs), "a clean run did not finish the stream"

    assert set(crashes) == set(STEPS), f"not every step boundary was crashed at: {crashes}"
    expected = sorted((p * 100_000 + i, m.offset) for p, log in logs.items() for i, m in enumerate(log)
                      if not is_bad(m) and (m.value is not None or mode == "upsert"))  # a CDC tombstone: no row
    bad = sorted((p, m.offset) for p, log in logs.items() for m in log if is_bad(m))
    dead = sorted((int(dict(m.headers())[HEADER_PARTITION]), int(dict(m.headers())[HEADER_OFFSET]))
                  for m in read_dlq(kafka.bootstrap, dlq_topic, len(bad)))
    assert dead == bad, "dead-letter topic must hold each bad offset exactly once"
    got = client.query("SELECT id, _offset FROM ev ORDER BY id, _offset").result_rows
    dupes = client.query("SELECT id, count() c FROM ev GROUP BY id HAVING c > 1 LIMIT 5").result_rows
    assert dupes == [], f"duplicated rows {dupes} (crashes: {crashes})"
    assert [tuple(r) for r in got] == expected, f"lost rows (crashes: {crashes})"
    if "_headers" in cols:  # every value stored exactly as the record had it, whichever path took it
        stored = client.query("SELECT id, _key, _headers, _timestamp_type FROM ev ORDER BY id").result_rows
        keys = {i: upsert_key(i % 100_000, {"id": i}).decode() for i, _ in expected} if mode == "upsert" else {}
        assert [tuple(r) for r in stored] == [(i, *expected_metadata(i % 100_000)) if mode != "upsert" else
                                              (i, keys[i], *expected_metadata(i % 100_000)[1:]) for i, _ in expected]
    if mode == "protobuf":  # each message's own values, framed or not
        notes = client.query("SELECT id, note FROM ev ORDER BY id").result_rows
        assert [tuple(r) for r in notes] == [(i, f"n{i % 100_000}") for i, _ in expected]
    if mode == "mixed":  # each value with the type of its kind
        got = client.query("SELECT id, dynamicType(v), toString(v), variantType(w), toString(w) FROM ev ORDER BY id")
        kinds = ("Int64", "String", "Array(Int64)", "JSON")
        want = []
        for i, _ in expected:
            m = mixed(i % 100_000)
            v = m["v"]
            text = json.dumps(v, separators=(",", ":")) if isinstance(v, dict | list) else str(v)
            want.append((i, kinds[i % 100_000 % 4], text, "Int64" if i % 2 else "String", str(m["w"])))
        assert [tuple(r) for r in got.result_rows] == want
    if mode == "upsert":  # each value its key's row, each tombstone its key's delete
        ops = client.query("SELECT id, _op, _deleted FROM ev ORDER BY id").result_rows
        assert [tuple(r) for r in ops] == [(i, *(("d", 1) if i % 100_000 % 7 == 0 and i % 100_000 else ("u", 0)))
                                           for i, _ in expected]
    if mode == "cdc":  # each change as its row: the operation, and deletes marked
        ops = client.query("SELECT id, _op, _deleted FROM ev ORDER BY id").result_rows
        kinds = {i: "d" if i % 100_000 % 7 == 6 else "cru"[i % 100_000 % 3] for i, _ in expected}
        assert [tuple(r) for r in ops] == [(i, kinds[i], int(kinds[i] == "d")) for i, _ in expected]


def _write_together(ctx: WriterContext, store: StateStore, logs: dict[int, list[Message]], names: tuple[str, ...],
                    rng: random.Random, crash_at: str | None, waiting: Waiting | None, handed: bool = False) -> None:
    """One writer run of the `many` path: each round, a batch of every partition, written together. `handed`: as
    an executor task, each round handed what the last one delivered (see _task_round)."""
    given: dict[PartitionKey, Begin] = {}  # the driver's: what the last round delivered
    pos: dict[int, int] = {}
    reach: dict[int, int] = {}  # a replayed first batch reaches into the stored range (wholly below: irrecoverable)
    for p, log in logs.items():
        pk = PartitionKey("crash-sink", "src", p)
        start = start_offset(rng, store, pk, log)
        pos[p] = next((i for i, m in enumerate(log) if m.offset >= start), len(log))
        row = store.get(pk)
        reach[p] = 0 if row is None else next(i for i, m in enumerate(log) if m.offset >= row.state.range.min)
    budget = rng.randrange(1, 6) if crash_at else 10**9
    while any(pos[p] < len(log) for p, log in logs.items()) and budget > 0:
        budget -= 1
        items = []
        for p, log in logs.items():
            n = max(rng.randrange(1, 30), reach.pop(p, 0) - pos[p] + 1)
            batch = log[pos[p]:pos[p] + n]
            if batch:
                items.append((ctx, PartitionKey("crash-sink", "src", p), line_batch(batch, names)))
            pos[p] += n
        if handed:
            _task_round(ctx, store, items, given, rng)
        else:
            write_lines_many(items, waiting)
    if handed:  # a run that ends cleanly confirms what waits
        Waiting(store, ctx.epoch, given, handed=True).flush()


def _task_round(ctx: WriterContext, store: StateStore, items: list[Any], given: dict[PartitionKey, Begin],
                rng: random.Random) -> None:
    """One batch as an executor task writes it, and the driver's part after it (ExecutorWriter.tasks_done): the
    task is handed the ranges of its partitions that the last batch delivered; a crashed task is retried half the
    time with the same hand-over (the first attempt may have taken them over), else the run ends."""
    mine = {it[1]: given[it[1]] for it in items if it[1] in given}
    task = Waiting(store, ctx.epoch, dict(mine), handed=True)
    try:
        write_lines_many(items, task)
    except Crash:
        if rng.random() < 0.5:
            raise
        task = Waiting(store, ctx.epoch, dict(mine), handed=True)
        write_lines_many(items, task)  # the fault fires once: the retry goes through
    for pk in mine:
        del given[pk]
    Waiting(store, ctx.epoch, given, handed=True).flush()  # partitions without records in this batch
    given.update(task.ranges)


def done(store: StateStore, logs: dict[int, list[Message]]) -> bool:
    for p, log in logs.items():
        row = store.get(PartitionKey("crash-sink", "src", p))
        if row is None or row.state.phase is not Phase.AFTER or row.state.range.max != log[-1].offset:
            return False
    return True
