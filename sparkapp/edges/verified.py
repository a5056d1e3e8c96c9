"""How far the scheduled verifier has checked each partition: a table beside the state table, on its engine.

Kept apart from the state rows: the verifier only reads what the writer wrote, and a writer never reads this.
One row per sink and partition; a later write of the same key replaces the row (both engines upsert by key).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config import Engine
from .store import StateStore, _esc, quote

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

_COLUMNS = ("key String, sink String, topic String, partition UInt32, verified_to Int64, offsets Int64, "
            "updated_at DateTime64(3, 'UTC')")


@dataclass(frozen=True)
class Verified:
    """Offsets below `verified_to` were checked; `offsets` of them in all, over every run."""

    verified_to: int
    offsets: int


class VerifiedStore:
    def __init__(self, store: StateStore) -> None:
        self.client: Client = store.client
        self.engine = store.engine
        self.keeper_path = f"{store.keeper_path}_verified"
        self.fqn = f"`{store.database}`.`{store.table}_verified`"

    def ensure_schema(self) -> None:
        engine = f"KeeperMap('{self.keeper_path}')" if self.engine is Engine.KEEPER_MAP else "EmbeddedRocksDB"
        self.client.command(f"CREATE TABLE IF NOT EXISTS {self.fqn} ({_COLUMNS}) ENGINE = {engine} PRIMARY KEY key")

    def positions(self, sink: str) -> dict[tuple[str, int], Verified]:
        rows = self.client.query(f"SELECT topic, partition, verified_to, offsets FROM {self.fqn} "
                                 f"WHERE sink = {quote(sink)}").result_rows
        return {(str(t), int(p)): Verified(int(v), int(n)) for t, p, v, n in rows}

    def record(self, sink: str, positions: Mapping[tuple[str, int], Verified]) -> None:
        if not positions:
            return
        at = dt.datetime.now(dt.UTC)
        rows = [[f"{_esc(sink)}/{_esc(t)}/{p}", sink, t, p, v.verified_to, v.offsets, at]
                for (t, p), v in sorted(positions.items())]
        self.client.insert(self.fqn, rows, column_names=["key", "sink", "topic", "partition", "verified_to",
                                                         "offsets", "updated_at"])

    def delete(self, sink: str) -> None:
        """A deleted sink's rows (its cleanup); nothing if the verifier never ran."""
        if self.client.query(f"EXISTS TABLE {self.fqn}").result_rows[0][0]:
            self.client.command(f"ALTER TABLE {self.fqn} DELETE WHERE sink = {quote(sink)}")
