"""Shard routing (pure), property-tested, and checked against ClickHouse's own hash functions."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from sparkapp.core.routing import (
    HashName,
    assign_partitions,
    hash64,
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
