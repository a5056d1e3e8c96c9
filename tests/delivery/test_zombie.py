"""Stale writers that keep going while a newer one takes over, on one shared table (real chdb and ZooKeeper).

A writer can be paused anywhere: a GC pause, a partitioned executor, a Spark task whose retry already
ran. When it wakes up it finishes what it had in hand. Each test pauses a stale writer at one point in a
thread, lets a newer writer (a new epoch with other `blockOffsets` and batch bounds, or a retried task of
the same epoch) take over, resumes the stale one, and then checks every offset landed exactly once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from sparkapp.core.state_machine import Case, Phase
from sparkapp.delivery.context import WriterContext
from sparkapp.delivery.writer import write_lines, write_partition
from sparkapp.edges.insert import Inserter
from sparkapp.edges.store import FencedError, PartitionKey, StateStore
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from tests.delivery.test_lost_reply import OFFSETS, counts, records, setup
from tests.helpers import line_batch, msg

PK = PartitionKey("lost", "src", 0)


class Pause:
    """Parks a writer thread at one point until the test lets it go."""

    def __init__(self) -> None:
        self.reached, self.go = threading.Event(), threading.Event()

    def here(self) -> None:
        self.reached.set()
        assert self.go.wait(60), "the paused writer was never resumed"

    def wait_reached(self) -> None:
        assert self.reached.wait(60), "the writer never reached its pause point"


class PausedClient:
    """A client that parks the calling thread once, right before the first call `when` matches."""

    def __init__(self, client: Any, pause: Pause, when: Callable[[str, tuple[Any, ...]], bool]) -> None:
        self._client, self._pause, self._when, self._armed = client, pause, when, True

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*a: Any, **kw: Any) -> Any:
            if self._armed and self._when(name, a):
                self._armed = False
                self._pause.here()
            return attr(*a, **kw)
        return call


def ctx_for(client: Any, store: StateStore, schema: Any, epoch: int, block_offsets: int,
            fault: Callable[[str], None] | None = None) -> WriterContext:
    return WriterContext("lost", store, Inserter(client, schema, backoff_s=0.01),
                         make_decoder(DecoderSpec(Format.JSON), schema), epoch, block_offsets=block_offsets,
                         fault=fault or (lambda step: None))


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as e:  # the test inspects what the stale writer hit
            out["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def at_step(step: str, pause: Pause) -> Callable[[str], None]:
    seen = {"n": 0}

    def fault(s: str) -> None:
        if s == step and seen["n"] == 0:
            seen["n"] += 1
            pause.here()
    return fault


@pytest.mark.parametrize("path", ["decode", "lines"])
def test_a_stale_writer_paused_between_blocks_adds_nothing(ch_db, path):
    """The stale writer sent its first window of a BEFORE range and paused; a new epoch with another
    blockOffsets and a longer batch re-sends that range as recorded, then goes on; the stale writer wakes
    up, sends its remaining windows, and is fenced at AFTER. Its late windows are the new run's."""
    client, db = ch_db
    store, schema = setup(client, db, OFFSETS, 100)
    msgs = records(400)
    pause = Pause()
    stale = ctx_for(client, store, schema, store.acquire_epoch("lost"), 50, at_step("after_block", pause))
    send = (lambda c, m: write_partition(c, PK, m)) if path == "decode" else (
        lambda c, m: write_lines(c, PK, line_batch(m, schema.names)))
    t, out = in_thread(lambda: send(stale, msgs[:200]))
    pause.wait_reached()
    fresh = ctx_for(client, store, schema, store.acquire_epoch("lost"), 70)
    send(fresh, msgs)
    pause.go.set()
    t.join(60)
    assert isinstance(out.get("error"), FencedError)
    assert counts(client) == (400, 400)


def test_a_stale_writer_paused_between_its_fence_check_and_its_insert_adds_nothing(ch_db):
    """The fence check passed, then the writer stalled with the block in hand; the new run re-sent the range,
    committed it and moved on before the stale block reached ClickHouse."""
    client, db = ch_db
    store, schema = setup(client, db, OFFSETS, 100)
    msgs = records(300)
    pause = Pause()
    paused = PausedClient(client, pause, lambda name, a: name in ("insert", "raw_insert"))
    stale = WriterContext("lost", store, Inserter(paused, schema, backoff_s=0.01),
                          make_decoder(DecoderSpec(Format.JSON), schema), store.acquire_epoch("lost"), block_offsets=60)
    t, out = in_thread(lambda: write_lines(stale, PK, line_batch(msgs[:150], schema.names)))
    pause.wait_reached()
    fresh = ctx_for(client, store, schema, store.acquire_epoch("lost"), 80)
    write_partition(fresh, PK, msgs)
    pause.go.set()
    t.join(60)
    assert isinstance(out.get("error"), FencedError)
    assert counts(client) == (300, 300)


