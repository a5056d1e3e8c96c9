"""The dead-letter topic: the original record, plus headers naming why and where it came from.

Kafka's idempotent producer dedupes only within one producer session, so a writer that crashed
after producing but before recording DONE would produce the same dead letters again. The writer
therefore records the topic's end positions (`mark`) before producing, and a retry reads back what
arrived since (`sent_since`) and produces only the rest.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..config import READ_COMMITTED
from ..core.records import DeadLetter

HEADER_REASON = "chsink.reason"
HEADER_TOPIC = "chsink.topic"
HEADER_PARTITION = "chsink.partition"
HEADER_OFFSET = "chsink.offset"
HEADER_SINK = "chsink.sink"
HEADER_TIMESTAMP = "chsink.timestamp"


def dead_letter_headers(sink: str, d: DeadLetter) -> list[tuple[str, str | bytes | None]]:
    m = d.message
    return [
        (HEADER_REASON, d.reason.encode()),
        (HEADER_TOPIC, m.topic.encode()),
        (HEADER_PARTITION, str(m.partition).encode()),
        (HEADER_OFFSET, str(m.offset).encode()),
        (HEADER_SINK, sink.encode()),
        (HEADER_TIMESTAMP, str(m.timestamp_ms).encode()),
        *m.headers,
    ]


DeadKey = tuple[str, int, int]  # source topic, partition, offset


@dataclass(frozen=True)
class DeadLetterRead:
    """One sink's dead letters read from a topic: (DLQ partition, DLQ offset, source key) each, and the end of
    each partition read, where the next read of what arrived since begins."""

    entries: list[tuple[int, int, DeadKey]]
    ends: dict[int, int]

    def counts(self) -> Counter[DeadKey]:
        return Counter(key for _, _, key in self.entries)


def dead_letter_entries(consumer: Any, topic: str, starts: dict[int, int], sink: str,
                        timeout: float = 60.0) -> DeadLetterRead:
    """One sink's dead letters in `topic`, from the given per-partition offsets to the current end."""
    import time

    from confluent_kafka import KafkaError, TopicPartition

    entries: list[tuple[int, int, DeadKey]] = []
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1] for p in starts}
    todo = {p: end for p, end in ends.items() if end > starts[p]}
    if not todo:
        return DeadLetterRead(entries, ends)
    consumer.assign([TopicPartition(topic, p, starts[p]) for p in todo])
    deadline = time.monotonic() + timeout
    while todo:
        if time.monotonic() > deadline:
            raise RuntimeError(f"dead-letter topic {topic}: timed out reading back partitions {sorted(todo)}")
        m = consumer.poll(1.0)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                todo.pop(m.partition(), None)
                continue
            raise RuntimeError(f"dead-letter topic {topic}: {m.error()}")
        h = dict(m.headers() or [])
        if h.get(HEADER_SINK, b"").decode() == sink:
            entries.append((m.partition(), m.offset(),
                            (h[HEADER_TOPIC].decode(), int(h[HEADER_PARTITION]), int(h[HEADER_OFFSET]))))
        if m.offset() + 1 >= todo.get(m.partition(), 0):
            todo.pop(m.partition(), None)
    return DeadLetterRead(entries, ends)


def read_dead_letters(consumer: Any, topic: str, starts: dict[int, int], sink: str,
                      timeout: float = 60.0) -> Counter[DeadKey]:
    """Counts the dead letters of one sink in `topic` from the given per-partition offsets to the current end."""
    return dead_letter_entries(consumer, topic, starts, sink, timeout).counts()


class KafkaDeadLetterSink:
    """Produces dead letters with an idempotent producer and flushes before returning."""

    def __init__(self, topic: str, producer_config: dict[str, Any]) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.config = producer_config
        self.producer = Producer({"enable.idempotence": True, "linger.ms": 5, **producer_config})
        self._marks: Any = None  # the consumer `mark` reads end offsets with

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        return Consumer({**self.config, "group.id": f"chsink-dlq-{uuid.uuid4().hex}", "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest", "log_level": 0,
                         **READ_COMMITTED})

    def mark(self) -> str:
        """The topic's current end offsets, as `partition:offset,...`."""
        from confluent_kafka import TopicPartition

        if self._marks is None:  # kept: a consumer's connection costs more than the marks it reads
            self._marks = self._consumer()
        c = self._marks
        n = len(c.list_topics(self.topic, timeout=15).topics[self.topic].partitions)
        ends = [(p, c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=15)[1]) for p in range(n)]
        return ",".join(f"{p}:{o}" for p, o in ends)

    def sent_since(self, mark: str, sink: str) -> set[DeadKey]:
        """The dead letters of `sink` that reached the topic after `mark` was taken."""
        starts = {int(p): int(o) for p, o in (kv.split(":") for kv in mark.split(",") if kv)}
        c = self._consumer()
        try:
            return set(read_dead_letters(c, self.topic, starts, sink))
        finally:
            c.close()

    def close(self) -> None:
        """Releases the producer (everything sent was flushed), so it does not outlive the job reaching for a
        broker that is gone."""
        if self._marks is not None:
            self._marks.close()
            self._marks = None
        self.producer.close()

    def send(self, sink: str, dead: Sequence[DeadLetter]) -> None:
        errors: list[str] = []

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for d in dead:
            self.producer.produce(self.topic, value=d.message.value, key=d.message.key,
                                  headers=dead_letter_headers(sink, d), on_delivery=on_delivery)
        remaining = self.producer.flush(60)
        if remaining or errors:
            raise RuntimeError(f"dead-letter topic {self.topic}: {remaining} undelivered, errors: {errors[:3]}")
