"""The lifecycle decision (pure), property-tested: whatever the job, the spec and the problems, `Ready` means the
job runs and nothing is wrong, every problem is a Degraded condition, and a wrong spec is Invalid."""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from sinkoperator.jobfailure import HELD, held
from sinkoperator.lifecycle import Observed, Problem, conditions, keep_transition_times, sink_state
from sinkoperator.model import JobFailure, SinkSpec
from sinkoperator.render import sink_config
from sinkoperator.spec import FAILED_APP_STATES, AppState, DesiredState, Reason, RebalancePhase, SinkState
from sinkoperator.status import merge_patch
from sparkapp.config import ConfigError

SAMPLE = yaml.safe_load((Path(__file__).parent / "sample.yaml").read_text())

problems = st.none() | st.builds(Problem, st.sampled_from(list(Reason)), st.text(max_size=20), st.booleans())
observed = st.builds(Observed, st.sampled_from(list(DesiredState)), st.none() | st.sampled_from(list(AppState)),
                     st.text(max_size=10), st.none() | st.sampled_from(list(RebalancePhase)), problems, st.booleans(),
                     st.sampled_from(["", "created", "patched", "deleted"]),
                     st.lists(st.sampled_from(["d (driver)", "e1 (executor)", "e2 (executor)"]), max_size=2)
                     .map(tuple), st.booleans())


@given(observed, st.integers(0, 10))
def test_ready_means_the_job_runs_and_nothing_is_wrong(o: Observed, generation: int) -> None:
    state, conds = conditions(o, generation, "2026-11-23T00:00:00Z")
    by = {c.type: c for c in conds}
    assert sorted(by) == ["Degraded", "Progressing", "Ready"] and len(conds) == 3
    assert all(c.observed_generation == generation for c in conds)
    if by["Ready"].true:
        assert state is SinkState.RUNNING and o.app is AppState.RUNNING and o.desired is DesiredState.RUNNING
        assert not by["Degraded"].true and o.problem is None and not o.deleting
    if o.problem is not None:
        assert by["Degraded"].true and by["Degraded"].reason == o.problem.reason and not by["Ready"].true
        assert by["Ready"].reason == o.problem.reason  # `kubectl get` READY False says why
    if o.problem is not None and o.problem.permanent and not o.deleting:
        assert state is SinkState.INVALID
    if o.problem is None and state is SinkState.FAILED:
        assert by["Degraded"].true and by["Degraded"].reason == Reason.JOB_FAILED
    if o.desired is DesiredState.RUNNING and o.app in FAILED_APP_STATES and not o.deleting and \
            o.rebalance is not RebalancePhase.DRAINING and not (o.problem and o.problem.permanent):
        assert state is SinkState.FAILED
    if state in (SinkState.PAUSED, SinkState.STOPPED):  # nothing of the job can still land
        assert not o.pods
    if o.pods and o.desired is not DesiredState.RUNNING and not o.deleting and not (o.problem and o.problem.permanent):
        assert state is (SinkState.PAUSING if o.desired is DesiredState.PAUSED else SinkState.STOPPING)
        assert by["Progressing"].true and not by["Ready"].true and (o.problem or o.pods[0] in by["Ready"].message)
    if o.rebalance is RebalancePhase.DRAINING and o.desired is DesiredState.RUNNING and not o.deleting and \
            not (o.problem and o.problem.permanent):
        assert state is SinkState.DRAINING and not by["Ready"].true and by["Progressing"].true
    if o.held and o.desired is DesiredState.RUNNING and not o.deleting and o.rebalance is not RebalancePhase.DRAINING \
            and not (o.problem and o.problem.permanent):  # suspended on a failure only a change fixes
        assert state is SinkState.FAILED and not by["Ready"].true


