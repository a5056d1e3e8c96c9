"""The shards one table is written to: an inserter per (layout, shard), and each shard's health.

IO edge for the pure routing of core/routing.py. A shard whose inserts keep failing after the
inserter's bounded retries is marked down; partitions routed to it stall (their state stays
BEFORE, so nothing is lost) and are tried again once `retry_interval_s` has passed, while
partitions routed elsewhere keep flowing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.routing import Layout
from .errors import first_line, worth_retrying
from .insert import Inserter

log = logging.getLogger(__name__)


class ShardUnavailableError(RuntimeError):
    """A shard cannot take inserts right now; the partitions routed to it wait, BEFORE, for it."""

    def __init__(self, label: str, reason: str) -> None:
        super().__init__(f"shard {label} unavailable: {reason}")
        self.label = label


class LayoutError(RuntimeError):
    """A stored range was sent under a shard layout this config no longer describes."""


@dataclass
class Health:
    """Per physical shard (endpoint and database): down since when, and when it was last tried."""

    retry_interval_s: float = 5.0
    down: dict[str, tuple[float, str]] = field(default_factory=dict)  # label -> (last try, reason)

    def check(self, label: str) -> None:
        if label in self.down:
            tried, reason = self.down[label]
            if time.monotonic() - tried < self.retry_interval_s:
                raise ShardUnavailableError(label, f"{reason} (next try in "
                                                   f"{self.retry_interval_s - (time.monotonic() - tried):.0f}s)")

    def failed(self, label: str, reason: str) -> ShardUnavailableError:
        """Marks the shard down; returns the error that stalls the partition which found out."""
        if label not in self.down:
            log.error("shard %s is unavailable: %s; partitions routed to it stall until it answers", label, reason)
        self.down[label] = (time.monotonic(), reason)
        return ShardUnavailableError(label, reason)

    def ok(self, label: str) -> None:
        if self.down.pop(label, None) is not None:
            log.info("shard %s answers again; its partitions catch up", label)


@dataclass
class ShardSet:
    """One table's shards over the current and previous layouts (see SinkConfig.layouts)."""

    layouts: dict[int, Layout]
    current: int
    make: Callable[[int, int], Inserter]  # (layout, shard) -> inserter
    label: Callable[[int, int], str]  # (layout, shard) -> the physical shard's name (endpoint/database)
    health: Health
    _inserters: dict[tuple[int, int], Inserter] = field(default_factory=dict)
    _labels: dict[tuple[int, int], str] = field(default_factory=dict)

    def name(self, layout: int, shard: int) -> str:
        """The physical shard's name, computed once (it is looked up for every sub-block)."""
        if (layout, shard) not in self._labels:
            self._labels[(layout, shard)] = self.label(layout, shard)
        return self._labels[(layout, shard)]

    def layout(self, version: int, where: str) -> Layout:
        if version not in self.layouts:
            raise LayoutError(
                f"{where}: its unconfirmed range was sent under shard layout v{version}, which this config no "
                f"longer describes (it knows {sorted(self.layouts)}); drain the sink under that layout first, or "
                "keep it as sharding.previous")
        return self.layouts[version]

    def inserter(self, layout: int, shard: int) -> Inserter:
        """Built on first use. A shard that does not answer then (a driver's catch-up, a new executor worker
        meeting it for the first time) is down like one whose inserts fail: only its partitions stall."""
        if (layout, shard) not in self._inserters:
            label = self.name(layout, shard)
            self.health.check(label)
            try:
                self._inserters[(layout, shard)] = self.make(layout, shard)
            except Exception as e:
                if not worth_retrying(e):
                    raise
                raise self.health.failed(label, first_line(e)) from None
        return self._inserters[(layout, shard)]

    def shards_of(self, layout: int, shard: int) -> list[int]:
        """The shards a range recorded under `layout` with `shard` touches."""
        return self.layouts[layout].shards_of(shard)
