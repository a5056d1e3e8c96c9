"""JSON records: reasons speak JSON's language, whatever Python type a value decodes to."""

from __future__ import annotations

import pytest

from sparkapp.formats.json import read_json
from sparkapp.formats.rows import DecodeError


@pytest.mark.parametrize(("value", "kind"), [
    (b"null", "null"), (b"[1, 2]", "an array"), (b'"text"', "a string"), (b"12", "a number"), (b"1.5", "a number"),
    (b"true", "a boolean"),
])
def test_a_json_value_that_is_not_an_object_is_named_as_json_names_it(value: bytes, kind: str) -> None:
    with pytest.raises(DecodeError) as e:
        read_json(value)
    assert str(e.value) == f"JSON value is {kind}, expected an object"
    assert "NoneType" not in str(e.value)


@pytest.mark.parametrize("text", ["-48209386309284.3501", "99999999999999999999999999999999.9999", "1.0000",
                                  "-0.0001", "1e-4", "12345678901234567890.1234"])
def test_decimal_values_keep_every_digit_the_record_wrote(ch_db, text: str) -> None:
    """Decoded in Python or parsed by ClickHouse (the fast path), a Decimal(38, 4) value is stored as written."""
    import decimal

    from sparkapp.core.records import Message
    from sparkapp.edges.clickhouse import load_schema
    from sparkapp.formats.registry import DecoderSpec, make_decoder

    client, db = ch_db
    for t in ("py", "ch"):
        client.command(f"CREATE TABLE {t} (v Decimal(38, 4)) ENGINE = MergeTree ORDER BY tuple()")
    record = ('{"v": ' + text + "}").encode()
    row = make_decoder(DecoderSpec(), load_schema(client, db, "py"))(Message("t", 0, 0, record))
    assert row == [decimal.Decimal(text).quantize(decimal.Decimal("0.0001"), context=decimal.Context(prec=100))]
    client.insert("py", [row], column_names=["v"])
    client.raw_insert("ch", None, record, fmt="JSONEachRow")
    [[py]] = client.query("SELECT toString(v) FROM py").result_rows
    [[ch]] = client.query("SELECT toString(v) FROM ch").result_rows
    assert py == ch and decimal.Decimal(py) == decimal.Decimal(text), (text, py, ch)