def test_a_stale_writer_that_starts_its_range_after_the_new_run_planned_cannot_split_it(ch_db):
    """The race inside the takeover: the new run read the partition's state and planned a range; then the
    stale writer (which had checked the sink epoch just before the takeover) recorded BEFORE over another
    range and sent a window of it. The new run must not overwrite that record with its own range: it
    re-plans, re-sends the stale range in the windows recorded, and only then its own."""
    client, db = ch_db
    store, schema = setup(client, db, OFFSETS, 100)
    msgs = records(300)
    in_begin, after_block = Pause(), Pause()
    # the stale writer stalls inside BEFORE: its sink-epoch check done, its state row not yet written
    paused = PausedClient(client, in_begin, lambda name, a: name == "insert" and "state" in str(a[0]))
    stale_store = StateStore(paused, "state", store.engine, keeper_path=store.keeper_path)
    stale = ctx_for(client, stale_store, schema, store.acquire_epoch("lost"), 50, at_step("after_block", after_block))
    t, out = in_thread(lambda: write_partition(stale, PK, msgs[:200]))
    in_begin.wait_reached()

    def let_the_stale_writer_in(step: str) -> None:
        if step == "before_begin" and not after_block.reached.is_set():
            in_begin.go.set()  # the stale BEFORE lands between the new run's read and its own BEFORE
            after_block.wait_reached()
    fresh = ctx_for(client, store, schema, store.acquire_epoch("lost"), 70, let_the_stale_writer_in)
    write_partition(fresh, PK, msgs)
    after_block.go.set()
    t.join(60)
    assert isinstance(out.get("error"), FencedError)
    assert counts(client) == (300, 300)


def test_a_retried_task_of_the_same_epoch_cannot_move_the_state_back(ch_db):
    """On executors a retried task and the first attempt (a zombie) share the run's epoch. The zombie planned
    from the old state and stalled; the retry delivered the batch and the next batch went on. The zombie's
    late BEFORE must not move the partition back to its range, or the next run (with another blockOffsets)
    would resume below what is delivered and insert it again under other tokens."""
    client, db = ch_db
    store, schema = setup(client, db, OFFSETS, 100)
    msgs = records(600)
    pause = Pause()
    epoch = store.acquire_epoch("lost")
    zombie = ctx_for(client, store, schema, epoch, 50, at_step("before_begin", pause))
    t, out = in_thread(lambda: write_partition(zombie, PK, msgs[:200]))
    pause.wait_reached()
    retry = ctx_for(client, store, schema, epoch, 50)
    write_partition(retry, PK, msgs[:200])
    write_partition(retry, PK, msgs[200:400])
    pause.go.set()
    t.join(60)
    assert "error" not in out and out["result"].case is Case.REPLAY  # it planned again, and found nothing to do
    row = store.get(PK)
    assert row is not None and row.state.phase is Phase.AFTER and row.state.range.max == 399
    redeployed = ctx_for(client, store, schema, store.acquire_epoch("lost"), 70)
    write_partition(redeployed, PK, msgs[row.state.resume_offset:])
    assert counts(client) == (600, 600)


