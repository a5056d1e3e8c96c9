"""Schema evolution, pure: which fields become which Nullable columns."""

from __future__ import annotations

from sparkapp.formats.evolution import new_columns
from sparkapp.formats.schema import build_schema

SCHEMA = build_schema("db", "t", [("id", "UInt64", "", None), ("n.a", "Array(String)", "", None),
                                  ("_offset", "UInt64", "", None)])


def test_new_fields_take_the_type_their_values_ask_for_in_order_of_appearance():
    records = [{"id": 1, "s": "x", "b": True, "i": 5, "nothing": None},
               {"id": 2, "f": 1.5, "i": 2.5, "later": None, "obj": {"a": 1}, "arr": [1], "big": 2**64},
               {"later": "now", "b": 1, "s": 7, "n": [], "_topic": "t", "a.b": 1, "": 1}]
    assert new_columns(SCHEMA, records) == {
        "s": "Nullable(String)",  # a number later stays String's: the decoder dead-letters it
        "b": "Nullable(Bool)",
        "i": "Nullable(Float64)",  # an integer and a fraction widen to Float64
        "f": "Nullable(Float64)",
        "later": "Nullable(String)",  # null first, then text
    }


def test_known_fields_and_existing_columns_are_not_added():
    assert new_columns(SCHEMA, [{"id": 1, "m": 1, "x": "a"}], known={"m"}) == {"x": "Nullable(String)"}
    assert new_columns(SCHEMA, [{"id": 1}, {"n": [{"a": "x"}]}]) == {}
