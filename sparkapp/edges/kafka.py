"""Kafka edges outside Spark: topic discovery, watermarks, and re-reading an exact offset range."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from ..config import READ_COMMITTED, ConfigError, KafkaConfig, UnavailableError
from ..core.records import Message
from ..core.state_machine import OffsetRange


def admin(cfg: KafkaConfig, errors: list[Any] | None = None) -> Any:
    """An admin client; `errors` collects what librdkafka reports while it tries (a refused password)."""
    from confluent_kafka.admin import AdminClient

    extra: dict[str, Any] = {"error_cb": errors.append} if errors is not None else {}
    return AdminClient({**cfg.client_options(), "log_level": 0, **extra})


class KafkaUnavailableError(UnavailableError):
    """Kafka did not answer, or the sink's topics do not exist (yet)."""


class KafkaRefusedError(ConfigError):
    """Kafka answered but refused the sink's credentials or the TLS handshake: trying again will not help,
    changing the options or the secret will."""


def topic_partitions(cfg: KafkaConfig, timeout: float = 15.0) -> dict[str, int]:
    """The subscribed topics and their partition counts."""
    from confluent_kafka import KafkaError

    errors: list[Any] = []
    client = admin(cfg, errors)
    try:
        md = client.list_topics(timeout=timeout)
    except Exception as e:
        client.poll(0)  # serves the error callbacks
        refused = next((x for x in errors if x.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL)
                        or _tls_alert(x.str())), None)
        if refused is not None:  # reached, but it refused the credentials or the TLS handshake: not transient
            raise KafkaRefusedError(f"{cfg.credentials_from or 'kafka.options / kafka.secretOptions'}: Kafka at "
                                    f"{cfg.bootstrap_servers} refused the connection: {refused.str()}") from None
        raise KafkaUnavailableError(f"cannot reach Kafka at {cfg.bootstrap_servers}: {e}") from None
    if cfg.topic_pattern:
        rx = re.compile(cfg.topic_pattern)
        names = sorted(t for t in md.topics if rx.fullmatch(t) and not t.startswith("__"))
    else:
        names = list(cfg.topics)
    missing = [t for t in names if t not in md.topics or md.topics[t].error is not None]
    if missing:
        raise KafkaUnavailableError(f"Kafka topic(s) {missing} do not exist at {cfg.bootstrap_servers}")
    if not names:
        raise KafkaUnavailableError(f"no Kafka topic matches pattern {cfg.topic_pattern!r}")
    return {t: len(md.topics[t].partitions) for t in names}


def _tls_alert(text: str) -> bool:
    """A broker that refuses the client's certificate ends the handshake with an alert (TLS 1.3: after the client
    finished its part), which librdkafka reports as a transport failure."""
    return "SSL alert" in text or "tls alert" in text.lower()


def consumer(cfg: KafkaConfig, group: str = "chsink-reader") -> Any:
    from confluent_kafka import Consumer

    return Consumer({**cfg.client_options(), "group.id": group, "enable.auto.commit": False,
                     "enable.partition.eof": True, "auto.offset.reset": "earliest", "log_level": 0, **READ_COMMITTED})


def watermarks(cfg: KafkaConfig, topic: str, partition: int, timeout: float = 15) -> tuple[int, int]:
    return _watermarks(cfg, [(topic, partition)], timeout)[(topic, partition)]


def all_watermarks(cfg: KafkaConfig, partitions: dict[str, int],
                   timeout: float = 15) -> dict[tuple[str, int], tuple[int, int]]:
    """Each partition's first offset Kafka still holds (records below were deleted by retention) and its end."""
    return _watermarks(cfg, [(t, p) for t, n in partitions.items() for p in range(n)], timeout)


def _watermarks(cfg: KafkaConfig, pairs: list[tuple[str, int]],
                timeout: float) -> dict[tuple[str, int], tuple[int, int]]:
    """A broker that does not answer is an outage (KafkaUnavailableError), as while it restarts."""
    from confluent_kafka import KafkaException, TopicPartition

    c = consumer(cfg)
    try:
        out = {}
        for t, p in pairs:
            try:
                lo, hi = c.get_watermark_offsets(TopicPartition(t, p), timeout=timeout)
            except KafkaException as e:
                err = e.args[0] if e.args else e
                why = err.str() if hasattr(err, "str") else str(err)
                raise KafkaUnavailableError(f"cannot read the offsets of {t}/{p} from Kafka at "
                                            f"{cfg.bootstrap_servers}: {why}") from None
            out[(t, p)] = (int(lo), int(hi))
        return out
    finally:
        c.close()