@pytest.mark.parametrize("first", ["new_run", "stale"])
def test_a_stale_writer_paused_between_its_shared_read_and_its_before_adds_nothing(ch_db, first):
    """write_lines_many: the stale writer read its partitions' rows and the sink's epoch in one read, sifted,
    and stalled before its one BEFORE write, which compares each row with that read instead of reading again.
    A newer epoch with other blockOffsets and batch bounds takes over and plans. Either its BEFORE lands first
    (the stale write finds the rows moved: FencedError, nothing sent), or the stale one does (it delivers its
    batch as recorded; the new run's compare-and-set fails and it plans again from that record). Either way
    every offset lands once."""
    from sparkapp.delivery.writer import write_lines_many

    client, db = ch_db
    store, schema = setup(client, db, OFFSETS, 100)
    msgs = {p: [msg({"id": p * 10_000 + i, "pad": "x"}, offset=i, topic="src", partition=p) for i in range(400)]
            for p in (0, 1)}
    pks = [PartitionKey("lost", "src", p) for p in (0, 1)]

    def batch(ctx: WriterContext, lo: int, hi: int) -> list[Any]:
        return write_lines_many([(ctx, pk, line_batch(msgs[pk.partition][lo:hi], schema.names)) for pk in pks])

    epoch = store.acquire_epoch("lost")
    batch(ctx_for(client, store, schema, epoch, 50), 0, 100)  # the rows exist: the steady case
    pause = Pause()
    t, out = in_thread(lambda: batch(ctx_for(client, store, schema, epoch, 50, at_step("before_begin", pause)),
                                     100, 250))
    pause.wait_reached()

    def stale_first(step: str) -> None:
        if first == "stale" and step == "before_begin" and not pause.go.is_set():
            pause.go.set()  # the stale BEFORE lands between the new run's read and its own BEFORE
            t.join(60)
    fresh = ctx_for(client, store, schema, store.acquire_epoch("lost"), 70, stale_first)
    batch(fresh, 100, 400)
    pause.go.set()
    t.join(60)
    if first == "new_run":
        assert isinstance(out.get("error"), FencedError)
    assert counts(client) == (800, 800)
    assert {pk: (r.state.phase, r.state.range.max) for pk, r in store.get_many(pks).items()} == \
        {pk: (Phase.AFTER, 399) for pk in pks}


@pytest.mark.parametrize("newer", ["untouched", "moved"])
def test_a_stale_driver_planning_from_the_rows_it_read_back_adds_nothing_once_the_sink_is_taken_over(ch_db, newer):
    """The driver plans a batch from the rows its last BEFORE read back, with no read before its write
    (Waiting.rows). A newer run, with other blockOffsets and batch bounds, takes the sink over between two of its
    batches: before touching a row ("untouched"), or after delivering one partition's next stretch ("moved"). The
    stale batch's conditional write then lands on rows nobody moved, or finds one moved; either way its read back
    reads the sink's epoch and fences it before anything is sent. The newer run re-sends what the stale write
    recorded, as recorded, and every offset lands once."""
    from sparkapp.delivery.writer import Waiting, write_lines_many

    client, db = ch_db
    store, schema = setup(client, db, OFFSETS, 100)
    msgs = {p: [msg({"id": p * 10_000 + i, "pad": "x"}, offset=i, topic="src", partition=p) for i in range(400)]
            for p in (0, 1)}
    pks = [PartitionKey("lost", "src", p) for p in (0, 1)]

    def batch(ctx: WriterContext, waiting: Waiting, bounds: dict[int, tuple[int, int]]) -> list[Any]:
        return write_lines_many([(ctx, pk, line_batch(msgs[pk.partition][slice(*bounds[pk.partition])], schema.names))
                                 for pk in pks if pk.partition in bounds], waiting)

    epoch = store.acquire_epoch("lost")
    stale, held = ctx_for(client, store, schema, epoch, 50), Waiting(store, epoch)
    batch(stale, held, {0: (0, 100), 1: (0, 100)})
    batch(stale, held, {0: (100, 200), 1: (100, 200)})
    assert set(held.rows) == set(pks)  # the next batch reads nothing before its write
    newer_epoch = store.acquire_epoch("lost")
    fresh, fresh_held = ctx_for(client, store, schema, newer_epoch, 70), Waiting(store, newer_epoch)
    if newer == "moved":
        batch(fresh, fresh_held, {0: (100, 330)})  # from the stored BEFORE range, as a new run resumes
    landed = counts(client)
    with pytest.raises(FencedError):
        batch(stale, held, {0: (200, 300), 1: (200, 300)})
    assert counts(client) == landed  # nothing of the stale batch was sent
    batch(fresh, fresh_held, {0: (330 if newer == "moved" else 100, 400), 1: (100, 400)})
    fresh_held.flush()
    assert counts(client) == (800, 800)
    assert {pk: (r.state.phase, r.state.range.max) for pk, r in store.get_many(pks).items()} == \
        {pk: (Phase.AFTER, 399) for pk in pks}
