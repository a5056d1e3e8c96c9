"""Everything one process needs to deliver partitions: clients, state store, routing, writer contexts.

Built once per process and epoch: on the driver for chdb DSNs (one engine per process), on each
executor for HTTP DSNs. The code that runs is the same in both places.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import ClickHouseConfig, ConfigError, SinkConfig
from ..core.records import Message
from ..core.routing import key_type_ok, record_table
from ..core.state_machine import IrrecoverableStateError, OffsetRange, Phase
from ..edges.clickhouse import clickhouse_client, load_schema, redact_dsn, unsafe_target
from ..edges.dlq import KafkaDeadLetterSink
from ..edges.insert import Inserter
from ..edges.kafka import read_range
from ..edges.shards import Health, ShardSet, ShardUnavailableError
from ..edges.store import READ_THROUGH, PartitionKey, SinkState, StateRow, StateStore, state_store
from ..formats.debezium import CHANGE_COLUMNS
from ..formats.jsoneachrow import LineBatch, eligible
from ..formats.registry import Reader, make_decoder, record_reader
from ..formats.rows import DecodeError, Decoder
from ..formats.schema import METADATA_COLUMNS, AtInsert, SchemaError, TableSchema
from ..formats.schema_registry import RegistryUnavailableError
from .context import DataLossError, PartitionResult, Refetch, WriterContext
from .evolve import add_columns
from .writer import Waiting, write_lines, write_lines_many, write_partition

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

log = logging.getLogger(__name__)
UNROUTABLE = "__unroutable__"


def routing_spec(ch: ClickHouseConfig, topic: str) -> str:
    """What decides the table of a topic's record, as text: the table a re-read record goes to depends on it."""
    return json.dumps({"table": ch.table_for(topic), "tableField": ch.table_field, "tableHeader": ch.table_header},
                      sort_keys=True)


def spec_table(spec: str) -> str | None:
    """The table a recorded routing_spec sends the topic's records to (those naming none, when routed)."""
    table = json.loads(spec).get("table")
    return str(table) if table else None


def check_routing(store: StateStore, sink: str, ch: ClickHouseConfig, topics: Iterable[str]) -> None:
    """Records how each topic's records go to tables, and refuses a change while a partition of the topic has
    records to read again. Run once the run holds its epoch, so no older writer moves the state meanwhile.

    A record read again (a BEFORE range re-sent, a table behind the others of its partition) must reach the
    table its first attempt reached: the retry counts what landed in that table, under the recorded token, and
    the tables ahead skip it as delivered. Routed otherwise it would be stored twice, or skipped as delivered
    and lost. In a drained sink every table of a partition resumes at one offset and nothing is read again, so
    the new routing applies from there."""
    state, routings = store.sink_state(sink), store.routings(sink)  # one read each, whatever the number of topics
    for topic in topics:
        history = routings.get(topic, [])
        spec, before = routing_spec(ch, topic), history[-1] if history else None
        if before == spec:
            continue
        if before is not None:
            again = _read_again(state, topic)
            if again:
                raise ConfigError(
                    f"clickhouse.tables/tableField/tableHeader: the routing of topic {topic!r} changed from {before} "
                    f"to {spec}, but {again}: re-read under the new routing, those records could reach other "
                    "tables than before (stored twice, or lost). Run the sink with its old routing until it has "
                    "delivered what it read (a graceful stop drains it), then change the routing; or route the "
                    "topic in a new sink")
            log.warning("the routing of topic %s changed from %s to %s; every partition had delivered what it "
                        "read, so the new routing applies from where each resumes", topic, before, spec)
        store.record_routing(sink, topic, spec)


def _read_again(state: SinkState, topic: str) -> str:
    """Why some of the topic's records would be read again on resuming (empty: none would)."""
    tables: dict[int, list[StateRow]] = {}
    for r in state.rows:
        if r.pk.topic == topic:
            tables.setdefault(r.pk.partition, []).append(r)
    for partition, rows in sorted(tables.items()):
        pending = next((r for r in rows if r.state.phase is Phase.BEFORE), None)
        if pending is not None:
            return f"{pending.pk} has range {pending.state.range} sent but not confirmed"
        resumes = sorted({state.table_resume(r) for r in rows})
        if len(resumes) > 1:
            return (f"the tables of partition {topic}/{partition} resume at offsets {resumes}, so the records from "
                    f"{resumes[0]} on are read again")
    return ""


