"""Routing keys read from JSONEachRow lines, as the decoder reads them (rows routed by `key` on the fast path).

A window's sub-blocks must be the same on the fast path and through the decoder, or a retry on the other
path would send a row to another shard under a token that shard has already seen. So each line's key is
the value the decoder's row would hold: Arrow's JSON reader, typed by the column, reads the plain lines
in one pass (it refuses a field given twice or of another type, which the decoder may read otherwise);
a line it cannot vouch for (a missing or null key, an escape in the line, a failed pass) is read by the
decoder's own functions. When even those fail, the decoder would dead-letter or read the record some
other way: there is no key, and the window takes the decoder.
"""

from __future__ import annotations

from typing import Any

from .chtypes import ConversionError
from .json import read_json
from .rows import DecodeError, nested_value
from .schema import Column

# The key column types Arrow's reader reads exactly as the decoder converts a JSON value of its own kind.
_ARROW = {"String": "string", "Int64": "int64", "UInt64": "uint64"}


def line_keys(lines: Any, col: Column) -> Any | None:
    """The key of each line (an Arrow string array of JSON objects, or pieces of one, one per line, each ending in a
    newline), in order, as a numpy array (of the key's own integers when the column is an integer one); None when a
    line's key is not one the decoder would read alike. Keys read whole by Arrow stay an array: a Python
    object per key cost more than the rest of routing a window."""
    import numpy as np
    import pyarrow as pa

    from ..core.blocks import whole

    if len(lines) == 0:
        return _key_array([], col)
    lines = whole(lines)  # Arrow's reader reads one buffer
    arrow_type = _arrow_type(col)
    picked = np.flatnonzero(_plain(lines)) if arrow_type else np.empty(0, dtype=np.int64)
    read = None
    if arrow_type and len(picked):
        read = _arrow_read(lines if len(picked) == len(lines) else lines.take(pa.array(picked, pa.int64())),
                           col.name, arrow_type)
        if read is not None and len(picked) == len(lines) and not isinstance(read, list):  # the common case
            return read
    keys: list[Any] = [None] * len(lines)
    if read is not None:
        for i, k in zip(picked.tolist(), read, strict=True):
            keys[i] = k
    rest = [i for i, k in enumerate(keys) if k is None]
    if rest:
        odd = lines.take(pa.array(rest, pa.int64())) if len(rest) < len(lines) else lines
        for i, raw in zip(rest, odd.view(pa.binary()).to_pylist(), strict=True):  # bytes: maybe not UTF-8
            try:
                keys[i] = decoder_key(raw, col)
            except (DecodeError, ConversionError):
                return None
    return _key_array(keys, col)


def _key_array(keys: list[Any], col: Column) -> Any:
    """Keys as a numpy array, as Arrow's reader gives them: the column's own integers for an integer column (each
    fits: the decoder converted it), else one Python object per key."""
    import numpy as np

    from ..core.routing import INT_DTYPES

    dtype = INT_DTYPES.get(_base(col).name)
    if dtype:
        return np.array(keys, dtype=dtype)
    out = np.empty(len(keys), dtype=object)  # not np.array(keys): that would make str keys a numpy string array
    out[:] = keys
    return out


def _base(col: Column) -> Any:
    return col.type.args[0] if col.type.name == "LowCardinality" else col.type


def decoder_key(line: bytes, col: Column) -> Any:
    """The key column's value in the row the decoder makes of this JSON object (DecodeError/ConversionError
    when it makes none of it)."""
    found, v = nested_value(read_json(line), col.name)
    return col.conv(v) if found else col.default


def _arrow_type(col: Column) -> str | None:
    """The Arrow type its reader reads the key column as, or None when the decoder reads every key."""
    if "." in col.name:  # a dotted name may be a Nested field: the decoder decides
        return None
    return _ARROW.get(_base(col).name)


def _plain(lines: Any) -> Any:
    """Which lines Arrow's reader may read (a numpy bool mask)."""
    import numpy as np

    from ..core.blocks import line_bounds, payload

    # the lines holding a backslash (an escape), found in their bytes at once: Arrow's substring search, line by
    # line, cost ten times more
    plain = np.ones(len(lines), dtype=np.bool_)
    at = np.flatnonzero(np.frombuffer(payload(lines), dtype=np.uint8) == ord("\\"))
    if len(at):
        plain[np.searchsorted(line_bounds(lines)[1:], at, side="right")] = False
    return plain


def _arrow_read(lines: Any, name: str, arrow_type: str) -> Any | None:
    """One pass of Arrow's JSON reader over the lines, typed by the column: each line's key, as a numpy array
    when every line has one, else a list with None where a line has none (missing or null); None when Arrow
    refuses any line."""
    import pyarrow as pa
    import pyarrow.json as pj

    from ..core.blocks import payload

    schema = pa.schema([(name, getattr(pa, arrow_type)())])
    opts = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    data = payload(lines)  # the lines' own bytes, not copied
    try:
        table = pj.read_json(pa.BufferReader(pa.py_buffer(data)),
                             # one block, parsed on this thread: Arrow's threads cost 15% more CPU for nothing
                             read_options=pj.ReadOptions(use_threads=False, block_size=max(len(data), 1 << 20)),
                             parse_options=opts)
        if table.num_rows != len(lines):
            return None
        read = table.column(0).combine_chunks()
        return read.to_pylist() if read.null_count else read.to_numpy(zero_copy_only=False)
    except (pa.ArrowException, UnicodeDecodeError):  # a line Arrow refuses, or text it let through undecoded
        return None
