"""Inserting blocks into ClickHouse with their deduplication tokens, retries and recovery.

A block is one window of a range and goes out as exactly one ClickHouse block under its token, whatever
the path (JSON lines parsed by ClickHouse, or rows decoded in Python): the same window is the same insert.

A failed attempt may have committed (the reply was lost), so no attempt after the first is sent blindly.
When the table carries `_topic`, `_partition` and `_offset`, the inserter first counts what already
landed, so the end state holds each offset exactly once whatever the deduplication window: landed ->
skip, not landed -> insert, partial -> insert only the missing rows (under their own deterministic
token). Without those columns the identical block and token are re-sent, and ClickHouse's deduplication
window drops the copy. A table with a window of 0 is refused at start (retry_safety): counting catches a
lost reply, but not a stale writer's block that arrives after the run that took over counted.
"""

from __future__ import annotations

import codecs
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..core.blocks import Block, LineBlock, payload, whole
from ..core.state_machine import OffsetRange
from ..formats.schema import AtInsert, TableSchema
from .errors import first_line, is_transient

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

log = logging.getLogger(__name__)

# ClickHouse error codes worth retrying: network and timeouts, Keeper hiccups, too many parts or queries,
# memory pressure, read-only replicas, and a shard's table or database missing (detached, being
# re-created): the shard's partitions wait for it. Any other code is the data's or the config's fault.
# Settings no sink config may change: synchronous, deduplicated inserts, deduplicated in materialized views too
PINNED = {"async_insert": 0, "insert_deduplicate": 1, "deduplicate_blocks_in_dependent_materialized_views": 1}


# inside a SQL string literal: backslashes first, then quotes
_SQL_STRING_ESCAPES = (("\\", "\\\\"), ("'", "\\'"))


# How decoded rows' text is written: UTF-8, with the bytes a String value held that are not UTF-8 (decoded with
# surrogateescape, as the String converter does) written back as they were, since a String column holds bytes.
# strict UTF-8 would fail the whole insert on one such value, and with it the sink.
STRING_ENCODING = "chsink_utf8_bytes"


def _string_codec(name: str) -> codecs.CodecInfo | None:
    if name != STRING_ENCODING:
        return None
    return codecs.CodecInfo(name=STRING_ENCODING,
                            encode=lambda s, errors="strict": (s.encode("utf-8", "surrogateescape"), len(s)),
                            decode=lambda b, errors="strict": (bytes(b).decode("utf-8", "surrogateescape"), len(b)))


codecs.register(_string_codec)


def _sent_as(type_text: str, column: Sequence[Any]) -> str:
    """The type a column goes out as: its own, but a Dynamic column as a Variant of the types its values took
    (formats/chtypes.dynamic_type), which ClickHouse stores in the Dynamic column with each value's type
    (clickhouse-connect would send it as String, every value its text)."""
    if type_text != "Dynamic" and not type_text.startswith("Dynamic("):
        return type_text
    members = sorted({v.type_name for v in column if v is not None})
    return f"Variant({', '.join(members or ['String'])})"


class _Pieces:
    """Views read one after the other as one body: clickhouse-connect writes a readable body to chdb's file piece
    by piece and streams it over HTTP (an iterable of views it would not take for chdb)."""

    def __init__(self, views: Sequence[memoryview]) -> None:
        self._views = iter(views)

    def read(self, size: int = -1) -> memoryview | bytes:
        return next(self._views, b"")


class InsertError(RuntimeError):
    """An insert failed permanently or ran out of retries."""

    @property
    def transient(self) -> bool:
        """Whether it failed for a reason that passes (an outage), not for what it carried."""
        return isinstance(self.__cause__, Exception) and is_transient(self.__cause__)


@dataclass(frozen=True)
class Recovery:
    """What a recovery check found for a retried block."""

    landed: int
    missing: tuple[int, ...]
    duplicated: tuple[int, ...]


