"""The scheduled verifier: each run checks the offsets settled since the last run, so its cost follows what was
written in between, not the size of the topic.

An offset is settled once the state store says it was delivered and Kafka has held it for longer than the
window. Each settled offset must be in ClickHouse or the DLQ exactly once. The check counts first (rows and
distinct offsets per chunk) and reads offsets and Kafka only where the counts leave a doubt, so a deleted row and
a duplicated one in the same chunk do not cancel out. A partition with a finding is not advanced: every later
run reports it again until someone repairs it. The verifier never changes data.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .config import SinkConfig
from .edges.clickhouse import clickhouse_client, load_schema
from .edges.dlq import DeadLetterRead
from .edges.kafka import all_watermarks, offsets_before, topic_partitions
from .edges.store import quote, state_store
from .edges.verified import Verified, VerifiedStore
from .formats.schema import SchemaError
from .verify import dlq_entries, held_offsets, sink_tables

CHUNK = 500_000  # offsets per count query: one partition's settled range is checked in pieces of this size
SUMMARY_LIMIT = 4000  # bytes: the pod's termination message, where the operator reads the result, holds 4096
_SHOWN = 10  # offsets a finding lists


@dataclass
class Finding:
    topic: str
    partition: int
    duplicates: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)

    @property
    def where(self) -> str:
        parts = [f"{len(offs)} {what} offset(s) {offs[:_SHOWN]}{' ...' if len(offs) > _SHOWN else ''}"
                 for what, offs in (("duplicated", self.duplicates), ("missing", self.missing)) if offs]
        return f"{self.topic}/{self.partition}: " + ", ".join(parts)


@dataclass
class SettledReport:
    sink: str
    checked: int = 0  # offsets checked by this run
    offsets: int = 0  # offsets checked by every run so far, this one included
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def summary(self) -> str:
        """One JSON line that fits a termination message, the findings cut where it would not."""
        head: dict[str, Any] = {"result": "OK" if self.ok else "ANOMALY", "checked": self.checked,
                                "offsets": self.offsets, "findings": [], "notes": self.notes[:3]}
        for i, f in enumerate(self.findings):
            trial = {**head, "findings": [*head["findings"], f.where], "more": len(self.findings) - i - 1}
            if len(json.dumps(trial).encode()) > SUMMARY_LIMIT:
                head["more"] = len(self.findings) - i
                break
            head = trial
        return json.dumps(head)


def verify_settled(cfg: SinkConfig, window_s: float, now_s: float) -> SettledReport:
    client = clickhouse_client(cfg.clickhouse)
    store = state_store(cfg, client)
    state = store.sink_state(cfg.name)
    verified = VerifiedStore(store)
    verified.ensure_schema()
    done = verified.positions(cfg.name)
    parts = topic_partitions(cfg.kafka)
    pairs = [(t, p) for t, n in parts.items() for p in range(n)]
    marks = all_watermarks(cfg.kafka, parts)
    settled = offsets_before(cfg.kafka, pairs, int((now_s - window_s) * 1000))
    delivered = state.resume()
    counter = _Counter(cfg, sink_tables(cfg, store, state))
    letters = dlq_entries(cfg, {p: v.verified_to for (t, p), v in done.items() if t == cfg.dlq.topic})
    dlq: dict[tuple[str, int], Counter[int]] = {}
    for _, _, (t, p, o) in letters.entries:
        dlq.setdefault((t, p), Counter())[o] += 1
    report = SettledReport(cfg.name, notes=counter.notes)
    moved: dict[tuple[str, int], Verified] = {}
    for tp in pairs:
        was = done.get(tp, Verified(0, 0))
        begin = max(was.verified_to, marks[tp][0], state.starts.get(tp, 0))
        end = min(delivered.get(tp, 0), settled[tp], marks[tp][1])
        at, checked = begin, 0
        while at < end:
            upto = min(at + CHUNK, end)
            finding = counter.check(tp, at, upto, {o: c for o, c in dlq.get(tp, {}).items() if at <= o < upto})
            if finding is not None:
                report.findings.append(finding)
                break
            checked += upto - at
            at = upto
        report.checked += checked
        report.offsets += was.offsets + checked
        if at != was.verified_to:
            moved[tp] = Verified(at, was.offsets + checked)
    moved.update(_dlq_marks(cfg, letters, {tp: moved.get(tp, done.get(tp, Verified(0, 0))).verified_to
                                           for tp in pairs}, done))
    verified.record(cfg.name, moved)
    return report


def _dlq_marks(cfg: SinkConfig, letters: DeadLetterRead, verified_to: dict[tuple[str, int], int],
               done: dict[tuple[str, int], Verified]) -> dict[tuple[str, int], Verified]:
    """Where the next run reads each DLQ partition from: its first letter of an offset not verified yet, else the
    end this run read to. Kept as rows of the DLQ topic, so a run reads only the letters it may need. A letter of
    a topic the sink no longer reads holds nothing back: no run will verify its offsets."""
    if not (topic := cfg.dlq.topic):
        return {}
    marks = dict(letters.ends)
    for q, at, key in letters.entries:
        if (to := verified_to.get(key[:2])) is not None and key[2] >= to:
            marks[q] = min(marks[q], at)
    return {(topic, q): Verified(mark, 0) for q, mark in marks.items()
            if done.get((topic, q), Verified(0, 0)).verified_to != mark}


class _Counter:
    """Counts one partition's chunk over every shard and table rows of the sink may be in."""

    def __init__(self, cfg: SinkConfig, tables: list[str]) -> None:
        self.cfg = cfg
        self.notes: list[str] = []
        self.targets: list[tuple[Any, str]] = []  # (client, table's fqn)
        for endpoint, database in cfg.all_shard_targets():
            client = clickhouse_client(cfg.clickhouse, endpoint)
            for table in tables:
                try:
                    schema = load_schema(client, database, table)
                except SchemaError as e:  # a table an earlier routing named may be gone
                    self.notes.append(f"{e}: its rows cannot be counted")
                    continue
                if not schema.has_offset_columns:
                    self.notes.append(f"table {table} has no _topic/_partition/_offset columns: its rows cannot "
                                      "be verified")
                    continue
                self.targets.append((client, schema.fqn))

    def _where(self, tp: tuple[str, int], lo: int, hi: int) -> str:
        return (f"_topic = {quote(tp[0])} AND _partition = {int(tp[1])} AND _offset >= {int(lo)} "
                f"AND _offset < {int(hi)}")

    def check(self, tp: tuple[str, int], lo: int, hi: int, dlq: dict[int, int]) -> Finding | None:
        found = []
        for client, fqn in self.targets:
            r = client.query(f"SELECT count(), uniqExact(_offset) FROM {fqn} WHERE {self._where(tp, lo, hi)}")
            if int(r.result_rows[0][0]):
                found.append((int(r.result_rows[0][0]), int(r.result_rows[0][1])))
        # every offset once, in one table, none dead-lettered: nothing to look at more closely. Counts of two
        # tables or shards are not added up: an offset in both and one in neither would sum to the right figure.
        if not dlq and found == [(hi - lo, hi - lo)]:
            return None
        counts: Counter[int] = Counter(dlq)
        for client, fqn in self.targets:
            tbl = client.query_arrow(f"SELECT _offset, count() FROM {fqn} WHERE {self._where(tp, lo, hi)} "
                                     "GROUP BY _offset")
            for o, c in zip(tbl.column(0).to_pylist(), tbl.column(1).to_pylist(), strict=True):
                counts[int(o)] += int(c)
        duplicates = sorted(o for o, c in counts.items() if c > 1)
        absent = [o for o in range(lo, hi) if o not in counts]
        missing = held_offsets(self.cfg, tp[0], tp[1], absent)  # holes Kafka has too (compaction, markers) are fine
        if not duplicates and not missing:
            return None
        return Finding(tp[0], tp[1], duplicates, missing)
