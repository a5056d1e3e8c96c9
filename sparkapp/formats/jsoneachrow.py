"""The fast path for JSON: ClickHouse parses the records itself (JSONEachRow), Python never touches a row.

Each Kafka record whose value is a JSON object becomes one JSONEachRow line with the table's
metadata columns (`_topic`, `_partition`, `_offset`, `_timestamp`, `_key`, `_headers`, `_timestamp_type`)
spliced in, built with vectorized Arrow compute from the Arrow batch Spark hands over, and contiguous
slices of those lines go to ClickHouse as INSERT payloads, zero-copy. Windows and tokens are the same as on the decoding
path, so the exactly-once protocol does not change. A record ClickHouse cannot parse or fit, or could
alter (the Guard), is decoded alone by the Python decoder, which names it and dead-letters it; its
neighbours stay on this path (delivery/sift.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.blocks import cut_windows
from ..core.records import Message
from ..core.state_machine import OffsetRange
from .chtypes import CHType
from .rows import header_map
from .schema import METADATA_COLUMNS, TIMESTAMP_TYPES, TableSchema

_PLAIN_KEY = r"^[ !#-\[\]-~]*$"  # printable ASCII but `"` and `\\`: needs no JSON escaping


def build_lines(tbl: Any, schema_columns: Sequence[str], max_bytes: int) -> Any:
    """One JSONEachRow line per record of a partition's Arrow slice, NULL where the value is not a JSON
    object (vectorized Arrow compute; a few keys that need JSON escaping go through `json.dumps`).

    Metadata goes first; a null key is left out so that `_key` takes its default (NULL, or '' when not
    Nullable, as the decoder does); `_timestamp` is epoch seconds with milliseconds; the record's own
    fields follow.
    """
    import json

    import pyarrow as pa
    import pyarrow.compute as pc

    # every input as one contiguous array, so that each result is one too and the lines need no copy at the end
    value = _array(tbl.column("value"))
    text = value.view(pa.string()) if pa.types.is_binary(value.type) else value
    framed = pc.fill_null(pc.and_(pc.starts_with(text, "{"), pc.ends_with(text, "}")), False)
    body = text
    if not pc.all(framed).as_py() and _padded(text.filter(pc.invert(framed))):  # trimming copies: rarely
        body = pc.ascii_trim(text, " \t\r\n")
        framed = pc.fill_null(pc.and_(pc.starts_with(body, "{"), pc.ends_with(body, "}")), False)
    ok = pc.fill_null(pc.and_(framed, pc.less_equal(pc.binary_length(value), max_bytes)), False)
    parts: list[Any] = []
    if "_topic" in schema_columns and tbl.num_rows:
        parts.append(',"_topic":' + json.dumps(str(tbl.column("topic")[0])))
    for c in ("_partition", "_offset"):
        if c in schema_columns:
            parts += [f',"{c}":', pc.cast(_array(tbl.column(c[1:])), pa.string())]
    if "_timestamp" in schema_columns:
        ms = pc.cast(pc.cast(_array(tbl.column("timestamp")), pa.timestamp("ms", "UTC")), pa.int64())
        secs = pc.divide(ms, 1000)
        frac = pc.utf8_lpad(pc.cast(pc.subtract(ms, pc.multiply(secs, 1000)), pa.string()), 3, "0")
        parts += [',"_timestamp":', pc.cast(secs, pa.string()), ".", frac]
    if "_key" in schema_columns:
        key = _array(tbl.column("key"))
        ktext = key.view(pa.string()) if pa.types.is_binary(key.type) else key
        plain = pc.fill_null(pc.match_substring_regex(ktext, _PLAIN_KEY), True)
        quoted = pc.binary_join_element_wise(',"_key":"', ktext, '"', "")
        if not pc.all(plain).as_py():
            special = {i: ',"_key":' + json.dumps(bytes(k).decode("utf-8", errors="replace"), ensure_ascii=False)
                       for i, (k, p) in enumerate(zip(key.to_pylist(), plain.to_pylist(), strict=True)) if not p}
            escaped = pa.array([special.get(i, "") for i in range(len(key))], pa.string())
            quoted = pc.if_else(plain, quoted, escaped)
        parts.append(pc.fill_null(quoted, ""))  # a null key: no field at all
    if "_timestamp_type" in schema_columns:
        log_append = pc.equal(_array(tbl.column("timestampType")), 1) if "timestampType" in tbl.column_names else None
        kinds = [f',"_timestamp_type":"{t}"' for t in TIMESTAMP_TYPES]
        parts.append(kinds[0] if log_append is None else
                     pc.if_else(pc.fill_null(log_append, False), kinds[1], kinds[0]))
    if "_headers" in schema_columns:
        parts.append(_header_parts(tbl))
    if not parts:
        return _unless(ok, pc.binary_join_element_wise(body, "\n", ""))
    if isinstance(parts[0], str):  # each part carries its leading comma; the first opens the object
        parts[0] = "{" + parts[0][1:]
    else:
        parts = [pc.replace_substring(pc.binary_join_element_wise(*parts, ""), ",", "{", max_replacements=1)]
    rest = pc.replace_substring(body, "{", ",", max_replacements=1)  # byte-wise: safe on any bytes
    if pc.any(pc.less(pc.binary_length(body), 16)).as_py():  # an empty object `{ }` closes the metadata
        empty = pc.fill_null(pc.match_substring_regex(body, r"^\{[ \t\r\n]*\}$"), False)
        rest = pc.if_else(empty, "}", rest)
    line = pc.binary_join_element_wise(*parts, rest, "\n", "")  # one pass, one allocation
    return _unless(ok, line)


def _padded(values: Any) -> bool:
    """Whether a value begins or ends with JSON whitespace. Asked of the values not framed by braces only: a framed
    one has none to trim, so when no other has any, trimming (a copy of every value) would change nothing; a
    batch with bad records, which are seldom padded, then keeps its values as they are."""
    import pyarrow.compute as pc

    return bool(pc.any(pc.match_substring_regex(values, r"^[ \t\r\n]|[ \t\r\n]$")).as_py())


def _header_parts(tbl: Any) -> Any:
    """`,"_headers":{...}` of each record: the map rows.header_map makes, as JSON (one constant when no record
    has headers, the common case; else built record by record)."""
    import json

    import pyarrow as pa
    import pyarrow.compute as pc

    empty = ',"_headers":{}'
    if "headers" not in tbl.column_names:
        return empty
    col = _array(tbl.column("headers"))
    if not pc.any(pc.fill_null(pc.greater(pc.list_value_length(col), 0), False)).as_py():
        return empty
    return pa.array([',"_headers":' + json.dumps(header_map((h["key"], h["value"]) for h in hs or ()),
                                                 ensure_ascii=False) for hs in col.to_pylist()], pa.string())


def _array(a: Any) -> Any:
    """One Arrow array: a chunked array's only chunk as it is (combine_chunks would copy even that)."""
    if not hasattr(a, "combine_chunks"):
        return a
    return a.chunk(0) if a.num_chunks == 1 else a.combine_chunks()


