"""The benchmark's data set: ~250-byte JSON events with 12 columns of demanding types."""

from __future__ import annotations

import json
import random
from typing import Any

TABLE = """CREATE TABLE IF NOT EXISTS {db}.{table} (
    id UInt64, ts DateTime64(3, 'UTC'), user_id UInt64, event LowCardinality(String),
    country LowCardinality(String), amount Decimal(18, 4), score Nullable(Float64), session String,
    tags Array(String), attrs Map(String, String), referrer Nullable(String), _offset UInt64,
    _topic LowCardinality(String), _partition UInt16
) ENGINE = MergeTree ORDER BY (_partition, _offset) SETTINGS non_replicated_deduplication_window = 1000"""
EVENTS = ["view", "click", "add_to_cart", "purchase", "search", "login"]
COUNTRIES = ["DE", "FR", "US", "BR", "JP", "IN", "NG", "AU", "CA", "MX"]


def event(rnd: random.Random, i: int) -> dict[str, Any]:
    return {
        "id": i,
        "ts": f"2026-11-{1 + i % 28:02d} {i % 24:02d}:{i % 60:02d}:{(i * 7) % 60:02d}.{i % 1000:03d}",
        "user_id": rnd.randrange(1, 2_000_000),
        "event": EVENTS[i % len(EVENTS)],
        "country": COUNTRIES[rnd.randrange(len(COUNTRIES))],
        "amount": f"{rnd.randrange(100_000)}.{rnd.randrange(10_000):04d}",
        "score": None if i % 9 == 0 else round(rnd.random() * 100, 3),
        "session": f"{rnd.getrandbits(64):016x}-{rnd.getrandbits(32):08x}",
        "tags": [f"tag{rnd.randrange(40)}" for _ in range(i % 4)],
        "attrs": {"ab": "variant-" + "ab"[i % 2], "ui": "dark" if i % 3 else "light"},
        "referrer": None if i % 4 else f"https://example.com/r/{rnd.randrange(1000)}",
    }


# Bad records of every kind the sink meets, each dead-lettered with the decoder's reason: values ClickHouse
# refuses (a string in a number, a date it cannot read), values it would alter (too many digits, null in a
# non-Nullable column, a Decimal with two dots), and records that are no JSON object at all.
BAD: list[Any] = [
    lambda e: {**e, "user_id": "not-a-number"},
    lambda e: {**e, "ts": "yesterday"},
    lambda e: {**e, "user_id": 10**30},
    lambda e: {**e, "id": None},
    lambda e: {**e, "amount": "1.2.3"},
    lambda e: b"{" + json.dumps(e).encode()[:40],
    lambda e: [e],
]


def encoded(rnd: random.Random, i: int, dirty: float = 0.0) -> bytes:
    e = event(rnd, i)
    if dirty and rnd.random() < dirty:
        bad = BAD[i % len(BAD)](e)
        return bad if isinstance(bad, bytes) else json.dumps(bad, separators=(",", ":")).encode()
    return json.dumps(e, separators=(",", ":")).encode()


def produce(bootstrap: str, topic: str, n: int, partitions: int, seed: int = 7, dirty: float = 0.0) -> float:
    """Produces n events round-robin over the partitions (a `dirty` fraction of them bad records, spread over
    every partition); returns the mean value size in bytes."""
    from confluent_kafka import Producer

    rnd = random.Random(seed)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 20000,
                  "compression.type": "lz4", "queue.buffering.max.messages": 2_000_000, "log_level": 0})
    size = 0
    for i in range(n):
        v = encoded(rnd, i, dirty)
        size += len(v)
        while True:
            try:
                p.produce(topic, v, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.1)
        if i % 10000 == 0:
            p.poll(0)
    if p.flush(120):
        raise RuntimeError("benchmark data: producer did not flush")
    return size / max(n, 1)


def probe_topics(kafka: Any, n: int, partitions: int, dirty: float) -> None:
    """The probes' data: n events on `bench`, and with `dirty` the same events with that share of bad records on
    `bench-dirty`, dead-lettered to `bench-dlq` (as `python -m bench` makes them)."""
    kafka.create_topic("bench", partitions)
    produce(kafka.bootstrap, "bench", n, partitions)
    if dirty:
        kafka.create_topic("bench-dirty", partitions)
        kafka.create_topic("bench-dlq", 1)
        produce(kafka.bootstrap, "bench-dirty", n, partitions, dirty=dirty)
