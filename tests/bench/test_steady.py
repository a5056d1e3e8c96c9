"""Which batches a benchmark's rate is taken over (bench.measure.steady), a peer's polled row counts as such
batches (as_batches), the rate over them (rate), and the repeated runs a warm measurement takes (after_warm_up): pure, no run."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.measure import after_warm_up, as_batches, rate, steady


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


def test_a_warm_up_repeats_the_run_until_it_has_passed_then_measures_one_more():
    now = [0.0]

    def clock() -> float:
        return now[0]

    def run() -> int:
        now[0] += 4.0  # each run takes 4 seconds
        return int(now[0])

    assert after_warm_up(run, 10.0, clock) == 16  # runs ending at 4, 8 and 12 warm it; the fourth counts
    now[0] = 0.0
    assert after_warm_up(run, 0.0, clock) == 4  # no warm-up: one run


def test_polls_become_batches_of_the_rows_each_found_new():
    polls = [(0.0, 0), (1.0, 0), (2.0, 500), (3.0, 500), (4.0, 1200)]
    assert as_batches(polls) == [(1.0, 2.0, 500), (3.0, 4.0, 700)]
    # the rows found by the first poll that saw any are left out, as a job's first batch is
    assert steady(as_batches(polls)) == [(3.0, 4.0, 700)]


@given(st.lists(st.integers(0, 10_000), min_size=1).map(lambda xs: sorted(xs)))
def test_polled_batches_hold_every_row_once_in_order(counts):
    polls = [(float(i), c) for i, c in enumerate([0, *counts])]
    batches = as_batches(polls)
    assert sum(b[2] for b in batches) == counts[-1]
    assert all(b[2] > 0 and b[0] < b[1] for b in batches)
    assert all(x[1] <= y[0] for x, y in itertools.pairwise(batches))


def test_a_rate_counts_the_gaps_between_batches_and_ignores_extra_fields():
    # 3,000 rows from the first start (1.0) to the last end (4.0); the idle second between the batches counts
    assert rate([(1.0, 2.0, 1000), (3.0, 4.0, 2000)]) == 1000.0
    assert rate([(1.0, 2.0, 1000, 0.7)]) == 1000.0  # a job's batches carry their duration too
