"""The per-partition exactly-once state machine, as a pure function.

Input: the last stored state of one (sink, topic, partition[, table]) and the offsets present in a
new batch, in order. Output: a Plan saying which offsets to skip, which stored range to re-send
identically, which new range to insert, and which to dead-letter. Kafka offsets may have gaps
(compaction, transaction markers), so every range is bounded by offsets actually present.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field


class Phase(enum.Enum):
    """BEFORE: an insert of the range was attempted but not confirmed. AFTER: it was acknowledged."""

    BEFORE = "BEFORE"
    AFTER = "AFTER"


class Case(enum.Enum):
    """How the batch relates to the stored range; kept in the plan for logs, metrics and tests."""

    FIRST = "first"  # no stored state: the batch is the partition's first range
    SAME = "same"  # the batch holds exactly the stored range
    OVERLAP = "overlap"  # the batch holds the stored range and more above it
    CONTAINED = "contained"  # the batch starts inside the stored range
    REPLAY = "replay"  # the batch lies wholly below the stored range (another table of the partition is behind)
    NEW = "new"  # the batch lies wholly above the stored range
    EMPTY = "empty"


class MissingPolicy(enum.Enum):
    """What to do with a BEFORE range whose messages this batch does not fully hold."""

    DEAD_LETTER = "dead_letter"  # the range may or may not have landed: its records go to the DLQ, flagged
    ERROR = "error"  # no DLQ configured: refuse, nothing is lost
    REFETCH = "refetch"  # the caller can re-read the stored range from Kafka and retry it
    # the batch holds everything Kafka still has of the range (a re-read): records retention or compaction
    # removed cannot come back, so the range is re-sent with what remains, cut into the windows recorded
    RESEND_PRESENT = "resend_present"


@dataclass(frozen=True, order=True)
class OffsetRange:
    """An inclusive offset range [min, max]."""

    min: int
    max: int

    def __post_init__(self) -> None:
        if self.min > self.max:
            raise ValueError(f"empty offset range [{self.min}, {self.max}]")

    def __contains__(self, offset: object) -> bool:
        return isinstance(offset, int) and self.min <= offset <= self.max

    def __str__(self) -> str:
        return f"[{self.min}, {self.max}]"


@dataclass(frozen=True)
class StoredState:
    """The last recorded transition of one partition."""

    range: OffsetRange
    phase: Phase
    epoch: int = 0
    layout: int = 0

    @property
    def resume_offset(self) -> int:
        """Where the partition resumes: past an acknowledged range, or at the start of an unconfirmed one."""
        return self.range.max + 1 if self.phase is Phase.AFTER else self.range.min


@dataclass(frozen=True)
class Plan:
    """What to do with a batch. Ranges are bounded by offsets present in the batch."""

    case: Case
    skip: tuple[OffsetRange, ...] = ()
    retry: OffsetRange | None = None  # identical to the stored BEFORE range
    insert: OffsetRange | None = None  # a new range: BEFORE, insert, AFTER
    dead_letter: tuple[OffsetRange, ...] = ()
    refetch: OffsetRange | None = None  # stored BEFORE range to re-read before anything else
    notes: tuple[str, ...] = field(default=(), compare=False)


class IrrecoverableStateError(RuntimeError):
    """The batch lies wholly below the stored range: offsets were reset or manipulated externally."""


class UnconfirmedRangeError(RuntimeError):
    """A BEFORE range cannot be re-sent identically and no dead-letter topic is configured."""


def _span(offsets: Sequence[int], lo: int, hi: int) -> OffsetRange | None:
    """The sub-range of present (sorted) offsets within [lo, hi], or None when none are present. Bisected: a
    batch holds hundreds of thousands of offsets per partition."""
    i, j = bisect.bisect_left(offsets, lo), bisect.bisect_right(offsets, hi)
    return OffsetRange(offsets[i], offsets[j - 1]) if j > i else None


def plan_batch(
    where: str,
    stored: StoredState | None,
    offsets: Sequence[int],
    missing: MissingPolicy = MissingPolicy.DEAD_LETTER,
    replay_below: bool = False,
) -> Plan:
    """Decides the plan for one partition's batch.

    `where` names the sink/topic/partition for error messages. `offsets` must be strictly
    increasing (one task reads one partition in order). `replay_below` treats a batch wholly below
    the stored range as an already-delivered replay instead of an error: for multi-table topics,
    where a partition restarts at the slowest table's position and the others see old offsets.
    """
    if not offsets:
        return Plan(Case.EMPTY)
    if not all(map(operator.lt, offsets, itertools.islice(offsets, 1, None))):
        raise ValueError(f"{where}: batch offsets are not strictly increasing")
    lo, hi = offsets[0], offsets[-1]
    if stored is None:
        return Plan(Case.FIRST, insert=OffsetRange(lo, hi))

    s = stored.range
    if hi < s.min and replay_below:
        return Plan(Case.REPLAY, skip=(OffsetRange(lo, hi),))
    if hi < s.min:
        raise IrrecoverableStateError(
            f"{where}: batch {OffsetRange(lo, hi)} lies wholly below the stored {stored.phase.value} range {s}; "
            "Kafka offsets were reset, the topic was recreated, or an older Spark checkpoint was restored "
            "(delete it: the state store is the source of truth). Reset this partition's state "
            "(`python -m sparkapp state reset`) only after checking the target table."
        )
    skip: list[OffsetRange] = []
    cropped = _span(offsets, lo, s.min - 1)
    if cropped is not None:  # below the stored minimum: delivered before the stored range, always skipped
        skip.append(cropped)
    rest = offsets[bisect.bisect_left(offsets, s.min):]
    lo = rest[0]
    new = _span(rest, s.max + 1, hi)
    old = _span(rest, s.min, s.max)
    after = stored.phase is Phase.AFTER

    if old is None:  # NEW: everything is above the stored range
        if not after:  # the stored BEFORE range was never confirmed and is not in this batch
            return _unconfirmed(where, stored, missing, Case.NEW, tuple(skip), new)
        return Plan(Case.NEW, skip=tuple(skip), insert=new)

    holds_stored = lo == s.min and old.max == s.max
    case = Case.SAME if holds_stored and new is None else Case.OVERLAP if holds_stored else Case.CONTAINED
    if after:
        return Plan(case, skip=(*skip, old), insert=new)
    if holds_stored:  # SAME/OVERLAP in BEFORE: re-send the stored block identically, then the rest
        return Plan(case, skip=tuple(skip), retry=s, insert=new)
    return _unconfirmed(where, stored, missing, Case.CONTAINED, tuple(skip), new, old)


def _unconfirmed(
    where: str,
    stored: StoredState,
    missing: MissingPolicy,
    case: Case,
    skip: tuple[OffsetRange, ...],
    new: OffsetRange | None,
    old: OffsetRange | None = None,
) -> Plan:
    """A BEFORE range that this batch cannot reproduce identically."""
    if missing is MissingPolicy.REFETCH:
        return Plan(case, skip=skip, refetch=stored.range)
    if missing is MissingPolicy.RESEND_PRESENT:
        note = f"stored BEFORE range {stored.range}: Kafka holds only {old or 'none'} of it; re-sent what remains"
        return Plan(case, skip=skip, retry=stored.range, insert=new, notes=(note,))
    if missing is MissingPolicy.ERROR or old is None:
        # Without its messages in hand, moving past an unconfirmed range could lose it: refuse.
        raise UnconfirmedRangeError(
            f"{where}: stored BEFORE range {stored.range} is not fully present in the batch "
            f"(holds {old or new}); it cannot be re-sent identically"
            + ("" if old is None else " and no dead-letter topic is configured")
        )
    note = f"stored BEFORE range {stored.range} not reproducible; dead-lettered {old}"
    return Plan(case, skip=skip, dead_letter=(old,), insert=new, notes=(note,))
