"""The order of a bench round's embedded runs: each target ratio compares runs made one after the other, and
neither side of it always runs first (a run that always follows the other would carry any drift as a
difference between them)."""

from __future__ import annotations

from bench.__main__ import embedded_runs
from bench.commits import run_order

# the ratios of the targets between embedded runs: exactly-once against at-least-once, and dirty
# data against clean
TARGET_PAIRS = [("c", "d"), ("c_dirty", "c")]


def test_each_target_ratio_compares_neighbours_and_each_side_goes_first_in_one_of_two_rounds() -> None:
    rounds = [[key for key, _, _ in embedded_runs(flip)] for flip in (False, True)]
    for order in rounds:
        assert sorted(order) == ["c", "c_dirty", "d", "d_dirty"]
    for x, y in TARGET_PAIRS:
        for order in rounds:
            assert abs(order.index(x) - order.index(y)) == 1, (x, y, order)
        assert {order.index(x) < order.index(y) for order in rounds} == {True, False}, (x, y, rounds)


def test_each_run_has_its_own_mode_and_topic() -> None:
    for flip in (False, True):
        for key, exactly_once, dirty in embedded_runs(flip):
            assert exactly_once == key.startswith("c")
            assert dirty == key.endswith("_dirty")


def test_bench_commits_reverses_its_order_every_other_rep() -> None:
    order = run_order(["A", "B"], ["clean", "dirty"], ["c", "d"], 2)
    assert order[:4] == [(0, "A", "clean", "c"), (0, "A", "clean", "d"), (0, "A", "dirty", "c"), (0, "A", "dirty", "d")]
    assert [x[1:] for x in order[8:]] == [x[1:] for x in reversed(order[:8])]  # the second rep: the first's, backwards
    assert {x[0] for x in order[8:]} == {1}
    # each ref meets each data set by each path once a rep
    assert sorted(x[1:] for x in order[:8]) == sorted((r, k, p) for r in "AB" for k in ("clean", "dirty") for p in "cd")