def _unless(ok: Any, lines: Any) -> Any:
    """The lines, NULL where not `ok`: `ok`'s bits become the lines' validity, so that a batch with bad records
    does not copy its lines for them (null slots keep their bytes, which nothing reads: `payload` refuses a slice
    holding one, and the sifting drops them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lines = _array(lines)
    if ok.null_count:  # an unknown is not ok
        ok = pc.fill_null(ok, False)
    if pc.all(ok).as_py():
        return lines
    valid = _array(pc.and_(ok, pc.is_valid(lines)) if lines.null_count else ok)
    if valid.offset or lines.offset:  # bits that would not line up: copy instead
        return _array(pc.if_else(ok, lines, pa.scalar(None, lines.type)))
    return pa.Array.from_buffers(lines.type, len(lines), [valid.buffers()[1], *lines.buffers()[1:]])


# Types whose JSON parsing in ClickHouse is at least as strict as the decoder's: a value that does not
# fit raises (and the window takes the decoder). Narrower integers, Date/DateTime, Float32 and JSON are
# not: ClickHouse wraps 300 into a UInt8 as 44, saturates dates and overflows Float32 to inf, silently.
_STRICT_IN_CLICKHOUSE = {"Int64", "UInt64", "Int128", "UInt128", "Int256", "UInt256", "Float64", "Bool", "String",
                         "FixedString", "UUID", "DateTime64", "IPv4", "IPv6", "Enum8", "Enum16", "Decimal",
                         "Decimal32", "Decimal64", "Decimal128", "Decimal256"}
_CONTAINERS = {"Nullable", "LowCardinality", "Array", "Map", "Tuple"}
_INT_BITS = {f"{p}Int{b}": b for p in ("", "U") for b in (64, 128, 256)}


def strict_in_clickhouse(t: CHType, nested: bool = False) -> bool:
    if t.name in _CONTAINERS:
        return all(strict_in_clickhouse(a, nested or t.name != "Nullable") for a in t.args if isinstance(a, CHType))
    return t.name in _STRICT_IN_CLICKHOUSE and not (nested and t.name == "DateTime64")  # see Guard


def eligible(schema: TableSchema) -> bool:
    """A table without Nested-flattened (`a.b`) columns or names that need JSON escaping, whose columns
    ClickHouse all parses strictly, with the Guard (the metadata columns are filled by chsink itself)."""
    return all(
        "." not in c.name and re.fullmatch(_PLAIN_KEY, c.name) is not None
        and (c.name in METADATA_COLUMNS or strict_in_clickhouse(c.type)) for c in schema.columns)


# digits from which an integer literal may not fit a (U)Int of that many bits: ClickHouse wraps it silently
_OVERFLOW_DIGITS = {64: 19, 128: 39, 256: 77}


def _leaves(t: CHType) -> list[CHType]:
    if t.name in _CONTAINERS:
        return [leaf for a in t.args if isinstance(a, CHType) for leaf in _leaves(a)]
    return [t]


def _zeroed_by_null(t: CHType) -> bool:
    """Whether a container holds a non-Nullable leaf that ClickHouse fills with 0 for a JSON null (a String
    leaf rejects it)."""
    if t.name == "Nullable":
        return False
    if t.name in _CONTAINERS:
        return any(_zeroed_by_null(a) for a in t.args if isinstance(a, CHType))
    return t.name not in ("String", "FixedString")


def _loose_time(key: str) -> str:
    """A DateTime64 value other than "YYYY-MM-DD hh:mm:ss[.f{1,9}]" (or T for the space) or an integer of
    at most 11 digits: each way text can leave that form, as one RE2 alternation (RE2 has no lookahead)."""
    form = [r"\d"] * 4 + ["-"] + [r"\d"] * 2 + ["-"] + [r"\d"] * 2 + ["[ T]"] + [r"\d"] * 2 + [":"] + \
        [r"\d"] * 2 + [":"] + [r"\d"] * 2
    off = {r"\d": r"[^\d]", "-": "[^-]", "[ T]": "[^ T]", ":": "[^:]"}
    full = "".join(form)
    quoted = [("".join(form[:i]) + off[c]) for i, c in enumerate(form)]
    quoted += [full + r'[^".]', full + r"\.[^\d]", full + r'\.\d{1,9}[^"\d]', full + r"\.\d{10}"]
    return key + r'\s*(?:"(?:' + "|".join(quoted) + r')|[^"\d\-n\s]|-?\d{12}|-?\d+\s*[.eE])'


@dataclass(frozen=True)
class Guard:
    """What ClickHouse's JSON parser accepts but alters, which no input-format setting turns off: integer
    literals too long for the column (wrapped), `""` in a number or Decimal column and null in a non-Nullable
    one (stored as 0), a Decimal string with two dots ("1.2.3" as 1.23), null inside a container (as 0), and
    DateTime64 text outside the one form both parsers read alike (best-effort parsing reads "12" as the 12th
    of this month). A line that may hold one goes through the decoder, which names the problem; the rest
    are left to ClickHouse. One RE2 pass over the window's lines (about 0.15 s per
    200,000 lines of 250 bytes here): false alarms only cost speed.

    `refusing` foresees the commonest lines ClickHouse refuses (text in a number column), and the lines only
    the decoder can judge (a surrogate escape: a pair is fine, a lone one is not): caught here, they cost the
    decoder one record each instead of a refused insert and a search for its bad lines. A line only it flags
    that the decoder keeps stays a line."""

    pattern: str = ""  # a line matching it is suspect
    refusing: str = ""  # a line matching it is likely refused

    def suspect(self, lines: Any) -> bool:
        return bool(self.flagged(lines))

    def flagged(self, lines: Any) -> list[int]:
        """The indexes of the suspect lines."""
        return _matching(lines, self.pattern)

    def hits(self, lines: Any) -> tuple[list[int], list[int]]:
        """(suspect, likely refused but not suspect) line indexes, in one pass over the lines."""
        import pyarrow as pa

        both = _matching(lines, "|".join(f"(?:{p})" for p in (self.pattern, self.refusing) if p))
        if not both or not (self.pattern and self.refusing):
            return (both, []) if self.pattern else ([], both)
        few = lines.take(pa.array(both, pa.int64()))
        suspect = {both[i] for i in _matching(few, self.pattern)}
        return sorted(suspect), [i for i in both if i not in suspect]


def _matching(lines: Any, pattern: str) -> list[int]:
    import numpy as np
    import pyarrow.compute as pc

    if not pattern:
        return []
    hits = pc.match_substring_regex(lines, pattern)
    if hits.null_count:  # a record without a line matches nothing
        hits = pc.fill_null(hits, False)
    return [int(i) for i in np.flatnonzero(hits.to_numpy(zero_copy_only=False))]


# top-level column types whose JSON text ClickHouse refuses unless it reads as a number
_NUMERIC = {*_INT_BITS, "Float64", "Decimal", "Decimal32", "Decimal64", "Decimal128", "Decimal256"}


_LOW_SURROGATE_ESCAPE = r"\\u[dD][c-fC-F]"


def _refusing(key: str) -> str:
    """A number column's value that is neither a number, a quoted number nor null: text, true/false, [ or {."""
    return key + r'\s*(?:"[^"]*[^"0-9.eE+\-]|[^"0-9\-n\s])'


