"""The operator's Prometheus metrics: reconciles, their errors, and sinks by state."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from sparkapp.edges.prometheus import set_per_shard

from .spec import SinkState

RECONCILES = Counter("chsink_operator_reconcile_total", "Reconciles of ClickHouseSinks, by outcome", ["result"])
RECONCILE_ERRORS = Counter("chsink_operator_reconcile_errors_total", "Reconciles that failed, by reason", ["reason"])
SINKS = Gauge("chsink_operator_sinks", "ClickHouseSinks by state, as last reconciled", ["state"])
_STATES: dict[tuple[str, str], str] = {}


def sink_state(namespace: str, name: str, state: str | None) -> None:
    """Records a sink's state (None when it is gone) and recounts the gauge."""
    if state is None:
        _STATES.pop((namespace, name), None)
    else:
        _STATES[(namespace, name)] = state
    for s in {*map(str, SinkState), *set(_STATES.values())}:
        SINKS.labels(s).set(sum(1 for v in _STATES.values() if v == s))


STALLED = Gauge("chsink_operator_stalled_partitions",
                "Partitions unconfirmed (BEFORE) past CHSINK_STALL_SECONDS, by sink and shard",
                ["namespace", "sink", "shard"])


def stalled(namespace: str, name: str, per_shard: dict[str, int]) -> None:
    set_per_shard(STALLED, (namespace, name), per_shard)


LEADER = Gauge("chsink_operator_leader", "1 on the replica that holds the leader Lease and acts, 0 on a standby")
