"""The operator's Prometheus metrics: reconciles, their errors, sinks by state, and each sink's health (lag,
state, readiness, last commit, rebalance phase, verification), labelled `namespace` and `sink` as the job's own
are: `sink` is the sink id (`<namespace>.<name>`), the label the driver's metrics carry."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge

from sparkapp.edges.prometheus import set_per_shard

from .spec import RebalancePhase, SinkState, sink_id

RECONCILES = Counter("chsink_operator_reconcile_total", "Reconciles of ClickHouseSinks, by outcome", ["result"])
RECONCILE_ERRORS = Counter("chsink_operator_reconcile_errors_total", "Reconciles that failed, by reason", ["reason"])
SINKS = Gauge("chsink_operator_sinks", "ClickHouseSinks by state, as last reconciled", ["state"])
_STATES: dict[tuple[str, str], str] = {}


def sink_state(namespace: str, name: str, state: str | None) -> None:
    """Records a sink's state (None when it is gone: its per-sink series go too) and recounts the gauge."""
    if state is None:
        _STATES.pop((namespace, name), None)
        _forget(namespace, name)
    else:
        _STATES[(namespace, name)] = state
    for s in {*map(str, SinkState), *set(_STATES.values())}:
        SINKS.labels(s).set(sum(1 for v in _STATES.values() if v == s))


SINK = ["namespace", "sink"]


def labels(namespace: str, name: str) -> tuple[str, str]:
    """A sink's labels: its namespace, and the sink id the job labels its own metrics with (`sink`), so one
    query joins the operator's series with the drivers'."""
    return namespace, sink_id(namespace, name)

LAG = Gauge("chsink_operator_sink_lag", "Offsets not yet delivered, over all the sink's partitions", SINK)
TOPIC_LAG = Gauge("chsink_operator_sink_topic_lag", "Offsets not yet delivered, per topic", [*SINK, "topic"])
STATE = Gauge("chsink_operator_sink_state", "1 for the sink's state, 0 for the others", [*SINK, "state"])
READY = Gauge("chsink_operator_sink_ready", "1 when the sink is Ready (its job runs and delivers)", SINK)
LAST_COMMIT = Gauge("chsink_operator_sink_last_commit_timestamp_seconds",
                    "When a block of the sink was last committed (AFTER), as the state store says", SINK)
COMMIT_AGE = Gauge("chsink_operator_sink_last_commit_age_seconds",
                   "Seconds since the sink's last commit, as of the operator's last look (alerts: prefer "
                   "time() - chsink_operator_sink_last_commit_timestamp_seconds)", SINK)
REBALANCE = Gauge("chsink_operator_sink_rebalance_phase", "1 for the phase of a rebalance in progress",
                  [*SINK, "phase"])
VERIFY_OK = Gauge("chsink_operator_sink_verify_ok",
                  "1 when the scheduled verifier's last run found every settled offset once, 0 otherwise", SINK)
VERIFY_ANOMALIES = Gauge("chsink_operator_sink_verify_anomalies",
                         "Partitions the scheduled verifier's last run found an offset missing or stored twice in",
                         SINK)
VERIFIED_OFFSETS = Gauge("chsink_operator_sink_verified_offsets", "Offsets the scheduled verifier has checked", SINK)
LAST_VERIFICATION = Gauge("chsink_operator_sink_last_verification_timestamp_seconds",
                          "When the scheduled verifier's last run finished", SINK)
JOB_FAILURES = Counter("chsink_operator_sink_job_failures_total",
                       "Drivers of the sink's job that ended in error, as the operator saw them", SINK)
EXECUTORS_LOST = Counter("chsink_operator_sink_executors_lost_total",
                         "Executor pods of the sink's job reported FAILED or UNKNOWN (deleted)", SINK)
_PER_SINK = (JOB_FAILURES, EXECUTORS_LOST, LAG, TOPIC_LAG, STATE, READY, LAST_COMMIT, COMMIT_AGE, REBALANCE,
             VERIFY_OK, VERIFY_ANOMALIES, VERIFIED_OFFSETS, LAST_VERIFICATION)


@dataclass(frozen=True)
class SinkHealth:
    state: str
    ready: bool
    lag: int | None = None  # None: not known (the store or Kafka did not answer)
    topic_lag: Mapping[str, int] = field(default_factory=dict)
    last_commit: float | None = None  # epoch seconds
    rebalance_phase: str | None = None


def sink_health(namespace: str, name: str, h: SinkHealth, now: float) -> None:
    """Sets the sink's per-sink series from what its reconcile found; states and phases are one-hot."""
    key = labels(namespace, name)
    for s in map(str, SinkState):
        STATE.labels(*key, s).set(1 if s == h.state else 0)
    READY.labels(*key).set(1 if h.ready else 0)
    JOB_FAILURES.labels(*key).inc(0)  # from 0, so that increase() sees the first failure
    EXECUTORS_LOST.labels(*key).inc(0)
    if h.lag is not None:
        LAG.labels(*key).set(h.lag)
        set_per_shard(TOPIC_LAG, key, dict(h.topic_lag))
    if h.last_commit is not None:
        LAST_COMMIT.labels(*key).set(h.last_commit)
        COMMIT_AGE.labels(*key).set(max(0.0, now - h.last_commit))
    for phase in map(str, RebalancePhase):
        REBALANCE.labels(*key, phase).set(1 if phase == h.rebalance_phase else 0)


def job_trouble(namespace: str, name: str, failures: int, lost: int) -> None:
    key = labels(namespace, name)
    JOB_FAILURES.labels(*key).inc(failures)
    EXECUTORS_LOST.labels(*key).inc(lost)


def verification(namespace: str, name: str, ok: bool, anomalies: int, offsets: int, now: float) -> None:
    key = labels(namespace, name)
    VERIFY_OK.labels(*key).set(1 if ok else 0)
    VERIFY_ANOMALIES.labels(*key).set(anomalies)
    VERIFIED_OFFSETS.labels(*key).set(offsets)
    LAST_VERIFICATION.labels(*key).set(now)


def _forget(namespace: str, name: str) -> None:
    for gauge in (*_PER_SINK, STALLED):  # counters too: both keep a child per label tuple
        for found in [k for k in _label_sets(gauge) if k[:2] == labels(namespace, name)]:
            gauge.remove(*found)


def _label_sets(gauge: Gauge | Counter) -> list[tuple[str, ...]]:
    # prometheus_client keeps a child per label tuple; it has no public listing
    return [tuple(labels) for labels in gauge._metrics]


STALLED = Gauge("chsink_operator_stalled_partitions",
                "Partitions unconfirmed (BEFORE) past CHSINK_STALL_SECONDS, by sink and shard",
                ["namespace", "sink", "shard"])


def stalled(namespace: str, name: str, per_shard: dict[str, int]) -> None:
    set_per_shard(STALLED, labels(namespace, name), per_shard)


LEADER = Gauge("chsink_operator_leader", "1 on the replica that holds the leader Lease and acts, 0 on a standby")
