"""The fast path: ClickHouse parses the JVM-built JSONEachRow lines. It must land the same rows as the
Python decoder, send what it cannot fit through the decoder (dead letters with reasons), and keep the
exactly-once protocol (same windows and tokens)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkapp.config import Engine
from sparkapp.core.blocks import payload
from sparkapp.core.records import Message
from sparkapp.delivery.context import WriterContext
from sparkapp.delivery.writer import write_lines, write_partition
from sparkapp.edges.clickhouse import load_schema
from sparkapp.edges.dlq import HEADER_OFFSET, HEADER_REASON, HEADER_SINK, KafkaDeadLetterSink
from sparkapp.edges.insert import Inserter
from sparkapp.edges.store import PartitionKey, StateStore
from sparkapp.formats.jsoneachrow import build_lines
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from tests.helpers import line_batch, messages_table, read_dlq, reference_lines

COLUMNS = ("id UInt64, ts DateTime64(3), user LowCardinality(String), amount Decimal(18, 4), "
           "score Nullable(Float64), tags Array(String), attrs Map(String, String), note String, "
           "_topic String, _partition UInt32, _offset UInt64, _timestamp DateTime64(3), _key Nullable(String)")


def record(rnd: random.Random, i: int) -> dict:
    return {"id": i, "ts": f"2026-0{1 + i % 9}-1{i % 9} 0{i % 10}:00:0{i % 10}.{i % 1000:03d}",
            "user": f"u{rnd.randrange(50)}", "amount": f"{rnd.randrange(10**6)}.{rnd.randrange(10**4):04d}",
            "score": None if i % 7 == 0 else rnd.random() * 100, "tags": [f"t{j}" for j in range(i % 4)],
            "attrs": {"k": "v\"quoted\"", "ü": "ñ\\n"} if i % 5 == 0 else {}, "note": "line\nbreak ✓" * (i % 3),
            **({"extra": 1} if i % 11 == 0 else {})}


def messages(n: int, topic: str = "src", seed: int = 1) -> list[Message]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        value = json.dumps(record(rnd, i), ensure_ascii=i % 2 == 0).encode()
        if i % 13 == 0:
            value = b"  " + value + b"\n"
        key = None if i % 3 == 0 else f"k{i}".encode()
        out.append(Message(topic, 0, 100 + i, value, key, 1_700_000_000_000 + 37 * i))
    return out


def make_ctx(client, db, table, dlq=None, sink="lines"):
    schema = load_schema(client, db, table)
    store = StateStore(client, "state", Engine.KEEPER_MAP, keeper_path=f"/lines_{db}_{table}")
    store.ensure_schema()
    return WriterContext(sink, store, Inserter(client, schema), make_decoder(DecoderSpec(Format.JSON), schema),
                         store.acquire_epoch(sink), block_offsets=40, dlq=dlq)


def fast_and_slow(ch_db, kafka, dlq_topic: str, fast: str, slow: str):
    """Two sinks (each its own table, named as the sink) sharing one dead-letter topic: the writer contexts of the
    fast path's and the decoding path's run over the same records, and the dead-letter sink."""
    client, db = ch_db
    dlq = KafkaDeadLetterSink(dlq_topic, {"bootstrap.servers": kafka.bootstrap})
    for t in (fast, slow):
        client.command(f"CREATE TABLE {t} ({COLUMNS}) ENGINE = MergeTree ORDER BY _offset")
    return make_ctx(client, db, fast, dlq, sink=fast), make_ctx(client, db, slow, dlq, sink=slow), dlq


def reasons_by_sink(bootstrap: str, dlq_topic: str, n: int) -> dict[str, dict[int, str]]:
    """The dead-letter topic's n letters: sink -> offset -> reason."""
    by_sink: dict[str, dict[int, str]] = {}
    for m in read_dlq(bootstrap, dlq_topic, n):
        h = dict(m.headers())
        by_sink.setdefault(h[HEADER_SINK].decode(), {})[int(h[HEADER_OFFSET])] = h[HEADER_REASON].decode()
    return by_sink


def rows(client, table):
    return client.query(f"SELECT * EXCEPT _key, toString(_key) FROM {table} ORDER BY _offset").result_rows