def starting_offsets(store: StateStore, sink: str, partitions: dict[str, int],
                     marks: dict[tuple[str, int], tuple[int, int]] | None = None,
                     fail_on_data_loss: bool = True) -> dict[str, dict[str, int]]:
    """Where each partition resumes when there is no checkpoint: AFTER -> max+1, BEFORE -> min.

    With several tables per partition the slowest table decides; the others skip what they have. A table's
    AFTER row counts from the partition's read-through when that is higher (SinkState): a table that gets no
    records must not hold its partition back at its last range.
    Partitions without state start where the sink chose to (first_start.py), else at the earliest offset (-2).
    A position below the partition's log start
    (`log_starts`: retention deleted records) starts at the log start instead, or Spark's source would refuse
    to start: a BEFORE range there is re-read from what Kafka still holds (the writer tells whether the rest
    had landed); an AFTER row below it means records were deleted before delivery: DataLossError, unless
    failOnDataLoss is off. A row past the partition's end (`marks` gives each partition's (start, end)) means
    the topic was recreated: refused, since its new records would be taken for ones delivered already.
    """
    state = store.sink_state(sink)
    rows = state.rows
    marks = marks or {}
    for pk, last in [*((r.pk, r.state.range.max) for r in rows),
                     *((PartitionKey(sink, t, p), at - 1) for (t, p), at in state.read_through.items()),
                     *((PartitionKey(sink, t, p), at - 1) for (t, p), at in state.starts.items())]:
        end = marks.get((pk.topic, pk.partition), (0, 1 << 62))[1]
        if last >= end:
            raise IrrecoverableStateError(
                f"{pk}: the state store recorded offset {last}, but the partition ends at {end - 1}: the topic was "
                "deleted and recreated (or its offsets were reset). Its new records would be taken for delivered "
                "ones; check the target table, then reset the sink's state (`python -m sparkapp state reset`)")
    resume = state.resume()
    for key, at in state.starts.items():  # where the sink chose to start, until a table's row says more
        resume.setdefault(key, at)
    for (t, p), at in sorted(resume.items()):
        low = marks.get((t, p), (0, 0))[0]
        if at >= low:
            continue
        for r in rows:
            if (r.pk.topic, r.pk.partition) == (t, p) and r.state.phase is Phase.AFTER and state.table_resume(r) < low:
                why = (f"{r.pk}: offsets [{state.table_resume(r)}, {low - 1}] were deleted from Kafka (retention) "
                       "before they were delivered: they are lost")
                if fail_on_data_loss:
                    raise DataLossError(why + '; set kafka.sourceOptions.failOnDataLoss: "false" to go on without them')
                log.error("%s; going on (failOnDataLoss is false)", why)
        resume[(t, p)] = low
    return {t: {str(p): resume.get((t, p), -2) for p in range(n)} for t, n in partitions.items()}


def _stalls(e: ShardUnavailableError) -> Decoder:
    def decode(m: Message) -> Any:
        raise e

    return decode


REGISTRY = "schema registry"  # what a partition waiting for the registry stalls on, as one waits for a shard


def waits_for_registry(read: Reader) -> Reader:
    """A registry that does not answer stalls the partition as an unavailable shard does: nothing of the batch is
    written or dead-lettered, the other partitions go on, and catch-up re-drives it from its state."""
    def fields(m: Message) -> Any:
        try:
            return read(m)
        except RegistryUnavailableError as e:
            raise ShardUnavailableError(REGISTRY, str(e)) from e

    return fields


