"""The seed-000 state machine: every case, and a property test against a per-offset reference model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkapp.core.state_machine import (
    Case,
    IrrecoverableStateError,
    MissingPolicy,
    OffsetRange,
    Phase,
    Plan,
    StoredState,
    UnconfirmedRangeError,
    plan_batch,
)

R = OffsetRange
W = "sink s t/0"


def S(lo: int, hi: int, phase: Phase) -> StoredState:
    return StoredState(R(lo, hi), phase)


def test_first_batch_inserts_everything():
    assert plan_batch(W, None, [5, 6, 9]) == Plan(Case.FIRST, insert=R(5, 9))


def test_empty_batch():
    assert plan_batch(W, S(0, 9, Phase.AFTER), []).case is Case.EMPTY


@pytest.mark.parametrize(("phase", "expected"), [
    (Phase.AFTER, Plan(Case.SAME, skip=(R(0, 9),))),
    (Phase.BEFORE, Plan(Case.SAME, retry=R(0, 9))),
])
def test_same_range(phase, expected):
    assert plan_batch(W, S(0, 9, phase), list(range(10))) == expected


@pytest.mark.parametrize(("phase", "expected"), [
    (Phase.AFTER, Plan(Case.OVERLAP, skip=(R(0, 9),), insert=R(10, 14))),
    (Phase.BEFORE, Plan(Case.OVERLAP, retry=R(0, 9), insert=R(10, 14))),
])
def test_overlap_splits_into_identical_first_chunk(phase, expected):
    assert plan_batch(W, S(0, 9, phase), list(range(15))) == expected


def test_contained_after_is_skipped():
    assert plan_batch(W, S(0, 9, Phase.AFTER), [3, 4, 5]) == Plan(Case.CONTAINED, skip=(R(3, 5),))


def test_contained_before_goes_to_dlq():
    plan = plan_batch(W, S(0, 9, Phase.BEFORE), [3, 4, 5], MissingPolicy.DEAD_LETTER)
    assert plan.case is Case.CONTAINED and plan.dead_letter == (R(3, 5),) and plan.retry is None


def test_contained_before_without_dlq_is_refused():
    with pytest.raises(UnconfirmedRangeError, match=r"\[0, 9\]"):
        plan_batch(W, S(0, 9, Phase.BEFORE), [3, 4, 5], MissingPolicy.ERROR)


def test_contained_before_with_refetch_asks_for_the_stored_range():
    assert plan_batch(W, S(0, 9, Phase.BEFORE), [3, 4, 5], MissingPolicy.REFETCH).refetch == R(0, 9)


def test_new_range_after_after():
    assert plan_batch(W, S(0, 9, Phase.AFTER), [10, 11, 15]) == Plan(Case.NEW, insert=R(10, 15))


def test_new_range_after_unconfirmed_before_is_never_silently_passed():
    with pytest.raises(UnconfirmedRangeError):
        plan_batch(W, S(0, 9, Phase.BEFORE), [10, 11], MissingPolicy.DEAD_LETTER)
    assert plan_batch(W, S(0, 9, Phase.BEFORE), [10, 11], MissingPolicy.REFETCH).refetch == R(0, 9)


def test_a_reread_range_goes_out_whole_with_what_kafka_still_holds():
    """Retention deleted the start of a BEFORE range (or all of it): it is re-sent as recorded, never
    dead-lettered (it may have landed), and the batch above it follows."""
    assert plan_batch(W, S(0, 9, Phase.BEFORE), [4, 9, 10], MissingPolicy.RESEND_PRESENT) == Plan(
        Case.CONTAINED, retry=R(0, 9), insert=R(10, 10))
    assert plan_batch(W, S(0, 9, Phase.BEFORE), [12], MissingPolicy.RESEND_PRESENT) == Plan(
        Case.NEW, retry=R(0, 9), insert=R(12, 12))


def test_cropping_below_stored_min():
    plan = plan_batch(W, S(5, 9, Phase.AFTER), list(range(0, 13)))
    assert plan == Plan(Case.OVERLAP, skip=(R(0, 4), R(5, 9)), insert=R(10, 12))
    plan = plan_batch(W, S(5, 9, Phase.BEFORE), list(range(0, 13)))
    assert plan == Plan(Case.OVERLAP, skip=(R(0, 4),), retry=R(5, 9), insert=R(10, 12))


def test_irrecoverable_names_sink_partition_and_ranges():
    with pytest.raises(IrrecoverableStateError, match=r"sink s t/0.*\[0, 3\].*BEFORE range \[10, 20\]"):
        plan_batch(W, S(10, 20, Phase.BEFORE), [0, 1, 3])


def test_replay_below_is_skipped_when_asked():
    assert plan_batch(W, S(10, 20, Phase.AFTER), [0, 3], replay_below=True) == Plan(Case.REPLAY, skip=(R(0, 3),))


def test_gaps_define_ranges_by_present_offsets():
    # compaction left 0, 4, 9; the stored range [4, 9] is held although 5..8 do not exist
    assert plan_batch(W, S(4, 9, Phase.BEFORE), [0, 4, 9, 12]) == Plan(
        Case.OVERLAP, skip=(R(0, 0),), retry=R(4, 9), insert=R(12, 12))
    assert plan_batch(W, None, [3, 7, 20]).insert == R(3, 20)


def test_offsets_must_increase():
    with pytest.raises(ValueError, match="strictly increasing"):
        plan_batch(W, None, [3, 3, 4])


# ---- property test against a per-offset reference model ---------------------------------------


def reference(stored: StoredState | None, offsets: list[int], policy: MissingPolicy) -> dict[str, object]:
    """Classifies each offset independently, as the seed's prose describes it."""
    if stored is None:
        return {"insert": set(offsets), "skip": set(), "retry": None, "dlq": set(), "error": None}
    s = stored.range
    if max(offsets) < s.min:
        return {"error": "irrecoverable"}
    below = {o for o in offsets if o < s.min}
    inside = {o for o in offsets if s.min <= o <= s.max}
    above = {o for o in offsets if o > s.max}
    if stored.phase is Phase.AFTER:
        return {"insert": above, "skip": below | inside, "retry": None, "dlq": set(), "error": None}
    if s.min in inside and s.max in inside:
        return {"insert": above, "skip": below, "retry": s, "dlq": set(), "error": None}
    if policy is MissingPolicy.REFETCH:
        return {"refetch": s}
    if policy is MissingPolicy.RESEND_PRESENT:  # a re-read: what Kafka still holds of the range goes out in it
        return {"insert": above, "skip": below, "retry": s, "dlq": set(), "error": None}
    if policy is MissingPolicy.ERROR or not inside:
        return {"error": "unconfirmed"}
    return {"insert": above, "skip": below, "retry": None, "dlq": inside, "error": None}