@given(observed)
def test_transition_times_move_only_when_the_status_does(o: Observed) -> None:
    _, first = conditions(o, 1, "t1")
    _, again = conditions(o, 2, "t2")
    kept = keep_transition_times(first, again)
    assert [c.last_transition_time for c in kept] == ["t1", "t1", "t1"]
    flipped = Observed(o.desired, o.app, problem=None if o.problem else Problem(Reason.RECONCILE_FAILED, "x"))
    _, other = conditions(flipped, 3, "t3")
    for old, new in zip(first, keep_transition_times(first, other), strict=True):
        assert new.last_transition_time == ("t1" if old.status == new.status else "t3")


def test_no_application_yet_is_pending_with_a_problem_and_deploying_without() -> None:
    assert sink_state(Observed(DesiredState.RUNNING, None)) is SinkState.DEPLOYING
    assert sink_state(Observed(DesiredState.RUNNING, None, problem=Problem(Reason.SPARK_OPERATOR_MISSING, "")))\
        is SinkState.PENDING


# (spec path, value, what the operator's error names, what the API server's CEL rule says or None where CEL
# cannot check it): one mistake, refused the same way at apply time and at reconcile time
BAD_SPECS = [
    (("batching", "triggerInterval"), "banana", "spec.batching.triggerInterval: 'banana' is not a duration",
     "spec.batching.triggerInterval"),
    (("clickhouse", "shards"), [{"endpoint": "https://a:8443"}, {"endpoint": "https://a:8443"}],
     "spec.clickhouse: shards[1] repeats shards[0]", "clickhouse.shards repeats a shard"),
    (("clickhouse", "tableHeader"), "t", "give tableField or tableHeader, not both",
     "give tableField or tableHeader, not both"),
    (("dlq", "topic"), "orders", "dlq.topic 'orders' is one of the sink's own source topics",
     "dlq.topic is one of kafka.topics"),
    (("kafka", "secretRef"), None, "spec.kafka: secretOptions names keys of a Secret", "give secretRef.name"),
    (("spark", "sparkConf"), {"spark.speculation": "true"}, "spec.spark: sparkConf spark.speculation='true'",
     "spark.speculation must stay false"),
    (("kafka", "topicPattern"), "orders[", "topicPattern 'orders[' is not a regular expression", None),
    (("format",), {"type": "string", "envelope": "debezium"}, "envelope debezium needs a record format",
     "format.envelope debezium needs a record format"),
    (("format",), {"keyFormat": "avro"}, "keyFormat avro needs `keyAvroSchema` or `schemaRegistryUrl`",
     "format.keyFormat avro needs keyAvroSchema or schemaRegistryUrl"),
    (("format",), {"type": "protobuf"}, "format protobuf needs `protobufDescriptorSet` with `protobufMessage`",
     "format protobuf needs protobufDescriptorSet with protobufMessage, or schemaRegistryUrl"),
    (("format",), {"type": "protobuf", "schemaRegistryUrl": "http://r:8081", "protobufMessage": "shop.v1.Order"},
     "`protobufDescriptorSet` and `protobufMessage` go together",
     "format.protobufDescriptorSet and format.protobufMessage go together"),
    (("format",), {"type": "protobuf", "protobufDescriptorSet": "CgA=", "protobufMessage": "shop.v1.Order"},
     "protobufMessage 'shop.v1.Order' is not a message of the descriptor set", None),
    (("spark", "volumes"), [{"name": "two", "emptyDir": {}, "secret": {"secretName": "s"}}],
     "volume two takes exactly one of persistentVolumeClaim, secret, configMap, emptyDir",
     "a volume takes exactly one of persistentVolumeClaim, secret, configMap, emptyDir"),
    (("spark", "executor"), {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]},
     "env A: give value or valueFrom, not both", "give value or valueFrom, not both"),
    (("spark", "driver"), {"envFrom": [{"secretRef": {"name": "a"}, "configMapRef": {"name": "b"}}]},
     "envFrom takes exactly one of secretRef, configMapRef", "envFrom takes exactly one of secretRef, configMapRef"),
    (("spark", "driver"), {"volumeMounts": [{"name": "nope", "mountPath": "/x"}]},
     "driver.volumeMounts[0]: no volume 'nope' in spark.volumes []", None),
    (("spark", "driver"), {"env": [{"name": "CHSINK_CLICKHOUSE_PASSWORD", "value": "x"}]},
     "driver.env[0]: CHSINK_CLICKHOUSE_PASSWORD is set by the operator", None),
    (("spark", "executor"), {"labels": {"team": "a", "chsink.io/sink": "other"}},
     "labels: ['chsink.io/sink'] are set by the operator or the spark-operator", None),
    (("spark", "driver"), {"annotations": {"prometheus.io/port": "1"}},
     "annotations: ['prometheus.io/port'] are set by the operator", None),
    (("spark", "driver"), {"priorityClassName": "Not_A_Name"}, "spark.driver.priorityClassName", None),
]


