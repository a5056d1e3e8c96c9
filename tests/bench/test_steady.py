"""Which batches a benchmark's rate is taken over (bench.measure.steady): pure, no run."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.measure import steady


def _batches(starts: list[float]) -> list[tuple[float, float, int]]:
    return [(s, s + 0.5, 1000) for s in starts]


def test_without_a_warm_up_only_the_first_batch_is_left_out():
    b = _batches([0.0, 1.0, 2.0])
    assert steady(b) == b[1:]
    assert steady(b[:1]) == b[:1]  # a lone batch is all there is


def test_a_warm_up_leaves_out_every_batch_that_starts_within_it():
    b = _batches([10.0, 12.0, 29.9, 30.0, 31.0])
    assert steady(b, 20.0) == b[3:]


def test_a_run_shorter_than_its_warm_up_is_refused():
    with pytest.raises(ValueError, match="give the run more events"):
        steady(_batches([0.0, 5.0, 9.0]), 20.0)


@given(st.lists(st.floats(0, 1e4), min_size=2, unique=True).map(sorted), st.floats(0, 1e4))
def test_kept_batches_are_a_tail_that_starts_after_the_warm_up(starts, warm):
    b = _batches(starts)
    try:
        kept = steady(b, warm)
    except ValueError:
        assert all(s < starts[0] + warm for s in starts[1:])
        return
    assert kept == b[len(b) - len(kept):] and b[0] not in kept
    assert all(k[0] >= starts[0] + warm for k in kept)
