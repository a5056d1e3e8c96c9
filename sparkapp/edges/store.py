"""The per-partition state store in ClickHouse: KeeperMap (cluster-wide) or EmbeddedRocksDB (single node).

One table serves many sinks; keys are namespaced by sink id. Every writer run holds an epoch taken
from the sink's epoch row by compare-and-set. A transition is a conditional update
(`... WHERE key = K AND epoch <= E`, with keeper_map_strict_mode so Keeper checks node versions) and is
read back: a writer whose epoch was overtaken gets FencedError and stops. All fencing decisions are
made here (`_fence`), never by callers.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import Engine, SinkConfig
from ..core.state_machine import OffsetRange, Phase, StoredState

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

SCHEMA_VERSION = 3  # v3: block_offsets (the window size a range was cut with); v2: dlq phase + mark
_STRICT = {"keeper_map_strict_mode": 1}
# The same in the statement: clickhouse-connect's chdb backend applies a command's settings with a SET, a read of
# system.settings and a restore (three more queries, ~3 ms on each state write); a SETTINGS clause costs nothing.
_STRICT_CLAUSE = " SETTINGS keeper_map_strict_mode = 1"


class DlqPhase(enum.Enum):
    """Where a range's dead letters stand. SENDING records the DLQ's end positions before producing, so a
    retry can read back what already arrived instead of producing it twice (Kafka produce is not idempotent
    across producer sessions)."""

    NONE = "NONE"
    DONE = "DONE"
    SENDING = "SENDING"


class FencedError(RuntimeError):
    """This writer's epoch is stale: a newer writer run owns the sink or the partition."""


class StateConflict(FencedError):
    """The partition's state moved between this writer's read and its transition (a stale writer of an older
    or the same epoch got there first): nothing was written; plan again from the state as it is now."""


ANY: Any = object()  # `expected` for callers that set up state without planning from a read (tests, tools)


class StateStoreError(RuntimeError):
    """The state table cannot be used (wrong schema version, unreachable Keeper...)."""


def _fence(pk: PartitionKey | str, epoch: int, owner_epoch: int, owner: str = "partition owned") -> None:
    """The one fencing rule: a writer whose epoch is below the owner's is stale and must stop."""
    if owner_epoch > epoch:
        raise FencedError(f"{pk}: writer epoch {epoch} is stale; {owner} by epoch {owner_epoch}")


@dataclass(frozen=True, order=True)
class PartitionKey:
    """State is kept per sink, topic, partition and target table (multi-table topics)."""

    sink: str
    topic: str
    partition: int
    table: str = ""

    @property
    def key(self) -> str:
        return "/".join(_esc(p) for p in (self.sink, self.topic, str(self.partition), self.table))

    def __str__(self) -> str:
        return f"sink {self.sink} {self.topic}/{self.partition}" + (f" table {self.table}" if self.table else "")


def _esc(s: str) -> str:
    return s.replace("%", "%25").replace("/", "%2F")


@dataclass(frozen=True)
class StateRow:
    """A stored partition row, with the fencing and layout fields next to the state machine's view."""

    pk: PartitionKey
    state: StoredState
    owner: str
    shard: int
    dlq: DlqPhase
    dlq_mark: str
    updated_at: dt.datetime
    block_offsets: int = 0  # offsets per window the range was cut with: a retry cuts the same windows (0: unknown)


@dataclass(frozen=True)
class Begin:
    """One partition's BEFORE in `begin_many`: its range, how it is cut, and the state it was planned from."""

    pk: PartitionKey
    rng: OffsetRange
    expected: StoredState | None
    layout: int = 0
    shard: int = 0
    block_offsets: int = 0
    dlq_mark: str | None = None  # the range's dead letters are produced right after: SENDING from this mark


READ_THROUGH = "__read_through__"  # the target of a routed partition's read-through row (not a table)
START = "__start__"  # the target of the row where a sink chose to start a partition (not a table)


def table_resume(r: StateRow, read_through: Mapping[tuple[str, int], int]) -> int:
    """Where the row's table resumes. An AFTER row is lifted to its partition's read-through: every record
    below that was handed to its table's writer in offset order, so a table that took none of them since its
    range lost nothing there. A BEFORE row keeps its start: that range is re-read to be re-sent as recorded."""
    at = r.state.resume_offset
    if r.state.phase is Phase.AFTER:
        return max(at, read_through.get((r.pk.topic, r.pk.partition), at))
    return at


