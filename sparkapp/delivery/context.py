"""What one partition's delivery works with (WriterContext) and reports (PartitionResult), shared by the
exactly-once writer and the at-least-once baseline."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypedDict

from ..core.records import DeadLetter, Message
from ..core.state_machine import Case, OffsetRange
from ..edges.insert import Inserter
from ..edges.shards import ShardSet
from ..edges.store import PartitionKey, StateStore
from ..formats.rows import Decoder


class DeadLetterSink(Protocol):
    def send(self, sink: str, dead: Sequence[DeadLetter]) -> None:
        """Writes the dead letters durably (flushed) before returning."""

    def mark(self) -> str:
        """The sink's current end position, taken before producing."""

    def sent_since(self, mark: str, sink: str) -> set[tuple[str, int, int]]:
        """(topic, partition, offset) of the sink's dead letters that arrived after `mark`."""


class UndeliverableError(RuntimeError):
    """Records cannot be decoded and no dead-letter topic is configured: refuse rather than lose them."""


class DataLossError(RuntimeError):
    """Records Kafka no longer holds were never delivered (retention deleted them first)."""


Refetch = Callable[[str, int, OffsetRange], list[Message]]


@dataclass
class WriterContext:
    sink: str
    store: StateStore
    inserter: Inserter
    decode: Decoder
    epoch: int
    block_offsets: int = 100_000
    dlq: DeadLetterSink | None = None
    refetch: Refetch | None = None
    layout: int = 0
    shard: int = 0
    replay_below: bool = False
    exactly_once: bool = True  # False: plain at-least-once inserts, no state and no tokens (a baseline)
    shards: ShardSet | None = None  # None: one shard, `inserter`, under `layout`/`shard`
    fail_on_data_loss: bool = True  # records gone from Kafka before they landed stop the run (Spark's default)
    fault: Callable[[str], None] = field(default=lambda step: None)


@dataclass
class PartitionResult:
    pk: PartitionKey
    case: Case
    inserted_rows: int = 0
    inserts: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    retried: OffsetRange | None = None
    committed: OffsetRange | None = None


def require_dlq(ctx: WriterContext, pk: PartitionKey, dead: list[DeadLetter]) -> DeadLetterSink:
    """The dead-letter sink, or UndeliverableError: records are refused rather than lost."""
    if ctx.dlq is None:
        first = "; ".join(d.reason for d in dead[:3])
        raise UndeliverableError(
            f"{pk}: {len(dead)} record(s) cannot be delivered and no dead-letter topic is configured "
            f"(set dlq.topic to divert them): {first}"
        )
    return ctx.dlq


def ordered(messages: Sequence[Message]) -> list[Message]:
    """Offset order, one message per offset (a re-read may repeat offsets the batch already holds)."""
    by_offset = {m.offset: m for m in messages}
    return [by_offset[o] for o in sorted(by_offset)]


class PartitionOutcome(TypedDict):
    """What one partition's delivery in one batch did; the only result row type (driver and executors)."""

    topic: str
    partition: int
    rows: int
    inserted: int
    dead: int
    inserts: int
    retried: int
    cases: str
    stalled: str  # the shard it waits for, "" when delivered
    upto: int  # the highest offset Spark handed over (-1: none)
    waiting: str  # an executor task's delivered ranges whose AFTER waits for the next batch (ranges_json), or ""


def outcome(topic: str, part: int, rows: int, upto: int, results: Sequence[PartitionResult],
            stalled: str = "") -> PartitionOutcome:
    return PartitionOutcome(topic=topic, partition=part, rows=rows, inserted=sum(r.inserted_rows for r in results),
                            dead=sum(r.dead_lettered for r in results), inserts=sum(r.inserts for r in results),
                            retried=sum(1 for r in results if r.retried),
                            cases=",".join(r.case.value for r in results), stalled=stalled, upto=upto,
                            waiting="")