def guard(schema: TableSchema) -> Guard:
    """The table's Guard (see there), from its column types."""
    patterns: list[str] = []
    bits = [_INT_BITS[leaf.name] for c in schema.columns if c.name not in METADATA_COLUMNS
            for leaf in _leaves(c.type) if leaf.name in _INT_BITS]
    if bits:
        patterns.append(rf"\d{{{_OVERFLOW_DIGITS[min(bits)]},}}")
    for c in schema.columns:
        if c.name in METADATA_COLUMNS:
            continue
        numeric = [leaf for leaf in _leaves(c.type) if leaf.name in _INT_BITS or leaf.name.startswith("Decimal")]
        key = '"' + re.escape(c.name) + '":'
        if numeric:
            patterns.append('""' if c.type.name not in ("Nullable", *_INT_BITS) and not
                            c.type.name.startswith("Decimal") else key + r'\s*""')
        if any(leaf.name.startswith("Decimal") for leaf in numeric):
            patterns.append(r'"[-+]?\d*\.\d*\.')  # "1.2.3" is read as 1.23
        if c.type.name != "Nullable":
            patterns.append(key + r"\s*null")  # stored as 0 in (U)Int128/256 whatever input_format_null_as_default
        if c.type.name in ("Array", "Map", "Tuple") and _zeroed_by_null(c.type):  # a null element is read as 0
            patterns.append(r"[\[,]\s*null" if c.type.name == "Array" else "null")
        if c.type.name == "DateTime64" or (c.type.name == "Nullable" and c.type.args[0].name == "DateTime64"):
            patterns.append(_loose_time(key))
    refusing = [_refusing('"' + re.escape(c.name) + '":') for c in schema.columns if c.name not in METADATA_COLUMNS
                and _unwrapped(c.type).name in _NUMERIC]
    # a low surrogate escape: ClickHouse stores a lone one (anywhere in the line, even in a field no column takes)
    # as bytes that are no UTF-8, where the decoder refuses it as it and ClickHouse refuse a lone high one; in a
    # pair (an escaped emoji) the decoder keeps the line, and it stays a line
    refusing.append(_LOW_SURROGATE_ESCAPE)
    return Guard("|".join(f"(?:{p})" for p in dict.fromkeys(patterns)), "|".join(f"(?:{p})" for p in refusing))


