"""The verifier (after eBay's runtime verifier): Kafka offsets vs ClickHouse `_offset` vs the DLQ.

For every partition it reports duplicates (an offset twice in ClickHouse, twice in the DLQ, or in
both), gaps (an offset that holds a committed record in Kafka, lies below what the state store says was
delivered, and is in neither place: every one of them, however many), rows outside the Kafka range, and
what is still pending (committed records above that point, in neither place). Offsets without a record
(compacted away, aborted transactions, transaction markers) are neither gaps nor pending. On a routed
(multi-table) sink each table has its own position: a record above the slowest table's is routed as the
writer routes it and judged by its own table's.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from .config import SinkConfig
from .core.routing import record_table
from .core.state_machine import OffsetRange
from .delivery.runtime import UNROUTABLE, spec_table
from .edges.clickhouse import clickhouse_client, load_schema
from .edges.dlq import DeadLetterRead, dead_letter_entries
from .edges.kafka import consumer, present_offsets, read_range, topic_partitions, watermarks
from .edges.store import SinkState, StateStore, state_store
from .formats.schema import SchemaError


@dataclass
class PartitionReport:
    topic: str
    partition: int
    low: int
    high: int
    delivered_to: int  # offsets below this are claimed delivered by the state store
    clickhouse: int = 0
    dead_lettered: int = 0
    pending: int = 0
    tombstones: int = 0  # a change stream's tombstones: records that hold no row (envelope debezium)
    duplicates: list[int] = field(default_factory=list)
    gaps: list[int] = field(default_factory=list)
    outside: list[int] = field(default_factory=list)

    @property
    def anomalies(self) -> int:
        return len(self.duplicates) + len(self.gaps) + len(self.outside)


@dataclass
class Report:
    sink: str
    partitions: list[PartitionReport]
    tables: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def totals(self) -> dict[str, int]:
        keys = ("clickhouse", "dead_lettered", "pending", "tombstones")
        out = {k: sum(getattr(p, k) for p in self.partitions) for k in keys}
        out["kafka"] = sum(p.high - p.low for p in self.partitions)
        out["duplicates"] = sum(len(p.duplicates) for p in self.partitions)
        out["gaps"] = sum(len(p.gaps) for p in self.partitions)
        out["outside"] = sum(len(p.outside) for p in self.partitions)
        return out

    @property
    def ok(self) -> bool:
        return all(p.anomalies == 0 for p in self.partitions)

    def to_json(self) -> str:
        return json.dumps({"sink": self.sink, "ok": self.ok, "totals": self.totals, "tables": self.tables,
                           "notes": self.notes, "partitions": [asdict(p) for p in self.partitions]}, indent=2)

    def to_text(self) -> str:
        head = ("TOPIC", "PART", "KAFKA [LOW,HIGH)", "CLICKHOUSE", "DLQ", "PENDING", "DUPLICATES", "GAPS", "OUTSIDE")
        rows = [head]
        for p in self.partitions:
            rows.append((p.topic, str(p.partition), f"[{p.low},{p.high})", str(p.clickhouse), str(p.dead_lettered),
                         str(p.pending), str(len(p.duplicates)), str(len(p.gaps)), str(len(p.outside))))
        t = self.totals
        rows.append(("TOTAL", "", str(t["kafka"]), str(t["clickhouse"]), str(t["dead_lettered"]), str(t["pending"]),
                     str(t["duplicates"]), str(t["gaps"]), str(t["outside"])))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        for p in self.partitions:
            for label, offs in (("duplicates", p.duplicates), ("gaps", p.gaps), ("outside", p.outside)):
                if offs:
                    lines.append(f"{p.topic}/{p.partition} {label}: {offs[:20]}{' ...' if len(offs) > 20 else ''}")
        lines += self.notes
        if t["tombstones"]:
            lines.append(f"{t['tombstones']} tombstone(s) of the change stream: records that hold no row")
        lines.append("OK: every offset is in ClickHouse or the DLQ exactly once" if self.ok else
                     f"ANOMALIES: {t['duplicates']} duplicated, {t['gaps']} missing, {t['outside']} outside the range")
        return "\n".join(lines)


Offsets = Counter[tuple[str, int, int]]


def _clickhouse_offsets(cfg: SinkConfig, tables: list[str]) -> tuple[Offsets, list[str]]:
    counts: Counter[tuple[str, int, int]] = Counter()
    notes: list[str] = []
    for endpoint, database in cfg.all_shard_targets():
        client = clickhouse_client(cfg.clickhouse, endpoint)
        _count_offsets(client, database, tables, counts, notes)
    return counts, notes


def _count_offsets(client: Any, database: str, tables: list[str], counts: Offsets, notes: list[str]) -> None:
    for table in tables:
        try:
            schema = load_schema(client, database, table)
        except SchemaError as e:  # a table an earlier routing named may be gone: its records count as not stored
            notes.append(f"{e}: its rows cannot be counted")
            continue
        if not schema.has_offset_columns:
            notes.append(f"table {table} has no _topic/_partition/_offset columns: its rows cannot be verified")
            continue
        tbl = client.query_arrow(f"SELECT _topic, _partition, _offset, count() AS c FROM {schema.fqn} "
                                 "GROUP BY _topic, _partition, _offset")
        for t, p, o, c in zip(*(tbl.column(i).to_pylist() for i in range(4)), strict=True):
            counts[(t, int(p), int(o))] += int(c)


def sink_tables(cfg: SinkConfig, store: StateStore, state: SinkState) -> list[str]:
    """The tables the config names, those with state rows, and those older routings of a topic named: what was
    delivered before a routing change stays there."""
    earlier = {t for specs in store.routings(cfg.name).values() for s in specs if (t := spec_table(s))}
    return sorted(set(cfg.clickhouse.tables.values()) | earlier | {r.pk.table for r in state.rows if r.pk.table
                                                                   and not r.pk.table.startswith("__")})


def dlq_offsets(cfg: SinkConfig) -> Counter[tuple[str, int, int]]:
    """The sink's dead letters, the whole topic read."""
    return dlq_entries(cfg, {}).counts()


