"""Rebalancing driven by the operator, on the real API server with state in the ZooKeeper-backed KeeperMap:
the plan in status, approval, the drain, the new layout in the job's config; and a stalled shard as Degraded.

The test bed has no spark-operator, so the test does its one part in the drain: once the operator has
suspended the SparkApplication, it sets the application's state to SUSPENDED, as the spark-operator
does after stopping the driver.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import yaml

from sparkapp.config import parse_config
from sparkapp.core.state_machine import OffsetRange
from sparkapp.edges.store import PartitionKey

from .test_operator import app_of, get, wait_for

APPROVAL = "chsink.io/rebalance-approval"
APPROVE = "chsink.io/approve-rebalance"


def shards(s, n: int | list[int]) -> dict:
    which = range(n) if isinstance(n, int) else n
    return {"shards": [{"endpoint": s["dsn"], "database": f"{s['db']}_s{i}"} for i in which],
            "database": s["db"], "tables": {"*": "events"}}


def cr(s) -> dict:
    return get(s["kube"], "clickhousesink", s["name"]) or {}


def job_config(s):
    cm = get(s["kube"], "configmap", f"chsink-{s['name']}")
    return parse_config(yaml.safe_load(cm["data"]["sink.yaml"]))


def set_app_state(s, state: str) -> None:
    """The spark-operator's part: the application's state as it reports it."""
    s["kube"].kubectl("patch", "sparkapplication", f"chsink-{s['name']}", "--subresource=status", "--type=merge",
                      "-p", json.dumps({"status": {"driverInfo": {}, "applicationState": {"state": state}}}))


def test_growing_then_shrinking_shards_plans_waits_for_approval_drains_then_applies(sink):
    s = sink
    sid = f"default.{s['name']}"
    store = s["store"]
    store.ensure_schema()
    s["apply"](clickhouse=shards(s, 2))
    wait_for("layout v0", lambda: (cr(s).get("status") or {}).get("layout", {}).get("version") == 0)
    epoch = store.acquire_epoch(sid)
    cfg = job_config(s)
    assert cfg.sharding.layout == 0 and len(cfg.clickhouse.endpoints) == 2
    layout = cfg.layouts()[0]
    for p in range(6):  # the job ran under layout 0: partitions on the shards it chose, AFTER
        pk = PartitionKey(sid, s["topic"], p)
        store.begin(pk, OffsetRange(0, 9), epoch, 0, layout.partition_shard(s["topic"], p))
        store.commit(pk, OffsetRange(0, 9), epoch, 0, layout.partition_shard(s["topic"], p))
    s["kube"].kubectl("annotate", "clickhousesink", s["name"], f"{APPROVAL}=required")
    s["apply"](clickhouse=shards(s, 3))
    rb = wait_for("a plan awaiting approval", lambda: (r := (cr(s).get("status") or {}).get("rebalance")) and
                  r["phase"] == "AwaitingApproval" and r)
    assert (rb["fromLayout"], rb["toLayout"]) == (0, 1)
    assert len(rb["plan"]) >= 2, "growing 2 -> 3 shards moves partitions to the new shard"
    # only partitions of shards over their share (6 partitions / 3 shards) move, and every shard ends with 2
    loads = Counter(layout.partition_shard(s["topic"], p) for p in range(6))
    for move in rb["plan"]:
        assert set(move) == {"partition", "from", "to"} and loads[int(move["from"].split()[0])] > 2, move
    assert sorted(Counter(rb["target"]["assignment"].values()).values()) == [2, 2, 2]
    assert any(move["to"].split()[0] == "2" for move in rb["plan"]), "the new shard gets partitions"
    assert job_config(s).sharding.layout == 0, "nothing applied before approval"
    plan_cmd = ("get", "clickhousesink", s["name"], "-o", "jsonpath={range .status.rebalance.plan[*]}"
                "{.partition}{'\\t'}{.from}{' -> '}{.to}{'\\n'}{end}")
    pending = [s["kube"].kubectl("get", "clickhousesink", s["name"]).stdout, s["kube"].kubectl(*plan_cmd).stdout,
               s["kube"].kubectl("get", "clickhousesink", s["name"], "-o",
                                 "jsonpath={.status.rebalance.message}").stdout]
    assert not app_of(s)["spec"].get("suspend")

    moved = int(rb["plan"][0]["partition"].rsplit("/", 1)[1])
    pk0 = PartitionKey(sid, s["topic"], moved)  # in flight when the drain starts
    store.begin(pk0, OffsetRange(10, 19), epoch, 0, layout.partition_shard(s["topic"], moved))
    s["kube"].kubectl("annotate", "clickhousesink", s["name"], f"{APPROVE}=1")
    wait_for("draining", lambda: cr(s)["status"]["rebalance"]["phase"] == "Draining"
             and app_of(s)["spec"].get("suspend") is True)
    set_app_state(s, "SUSPENDED")  # the driver stopped at a batch boundary, leaving pk0 BEFORE
    # the drain does not wait for pk0 (it could not: the job is stopped); it is re-sent under layout 0 later
    wait_for("applied", lambda: cr(s)["status"]["rebalance"]["phase"] == "Applied", timeout=90)
    status = cr(s)["status"]
    assert status["layout"]["version"] == 1 and len(status["layout"]["endpoints"]) == 3
    assert status["previousLayout"]["version"] == 0
    cfg = job_config(s)
    assert cfg.sharding.layout == 1 and len(cfg.clickhouse.endpoints) == 3
    assert cfg.sharding.previous is not None and cfg.sharding.previous.layout == 0
    for move in rb["plan"]:
        assert cfg.sharding.assignment[move["partition"]] == int(move["to"].split()[0])
    wait_for("resumed", lambda: not app_of(s)["spec"].get("suspend"))
    kubectl = s["kube"].kubectl
    shown = [kubectl("get", "clickhousesink", s["name"]).stdout, kubectl(*plan_cmd).stdout]
    assert shown[1].count(" -> ") == len(rb["plan"]) and pending[1] == shown[1]
    print("\n".join([*pending, "", "after approval and the drain:", *shown]), file=sys.__stdout__)
    set_app_state(s, "RUNNING")  # resubmitted under layout 1

    # the status lost (a backup restore, a GitOps tool re-applying the object): the layout comes back as applied,
    # from the sink's ConfigMap, and the job's config and spec are untouched (nothing restarts or is re-sent)
    before = {k: cr(s)["status"][k] for k in ("layout", "previousLayout")}
    cm_before, hash_before = job_config(s), app_of(s)["metadata"]["annotations"]["chsink.io/spec-hash"]
    wiped = json.loads(s["kube"].kubectl("patch", "clickhousesink", s["name"], "--subresource=status",
                                         "--type=merge", "-p", '{"status": null}', "-o", "json").stdout)
    assert "layout" not in (wiped.get("status") or {})
    wait_for("the layout back", lambda: (cr(s).get("status") or {}).get("layout"))
    assert {k: cr(s)["status"][k] for k in ("layout", "previousLayout")} == before
    assert job_config(s) == cm_before
    assert app_of(s)["metadata"]["annotations"]["chsink.io/spec-hash"] == hash_before
    # kopf posts Events in the background, after the status patch: the Event may land a moment later (CI of 8ae4e81)
    wait_for("the LayoutRestored Event", lambda: "LayoutRestored" in s["kube"].kubectl(
        "get", "events", "--field-selector", f"involvedObject.name={s['name']}").stdout, timeout=30)

    # shrink 3 -> 2, the middle shard removed: exactly its partitions move
    job_config_assignment_v1 = dict(cfg.sharding.assignment)
    on_middle = {tp for tp, shard in job_config_assignment_v1.items() if shard == 1}
    s["apply"](clickhouse=shards(s, [0, 2]))
    rb = wait_for("a shrink plan", lambda: (r := cr(s)["status"]["rebalance"]) and r["toLayout"] == 2
                  and r["phase"] == "AwaitingApproval" and r)
    assert {m["partition"] for m in rb["plan"]} == on_middle
    print("\n".join(["", "shrinking 3 -> 2 (the middle shard removed):",
                     s["kube"].kubectl("get", "clickhousesink", s["name"]).stdout,
                     s["kube"].kubectl(*plan_cmd).stdout]), file=sys.__stdout__)
    assert all(m["from"].startswith(f"1 ({s['dsn']}#{s['db']}_s1)") for m in rb["plan"])
    s["kube"].kubectl("annotate", "clickhousesink", s["name"], f"{APPROVE}=2", "--overwrite")
    # layout 0 would be dropped while pk0 is still unconfirmed under it: the job keeps running until it is
    msg = wait_for("settling", lambda: (r := cr(s)["status"]["rebalance"])["phase"] == "Settling" and r["message"])
    assert f"{s['topic']}/{moved} [10, 19] (layout v0)" in msg and not app_of(s)["spec"].get("suspend")
    store.commit(pk0, OffsetRange(10, 19), epoch, 0, layout.partition_shard(s["topic"], moved))
    wait_for("draining again", lambda: cr(s)["status"]["rebalance"]["phase"] == "Draining")
    set_app_state(s, "SUSPENDED")
    wait_for("shrunk", lambda: cr(s)["status"]["rebalance"]["phase"] == "Applied", timeout=90)
    cfg = job_config(s)
    assert cfg.sharding.layout == 2 and cfg.clickhouse.shard_databases == [f"{s['db']}_s0", f"{s['db']}_s2"]
    assert cfg.sharding.previous is not None and cfg.sharding.previous.layout == 1
    for tp, shard in cfg.sharding.assignment.items():  # the others kept their shard (renumbered 2 -> 1)
        if tp not in on_middle:
            assert shard == {0: 0, 2: 1}[job_config_assignment_v1[tp]]


def test_a_shard_whose_partitions_stay_unconfirmed_is_degraded_by_name(sink, monkeypatch):
    monkeypatch.setenv("CHSINK_STALL_SECONDS", "1")
    s = sink
    sid = f"default.{s['name']}"
    store = s["store"]
    store.ensure_schema()
    s["apply"](clickhouse=shards(s, 3), sharding={"policy": "partition"})
    wait_for("layout v0", lambda: (cr(s).get("status") or {}).get("layout", {}).get("version") == 0)
    epoch = store.acquire_epoch(sid)
    pk = PartitionKey(sid, s["topic"], 1)
    store.begin(pk, OffsetRange(0, 9), epoch, 0, 2)  # sent to shard 2, never acknowledged
    cond = wait_for("Degraded", lambda: next((c for c in cr(s)["status"].get("conditions", [])
                                              if c["type"] == "Degraded" and c["status"] == "True"), None))
    assert cond["reason"] == "ShardStalled"
    assert "shard 2 (" in cond["message"] and f"#{s['db']}_s2)" in cond["message"]
    assert f"{s['topic']}/1" in cond["message"]
    store.commit(pk, OffsetRange(0, 9), epoch, 0, 2)
    wait_for("recovered", lambda: next(c for c in cr(s)["status"]["conditions"] if c["type"] == "Degraded")
             ["status"] == "False")