def covered(ranges, offsets):
    return {o for o in offsets for r in ranges if o in r}


offset_lists = st.lists(st.integers(0, 60), min_size=1, max_size=40, unique=True).map(sorted)
stored_states = st.one_of(
    st.none(),
    st.builds(lambda a, n, ph: StoredState(R(a, a + n), ph), st.integers(0, 50), st.integers(0, 15),
              st.sampled_from(Phase)),
)


@settings(max_examples=600, deadline=None)
@given(stored=stored_states, offsets=offset_lists, policy=st.sampled_from(MissingPolicy))
def test_plan_matches_reference_model(stored, offsets, policy):
    ref = reference(stored, offsets, policy)
    try:
        plan = plan_batch(W, stored, offsets, policy)
    except IrrecoverableStateError:
        assert ref.get("error") == "irrecoverable"
        return
    except UnconfirmedRangeError:
        assert ref.get("error") == "unconfirmed"
        return
    if "refetch" in ref:
        assert plan.refetch == ref["refetch"]
        return
    assert ref.get("error") is None
    assert covered([plan.insert] if plan.insert else [], offsets) == ref["insert"]
    assert covered(plan.skip, offsets) == ref["skip"]
    assert covered(plan.dead_letter, offsets) == ref["dlq"]
    assert plan.retry == ref["retry"]
    # every offset is handled exactly once, ranges are bounded by present offsets
    parts = [plan.insert, *plan.skip, *plan.dead_letter, plan.retry]
    for o in offsets:
        assert sum(1 for r in parts if r is not None and o in r) == 1
    for r in [plan.insert, *plan.skip, *plan.dead_letter]:
        if r is not None:
            assert r.min in offsets and r.max in offsets


@settings(max_examples=300, deadline=None)
@given(offsets=offset_lists, cuts=st.lists(st.integers(1, 10), min_size=1, max_size=10))
def test_replaying_a_stream_never_inserts_an_offset_twice(offsets, cuts):
    """Feed the stream in random batches, acknowledging each; then replay from random points."""
    stored = None
    inserted: list[int] = []
    i = 0
    for n in cuts * 5:
        batch = offsets[i:i + n]
        if not batch:
            break
        plan = plan_batch(W, stored, batch)
        if plan.insert:
            inserted += [o for o in batch if o in plan.insert]
            stored = StoredState(plan.insert, Phase.AFTER)
        i += n
    for start in range(0, i, 3):  # replays after AFTER never insert again
        plan = plan_batch(W, stored, offsets[start:i]) if offsets[start:i] else None
        assert plan is None or plan.insert is None
    assert inserted == offsets[:i]