def test_clickhouse_parsing_lands_the_same_rows_as_the_python_decoder(ch_db):
    client, db = ch_db
    for t in ("fast", "slow"):
        client.command(f"CREATE TABLE {t} ({COLUMNS}) ENGINE = MergeTree ORDER BY _offset")
    msgs = messages(300)
    fast, slow = make_ctx(client, db, "fast", sink="fast"), make_ctx(client, db, "slow", sink="slow")
    schema = fast.inserter.schema
    r = write_lines(fast, PartitionKey("fast", "src", 0), line_batch(msgs, schema.names))
    assert fast.inserter.inserts == 8 and r.inserted_rows == 300 and r.dead_lettered == 0  # 300 offsets / 40
    write_partition(slow, PartitionKey("slow", "src", 0), msgs)
    assert rows(client, "fast") == rows(client, "slow")


def test_built_lines_equal_the_plain_reference(ch_db):
    """Vectorized line building against a plain one-record-at-a-time reference, on tricky values."""
    client, db = ch_db
    client.command(f"CREATE TABLE ref ({COLUMNS}) ENGINE = MergeTree ORDER BY _offset")
    names = load_schema(client, db, "ref").names
    msgs = [*messages(200), Message("src", 0, 900, b"[1,2]"), Message("src", 0, 901, b"{}"),
            Message("src", 0, 902, b" { } "), Message("src", 0, 903, None), Message("src", 0, 904, b"{broken"),
            Message("src", 0, 905, b'{"a":1}', b'k"\\\n'), Message("src", 0, 906, b'{"a":1}', "ключ".encode()),
            Message("src", 0, 907, b'{"a":1}', b"\xff\xfe"), Message("src", 0, 908, b"\t{\"a\": 2}\r\n", b""),
            Message("src", 0, 909, b'{"a": "' + b"x" * 100 + b'"}')]
    built = build_lines(messages_table(msgs), names, 80)
    built.validate(full=True)  # a bad record's line is null by its validity bit; the array stays well-formed
    got = built.to_pylist()
    assert got == reference_lines(msgs, names, 80).to_pylist()
    assert got[-1] is None and got[-2] is not None  # over maxMessageBytes: decoded (and dead-lettered)
    assert build_lines(messages_table(msgs[:3]), ("id",), 1 << 20).to_pylist() == [
        m.value.decode().strip() + "\n" for m in msgs[:3]]
    # bad records none of which is padded (the values are left untrimmed), and a padded one among them
    for extra in ([b"[1,2]", b"{broken", None], [b"[1,2]", b"{broken", b' {"a": 3}'], [b"{broken", b"{}\n"],
                  [b"[1]", b"\n"]):
        odd = [*msgs[:20], *(Message("src", 0, 950 + i, v) for i, v in enumerate(extra))]
        assert build_lines(messages_table(odd), names, 1 << 20).to_pylist() == reference_lines(odd, names).to_pylist()


def test_bad_records_are_dead_lettered_once_with_the_decoders_reason_and_the_rest_lands(ch_db, kafka, topic):
    client, db = ch_db
    client.command(f"CREATE TABLE mixed ({COLUMNS}) ENGINE = MergeTree ORDER BY _offset")
    dlq_topic = topic(1)
    ctx = make_ctx(client, db, "mixed", KafkaDeadLetterSink(dlq_topic, {"bootstrap.servers": kafka.bootstrap}))
    msgs = messages(120)
    bad = {105: b"{broken", 110: b"[1, 2]",  # no line: decoded in Python, dead-lettered up front
           150: b'{"id": "not a number"}', 199: b'{"id": 1, "ts": "yesterday"}'}  # ClickHouse rejects
    msgs = [Message(m.topic, 0, m.offset, bad.get(m.offset, m.value), m.key, m.timestamp_ms) for m in msgs]
    r = write_lines(ctx, PartitionKey("lines", "src", 0), line_batch(msgs, ctx.inserter.schema.names))
    assert (r.inserted_rows, r.dead_lettered) == (116, 4)
    assert client.query("SELECT count(), uniqExact(_offset) FROM mixed").result_rows == [(116, 116)]
    dead = read_dlq(kafka.bootstrap, dlq_topic, 4)
    reasons = {int(dict(m.headers())[HEADER_OFFSET]): dict(m.headers())[HEADER_REASON].decode() for m in dead}
    assert len(dead) == 4, "each dead letter exactly once, though the range took two sends"
    assert set(reasons) == {105, 110, 150, 199} and "column `id`" in reasons[150] and "column `ts`" in reasons[199]
    assert "malformed JSON" in reasons[105]
    assert ctx.inserter.inserts == 3  # window [100,139] on the fast path, then the 2 others decoded