def resume_positions(rows: Iterable[StateRow],
                     read_through: Mapping[tuple[str, int], int] | None = None) -> dict[tuple[str, int], int]:
    """Per (topic, partition), the offset everything below which is delivered; the slowest table decides."""
    out: dict[tuple[str, int], int] = {}
    for r in rows:
        key, at = (r.pk.topic, r.pk.partition), table_resume(r, read_through or {})
        out[key] = min(at, out.get(key, at))
    return out


@dataclass(frozen=True)
class SinkState:
    """A sink's partition rows, one per (topic, partition, table), and each routed partition's read-through:
    the offset below which every record was handed to its table's writer (a table stays BEFORE where that
    failed). A partition's restart position needs both: a table that gets no records keeps its last range."""

    rows: list[StateRow]
    read_through: dict[tuple[str, int], int]
    # where the sink chose to start each partition (kafka.startingOffsets), recorded before its first batch
    starts: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """Nothing recorded: a new sink, or one re-created or reset."""
        return not (self.rows or self.read_through or self.starts)

    def resume(self) -> dict[tuple[str, int], int]:
        return resume_positions(self.rows, self.read_through)

    def table_resume(self, r: StateRow) -> int:
        return table_resume(r, self.read_through)


_COLUMNS = (
    "key String, kind Enum8('partition' = 1, 'epoch' = 2, 'schema' = 3), sink String, topic String, "
    "partition Int32, target String, phase Enum8('NONE' = 0, 'BEFORE' = 1, 'AFTER' = 2), "
    "min_offset Int64, max_offset Int64, epoch UInt64, owner String, layout UInt32, shard UInt32, "
    "dlq Enum8('NONE' = 0, 'DONE' = 1, 'SENDING' = 2), dlq_mark String, updated_at DateTime64(3, 'UTC'), "
    "block_offsets UInt32"
)
_NAMES = (
    "key", "kind", "sink", "topic", "partition", "target", "phase", "min_offset", "max_offset",
    "epoch", "owner", "layout", "shard", "dlq", "dlq_mark", "updated_at", "block_offsets",
)
_SELECT = ", ".join(n for n in _NAMES if n != "kind")


def _is_node_exists(e: Exception) -> bool:
    text = str(e)
    return "Node exists" in text or ("KEEPER_EXCEPTION" in text and "exists" in text.lower())


