"""Kafka records and dead letters, as every layer passes them around."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Message:
    """One Kafka record, as the Spark source or a consumer gives it."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = None
    timestamp_ms: int = 0
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_type: int = 0  # as Spark's source numbers it: 0 CreateTime, 1 LogAppendTime

    @property
    def where(self) -> str:
        return f"{self.topic}/{self.partition}@{self.offset}"


@dataclass(frozen=True)
class DeadLetter:
    """An undecodable or undeliverable record and why."""

    message: Message
    reason: str