DIRTY = [b'{"id": "not a number"}', b'{"id": 1, "ts": "yesterday"}',  # ClickHouse refuses them
         b'{"id": 123456789012345678901234567890}', b'{"id": null}',  # ClickHouse would alter them (the Guard)
         b'{"id": 2, "amount": "1.2.3"}', b"{broken", b"[1]"]  # the last two have no line at all


def spy(calls: dict[str, int], obj, *names: str) -> dict[str, int]:
    """Counts calls of obj's methods `names` in `calls` from now on (the real methods run)."""
    calls.update(dict.fromkeys(names, 0))
    for name in names:
        real = getattr(obj, name)

        def counted(*a, _name=name, _real=real, **kw):
            calls[_name] += 1
            return _real(*a, **kw)
        setattr(obj, name, counted)
    return calls


def counting(ctx) -> list[int]:
    """The offsets the Python decoder sees, from now on."""
    seen: list[int] = []
    decode = ctx.decode

    def count(m):
        seen.append(m.offset)
        return decode(m)
    ctx.decode = count
    return seen


def test_only_the_bad_records_leave_the_fast_path_never_their_neighbours(ch_db, kafka, topic):
    """Dirty data at clean-data speed: each bad record is decoded (and dead-lettered) alone, and its window's
    other lines stay on the fast path under the window's token; the table and the dead letters equal the
    decoding path's."""
    client, _ = ch_db
    dlq_topic = topic(1)
    fast, slow, dlq = fast_and_slow(ch_db, kafka, dlq_topic, "dirty", "ref")
    msgs = messages(400)
    bad = {100 + i: DIRTY[i % len(DIRTY)] for i in range(3, 400, 9)}  # one or more in every window of 40
    msgs = [Message(m.topic, 0, m.offset, bad.get(m.offset, m.value), m.key, m.timestamp_ms) for m in msgs]
    seen = counting(fast)
    calls: dict[str, int] = {}
    spy(calls, fast.inserter, "refused")
    spy(calls, dlq, "send", "sent_since")
    r = write_lines(fast, PartitionKey("dirty", "src", 0), line_batch(msgs, fast.inserter.schema.names))
    assert sorted(seen) == sorted(bad), "only the bad records take the decoder"
    assert (r.inserted_rows, r.dead_lettered) == (400 - len(bad), len(bad))
    assert fast.inserter.inserts == 10  # one block per window, as on a clean run
    # found before any insert (no window refused, no search for its bad lines), dead-lettered in one send
    assert calls == {"refused": 0, "send": 1, "sent_since": 0}, calls
    write_partition(slow, PartitionKey("ref", "src", 0), msgs)
    assert rows(client, "dirty") == rows(client, "ref")
    by_sink = reasons_by_sink(kafka.bootstrap, dlq_topic, 2 * len(bad))
    assert by_sink["dirty"] == by_sink["ref"] and set(by_sink["dirty"]) == set(bad), "the decoder's reasons, once"


def test_a_lone_surrogate_escape_is_dead_lettered_on_both_paths_not_stored_or_stuck(ch_db, kafka, topic):
    """`"\\ud800"` names no character: ClickHouse refuses it (CANNOT_PARSE_ESCAPE_SEQUENCE), so the decoder must
    too, with a reason, on both paths, rather than keep a string no insert can encode (which stopped the sink)."""
    client, _ = ch_db
    dlq_topic = topic(1)
    fast, slow, _dlq = fast_and_slow(ch_db, kafka, dlq_topic, "fast", "slow")
    bad = {110: b'{"id": 1, "note": "\\ud800 alone"}', 111: b'{"id": 2, "note": "x\\uDC80"}',
           112: b'{"id": 3, "attrs": {"\\ud83d": "v"}}'}
    ok = b'{"id": 4, "note": "\\ud83d\\ude00 a pair is one character"}'
    msgs = [Message(m.topic, 0, m.offset, bad.get(m.offset, ok if m.offset == 113 else m.value), m.key,
                    m.timestamp_ms) for m in messages(60)]
    r = write_lines(fast, PartitionKey("fast", "src", 0), line_batch(msgs, fast.inserter.schema.names))
    s = write_partition(slow, PartitionKey("slow", "src", 0), msgs)
    assert (r.inserted_rows, r.dead_lettered) == (s.inserted_rows, s.dead_lettered) == (57, 3)
    assert rows(client, "fast") == rows(client, "slow")
    assert client.query("SELECT note FROM fast WHERE _offset = 113").result_rows == [("😀 a pair is one character",)]
    reasons = reasons_by_sink(kafka.bootstrap, dlq_topic, 6)
    assert reasons["fast"] == reasons["slow"] and set(reasons["fast"]) == set(bad)
    assert "lone surrogate" in reasons["fast"][110], reasons


