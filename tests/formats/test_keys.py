"""Routing keys read from JSONEachRow lines agree with the decoder's rows, or are not read at all (pure).

The fast path splits a window by these keys and the decoding path by the decoder's key column: were they
to differ for one record, a retry on the other path would route it to another shard (see formats/keys.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkapp.formats.jsoneachrow import build_lines
from sparkapp.formats.keys import _plain, line_keys
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from sparkapp.formats.rows import DecodeError
from sparkapp.formats.schema import build_schema
from tests.helpers import messages_table, msg

KEY_TYPES = ("String", "LowCardinality(String)", "Int64", "UInt64")

values = st.one_of(
    st.integers(-(2**64), 2**65), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6),
    st.sampled_from(["5", " 7", "1e2", "-0", "ü", 'a"b', "a\\b", "\ud800x"]), st.booleans(), st.none(),
    st.lists(st.integers(0, 3), max_size=2), st.just({"k": 1}))


@st.composite
def raw_records(draw: Any) -> bytes:
    """A JSON object in one of the forms a producer writes: the key plain, escaped, missing, nested, twice."""
    form = draw(st.sampled_from(["plain", "ascii", "missing", "nested", "twice", "spaced"]))
    k = draw(values)
    if form == "missing":
        return json.dumps({"id": 1}).encode()
    if form == "nested":
        return json.dumps({"attrs": {"k": k}, "k": draw(values)}).encode()
    if form == "twice":
        return b'{"k":' + json.dumps(k).encode() + b',"k":' + json.dumps(draw(values)).encode() + b"}"
    if form == "spaced":
        return b'{ "id" : 1 , "k" : ' + json.dumps(k, ensure_ascii=False).encode("utf-8", "surrogatepass") + b" }"
    try:
        return json.dumps({"id": 1, "k": k}, ensure_ascii=form == "ascii").encode()
    except UnicodeEncodeError:  # a lone surrogate, as raw bytes: not UTF-8
        return json.dumps({"id": 1, "k": k}).encode()


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(KEY_TYPES), st.lists(raw_records(), min_size=1, max_size=12))
def test_keys_are_the_decoders_or_none(key_type, raws):
    schema = build_schema("db", "t", [("id", "UInt64", "", None), ("k", key_type, "", None)])
    decode = make_decoder(DecoderSpec(Format.JSON), schema)
    messages = [msg(raw, offset=i) for i, raw in enumerate(raws)]
    lines = build_lines(messages_table(messages), schema.names, 8 << 20)
    if lines.null_count:  # not an object: the job decodes it alone, it never reaches a window's lines
        return
    keys = line_keys(lines, schema.columns[1])
    expected: list[Any] = []
    for m in messages:
        try:
            expected.append(decode(m)[1])
        except DecodeError:
            assert keys is None, f"a key read for {m.value!r}, which the decoder dead-letters"
            return
    if keys is not None:
        assert keys.tolist() == expected
        assert all(type(a) is type(b) for a, b in zip(keys.tolist(), expected, strict=True))


def test_plain_keys_are_read_in_one_arrow_pass_and_odd_ones_alike():
    """Escaped, missing and spaced keys beside plain ones: every key read, each as the decoder reads it."""
    raws = [b'{"id":1,"k":"a"}', b'{"id":2,"k":"\\u00fc\\""}', b'{"id":3}', b'{ "k" : "b" , "id":4}']
    schema = build_schema("db", "t", [("id", "UInt64", "", None), ("k", "String", "", None)])
    lines = build_lines(messages_table([msg(r, offset=i) for i, r in enumerate(raws)]), schema.names, 8 << 20)
    assert line_keys(lines, schema.columns[1]).tolist() == ["a", 'ü"', "", "b"]
    broken = build_lines(messages_table([msg(b'{"id":1,"k":"\xed\xa0\x80"}')]), schema.names, 8 << 20)
    assert line_keys(broken, schema.columns[1]).tolist() == ["\ud800"]  # not UTF-8, read as Python's json reads it
    text = build_schema("db", "t", [("id", "UInt64", "", None), ("k", "Int64", "", None)])
    assert line_keys(lines, text.columns[1]) is None  # text in an Int64 key: the decoder dead-letters it


@pytest.mark.parametrize("key_type", ["UInt64", "Int64", "Int32", "LowCardinality(String)"])
def test_keys_stay_one_array_of_the_columns_own_type(key_type):
    """A window's keys are one numpy array, of the column's integers for an integer key, whether Arrow's reader
    read them all or some took the decoder's functions: no Python object per key on the way to their shards."""
    import numpy as np

    schema = build_schema("db", "t", [("id", "UInt64", "", None), ("k", key_type, "", None)])
    number = key_type != "LowCardinality(String)"
    plain = [json.dumps({"id": i, "k": i if number else f"u{i}"}).encode() for i in range(5)]
    for raws in (plain, [*plain, b'{"id":9,"k":' + (b'7' if number else b'"\\u0041"') + b',"s":"\\n"}']):
        lines = build_lines(messages_table([msg(r, offset=i) for i, r in enumerate(raws)]), schema.names, 8 << 20)
        keys = line_keys(lines, schema.columns[1])
        assert isinstance(keys, np.ndarray)
        assert keys.dtype == (np.dtype(key_type.lower()) if number else np.dtype(object))
        assert keys.tolist()[:5] == [i if number else f"u{i}" for i in range(5)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([b'{"k":"a"}', b'{"k":"\\u00fc"}', b'{"k":"b\\\\c"}', b'{"id":"\\"","k":"d"}',
                                 b'{"k":"e"}']), min_size=1, max_size=20), st.data())
def test_lines_with_an_escape_are_found_in_a_windows_slice(raws, data):
    """The lines Arrow's reader reads are those without a backslash, found in a window's slice of the partition's
    lines (its first line not at the start of the buffer), each escape charged to its own line."""
    schema = build_schema("db", "t", [("id", "String", "", None), ("k", "String", "", None)])
    lines = build_lines(messages_table([msg(r, offset=i) for i, r in enumerate(raws)]), schema.names, 8 << 20)
    i = data.draw(st.integers(0, len(raws) - 1))
    j = data.draw(st.integers(i + 1, len(raws)))
    window = lines.slice(i, j - i)
    assert _plain(window).tolist() == [b"\\" not in r for r in raws[i:j]]