def dlq_entries(cfg: SinkConfig, starts: dict[int, int]) -> DeadLetterRead:
    """The sink's dead letters from `starts` (per DLQ partition; 0 where it has none) to the topic's end."""
    if not cfg.dlq.topic:
        return DeadLetterRead([], {})
    parts = topic_partitions(cfg.kafka.model_copy(update={"topics": [cfg.dlq.topic], "topic_pattern": None}))
    c = consumer(cfg.kafka, group=f"chsink-verify-{cfg.name}")
    try:
        return dead_letter_entries(c, cfg.dlq.topic, {p: starts.get(p, 0) for p in range(parts[cfg.dlq.topic])},
                                   cfg.name)
    finally:
        c.close()


def held_offsets(cfg: SinkConfig, topic: str, partition: int, missing: list[int],
              rep: PartitionReport | None = None) -> list[int]:
    """Of offsets missing from ClickHouse and the DLQ, those that hold records in Kafka: one read over their
    whole span, so every one is checked, wherever compaction left holes. A change stream's tombstones hold no
    row: they are counted in `rep`, not returned."""
    if not missing:
        return []
    span = OffsetRange(missing[0], missing[-1])
    if not cfg.format.tombstones_hold_no_row:
        present = present_offsets(cfg.kafka, topic, partition, span)
        return [o for o in missing if o in present]
    wanted = set(missing)
    records = [m for m in read_range(cfg.kafka, topic, partition, span) if m.offset in wanted]
    if rep is not None:
        rep.tombstones += sum(1 for m in records if m.value is None)
    return [m.offset for m in records if m.value is not None]


def _routed_gaps(cfg: SinkConfig, topic: str, partition: int, missing: list[int],
                 positions: dict[str, int]) -> tuple[list[int], int]:
    """Of offsets missing between the slowest and the fastest table of a routed partition, those whose own
    table's state says delivered (gaps), and how many wait for their table (pending): each record is read
    and routed as the writer routes it, so a silent table cannot hide another table's loss."""
    if not missing:
        return [], 0
    ch = cfg.clickhouse
    default = ch.table_for(topic)
    gaps, pending = [], 0
    wanted = set(missing)
    for m in read_range(cfg.kafka, topic, partition, OffsetRange(missing[0], missing[-1])):
        if m.offset not in wanted:
            continue
        table, _ = record_table(m, ch.table_field, ch.table_header, default)
        at = positions.get(table or UNROUTABLE, positions.get(UNROUTABLE, 0))
        if m.offset < at:
            gaps.append(m.offset)
        else:
            pending += 1
    return gaps, pending


def verify(cfg: SinkConfig) -> Report:
    parts = topic_partitions(cfg.kafka)
    client = clickhouse_client(cfg.clickhouse)
    store = state_store(cfg, client)
    state = store.sink_state(cfg.name)
    rows = state.rows
    tables = sink_tables(cfg, store, state)
    ch, notes = _clickhouse_offsets(cfg, tables)
    dlq = dlq_offsets(cfg)
    delivered = state.resume()
    reports = []
    for topic, n in parts.items():
        for p in range(n):
            lo, hi = watermarks(cfg.kafka, topic, p)
            # a sink that chose where to start (kafka.startingOffsets) answers for what follows only; rows below
            # are an earlier sink's
            start = state.starts.get((topic, p), 0)
            lo = max(lo, start)
            rep = PartitionReport(topic, p, lo, hi, delivered.get((topic, p), lo))
            ch_here = {o: c for (t, q, o), c in ch.items() if t == topic and q == p and o >= start}
            dlq_here = {o: c for (t, q, o), c in dlq.items() if t == topic and q == p and o >= start}
            rep.clickhouse = sum(ch_here.values())
            rep.dead_lettered = sum(dlq_here.values())
            rep.duplicates = sorted(o for o in set(ch_here) | set(dlq_here)
                                    if ch_here.get(o, 0) + dlq_here.get(o, 0) > 1)
            rep.outside = sorted(o for o in ch_here if o >= hi or o < 0)
            absent = [o for o in range(lo, hi) if o not in ch_here and o not in dlq_here]
            tables_at = {r.pk.table: state.table_resume(r) for r in rows if (r.pk.topic, r.pk.partition) == (topic, p)}
            reach = max(tables_at.values(), default=rep.delivered_to)  # the fastest table's position
            rep.gaps = held_offsets(cfg, topic, p, [o for o in absent if o < rep.delivered_to], rep)
            rep.gaps += (routed := _routed_gaps(cfg, topic, p, [o for o in absent if rep.delivered_to <= o < reach],
                                                tables_at))[0]
            rep.pending = routed[1] + len(held_offsets(cfg, topic, p, [o for o in absent if o >= max(reach, lo)]))
            reports.append(rep)
    return Report(cfg.name, reports, tables, notes)