def test_a_flagged_line_the_decoder_keeps_sends_its_whole_window_through_the_decoder(ch_db):
    """A Guard false alarm (a long digit run inside a string): the decoder keeps the record, so its window is
    decoded whole, as the decoding path would send it; the other windows stay on the fast path."""
    client, db = ch_db
    client.command(f"CREATE TABLE alarm ({COLUMNS}) ENGINE = MergeTree ORDER BY _offset")
    ctx = make_ctx(client, db, "alarm", sink="alarm")
    msgs = messages(120)
    msgs[45] = Message("src", 0, 145, b'{"id": 45, "note": "12345678901234567890123"}', None, msgs[45].timestamp_ms)
    seen = counting(ctx)
    r = write_lines(ctx, PartitionKey("alarm", "src", 0), line_batch(msgs, ctx.inserter.schema.names))
    assert seen[0] == 145 and sorted(set(seen)) == list(range(140, 180)) and r.inserted_rows == 120
    assert client.query("SELECT note FROM alarm WHERE _offset = 145").result_rows == [("12345678901234567890123",)]


def test_records_that_are_no_object_are_nulled_without_copying_the_lines():
    """A batch's bad records cost no copy of its lines: the check's bits become the lines' validity, and the lines'
    bytes are the very buffer they were built in."""
    import pyarrow as pa

    from sparkapp.formats.jsoneachrow import _unless

    lines = pa.array(['{"id": 0}\n', "[1,2]\n", '{"id": 2}\n'])
    for lines_in in (lines, pa.array(['{"id": 0}\n', None, '{"id": 2}\n'])):
        out = _unless(pa.array([True, False, True]), lines_in)
        out.validate(full=True)
        assert out.to_pylist() == ['{"id": 0}\n', None, '{"id": 2}\n']
        assert out.buffers()[2].address == lines_in.buffers()[2].address  # not copied
    # sliced lines, whose bits would not line up, are copied instead; an unknown in the check is not ok
    for ok, lines_in in ((pa.array([True, False, True]), pa.array(["x\n", *lines.to_pylist()]).slice(1)),
                        (pa.array([True, None, True]), lines)):
        out = _unless(ok, lines_in)
        out.validate(full=True)
        assert out.to_pylist() == ['{"id": 0}\n', None, '{"id": 2}\n']
    msgs = [*(Message("src", 0, i, json.dumps({"id": i}).encode()) for i in range(5)), Message("src", 0, 5, b"[1,2]")]
    assert build_lines(messages_table(msgs), ("id",), 1 << 20).to_pylist() == [
        f'{{"id": {i}}}\n' for i in range(5)] + [None]


def test_payload_is_the_slice_bytes():
    import pyarrow as pa

    arr = pa.array(["a\n", "bc\n", "d\n", "ef\n"])
    assert bytes(payload(arr.slice(1, 2))) == b"bc\nd\n" and bytes(payload(arr.slice(0, 0))) == b""
    with pytest.raises(ValueError):
        payload(pa.array(["a", None]))


