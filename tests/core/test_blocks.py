"""Deterministic windows and the documented dedup-token format."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkapp.core.blocks import Block, LineBlock, build_blocks, cut_windows, dedup_token, split_block
from sparkapp.core.state_machine import OffsetRange as R


def test_token_format_is_pinned():
    assert dedup_token("orders-sink", "orders", 3, R(100, 199)) == "chsink1|orders-sink|orders|3||0|100-199"
    assert dedup_token("s", "t", 0, R(0, 9), table="db.events", shard=2) == "chsink1|s|t|0|db.events|2|0-9"


def test_token_escapes_separators():
    assert dedup_token("a|b", "t%", 0, R(1, 1)) == "chsink1|a%7Cb|t%25|0||0|1-1"
    assert dedup_token("a|b", "t", 0, R(1, 1)) != dedup_token("a", "b|t", 0, R(1, 1))


def test_windows_counted_from_range_start():
    assert cut_windows(R(5, 27), 10) == [R(5, 14), R(15, 24), R(25, 27)]
    assert cut_windows(R(5, 5), 10) == [R(5, 5)]
    with pytest.raises(ValueError):
        cut_windows(R(0, 1), 0)


def _rows(offsets):
    return [(o, [o, f"v{o}"]) for o in offsets]


def test_empty_windows_produce_no_block_and_rows_outside_fail():
    blocks = build_blocks(R(0, 29), _rows([0, 1, 25]), ["a", "b"], 10, lambda w: str(w))
    assert [b.window for b in blocks] == [R(0, 9), R(20, 29)]
    assert blocks[0].data == ([0, 1], ["v0", "v1"])
    with pytest.raises(ValueError, match="outside"):
        build_blocks(R(0, 9), _rows([3, 12]), ["a", "b"], 10, str)


@settings(max_examples=200, deadline=None)
@given(offsets=st.lists(st.integers(0, 500), min_size=1, max_size=80, unique=True).map(sorted),
       size=st.integers(1, 50), drop=st.sets(st.integers(0, 500)))
def test_same_range_same_windows_and_tokens_whatever_compaction_removed(offsets, size, drop):
    rng = R(offsets[0], offsets[-1])
    token = lambda w: dedup_token("s", "t", 0, w)  # noqa: E731
    full = build_blocks(rng, _rows(offsets), ["a", "b"], size, token)
    again = build_blocks(rng, _rows(offsets), ["a", "b"], size, token)
    assert full == again  # byte-identical on retry
    compacted = build_blocks(rng, _rows([o for o in offsets if o not in drop]), ["a", "b"], size, token)
    by_window = {b.window: b.token for b in full}
    assert all(by_window[b.window] == b.token for b in compacted)  # windows never shift
    assert sum(b.rows for b in full) == len(offsets)


@st.composite
def blocks_with_shards(draw):
    """A window's rows, as a decoded Block and as a LineBlock of the same lines, and a shard for each row."""
    import pyarrow as pa

    offsets = sorted(draw(st.sets(st.integers(0, 99), max_size=30)))
    shards = draw(st.lists(st.integers(0, 3), min_size=len(offsets), max_size=len(offsets)))
    names = [f"v{o}" for o in offsets]
    block = Block(R(0, 99), "t", ("name", "n"), (names, list(offsets)), tuple(offsets))
    # a window's lines are a slice of its partition's: here after another line
    lines = pa.array(['{"name":"before"}\n', *(f'{{"name":"{n}"}}\n' for n in names)], pa.string()).slice(1)
    line_block = LineBlock(R(0, 99), "t", tuple(offsets), lines, 0, tuple(names))
    return block, line_block, shards


@settings(max_examples=200)
@given(blocks_with_shards())
def test_split_block_groups_rows_by_shard_in_order(case):
    """One sub-block per shard present, in shard order, each with its rows in their order, its token and shard;
    a block wholly on one shard is the same block under that shard's token."""
    block, line_block, shards = case
    expected: dict[int, list[int]] = {}
    for i, s in enumerate(shards):
        expected.setdefault(s, []).append(i)
    for b in (block, line_block):
        out = split_block(b, shards, lambda s: f"t:{s}")
        assert [s for s, _ in out] == sorted(expected)
        for s, sub in out:
            idx = expected[s]
            assert (sub.token, sub.shard, sub.offsets) == (f"t:{s}", s, tuple(b.offsets[i] for i in idx))
            if isinstance(sub, Block):
                assert sub.data == tuple([col[i] for i in idx] for col in block.data)
            else:
                assert sub.keys == tuple(line_block.keys[i] for i in idx)
                assert b"".join(sub.payload) == b"".join(f'{{"name":"v{b.offsets[i]}"}}\n'.encode() for i in idx)
