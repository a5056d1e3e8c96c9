"""Inserting blocks into ClickHouse with their deduplication tokens, retries and recovery.

A retry always re-sends the identical block with the identical token. When a BEFORE block is
retried and the table carries `_topic`, `_partition` and `_offset`, the inserter first counts what
already landed, so the end state holds each offset exactly once even after the deduplication
window has expired: landed -> skip, not landed -> insert, partial -> insert only the missing rows
(under their own deterministic token).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..core.blocks import Block, LineBlock, payload
from ..formats.schema import TableSchema

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

log = logging.getLogger(__name__)

# Error codes worth retrying: network, timeouts, Keeper hiccups, too many parts, memory pressure, and a
# shard's table or database missing (detached, being re-created): the shard's partitions wait for it.
_TRANSIENT_CODES = {3, 60, 81, 159, 164, 209, 210, 241, 242, 252, 319, 425, 999, 1000, 1002}
_TRANSIENT_WORDS = ("timeout", "timed out", "connection", "temporarily", "too many parts", "keeper", "zookeeper",
                    "broken pipe", "reset by peer", "network")


class InsertError(RuntimeError):
    """An insert failed permanently or ran out of retries."""


def is_transient(e: Exception) -> bool:
    text = str(e).lower()
    code = getattr(e, "code", None)
    return (isinstance(code, int) and code in _TRANSIENT_CODES) or any(w in text for w in _TRANSIENT_WORDS)


@dataclass(frozen=True)
class Recovery:
    """What a recovery check found for a retried block."""

    landed: int
    missing: tuple[int, ...]
    duplicated: tuple[int, ...]


class Inserter:
    """Sends blocks to one ClickHouse endpoint (one shard)."""

    def __init__(self, client: Client, schema: TableSchema, settings: dict[str, Any] | None = None,
                 retries: int = 5, backoff_s: float = 0.2, sleep: Callable[[float], None] = time.sleep,
                 skip_unknown_fields: bool = True) -> None:
        self.client = client
        self.schema = schema
        self.settings = dict(settings or {})
        self.retries = retries
        self.backoff_s = backoff_s
        self.sleep = sleep
        self.inserts = 0  # INSERT statements that succeeded (a test looks at which path sent what)
        # ClickHouse's own JSON parser, made strict and deterministic: a record it cannot fit fails the
        # window (which then takes the decoding path) rather than being altered; one thread, one block
        self.line_settings: dict[str, Any] = {
            "input_format_skip_unknown_fields": int(skip_unknown_fields), "input_format_null_as_default": 0,
            "input_format_defaults_for_omitted_fields": 1, "input_format_parallel_parsing": 0,
            "date_time_input_format": "best_effort", "input_format_allow_errors_num": 0,
            "input_format_allow_errors_ratio": 0,
        }

    def _settings(self, token: str, rows: int) -> dict[str, Any]:
        if not token:  # the at-least-once baseline
            return {**self.settings, "insert_deduplicate": 0}
        return {
            **self.settings,
            "insert_deduplicate": 1,
            "insert_deduplication_token": token,
            # one insert must stay one ClickHouse block, or the token suffixes would depend on sizes
            "max_insert_block_size": max(1_048_576, rows + 1),
            "min_insert_block_size_rows": 0,
            "min_insert_block_size_bytes": 0,
        }

    def insert(self, block: Block | LineBlock) -> None:
        """Inserts one block; transient failures are retried with the identical block and token."""
        settings = self._settings(block.token, block.rows)
        if isinstance(block, LineBlock):
            settings.update(self.line_settings)
        attempt = 0
        while True:
            try:
                if isinstance(block, LineBlock):
                    # a memoryview goes out as the request body as is: the lines are never copied
                    self.client.raw_insert(self.schema.fqn, None, block.payload,  # type: ignore[arg-type]
                                           settings=settings, fmt="JSONEachRow")
                else:
                    self.client.insert(self.schema.fqn, list(block.data), column_names=list(block.columns),
                                       column_oriented=True, settings=settings)
                self.inserts += 1
                return
            except Exception as e:
                attempt += 1
                if attempt > self.retries or not is_transient(e):
                    raise InsertError(f"insert of {block.rows} rows (token {block.token}) into {self.schema.fqn} "
                                      f"failed after {attempt} attempt(s): {e}") from e
                delay = self.backoff_s * 2 ** (attempt - 1)
                log.warning("transient insert error, retry %d/%d in %.1fs: %s", attempt, self.retries, delay, e)
                self.sleep(delay)

    def check(self, block: Block | LineBlock, topic: str, partition: int) -> Recovery:
        """Counts the block's offsets already present in the table (needs the offset columns)."""
        res = self.client.query(
            f"SELECT _offset, count() FROM {self.schema.fqn} WHERE _topic = {{t:String}} "
            f"AND _partition = {{p:Int64}} AND _offset BETWEEN {{lo:Int64}} AND {{hi:Int64}} GROUP BY _offset",
            parameters={"t": topic, "p": partition, "lo": block.window.min, "hi": block.window.max},
            settings={"select_sequential_consistency": 1} if self.settings.get("sequential") else None,
        )
        counts = {int(o): int(c) for o, c in res.result_rows}
        present = set(block.offsets)
        return Recovery(
            landed=sum(1 for o in block.offsets if o in counts),
            missing=tuple(o for o in block.offsets if o not in counts),
            duplicated=tuple(sorted(o for o, c in counts.items() if c > 1 or o not in present)),
        )

    def retry(self, block: Block | LineBlock, topic: str, partition: int) -> int:
        """Re-sends a BEFORE block so the end state holds each of its offsets exactly once; returns the rows
        sent (fewer than the block's when some had landed, and then only those rows count as inserted)."""
        if not self.schema.has_offset_columns:
            self.insert(block)  # relies on the deduplication window; see README "Window limits"
            return block.rows
        try:
            rec = self.check(block, topic, partition)
        except Exception as e:
            raise InsertError(f"cannot count what landed of {block.token} in {self.schema.fqn}: {e}") from e
        if rec.duplicated:
            log.error("offsets %s of %s/%d appear more than once in %s before retry", rec.duplicated[:10],
                      topic, partition, self.schema.fqn)
        if not rec.missing:
            return 0
        if rec.landed == 0:
            self.insert(block)
            return block.rows
        keep = [i for i, o in enumerate(block.offsets) if o in set(rec.missing)]
        token = f"{block.token}|rest:{rec.missing[0]}-{rec.missing[-1]}:{len(rec.missing)}"
        offsets = tuple(block.offsets[i] for i in keep)
        if isinstance(block, LineBlock):
            lines = block.lines.take(keep)
            self.insert(replace(block, token=token, payload=payload(lines), offsets=offsets, lines=lines))
        else:
            self.insert(replace(block, token=token, data=tuple([col[i] for i in keep] for col in block.data),
                                offsets=offsets))
        return len(offsets)