def test_tables_with_types_clickhouse_parses_leniently_stay_on_the_decoder(ch_db):
    """ClickHouse's JSON parser wraps 300 into a UInt8 (44) without an error: such tables must not take
    the fast path, or a value would be silently altered instead of dead-lettered."""
    from sparkapp.formats.chtypes import parse_type
    from sparkapp.formats.jsoneachrow import eligible, strict_in_clickhouse

    client, db = ch_db
    client.command("CREATE TABLE wrap (b UInt8) ENGINE = MergeTree ORDER BY tuple()")
    client.raw_insert(f"`{db}`.wrap", None, b'{"b": 300}\n', fmt="JSONEachRow")
    assert client.query("SELECT b FROM wrap").result_rows == [(44,)]  # what the fast path would have done
    for t, ok in [("UInt64", True), ("Nullable(Decimal(18, 4))", True), ("Array(LowCardinality(String))", True),
                  ("Map(String, Array(Int64))", True), ("DateTime64(3, 'UTC')", True), ("UInt8", False),
                  ("Nullable(Int32)", False), ("Array(UInt16)", False), ("DateTime", False), ("Date", False),
                  ("Float32", False), ("Map(String, UInt32)", False), ("JSON", False)]:
        assert strict_in_clickhouse(parse_type(t)) is ok, t
    client.command("CREATE TABLE narrow (id UInt32, _partition UInt16, _offset UInt64) ENGINE = MergeTree ORDER BY id")
    client.command("CREATE TABLE wide (id UInt64, _partition UInt16, _offset UInt64) ENGINE = MergeTree ORDER BY id")
    assert not eligible(load_schema(client, db, "narrow"))
    assert eligible(load_schema(client, db, "wide"))  # metadata columns are filled by chsink


def test_only_unrouted_json_sinks_on_strict_tables_take_the_fast_path(ch_db):
    from sparkapp.config import parse_config
    from sparkapp.delivery.runtime import Runtime

    client, db = ch_db
    window = "SETTINGS non_replicated_deduplication_window = 100"  # no offset columns: retries rely on it
    client.command(f"CREATE TABLE fast_ok (id UInt64, _offset UInt64) ENGINE = MergeTree ORDER BY id {window}")
    client.command(f"CREATE TABLE fast_no (id UInt32, _offset UInt64) ENGINE = MergeTree ORDER BY id {window}")
    store = StateStore(client, "state", Engine.KEEPER_MAP, keeper_path=f"/fast_{db}")

    def runtime(**extra):
        cfg = parse_config({"name": "fast", "kafka": {"bootstrapServers": "127.0.0.1:1", "topics": ["a", "b"]},
                            "clickhouse": {"endpoints": ["chdb:///unused"], "database": db,
                                           "tables": {"a": "fast_ok", "b": "fast_no"}, **extra.pop("ch", {})},
                            "checkpointLocation": "/tmp/unused", **extra}, "test")
        return Runtime(cfg, 1, client, store, None)

    assert runtime().fast_context("a") is not None
    assert runtime().fast_context("b") is None  # UInt32: ClickHouse would wrap out-of-range values
    assert runtime(format={"parser": "python"}).fast_context("a") is None
    assert runtime(ch={"tableField": "kind"}).fast_context("a") is None  # routed: one state row per table


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_window_loses_its_bad_lines_without_its_good_ones_being_copied(data):
    """`sift.without` leaves a window's kept lines where they are, in order: pieces of the window's own buffer, which
    the insert sends one after the other. Dropping more (lines ClickHouse refuses all the same) cuts the pieces
    again; records without a line are among the dropped."""
    import pyarrow as pa

    from sparkapp.delivery.sift import without

    n = data.draw(st.integers(1, 40))
    nulls = data.draw(st.sets(st.integers(0, n - 1)))
    texts = [None if i in nulls else f'{{"id":{i}}}\n' for i in range(n)]
    window = pa.array(["x\n", *texts], pa.string()).slice(1)  # a window is a slice of its partition's lines
    home = window.buffers()[2].address
    offsets = tuple(range(100, 100 + n))
    first = data.draw(st.permutations(sorted(nulls | data.draw(st.sets(st.integers(0, n - 1))))))
    offs, kept = without(offsets, window, first)
    left = [i for i in range(n) if i not in set(first)]
    second = data.draw(st.permutations(sorted(data.draw(st.sets(st.integers(0, len(left) - 1)))))) if left else []
    offs2, kept2 = without(offs, kept, second)
    left2 = [i for j, i in enumerate(left) if j not in set(second)]
    for o, ls, idx in ((offs, kept, left), (offs2, kept2, left2)):
        assert o == tuple(offsets[i] for i in idx)
        assert ls.to_pylist() == [texts[i] for i in idx]
        chunks = ls.chunks if isinstance(ls, pa.ChunkedArray) else [ls]
        assert {c.buffers()[2].address for c in chunks if len(c)} <= {home}, "the lines were copied"
