"""Prometheus helpers shared by the job's and the operator's metrics (each registers only its own)."""

from __future__ import annotations

from prometheus_client import Gauge, start_http_server


def set_per_shard(gauge: Gauge, prefix: tuple[str, ...], per_shard: dict[str, int]) -> None:
    """Sets a gauge whose last label is the shard; shards absent now (answering again) go back to 0."""
    for labels in list(gauge._metrics):
        if labels[:len(prefix)] == prefix and labels[len(prefix)] not in per_shard:
            gauge.labels(*labels).set(0)
    for shard, n in per_shard.items():
        gauge.labels(*prefix, shard).set(n)


def serve(port: int) -> None:
    start_http_server(port)