@dataclass
class Runtime:
    cfg: SinkConfig
    epoch: int
    client: Client
    store: StateStore
    dlq: KafkaDeadLetterSink | None
    contexts: dict[str, WriterContext] = field(default_factory=dict)
    missing_tables: dict[str, str] = field(default_factory=dict)
    fast: dict[str, WriterContext | None] = field(default_factory=dict)  # per topic, see fast_context
    health: Health = field(default_factory=Health)  # shared by every table's shards: one physical shard, one health
    tried: dict[str, set[str]] = field(default_factory=dict)  # per table, fields not to add as columns (addColumns)
    readers: dict[str, Reader] = field(default_factory=dict)  # per table, what its decoder reads records with
    waiting: Waiting | None = None  # delivered ranges whose AFTER waits for their next BEFORE (Waiting)

    @classmethod
    def open(cls, cfg: SinkConfig, epoch: int) -> Runtime:
        client = clickhouse_client(cfg.clickhouse)
        dlq = KafkaDeadLetterSink(cfg.dlq.topic, cfg.kafka.client_options()) if cfg.dlq.topic else None
        return cls(cfg, epoch, client, state_store(cfg, client), dlq)

    def close(self) -> None:
        if self.dlq is not None:
            self.dlq.close()

    def defer_after(self) -> None:
        """Lets delivered ranges wait for their partitions' next BEFORE instead of an AFTER write (Waiting): for a
        runtime that writes every batch of the run (the driver's)."""
        self.waiting = Waiting(self.store, self.epoch)

    def confirm(self, topic: str | None = None, partition: int | None = None) -> None:
        """Writes the AFTER of the ranges waiting (of one partition, when given): when no batch follows (the run
        is idle or stops), or before a partition is written outside the shared transitions."""
        if self.waiting is not None and self.waiting.ranges:
            self.waiting.flush(None if topic is None else
                               [pk for pk in self.waiting.ranges if (pk.topic, pk.partition) == (topic, partition)])

    # ---- table routing (tableField / tableHeader) ----------------------------------------------

    def by_table(self, topic: str, messages: Sequence[Message]) -> tuple[dict[str, list[Message]], dict[int, str]]:
        """Splits a partition's messages by target table; records with no usable table get a reason."""
        ch = self.cfg.clickhouse
        default = ch.table_for(topic)
        if not ch.routed:
            assert default is not None
            return {default: list(messages)}, {}
        groups: dict[str, list[Message]] = {}
        reasons: dict[int, str] = {}
        for m in messages:
            table, why = self._table_of(m, default)
            if table is None:
                reasons[m.offset] = f"{why} (at {m.where})"
                groups.setdefault(UNROUTABLE, []).append(m)
            else:
                groups.setdefault(table, []).append(m)
        return groups, reasons

    def _table_of(self, m: Message, default: str | None) -> tuple[str | None, str]:
        ch = self.cfg.clickhouse
        name, why = record_table(m, ch.table_field, ch.table_header, default)
        if name is None:
            return None, why
        if name in (UNROUTABLE, READ_THROUGH):  # their state rows would be taken for chsink's own
            return None, f"table name {name!r} is reserved by chsink"
        if self._context(name) is None:
            return None, self.missing_tables[name]
        return name, ""

    # ---- writing ------------------------------------------------------------------------------

    def _context(self, table: str) -> WriterContext | None:
        if table in self.contexts:
            return self.contexts[table]
        if table in self.missing_tables:
            return None
        try:
            schema = load_schema(self.client, self.cfg.clickhouse.shard_database(0), table)
        except SchemaError as e:
            self.missing_tables[table] = f"unknown target table {table!r}: {e}"
            return None
        unsafe = unsafe_target(self.client, schema, self.cfg.state.enabled)
        if unsafe is not None:
            if not self.cfg.clickhouse.routed:
                raise ConfigError(f"clickhouse.tables: {unsafe}")
            self.missing_tables[table] = f"target table {table!r} refused: {unsafe}"
            return None
        spec = self.cfg.format.decoder_spec()
        # kept for addColumns: one reader (and schema cache) per table
        self.readers[table] = waits_for_registry(record_reader(spec, schema))
        self.contexts[table] = self._make_context(table, schema, make_decoder(spec, schema, self.readers[table]))
        return self.contexts[table]

    def _evolved(self, table: str, ctx: WriterContext, pk: PartitionKey, msgs: Sequence[Message]) -> WriterContext:
        """The table's context after adding the columns the records need (format.addColumns; evolve.py): built
        again from the altered table, on every shard."""
        if not self.cfg.format.add_columns:
            return ctx
        if table not in self.tried:
            self.tried[table] = set(CHANGE_COLUMNS) | self._uninsertable(table)

        def targets() -> list[tuple[Any, str]]:
            ch = self.cfg.clickhouse
            return [(self.client if e == ch.endpoints[0] else clickhouse_client(ch, e), d)
                    for e, d in self.cfg.all_shard_targets()]

        if not add_columns(ctx, pk, msgs, self.readers[table], targets, self.tried[table]):
            return ctx
        self.contexts.pop(table, None)
        rebuilt = self._context(table)
        assert rebuilt is not None
        return rebuilt

    def _uninsertable(self, table: str) -> set[str]:
        """The table's columns chsink does not insert (MATERIALIZED, ALIAS, EPHEMERAL): never fields to add."""
        res = self.client.query("SELECT name FROM system.columns WHERE database = {db:String} AND table = {t:String} "
                                "AND default_kind IN ('MATERIALIZED', 'ALIAS', 'EPHEMERAL')",
                                parameters={"db": self.cfg.clickhouse.shard_database(0), "t": table})
        return {str(r[0]) for r in res.result_rows}

    def _make_context(self, table: str, schema: TableSchema, decoder: Decoder) -> WriterContext:
        inserter = self._new_inserter(self.client, schema)
        return WriterContext(
            self.cfg.name, self.store, inserter, decoder,
            self.epoch, self.cfg.batching.block_offsets, self.dlq, refetch=None,
            replay_below=self.cfg.clickhouse.routed,
            exactly_once=self.cfg.state.enabled, fail_on_data_loss=self.cfg.kafka.fail_on_data_loss,
            shards=self._shard_set(table, schema) if table != UNROUTABLE else None,
        )

    def _new_inserter(self, client: Client, schema: TableSchema) -> Inserter:
        return Inserter(client, schema, self.cfg.clickhouse.settings,
                        skip_unknown_fields=self.cfg.format.unknown_fields == "ignore")

    # ---- shards -------------------------------------------------------------------------------

    def _shard_set(self, table: str, schema: TableSchema) -> ShardSet:
        """The table's shards: an inserter per (layout, shard), built on first use, each checked to hold a
        table with the columns of the first shard's."""
        sh = self.cfg.sharding

        def type_of(key: str) -> str:
            col = next((c for c in schema.columns if c.name == key), None)
            if col is None or col.default_kind in ("MATERIALIZED", "ALIAS", "EPHEMERAL"):
                raise ConfigError(f"sharding.key: table {schema.fqn} has no insertable column {key!r}")
            if isinstance(col.default, AtInsert):  # a retried block would send the row to another shard
                raise ConfigError(f"sharding.key: column {key!r} of {schema.fqn} has a DEFAULT ClickHouse computes "
                                  f"anew at each insert ({col.default.expr}); a record without the field would "
                                  "have no shard of its own. Route by a column the records give")
            if not key_type_ok(str(col.type)):
                raise ConfigError(f"sharding.key: column {key!r} of {schema.fqn} is {col.type}; chsink hashes "
                                  "String and (U)Int8..64 keys exactly as ClickHouse does, not this type")
            return str(col.type)

        def make(layout: int, shard: int) -> Inserter:
            endpoint, database = self.cfg.shard_target(layout, shard)
            client = self.client if endpoint == self.cfg.clickhouse.endpoints[0] else \
                clickhouse_client(self.cfg.clickhouse, endpoint)
            try:
                other = load_schema(client, database, table)
            except SchemaError as e:
                raise ConfigError(f"clickhouse shard {shard} (layout v{layout}): {e}") from None
            if other.names != schema.names:
                raise ConfigError(f"clickhouse shard {shard} (layout v{layout}): table {other.fqn} has columns "
                                  f"{list(other.names)}, unlike {schema.fqn} {list(schema.names)}")
            unsafe = unsafe_target(client, other, self.cfg.state.enabled)
            if unsafe is not None:
                raise ConfigError(f"clickhouse shard {shard} (layout v{layout}): {unsafe}")
            return self._new_inserter(client, other)

        def label(layout: int, shard: int) -> str:
            endpoint, database = self.cfg.shard_target(layout, shard)
            return f"{redact_dsn(endpoint)}#{database}"

        return ShardSet(self.cfg.layouts(type_of), sh.layout, make, label, self.health)

    def fast_context(self, topic: str) -> WriterContext | None:
        """The writer context of the topic's table when it can take the fast path (ClickHouse parses JSON)."""
        if topic not in self.fast:
            ch, fmt = self.cfg.clickhouse, self.cfg.format
            table = ch.table_for(topic)
            # rows routed by a metadata column (`_key`...): those values are not in the record, the decoder has them
            meta_key = any(lay.needs_key and lay.key in METADATA_COLUMNS for lay in self.cfg.layouts().values())
            ctx = None if ch.routed or table is None or not fmt.clickhouse_parses or meta_key else self._context(table)
            self.fast[topic] = ctx if ctx is not None and eligible(ctx.inserter.schema) else None
        return self.fast[topic]

    def process_lines(self, ctx: WriterContext, topic: str, partition: int, batch: LineBatch) -> list[PartitionResult]:
        """The fast path of process(): one table (no routing), JSON lines parsed by ClickHouse."""
        self.confirm(topic, partition)
        ctx.refetch = self._refetcher(ctx.inserter.schema.table)
        return [write_lines(ctx, PartitionKey(self.cfg.name, topic, partition, ""), batch)]

    def process_lines_many(self, items: Sequence[tuple[WriterContext, str, int, LineBatch]]
                           ) -> list[PartitionResult | ShardUnavailableError]:
        """process_lines of many partitions of one batch, their state transitions shared (write_lines_many)."""
        for ctx, *_ in items:
            ctx.refetch = self._refetcher(ctx.inserter.schema.table)
        return write_lines_many([(ctx, PartitionKey(self.cfg.name, topic, partition, ""), batch)
                                 for ctx, topic, partition, batch in items], self.waiting)

    def process(self, topic: str, partition: int, messages: Sequence[Message]) -> list[PartitionResult]:
        """Delivers one topic-partition's batch: one state transition per target table."""
        self.confirm(topic, partition)
        groups, reasons = self.by_table(topic, messages)
        results = []
        stalled: ShardUnavailableError | None = None
        for table, msgs in sorted(groups.items()):
            found = self._unroutable_context(reasons) if table == UNROUTABLE else self._context(table)
            assert found is not None
            pk = PartitionKey(self.cfg.name, topic, partition, table if self.cfg.clickhouse.routed else "")
            try:
                ctx = found if table == UNROUTABLE else self._evolved(table, found, pk, msgs)
            except ShardUnavailableError as e:  # the registry does not answer: the write stalls where it decodes,
                ctx = dataclasses.replace(found, decode=_stalls(e))  # after its range is BEFORE
            ctx.refetch = self._refetcher(table)
            try:
                results.append(write_partition(ctx, pk, msgs))
            except ShardUnavailableError as e:  # the other tables still take their records of this batch:
                stalled = stalled or e  # skipping them would leave a hole below their next range
        if stalled is not None:
            raise stalled
        return results

    def catch_up(self, topic: str, partition: int, start: int | None, upto: int) -> list[PartitionResult]:
        """Delivers a partition from `start` (where its state resumes) up to `upto`, re-read from Kafka: for a
        partition that stalled on an unavailable shard while Spark moved on. Read and delivered a stretch of
        at most a micro-batch's offsets (`maxOffsetsPerTrigger`, else `blockOffsets`) at a time, each its own
        range: a long outage is never read into memory at once. A stretch that ends inside the stored BEFORE
        range is fine: the plan re-reads that range whole (it is re-sent as recorded)."""
        if start is None or start > upto:
            return []
        step = self.cfg.batching.max_offsets_per_trigger or self.cfg.batching.block_offsets
        results: list[PartitionResult] = []
        for lo in range(start, upto + 1, step):
            stretch = OffsetRange(lo, min(upto, lo + step - 1))
            results += self.process(topic, partition, read_range(self.cfg.kafka, topic, partition, stretch))
        return results

    def _unroutable_context(self, reasons: dict[int, str]) -> WriterContext:
        def reject(m: Message) -> list[Any]:
            raise DecodeError(reasons.get(m.offset, "unroutable record").rsplit(" (at ", 1)[0])

        schema = TableSchema(self.cfg.clickhouse.database, UNROUTABLE, ())
        return self._make_context(UNROUTABLE, schema, reject)

    def _refetcher(self, table: str) -> Refetch:
        def refetch(topic: str, partition: int, rng: OffsetRange) -> list[Message]:
            msgs = read_range(self.cfg.kafka, topic, partition, rng)
            if not self.cfg.clickhouse.routed:
                return msgs
            groups, _ = self.by_table(topic, msgs)
            return groups.get(table, [])

        return refetch
