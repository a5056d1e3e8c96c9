"""Shared test helpers: build decoders and inserters on a real chdb table."""

from __future__ import annotations

import json
from typing import Any

from sparkapp.blocks import build_blocks, dedup_token
from sparkapp.decode import DecoderSpec, Format, Message, decode_batch, make_decoder
from sparkapp.insert import Inserter
from sparkapp.schema import load_schema
from sparkapp.state_machine import OffsetRange


def msg(value: Any, offset: int = 0, topic: str = "t", partition: int = 0, key: bytes | None = None) -> Message:
    raw = value if isinstance(value, bytes | type(None)) else json.dumps(value).encode()
    return Message(topic, partition, offset, raw, key, 1_700_000_000_000 + offset)


def load_rows(client: Any, db: str, table: str, messages: list[Message], spec: DecoderSpec | None = None):
    """Decodes and inserts messages in one block; returns the dead letters."""
    schema = load_schema(client, db, table)
    rows, dead = decode_batch(make_decoder(spec or DecoderSpec(Format.JSON), schema), messages)
    if rows:
        rng = OffsetRange(rows[0][0], rows[-1][0])
        for b in build_blocks(rng, rows, schema.names, 1000, lambda w: dedup_token("test", "t", 0, w)):
            Inserter(client, schema).insert(b)
    return dead


def read_dlq(bootstrap: str, topic: str, n: int, linger_s: float = 2.0) -> list[Any]:
    """Reads the dead-letter topic from the start: n messages, then waits briefly for any extra."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"dlq-{topic}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    out: list[Any] = []
    while True:
        m = c.poll(15 if len(out) < n else linger_s)
        if m is None:
            break
        if m.error() is None:
            out.append(m)
    c.close()
    assert len(out) >= n, f"only {len(out)} of {n} dead letters arrived"
    return out