class StateStore:
    """State rows over ClickHouse SQL. All methods are IO; the state machine stays pure."""

    def __init__(self, client: Client, table: str, engine: Engine = Engine.KEEPER_MAP,
                 keeper_path: str | None = None, database: str | None = None) -> None:
        self.client = client
        self.engine = engine
        self.database = database or client.database or "default"
        self.table = table
        self.keeper_path = keeper_path or f"/chsink/{self.database}/{table}"
        self.fqn = f"`{self.database}`.`{table}`"

    # ---- schema -----------------------------------------------------------------------------

    def ensure_schema(self) -> None:
        """Creates the table if missing and checks its schema version; idempotent."""
        engine = f"KeeperMap('{self.keeper_path}')" if self.engine is Engine.KEEPER_MAP else "EmbeddedRocksDB"
        self.client.command(f"CREATE TABLE IF NOT EXISTS {self.fqn} ({_COLUMNS}) ENGINE = {engine} PRIMARY KEY key")
        rows = self._select("key = '__schema__'")
        if not rows:
            try:
                self._insert([self._row("__schema__", "schema", epoch=SCHEMA_VERSION)], strict=True)
            except Exception as e:
                if not _is_node_exists(e):
                    raise
            rows = self._select("key = '__schema__'")
        version = int(rows[0][8])
        if version > SCHEMA_VERSION:
            raise StateStoreError(
                f"state table {self.fqn} has schema v{version}, newer than this chsink "
                f"(v{SCHEMA_VERSION}); upgrade chsink"
            )
        if version < SCHEMA_VERSION:
            raise StateStoreError(
                f"state table {self.fqn} has schema v{version}, older than this chsink (v{SCHEMA_VERSION}); "
                "drain the sink with the old version, then drop the table (state.table) and restart"
            )

    # ---- epochs -----------------------------------------------------------------------------

    def acquire_epoch(self, sink: str, owner: str | None = None, attempts: int = 20) -> int:
        """Takes the next epoch of the sink by compare-and-set; older writer runs are fenced from then on."""
        owner = owner or uuid.uuid4().hex
        key = self._epoch_key(sink)
        for _ in range(attempts):
            rows = self._select(f"key = {quote(key)}")
            if not rows:
                try:
                    self._insert([self._row(key, "epoch", sink=sink, epoch=1, owner=owner)], strict=True)
                except Exception as e:
                    if not _is_node_exists(e):
                        raise
                    continue
            else:
                current = int(rows[0][8])
                self._update(f"epoch = {current + 1}, owner = {quote(owner)}, updated_at = now64(3)",
                             f"key = {quote(key)} AND epoch = {current}")
            rows = self._select(f"key = {quote(key)}")
            if rows and rows[0][9] == owner:
                return int(rows[0][8])
            time.sleep(0.05)
        raise StateStoreError(f"could not acquire an epoch for sink {sink} after {attempts} attempts (contention)")

    def current_epoch(self, sink: str) -> int:
        rows = self._select(f"key = {quote(self._epoch_key(sink))}")
        return int(rows[0][8]) if rows else 0

    # ---- partition state ----------------------------------------------------------------------

    def get(self, pk: PartitionKey) -> StateRow | None:
        rows = self._select(f"key = {quote(pk.key)}")
        return self._state_row(rows[0]) if rows else None

    def get_many(self, pks: Iterable[PartitionKey]) -> dict[PartitionKey, StateRow]:
        keys = {pk.key: pk for pk in pks}
        if not keys:
            return {}
        rows = self._select(f"key IN ({', '.join(map(quote, keys))})")
        return {keys[r[0]]: self._state_row(r) for r in rows}

    def sink_state(self, sink: str) -> SinkState:
        """The sink's table rows and read-through positions, in one read."""
        rows = sorted((self._state_row(r) for r in self._select(f"kind = 'partition' AND sink = {quote(sink)}")),
                      key=lambda s: s.pk)
        def at(target: str) -> dict[tuple[str, int], int]:
            return {(r.pk.topic, r.pk.partition): r.state.resume_offset for r in rows if r.pk.table == target}

        return SinkState([r for r in rows if r.pk.table not in (READ_THROUGH, START)], at(READ_THROUGH), at(START))

    def list_sink(self, sink: str) -> list[StateRow]:
        """The sink's table rows."""
        return self.sink_state(sink).rows

    def record_read_through(self, sink: str, positions: Mapping[tuple[str, int], int], epoch: int) -> None:
        """Raises each partition's read-through to the given offset, never lowers it, in one conditional write
        (and one read first, which fences a writer whose sink was taken over). Only the writer that handed the
        records over in order, and saw each table's writer return, may claim a position."""
        self._raise_positions(sink, positions, epoch, READ_THROUGH, least=1)

    def record_start(self, sink: str, positions: Mapping[tuple[str, int], int], epoch: int) -> None:
        """Records where the sink starts each partition, before its first batch: a restart before any is
        delivered resumes there rather than resolving `latest` again, and the verifier counts from there."""
        self._raise_positions(sink, positions, epoch, START, least=0)  # a start at 0 too: it is a choice

    def _raise_positions(self, sink: str, positions: Mapping[tuple[str, int], int], epoch: int, target: str,
                         least: int) -> None:
        if not positions:
            return
        keys = {PartitionKey(sink, t, p, target).key: (t, p, at) for (t, p), at in positions.items() if at >= least}
        epoch_key = self._epoch_key(sink)
        rows = {r[0]: r for r in self._select(f"key IN ({', '.join(map(quote, [*keys, epoch_key]))})")}
        _fence(sink, epoch, int(rows[epoch_key][8]) if epoch_key in rows else 0, "sink taken over")
        created = [self._row(k, "partition", sink=sink, topic=t, partition=p, target=target,
                             phase=Phase.AFTER.value, max_offset=at - 1, epoch=epoch)
                   for k, (t, p, at) in keys.items() if k not in rows]
        if created:
            try:
                self._insert(created, strict=True)
            except Exception as e:
                if not _is_node_exists(e):
                    raise  # another writer created one first: the next batch raises it
        old = [k for k in keys if k in rows]
        if old:
            last = ", ".join(f"toInt64({keys[k][2] - 1})" for k in old)
            values = f"transform(key, [{', '.join(map(quote, old))}], [{last}], max_offset)"
            self._update(f"max_offset = greatest(max_offset, {values}), epoch = {epoch}, updated_at = now64(3)",
                         f"key IN ({', '.join(map(quote, old))}) AND epoch <= {epoch}")

    def begin(self, pk: PartitionKey, rng: OffsetRange, epoch: int, layout: int = 0, shard: int = 0,
              block_offsets: int = 0, expected: StoredState | None = ANY) -> None:
        """Records BEFORE over the range, and how it is cut (layout, shard, window size): from here on, a crash
        leads to an identical retry.

        `expected` is the state the writer planned from (None: no row). The write is a compare-and-set on it,
        not only on the epoch: a stale writer that slipped its own BEFORE in after this writer's read, or a
        zombie task of the same epoch that planned from an older state, makes this StateConflict instead of
        being overwritten (its range could then never be re-sent in the windows it was cut in) or moving the
        partition back."""
        epoch_key = self._epoch_key(pk.sink)
        rows = {r[0]: r for r in self._select(f"key IN ({quote(pk.key)}, {quote(epoch_key)})")}  # one round trip
        _fence(pk, epoch, int(rows[epoch_key][8]) if epoch_key in rows else 0, "sink taken over")
        existing = self._state_row(rows[pk.key]) if pk.key in rows else None
        if expected is not ANY and (existing.state if existing else None) != expected:
            if existing is not None:
                _fence(pk, epoch, existing.state.epoch)
            raise StateConflict(f"{pk}: state is {existing.state if existing else 'absent'}, planned from {expected}")
        self._transition(pk, rng, Phase.BEFORE, epoch, layout, shard, existing, block_offsets,
                         cas=expected is not ANY)

    def load_many(self, pks: Sequence[PartitionKey], epoch: int) -> dict[PartitionKey, StateRow]:
        """`load` of many partitions of one sink in one round trip, which also reads the sink's epoch: FencedError
        when a newer epoch owns any of them or the sink (what `begin_many` checks with `loaded`)."""
        if not pks:
            return {}
        rows = self._fenced_read(pks, epoch)
        for pk, row in rows.items():
            _fence(pk, epoch, row.state.epoch)
        return rows

    def _fenced_read(self, pks: Sequence[PartitionKey], epoch: int) -> dict[PartitionKey, StateRow]:
        """The partitions' rows (one sink's) and the sink's epoch in one read; FencedError when a newer epoch
        took the sink over."""
        sinks = {pk.sink for pk in pks}
        assert len(sinks) == 1, f"one sink's partitions, got {sorted(sinks)}"
        epoch_key = self._epoch_key(next(iter(sinks)))
        keys = {pk.key: pk for pk in pks}
        rows = {r[0]: r for r in self._select(f"key IN ({', '.join(map(quote, [*keys, epoch_key]))})")}
        _fence(pks[0], epoch, int(rows[epoch_key][8]) if epoch_key in rows else 0, "sink taken over")
        return {keys[k]: self._state_row(r) for k, r in rows.items() if k in keys}

    def begin_many(self, items: Sequence[Begin], epoch: int, loaded: Mapping[PartitionKey, StateRow] | None = None,
                   seen: dict[PartitionKey, StateRow] | None = None) -> dict[PartitionKey, StateConflict]:
        """`begin` of many partitions of one sink, in three round trips whatever their number (two with
        `loaded`): one read (the rows and the sink's epoch), one conditional write of them all, one read back
        (the rows and the sink's epoch again). Each item is fenced and compared with the state it was planned
        from exactly as `begin` does; an item whose state moved is returned as a StateConflict (nothing of it was
        written: plan it again), the others are BEFORE, and `seen` gets the rows they were read back as.

        `loaded` holds the rows these partitions were planned from: what `load_many` read, or what the last
        begin_many of their only writer read back (`seen`). When every item updates a row it holds (the steady
        case), no read is needed before the write: the conditional write compares each row with the state it was
        planned from, and its read back tells a row that moved since (StateConflict) from one a newer epoch took
        (FencedError), and reads the sink's epoch, before anything of the ranges is sent. A row to create is read
        again right before: creating one does not compare."""
        if not items:
            return {}
        pks = [it.pk for it in items]
        if loaded is not None and all(it.pk in loaded and loaded[it.pk].state == it.expected for it in items):
            rows = dict(loaded)
        else:
            rows = self._fenced_read(pks, epoch)
        conflicts: dict[PartitionKey, StateConflict] = {}
        created: list[Begin] = []
        updated: list[tuple[Begin, StateRow]] = []
        for it in items:
            existing = rows.get(it.pk)
            if existing is not None:
                _fence(it.pk, epoch, existing.state.epoch)
            if (existing.state if existing else None) != it.expected:
                conflicts[it.pk] = StateConflict(f"{it.pk}: state is {existing.state if existing else 'absent'}, "
                                                 f"planned from {it.expected}")
            elif existing is None:
                created.append(it)
            else:
                updated.append((it, existing))
        if created:
            try:
                self._insert([self._row(it.pk.key, "partition", sink=it.pk.sink, topic=it.pk.topic,
                                        partition=it.pk.partition, target=it.pk.table, phase=Phase.BEFORE.value,
                                        min_offset=it.rng.min, max_offset=it.rng.max, epoch=epoch,
                                        layout=it.layout, shard=it.shard, block_offsets=it.block_offsets,
                                        **({} if it.dlq_mark is None else {"dlq": DlqPhase.SENDING.value,
                                                                           "dlq_mark": it.dlq_mark}))
                              for it in created], strict=True)
            except Exception as e:
                if not _is_node_exists(e):
                    raise
                for it in created:  # another writer created one of them first; which one, the read back tells
                    conflicts.setdefault(it.pk, StateConflict(f"{it.pk}: another writer created a state row first"))
        if updated:
            self._update_many(updated, epoch)
        got = self._read_back_many([(it.pk, it.rng, Phase.BEFORE, it.layout) for it in items
                                    if it.pk not in conflicts], epoch, conflicts)
        if seen is not None:
            seen.update((pk, r) for pk, r in got.items() if pk not in conflicts)
        return conflicts

    def commit_many(self, items: Sequence[Begin], epoch: int,
                    moved: dict[PartitionKey, StateConflict] | None = None) -> None:
        """`commit` of many partitions (the ranges `begin_many` recorded, as the same items) in two round trips:
        one conditional write, one read back; FencedError when any of them was taken over meanwhile. With
        `moved`, a row this epoch (or an older one) moved past its range is reported there instead. Dead
        letters still SENDING are DONE: every send of a range is flushed before its AFTER.

        The write assigns only what changes (see `_update_many`): the rows hold this epoch since their BEFORE,
        which no older epoch's write can match, so the condition pins it instead of assigning it; and only a
        range begun with a dead-letter mark is SENDING, so `dlq` is assigned only when one is (the read back
        checks that none is left SENDING)."""
        if not items:
            return
        ranges = ", ".join(f"({quote(it.pk.key)}, {it.rng.min}, {it.rng.max})" for it in items)
        done = " dlq = if(dlq = 'SENDING', 'DONE', dlq)," if any(it.dlq_mark is not None for it in items) else ""
        self._update(f"phase = 'AFTER',{done} updated_at = now64(3)",
                     f"key IN ({', '.join(quote(it.pk.key) for it in items)}) AND epoch = {epoch} AND "
                     f"(key, min_offset, max_offset) IN ({ranges})")
        got = self._read_back_many([(it.pk, it.rng, Phase.AFTER, it.layout) for it in items], epoch, moved)
        if sending := sorted(str(pk) for pk, r in got.items() if r.dlq is DlqPhase.SENDING and pk not in (moved or {})):
            raise StateStoreError(f"AFTER left dead letters SENDING on {', '.join(sending)}: commit_many takes "
                                  "the items begin_many recorded, whose marks tell which ranges have dead letters")

    def commit(self, pk: PartitionKey, rng: OffsetRange, epoch: int, layout: int = 0, shard: int = 0) -> None:
        """Records AFTER over the range `begin` recorded (dead-letter fields kept): update, then read back. Only a
        range this epoch recorded is confirmed (as `commit_many`)."""
        self._update("phase = 'AFTER', updated_at = now64(3)",
                     f"key = {quote(pk.key)} AND epoch = {epoch} AND min_offset = {rng.min} AND max_offset = {rng.max}")
        self._read_back(pk, rng, Phase.AFTER, epoch, layout)

    def load(self, pk: PartitionKey, epoch: int) -> StateRow | None:
        """The partition's row, for planning; FencedError when a newer epoch owns it (a stale run must not act)."""
        row = self.get(pk)
        if row is not None:
            _fence(pk, epoch, row.state.epoch)
        return row

    def check_fence(self, pk: PartitionKey, epoch: int) -> StateRow | None:
        """Raises FencedError when a newer epoch owns the partition; called right before inserting."""
        row = self.load(pk, epoch)
        if row is None:  # deleted (e.g. its topic was removed): only the sink's epoch can tell
            _fence(pk, epoch, self.current_epoch(pk.sink), "sink taken over")
        return row

    def mark_dlq_sending(self, pk: PartitionKey, epoch: int, mark: str | None) -> StateRow:
        """Records the DLQ's end positions before the range's first send (NONE -> SENDING); a later send
        of the same range (mark None: DONE -> SENDING) keeps the first mark, so a read-back sees all."""
        if mark is None:
            self._update("dlq = 'SENDING', updated_at = now64(3)",
                         f"key = {quote(pk.key)} AND epoch <= {epoch} AND dlq = 'DONE'")
        else:
            self._update(f"dlq = 'SENDING', dlq_mark = {quote(mark)}, updated_at = now64(3)",
                         f"key = {quote(pk.key)} AND epoch <= {epoch} AND dlq = 'NONE'")
        row = self.check_fence(pk, epoch)
        if row is None or row.dlq is not DlqPhase.SENDING:
            raise FencedError(f"{pk}: could not record the dead-letter mark (row gone or taken over)")
        return row

    def mark_dlq_done(self, pk: PartitionKey, epoch: int) -> None:
        self._update("dlq = 'DONE', updated_at = now64(3)", f"key = {quote(pk.key)} AND epoch <= {epoch}")

    def delete_topics(self, sink: str, topics: Iterable[str]) -> int:
        """Deletes the partition rows of whole topics (removed from the sink)."""
        gone = set(topics)
        return self.delete(sink, [(r.pk.topic, r.pk.partition) for r in self.list_sink(sink) if r.pk.topic in gone])

    def delete(self, sink: str, partitions: Iterable[tuple[str, int]] | None = None) -> int:
        """Deletes a sink's partition rows (all, or the given (topic, partition) pairs); returns how many."""
        cond = f"kind = 'partition' AND sink = {quote(sink)}"
        if partitions is not None:
            pairs = [f"({quote(t)}, {int(p)})" for t, p in partitions]
            if not pairs:
                return 0
            cond += f" AND (topic, partition) IN ({', '.join(pairs)})"
        n = len(self._select(cond))
        if n:
            self.client.command(f"ALTER TABLE {self.fqn} DELETE WHERE {cond}{_STRICT_CLAUSE}")
        if partitions is None:
            self.client.command(f"ALTER TABLE {self.fqn} DELETE WHERE key = {quote(self._epoch_key(sink))} OR "
                                f"startsWith(key, {quote(self._routing_key(sink, ''))}){_STRICT_CLAUSE}")
        return n

    # ---- routing ------------------------------------------------------------------------------

    def routing(self, sink: str, topic: str) -> str | None:
        """How the sink last sent the topic's records to tables (what record_routing stored); None before."""
        history = self.routings(sink).get(topic, [])
        return history[-1] if history else None

    def routings(self, sink: str) -> dict[str, list[str]]:
        """Per topic, every routing the sink has sent its records by, oldest first: records delivered before a
        change stay in the tables the older ones named."""
        rows = self._select(f"kind = 'schema' AND startsWith(key, {quote(self._routing_key(sink, ''))})")
        return {str(r[2]): [str(x) for x in json.loads(r[4])] for r in rows}

    def record_routing(self, sink: str, topic: str, spec: str) -> None:
        """Adds how the sink now sends the topic's records to tables (a row of kind schema: it says how the
        partition rows are to be read, as the store's version does)."""
        key = self._routing_key(sink, topic)
        history = self.routings(sink).get(topic)
        text = json.dumps([*(history or []), spec])
        if history is None:
            self._insert([self._row(key, "schema", sink=sink, topic=topic, target=text)])
        else:
            self._update(f"target = {quote(text)}, updated_at = now64(3)", f"key = {quote(key)}")

    # ---- internals ----------------------------------------------------------------------------

    def _transition(
        self, pk: PartitionKey, rng: OffsetRange, phase: Phase, epoch: int, layout: int, shard: int,
        existing: StateRow | None, block_offsets: int = 0, cas: bool = False,
    ) -> None:
        """Writes the transition conditionally (on the epoch; with `cas`, on the whole state `existing` holds)
        and reads it back."""
        if existing is not None:
            _fence(pk, epoch, existing.state.epoch)
        same = existing is not None and existing.state.range == rng
        dlq, mark = (existing.dlq, existing.dlq_mark) if existing is not None and same else (DlqPhase.NONE, "")
        if existing is None:  # begin() has just checked the sink epoch: a stale writer cannot re-create it
            row = self._row(pk.key, "partition", sink=pk.sink, topic=pk.topic, partition=pk.partition,
                            target=pk.table, phase=phase.value, min_offset=rng.min, max_offset=rng.max,
                            epoch=epoch, layout=layout, shard=shard, block_offsets=block_offsets)
            try:
                self._insert([row], strict=True)
            except Exception as e:
                if not _is_node_exists(e):
                    raise
                if cas:
                    raise StateConflict(f"{pk}: another writer created the state row first") from e
                return self._transition(pk, rng, phase, epoch, layout, shard, self.get(pk),  # raced: re-check
                                        block_offsets)
        else:
            was = existing.state
            cond = (f" AND epoch = {was.epoch} AND phase = '{was.phase.value}' AND min_offset = {was.range.min}"
                    f" AND max_offset = {was.range.max} AND layout = {was.layout}") if cas else ""
            self._update(
                f"phase = '{phase.value}', min_offset = {rng.min}, max_offset = {rng.max}, epoch = {epoch}, "
                f"layout = {layout}, shard = {shard}, dlq = '{dlq.value}', dlq_mark = {quote(mark)}, "
                f"block_offsets = {block_offsets}, updated_at = now64(3)",
                f"key = {quote(pk.key)} AND epoch <= {epoch}{cond}",
            )
        return self._read_back(pk, rng, phase, epoch, layout, conflict=cas)

    def _update_many(self, items: Sequence[tuple[Begin, StateRow]], epoch: int) -> None:
        """BEFORE over each item's range in one conditional write, each row on the exact state it was planned
        from (as `_transition` with `cas`); dead-letter fields kept only where the range stays the same.

        ClickHouse evaluates the condition once per column it assigns, so the write assigns only what changes:
        not the epoch and layout where the condition already holds them at their new values, nor a shard and window
        size that stay, and a range that follows the row's own is `max_offset + 1` rather than a value per key. The
        read back checks the result."""
        def per_key(value: Callable[[Begin, StateRow], str | None], column: str, default: str | None = None) -> str:
            """The column's new value by key: `value` gives a key's constant, None for `default` (an expression
            of the row; the column itself, kept, unless given). transform over constant arrays: ClickHouse
            analyses it in a fraction of a multiIf's time."""
            otherwise = default or column
            pairs = [(quote(it.pk.key), v) for it, ex in items if (v := value(it, ex)) is not None]
            if not pairs:
                return otherwise
            if len(pairs) == len(items) and len({v for _, v in pairs}) == 1:
                return pairs[0][1]  # the same for every key the WHERE matches: a constant costs no analysis
            keys, values = ", ".join(k for k, _ in pairs), ", ".join(v for _, v in pairs)
            return f"transform(key, [{keys}], [{values}], {otherwise})"

        def dlq(it: Begin, ex: StateRow) -> str | None:
            if it.dlq_mark is not None:
                return f"'{DlqPhase.SENDING.value}'"
            return None if ex.state.range == it.rng else "'NONE'"

        def mark(it: Begin, ex: StateRow) -> str | None:
            if it.dlq_mark is not None:
                return quote(it.dlq_mark)
            return None if ex.state.range == it.rng else "''"

        sets = {  # the condition below holds epoch, layout and max_offset at the planned state's values
            "epoch": "epoch" if all(ex.state.epoch == epoch for _, ex in items) else str(epoch),
            "min_offset": per_key(lambda it, ex: None if it.rng.min == ex.state.range.max + 1 else
                                  f"toInt64({it.rng.min})", "min_offset", "max_offset + 1"),
            "max_offset": per_key(lambda it, ex: f"toInt64({it.rng.max})", "max_offset"),
            "layout": per_key(lambda it, ex: None if it.layout == ex.state.layout else f"toUInt32({it.layout})",
                              "layout"),
            # the condition pins the state, and only a transition away from it moves these: as read, so kept
            "shard": per_key(lambda it, ex: None if it.shard == ex.shard else f"toUInt32({it.shard})", "shard"),
            "block_offsets": per_key(lambda it, ex: None if it.block_offsets == ex.block_offsets else
                                     f"toUInt32({it.block_offsets})", "block_offsets"),
            "dlq": per_key(dlq, "dlq"),
            "dlq_mark": per_key(mark, "dlq_mark"),
        }
        was = ", ".join(f"({quote(it.pk.key)}, {ex.state.epoch}, '{ex.state.phase.value}', {ex.state.range.min}, "
                        f"{ex.state.range.max}, {ex.state.layout})" for it, ex in items)
        self._update(", ".join(["phase = 'BEFORE'", *(f"{c} = {v}" for c, v in sets.items() if v != c),
                                "updated_at = now64(3)"]),
                     f"key IN ({', '.join(quote(it.pk.key) for it, _ in items)}) AND epoch <= {epoch} AND "
                     f"(key, epoch, phase, min_offset, max_offset, layout) IN ({was})")

    def _read_back_many(self, items: Sequence[tuple[PartitionKey, OffsetRange, Phase, int]], epoch: int,
                        conflicts: dict[PartitionKey, StateConflict] | None) -> dict[PartitionKey, StateRow]:
        """`_read_back` of many rows in one read (the rows it read), which reads the sink's epoch too: FencedError
        when a newer epoch took the sink over or owns a row. With `conflicts`, a row another writer of this or an
        older epoch moved is added there (compare-and-set lost)."""
        if not items:
            return {}
        got = self._fenced_read([pk for pk, *_ in items], epoch)
        for pk, rng, phase, layout in items:
            after = got.get(pk)
            if after is not None and after.state == StoredState(rng, phase, epoch, layout):
                continue
            owner = after.state.epoch if after else "nobody (row deleted)"
            lost = f"{pk}: transition to {phase.value} {rng} by epoch {epoch} lost to epoch {owner}"
            if conflicts is not None and after is not None and after.state.epoch <= epoch:
                conflicts[pk] = StateConflict(lost)
            else:
                raise FencedError(lost)
        return got

    def _read_back(self, pk: PartitionKey, rng: OffsetRange, phase: Phase, epoch: int, layout: int,
                   conflict: bool = False) -> None:
        after = self.get(pk)
        if after is None or after.state != StoredState(rng, phase, epoch, layout):
            owner = after.state.epoch if after else "nobody (row deleted)"
            lost = f"{pk}: transition to {phase.value} {rng} by epoch {epoch} lost to epoch {owner}"
            if conflict and after is not None and after.state.epoch <= epoch:
                raise StateConflict(lost)
            raise FencedError(lost)

    def _epoch_key(self, sink: str) -> str:
        return f"{_esc(sink)}/__epoch__"

    def _routing_key(self, sink: str, topic: str) -> str:
        return f"{_esc(sink)}/__routing__/{_esc(topic)}"

    def _row(self, key: str, kind: str, **kw: Any) -> list[Any]:
        return [key, kind, kw.get("sink", ""), kw.get("topic", ""), kw.get("partition", 0), kw.get("target", ""),
                kw.get("phase", "NONE"), kw.get("min_offset", 0), kw.get("max_offset", 0), kw.get("epoch", 0),
                kw.get("owner", ""), kw.get("layout", 0), kw.get("shard", 0), kw.get("dlq", "NONE"),
                kw.get("dlq_mark", ""),
                dt.datetime.now(dt.UTC), kw.get("block_offsets", 0)]

    def _insert(self, rows: list[list[Any]], strict: bool = False) -> None:
        self.client.insert(self.fqn, rows, column_names=list(_NAMES), settings=_STRICT if strict else None)

    def _update(self, assignments: str, where: str) -> None:
        self.client.command(f"ALTER TABLE {self.fqn} UPDATE {assignments} WHERE {where}{_STRICT_CLAUSE}")

    def _select(self, where: str) -> Sequence[Sequence[Any]]:
        return self.client.query(f"SELECT {_SELECT} FROM {self.fqn} WHERE {where}").result_rows

    def _state_row(self, r: Sequence[Any]) -> StateRow:
        pk = PartitionKey(r[1], r[2], int(r[3]), r[4])
        state = StoredState(OffsetRange(int(r[6]), int(r[7])), Phase(r[5]), int(r[8]), int(r[10]))
        return StateRow(pk, state, r[9], int(r[11]), DlqPhase(r[12]), r[13], r[14], int(r[15]))


def quote(s: str) -> str:
    """Quotes a string literal for ClickHouse SQL."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def state_store(cfg: SinkConfig, client: Client) -> StateStore:
    """The sink's state store on an open ClickHouse client."""
    return StateStore(client, cfg.state.table, cfg.state.engine, cfg.state.keeper_path,
                      cfg.state.database or cfg.clickhouse.database)
