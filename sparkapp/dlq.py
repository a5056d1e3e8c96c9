"""The dead-letter topic: the original record, plus headers naming why and where it came from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .decode import DeadLetter

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


class KafkaDeadLetterSink:
    """Produces dead letters with an idempotent producer and flushes before returning."""

    def __init__(self, topic: str, producer_config: dict[str, Any]) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.producer = Producer({"enable.idempotence": True, "linger.ms": 5, **producer_config})
        self.sent = 0

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
        self.sent += len(dead)