def _scan(cfg: KafkaConfig, topic: str, partition: int, rng: OffsetRange, timeout: float,
          take: Callable[[Any], None]) -> None:
    """Hands every committed record with an offset in rng to `take`, in order (gaps are skipped by Kafka)."""
    from confluent_kafka import KafkaError, TopicPartition

    c = consumer(cfg)
    try:
        c.assign([TopicPartition(topic, partition, rng.min)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return
                raise RuntimeError(f"re-reading {topic}/{partition} {rng}: {m.error()}")
            if m.offset() > rng.max:
                return
            take(m)
            if m.offset() >= rng.max:
                return
        raise RuntimeError(f"timed out re-reading {topic}/{partition} {rng}")
    finally:
        c.close()


def read_range(cfg: KafkaConfig, topic: str, partition: int, rng: OffsetRange, timeout: float = 60.0) -> list[Message]:
    """Reads every message with an offset in rng (gaps are skipped by Kafka itself)."""
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

    out: list[Message] = []

    def take(m: Any) -> None:
        kind, ts = m.timestamp()
        out.append(Message(topic, partition, m.offset(), m.value(), m.key(), ts,
                           tuple((k, v or b"") for k, v in (m.headers() or [])),
                           int(kind == TIMESTAMP_LOG_APPEND_TIME)))  # numbered as Spark's source numbers it

    _scan(cfg, topic, partition, rng, timeout, take)
    return out


def present_offsets(cfg: KafkaConfig, topic: str, partition: int, rng: OffsetRange,
                    timeout: float = 300.0) -> set[int]:
    """The offsets in rng that hold committed records (not compacted away, not aborted, not markers)."""
    out: set[int] = set()
    _scan(cfg, topic, partition, rng, timeout, lambda m: out.add(m.offset()))
    return out


def offsets_before(cfg: KafkaConfig, pairs: list[tuple[str, int]], ts_ms: int,
                   timeout: float = 15) -> dict[tuple[str, int], int]:
    """Per partition, the first offset whose record was written at or after `ts_ms`: every offset below it was in
    Kafka before then. A partition with nothing written since gives its end (-1 from Kafka means none)."""
    from confluent_kafka import KafkaException, TopicPartition

    if not pairs:
        return {}
    c = consumer(cfg)
    try:
        try:
            found = c.offsets_for_times([TopicPartition(t, p, ts_ms) for t, p in pairs], timeout=timeout)
        except KafkaException as e:
            raise KafkaUnavailableError(f"cannot look up offsets by time in Kafka at {cfg.bootstrap_servers}: "
                                        f"{e}") from None
        out = {}
        for tp in found:
            if tp.offset >= 0:
                out[(tp.topic, tp.partition)] = int(tp.offset)
            else:
                out[(tp.topic, tp.partition)] = int(c.get_watermark_offsets(tp, timeout=timeout)[1])
        return out
    finally:
        c.close()


# the group coordinator moving or loading: the same request succeeds once it settled
_COORDINATOR_BUSY = ("COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR")


def commit_group_offsets(cfg: KafkaConfig, group: str, positions: dict[tuple[str, int], int],
                         attempts: int = 5, timeout: float = 15) -> None:
    """Sets the consumer group's committed offsets (the next offset to read, per partition), as a consumer of the
    group would commit them, without joining it. Raises on what retrying does not fix."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

    todo = {tp: o for tp, o in positions.items() if o >= 0}
    client = admin(cfg)
    for attempt in range(attempts):
        if not todo:
            return
        req = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p, o) for (t, p), o in sorted(todo.items())])
        try:
            done = next(iter(client.alter_consumer_group_offsets([req], request_timeout=timeout).values())).result()
        except KafkaException as e:
            err = e.args[0] if e.args else e
            if getattr(err, "name", lambda: "")() in _COORDINATOR_BUSY and attempt + 1 < attempts:
                time.sleep(1.0)
                continue
            raise
        failed = {(tp.topic, tp.partition): tp.error for tp in done.topic_partitions if tp.error is not None}
        if any(e.name() not in _COORDINATOR_BUSY for e in failed.values()) or attempt + 1 == attempts:
            raise RuntimeError(f"consumer group {group}: offsets not committed: "
                               + ", ".join(f"{t}/{p} {e.str()}" for (t, p), e in sorted(failed.items())))
        todo = {tp: todo[tp] for tp in failed}
        if todo:
            time.sleep(1.0)