Where = tuple[str, int]  # the topic and partition a block's offsets belong to


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
            # no coercions the decoder would not make: a number, bool, array or object is no String, a bool no
            # number, and a named tuple needs all its fields
            "input_format_json_read_numbers_as_strings": 0, "input_format_json_read_bools_as_strings": 0,
            "input_format_json_read_objects_as_strings": 0, "input_format_json_read_arrays_as_strings": 0,
            "input_format_json_read_bools_as_numbers": 0,
            "input_format_json_defaults_for_missing_elements_in_named_tuple": 0,
            "input_format_json_empty_as_default": 0,
        }
        self._types = [c.type_text or str(c.type) for c in schema.columns]
        # the columns whose DEFAULT ClickHouse computes at each insert; an Inserter's schema never changes
        self._computed_at_insert = {c.name: (c, c.default) for c in schema.columns if isinstance(c.default, AtInsert)}
        self._views: bool | None = None  # whether materialized views read the table (looked up when needed)

    def _settings(self, block: Block | LineBlock) -> dict[str, Any]:
        # lines are parsed under the same settings on every path, the at-least-once baseline's too: ClickHouse's
        # defaults would store values the decoder dead-letters (a number as a String's text), on threads of their own
        lines = self.line_settings if isinstance(block, LineBlock) else {}
        if not block.token:  # the at-least-once baseline
            return {**self.settings, "insert_deduplicate": 0, "async_insert": 0, **lines}
        settings = {
            **self.settings, **PINNED,
            "insert_deduplication_token": block.token,
            # one insert must stay one ClickHouse block, or the token suffixes would depend on sizes
            "max_insert_block_size": max(1_048_576, block.rows + 1),
            "min_insert_block_size_rows": 0,
            "min_insert_block_size_bytes": 0,
            **lines,
        }
        return settings

    def _send(self, block: Block | LineBlock) -> int:
        """One INSERT of the block as one ClickHouse block; returns its rows."""
        settings = self._settings(block)
        if isinstance(block, LineBlock):
            # views of the lines go out as the request body as they are: the lines are never copied. Pieces are
            # read one by one; over HTTP with their length given, or each would be copied into a chunk
            body = block.payload
            one = len(body) == 1
            self.client.raw_insert(self.schema.fqn, None, body[0] if one else _Pieces(body),  # type: ignore[arg-type]
                                   settings=settings, fmt="JSONEachRow",
                                   transport_settings=None if one else {"Content-Length": str(sum(map(len, body)))})
        else:
            names, data = self._at_insert(list(block.columns), list(block.data))
            types = [self._types[self.schema.names.index(n)] for n in names]
            types = [_sent_as(t, col) for t, col in zip(types, data, strict=True)]
            ctx = self.client.create_insert_context(self.schema.fqn, names, column_type_names=types,
                                                    column_oriented=True, settings=settings)
            ctx.req_block_size = max(1, block.rows)  # the client would cut ~2 MB blocks, each with its own token
            ctx.encoding = STRING_ENCODING
            ctx.data = data
            self.client.insert(context=ctx)
        self.inserts += 1
        return block.rows

    def _at_insert(self, names: list[str], data: list[Sequence[Any]]) -> tuple[list[str], list[Sequence[Any]]]:
        """The columns whose DEFAULT ClickHouse computes at each insert (AtInsert), as a JSON line without the
        field gets it: a column no row of the block gives a value is left out (ClickHouse computes it for the
        block); in one that mixes, the rows without get values ClickHouse computes now, in one query."""
        if not self._computed_at_insert:  # the common case: the block goes as it is
            return names, data
        out_names, out_data = [], []
        for name, column in zip(names, data, strict=True):
            if name in self._computed_at_insert:
                col, default = self._computed_at_insert[name]
                missing = [i for i, v in enumerate(column) if isinstance(v, AtInsert)]
                if len(missing) == len(column):
                    continue
                if missing:
                    from .clickhouse import default_values

                    column = list(column)
                    for i, v in zip(missing, default_values(self.client, default.expr, len(missing)), strict=True):
                        column[i] = col.conv(v)
            out_names.append(name)
            out_data.append(column)
        return out_names, out_data

    def insert(self, block: Block | LineBlock, where: Where | None = None) -> int:
        """Inserts one block; returns the rows sent. After a failed attempt, which may have committed, the next
        one re-sends only what did not land (`where` names the block's partition for that count)."""
        return self._attempts(block, where, recovering=False)

    def retry(self, block: Block | LineBlock, topic: str, partition: int) -> int:
        """Re-sends a BEFORE block so the end state holds each of its offsets exactly once; returns the rows
        sent (fewer than the block's when some had landed, and then only those rows count as inserted)."""
        return self._attempts(block, (topic, partition), recovering=True)

    def _attempts(self, block: Block | LineBlock, where: Where | None, recovering: bool) -> int:
        attempt = 0
        while True:
            try:
                return self._recover(block, where) if recovering else self._send(block)
            except Exception as e:
                attempt += 1
                if attempt > self.retries or not is_transient(e):
                    raise InsertError(f"insert of {block.rows} rows (token {block.token}) into {self.schema.fqn} "
                                      f"failed after {attempt} attempt(s): {e}") from e
                delay = self.backoff_s * 2 ** (attempt - 1)
                log.warning("transient insert error, retry %d/%d in %.1fs: %s", attempt, self.retries, delay, e)
                self.sleep(delay)
                recovering = bool(block.token)  # the failed attempt may have committed: count before re-sending

    def _recover(self, block: Block | LineBlock, where: Where | None) -> int:
        if not self.schema.has_offset_columns or where is None:
            return self._send(block)  # the identical block and token: the deduplication window drops a copy
        rec = self.check(block, *where)
        if rec.duplicated:
            log.error("offsets %s of %s/%d appear more than once in %s before retry", rec.duplicated[:10],
                      where[0], where[1], self.schema.fqn)
        if not rec.missing:
            if self._feeds_views():
                # ClickHouse commits the source part before the views' inserts, not atomically: a view may lack
                # a block the source holds. The identical block under its token is dropped by the source and
                # reaches each view, whose own deduplication drops what it has
                self._send(block)
            return 0
        if rec.landed == 0:
            return self._send(block)
        keep = [i for i, o in enumerate(block.offsets) if o in set(rec.missing)]
        token = f"{block.token}|rest:{rec.missing[0]}-{rec.missing[-1]}:{len(rec.missing)}"
        offsets = tuple(block.offsets[i] for i in keep)
        if isinstance(block, LineBlock):
            return self._send(replace(block, token=token, offsets=offsets, lines=block.lines.take(keep)))
        return self._send(replace(block, token=token, data=tuple([col[i] for i in keep] for col in block.data),
                                  offsets=offsets))

    def refused(self, lines: Any) -> list[int]:
        """The indexes of the JSON lines ClickHouse's parser refuses under the insert's settings: one read of
        them all with errors skipped (`format()`, nothing is written), each line tagged with its index. Empty
        when it refuses none (an insert failed for another reason) or the read itself fails."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        lines = whole(lines)
        n = len(lines)
        try:
            index = pc.cast(pa.array(np.arange(n)), pa.string())
            tagged = pc.binary_join_element_wise('{"_chsink_line":', index, ",",
                                                 pc.replace_substring(lines, "{", "", max_replacements=1), "")
            for a, b in _SQL_STRING_ESCAPES:
                tagged = pc.replace_substring(tagged, a, b)
            data = bytes(payload(tagged)).decode()
            columns = ", ".join(f"`{c.name}` {t}" for c, t in zip(self.schema.columns, self._types, strict=True))
            structure = f"{columns}, _chsink_line UInt64"
            for a, b in _SQL_STRING_ESCAPES:
                structure = structure.replace(a, b)
            sql = f"SELECT _chsink_line FROM format(JSONEachRow, '{structure}', '{data}')"
            settings = {**self.line_settings, "input_format_allow_errors_num": n + 1,
                        "input_format_allow_errors_ratio": 1, "max_query_size": len(sql) + 1024}
            # raw_query: the client's own query preparation scans the whole text with regular expressions
            read = self.client.raw_query(sql, settings=settings, fmt="TSV")
        except Exception as e:  # only a speed-up: the caller decodes the window instead
            log.warning("could not tell the refused lines apart: %s", first_line(e))
            return []
        kept = np.zeros(n, dtype=bool)
        if read.strip():
            kept[np.array(read.split(), dtype=np.int64)] = True
        return [int(i) for i in np.flatnonzero(~kept)]

    def _feeds_views(self) -> bool:
        if self._views is None:
            from .clickhouse import view_targets

            self._views = bool(view_targets(self.client, self.schema.database, self.schema.table))
        return self._views

    def landed(self, topic: str, partition: int, rng: OffsetRange) -> int | None:
        """Rows of the partition with offsets in rng in the table; None without the offset columns."""
        if not self.schema.has_offset_columns:
            return None
        return int(self.client.query(
            f"SELECT count() FROM {self.schema.fqn} WHERE _topic = {{t:String}} AND _partition = {{p:Int64}} "
            f"AND _offset BETWEEN {{lo:Int64}} AND {{hi:Int64}}",
            parameters={"t": topic, "p": partition, "lo": rng.min, "hi": rng.max}).result_rows[0][0])

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
