"""Shard routing (pure), property-tested, and checked against ClickHouse's own hash functions."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkapp.core.routing import (
    HASHABLE_KEY_TYPES,
    HashName,
    Layout,
    Policy,
    assign_partitions,
    hash64,
    hashes64,
    key_bytes,
    rebalance,
    stripe_shard,
    weighted_shard,
)

parts = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 40)), unique=True, max_size=60)
weights = st.lists(st.integers(1, 5), min_size=1, max_size=6)


def test_hashes_match_clickhouse(ch_db):
    client, _ = ch_db
    [row] = client.query("SELECT xxHash64('customer-42'), cityHash64('customer-42'), xxHash64(toUInt64(5)), "
                         "cityHash64(toUInt32(7)), xxHash64(toInt32(-3)), cityHash64(toInt32(-3)), "
                         "cityHash64(toUInt64(18446744073709551615))").result_rows
    assert row[0] == hash64(HashName.XXHASH64, key_bytes("customer-42", "String"))
    assert row[1] == hash64(HashName.CITYHASH64, key_bytes("customer-42", "String"))
    assert row[2] == hash64(HashName.XXHASH64, key_bytes(5, "UInt64"))
    assert row[3] == hash64(HashName.CITYHASH64, key_bytes(7, "UInt32"), numeric=True)
    assert row[4] == hash64(HashName.XXHASH64, key_bytes(-3, "Int32"))
    assert row[5] == hash64(HashName.CITYHASH64, key_bytes(-3, "Int32"), numeric=True)
    assert row[6] == hash64(HashName.CITYHASH64, key_bytes(2**64 - 1, "UInt64"), numeric=True)


INT_KEY_TYPES = [t for t in HASHABLE_KEY_TYPES if t != "String"]


def int_range(type_name: str) -> tuple[int, int]:
    bits = int(type_name.removeprefix("U").removeprefix("Int"))
    return (0, 2**bits - 1) if type_name.startswith("U") else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def edge_values(type_name: str) -> list[int]:
    lo, hi = int_range(type_name)
    return [v for v in (lo, lo + 1, -129, -128, -1, 0, 1, 127, 128, 255, 256, 65535, 65536, 2**31, 2**32 - 1, 2**32,
                        2**63 - 1, hi - 1, hi, 7_919, 1_000_003, 123_456_789_012) if lo <= v <= hi]


def reference_shards(lay: Layout, keys: list) -> list[int]:
    """What Layout.row_shards must give: the per-value functions, one key at a time."""
    base = lay.key_type.removeprefix("LowCardinality(").removesuffix(")")
    return [weighted_shard(hash64(lay.hash, key_bytes(k, base), "Int" in base), lay.weights) for k in keys]


@pytest.mark.parametrize("type_name", HASHABLE_KEY_TYPES)
def test_hashes_over_arrays_match_clickhouse(ch_db, type_name):
    """Every key type's edge values, both hashes, computed by ClickHouse itself and by the vectorized hashes."""
    client, _ = ch_db
    values = ["", "a", "customer-42", "ü" * 40, "x" * 31, "y" * 32, "z" * 33] if type_name == "String" else \
        edge_values(type_name)
    literal = "[" + ", ".join(f"'{v}'" if isinstance(v, str) else str(v) for v in values) + "]"
    [row] = client.query(f"SELECT arrayMap(x -> xxHash64(CAST(x AS {type_name})), {literal}), "
                         f"arrayMap(x -> cityHash64(CAST(x AS {type_name})), {literal})").result_rows
    assert hashes64(HashName.XXHASH64, values, type_name).tolist() == list(row[0])
    assert hashes64(HashName.CITYHASH64, values, type_name).tolist() == list(row[1])


@st.composite
def keyed_layouts(draw):
    type_name = draw(st.sampled_from([*HASHABLE_KEY_TYPES, "LowCardinality(String)"]))
    if "String" in type_name:
        keys = draw(st.lists(st.text(max_size=40), max_size=40))
    else:
        lo, hi = int_range(type_name)
        keys = draw(st.lists(st.one_of(st.integers(lo, hi), st.sampled_from(edge_values(type_name))), max_size=40))
    lay = Layout(0, tuple(draw(weights)), Policy.KEY, draw(st.sampled_from(list(HashName))), type_name, key="k")
    return lay, keys


@given(keyed_layouts())
def test_row_shards_over_arrays_are_the_per_value_reference(case):
    lay, keys = case
    assert lay.row_shards(range(len(keys)), keys) == reference_shards(lay, keys)


@pytest.mark.parametrize("type_name", INT_KEY_TYPES)
@pytest.mark.parametrize("keys", [[1, 2**64], [-(2**63) - 1], [5, -200], [300], [70_000], [2**40], [3, 1.5], [4, "5"],
                                  [None], [True, 0]])
def test_keys_the_array_cannot_hold_take_the_per_value_way(type_name, keys):
    """Out of the column's range, a float, text, None: the same outcome (shards or error) as the reference;
    numpy would have wrapped or parsed some of them."""
    lay = Layout(0, (1, 2), Policy.KEY, HashName.XXHASH64, type_name, key="k")
    try:
        expected: object = reference_shards(lay, keys)
    except Exception as e:  # the reference's own error is the expectation
        with pytest.raises(type(e)):
            lay.row_shards(range(len(keys)), keys)
        return
    assert lay.row_shards(range(len(keys)), keys) == expected


@given(st.lists(st.integers(0, 10**12), max_size=30), st.integers(1, 1000), st.integers(1, 8))
def test_offset_stripes_over_arrays(offsets, stripe, shards):
    lay = Layout(0, (1,) * shards, Policy.OFFSET_STRIPE, stripe=stripe)
    assert lay.row_shards(offsets) == [stripe_shard(o, stripe, shards) for o in offsets]


@given(st.integers(0, 2**64 - 1), weights)
def test_weighted_shard_is_distributed_style(h, w):
    slot = h % sum(w)
    shard = weighted_shard(h, w)
    assert sum(w[:shard]) <= slot < sum(w[: shard + 1])


@given(st.integers(0, 10**12), st.integers(1, 1000), st.integers(1, 8))
def test_stripe(offset, stripe, shards):
    assert stripe_shard(offset, stripe, shards) == (offset // stripe) % shards


@given(parts, weights, parts)
def test_assignment_is_stable_when_partitions_are_added(first, w, more):
    before = assign_partitions(first, w)
    after = assign_partitions([*first, *more], w, before)
    assert all(after[tp] == s for tp, s in before.items())
    assert set(after.values()) <= set(range(len(w)))


@given(parts, weights, weights)
def test_rebalance_keeps_shards_within_their_share_and_moves_only_what_it_must(p, old_w, new_w):
    old = assign_partitions(p, old_w)
    new, moves = rebalance(p, new_w, old)
    assert set(new) == set(p) and set(new.values()) <= set(range(len(new_w)))
    counts = [sum(1 for s in new.values() if s == i) for i in range(len(new_w))]
    for i, c in enumerate(counts):
        assert c <= math.ceil(len(p) * new_w[i] / sum(new_w) - 1e-9) + 1
    assert {(m.topic, m.partition) for m in moves} == {tp for tp in p if old.get(tp) != new[tp]}
    for m in moves:  # a partition leaves a surviving shard only if that shard was over its share
        if m.old is not None and m.old < len(new_w):
            assert sum(1 for s in old.values() if s == m.old) > math.ceil(len(p) * new_w[m.old] / sum(new_w) - 1e-9)