def bad_spec(path: tuple[str, ...], value: object) -> dict:
    spec = copy.deepcopy(SAMPLE["spec"])
    spec["clickhouse"]["tableField"] = "table"
    if path == ("clickhouse", "tableHeader"):
        spec["clickhouse"]["tableHeader"] = value
    else:
        del spec["clickhouse"]["tableField"]
        node = spec
        for p in path[:-1]:
            node = node.setdefault(p, {})
        if value is None:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    if path == ("kafka", "topicPattern"):
        del spec["kafka"]["topics"]
    return spec


@pytest.mark.parametrize(("path", "value", "needle"), [b[:3] for b in BAD_SPECS], ids=[".".join(b[0]) for b in BAD_SPECS])
def test_the_operator_names_what_is_wrong(path, value, needle) -> None:
    with pytest.raises(ConfigError) as e:
        sink_config("default", "orders", SinkSpec.parse(bad_spec(path, value)))
    assert needle in str(e.value), str(e.value)


def test_a_dlq_topic_the_pattern_matches_is_a_loop_and_a_long_name_is_refused() -> None:
    spec = bad_spec(("kafka", "topicPattern"), "orders.*")
    spec["dlq"] = {"topic": "orders-dlq"}
    with pytest.raises(ConfigError, match=r"dlq\.topic 'orders-dlq' is one of the sink's own source topics"):
        sink_config("default", "orders", SinkSpec.parse(spec))
    with pytest.raises(ConfigError, match=r"metadata\.name: 50 characters; at most 45"):
        SinkSpec.parse(SAMPLE["spec"], "n" * 50)


@given(st.sampled_from([1, 2, 3, 4, 5, 6]), st.integers(0, 1000), st.integers(1, 600), st.booleans())
def test_only_an_error_a_change_fixes_is_held_and_only_for_its_interval(code: int, age: int, hold_s: int,
                                                                        same: bool) -> None:
    now = dt.datetime(2026, 12, 7, 3, 0, tzinfo=dt.UTC)
    last = JobFailure.model_validate({"exitCode": code, "pod": "d", "specHash": "h1",
                                      "finishedAt": (now - dt.timedelta(seconds=age)).isoformat()})
    assert held(last, "h1" if same else "h2", now, hold_s) == (code in HELD and same and age < hold_s)
    assert not held(None, "h1", now, hold_s)


def _merged(target: object, patch: object) -> object:
    """RFC 7386's MergePatch, as the API server applies a merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merged(out.get(key), value)
    return out


_leaf = st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "x", "y"])  # a status holds no nulls
_json = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=3) |
                     st.dictionaries(st.sampled_from("abcd"), inner, max_size=4), max_leaves=12)
_status = st.dictionaries(st.sampled_from("abcde"), _json, max_size=5)


@given(_status, _status)
def test_the_status_patch_turns_what_was_read_into_the_new_status_and_sends_only_what_changed(
        was: dict[str, object], now: dict[str, object]) -> None:
    patch = merge_patch(was, now)
    assert _merged(was, patch) == now  # a field the new status leaves out is removed, at any depth
    assert all(key not in patch for key in was if key in now and was[key] == now[key])  # what is unchanged is not
    assert merge_patch(now, now) == {}