def _unwrapped(t: CHType) -> CHType:
    while t.name in ("Nullable", "LowCardinality") and t.args and isinstance(t.args[0], CHType):
        t = t.args[0]
    return t


def null_indexes(lines: Any) -> list[int]:
    """The indexes of the records without a line (their few indexes, not a mask over all of them)."""
    import pyarrow.compute as pc

    if not lines.null_count:
        return []
    return [int(i) for i in pc.indices_nonzero(pc.is_null(lines)).to_numpy()]


def window_slices(offsets: Any, windows: Sequence[OffsetRange]) -> list[tuple[OffsetRange, int, int]]:
    """(window, i, j): the rows [i, j) of sorted `offsets` inside each window that holds any."""
    import numpy as np

    arr = np.asarray(offsets)
    out = []
    for w in windows:
        i, j = int(np.searchsorted(arr, w.min, "left")), int(np.searchsorted(arr, w.max, "right"))
        if j > i:
            out.append((w, i, j))
    return out


@dataclass
class LineBatch:
    """One partition's batch on the fast path: sorted offsets, their lines, and messages on demand.

    Values become Messages only for the records the decoder must see (`take`: those without a line, a bad
    record a window sifts out); `messages` may re-read the batch from Kafka when the decoding path needs
    all of them.
    """

    offsets: list[int]
    lines: Any  # pyarrow string array aligned with offsets; null where the value is not a JSON object
    messages: Callable[[], list[Message]]
    take: Callable[[Sequence[int]], list[Message]]  # the records at these offsets, values included

    @property
    def complete(self) -> bool:
        return int(self.lines.null_count) == 0

    def odd(self) -> list[Message]:
        """The records without a line."""
        return self.take([self.offsets[i] for i in null_indexes(self.lines)])

    def windows(self, rng: OffsetRange, block_offsets: int) -> list[tuple[OffsetRange, tuple[int, ...], Any]]:
        """(window, offsets, lines) of the range's windows that hold records, slices of the batch: a record
        without a line is still there as a null, which the window's sifting drops along with its bad lines
        (one copy of the lines, not one for each)."""
        out = []
        for w, i, j in window_slices(self.offsets, cut_windows(rng, block_offsets)):
            # offsets as Python ints: no per-element conversion on the common path
            out.append((w, tuple(self.offsets[i:j]), self.lines.slice(i, j - i)))
        return out
