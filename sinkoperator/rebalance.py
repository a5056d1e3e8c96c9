"""Shard layouts and rebalance plans, pure: what the operator shows in status and applies after a drain.

A layout is what a ClickHouseSink's job writes under: its version, shard endpoints (and databases),
weights and, for policy `partition`, the assignment of partitions to shards. The spec says what the
user wants; `status.layout` says what the job runs with. When they differ, the operator plans a move
(status.rebalance), waits for approval if the sink asks for it, drains the job (suspended at a batch
boundary; a range it left BEFORE is re-sent under the layout it was sent under, kept as the previous one),
and only then applies the new layout.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sparkapp.core.routing import DEFAULT_STRIPE, HashName, Layout, Policy, parse_assignment, rebalance

from .model import SinkSpec

Partition = tuple[str, int]
# what decides a row's shard besides the shards themselves, and the defaults of each
_ROUTING_DEFAULTS = {"policy": Policy.PARTITION.value, "key": None, "hash": HashName.XXHASH64.value,
                     "stripe": DEFAULT_STRIPE}


def spec_layout(spec: SinkSpec) -> dict[str, Any]:
    """The shards and routing the spec asks for, in status.layout's shape (without version or assignment)."""
    shards, sharding = spec.clickhouse.shards, spec.sharding
    chosen = sharding.model_dump(exclude_unset=True)
    return {"endpoints": [s.endpoint for s in shards],
            "shardDatabases": [s.database or spec.clickhouse.database for s in shards],
            "weights": list(sharding.weights or [1] * len(shards)),
            **{k: chosen.get(k, d) if chosen.get(k) is not None else d for k, d in _ROUTING_DEFAULTS.items()}}


def routing(layout: Mapping[str, Any]) -> dict[str, Any]:
    """A layout's routing parameters (layouts recorded before they were kept default to the defaults)."""
    return {k: layout.get(k, d) for k, d in _ROUTING_DEFAULTS.items()}


def same_shards(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(list(a.get(k) or []) == list(b.get(k) or []) for k in ("endpoints", "shardDatabases", "weights")) \
        and routing(a) == routing(b)


def initial_layout(spec: SinkSpec) -> dict[str, Any]:
    """Layout 0: what the spec asks for when the sink is created (nothing ran yet, nothing to move)."""
    return {"version": 0, **spec_layout(spec), "assignment": {}}


def to_layout(status_layout: Mapping[str, Any], policy: Policy) -> Layout:
    assignment = parse_assignment(status_layout.get("assignment") or {})
    return Layout(int(status_layout["version"]), tuple(status_layout["weights"]), policy, assignment=assignment)


def _shard_id(layout: Mapping[str, Any], shard: int) -> tuple[str, str]:
    return layout["endpoints"][shard], layout["shardDatabases"][shard]


def shard_label(layout: Mapping[str, Any], shard: int) -> str:
    endpoint, database = _shard_id(layout, shard)
    return f"{shard} ({endpoint}#{database})"


def plan(old: Mapping[str, Any], new_shards: Mapping[str, Any], partitions: Iterable[Partition],
         stored: Mapping[Partition, tuple[int, int]]) -> dict[str, Any]:
    """The next layout and the plan of moves from `old` (status.layout) to the spec's shards.

    `stored`: per partition, (layout, shard) from its state row: the recorded assignment, which wins
    over what the old layout would compute. Shards are matched by endpoint and database, so removing
    a shard from the middle of the list moves only that shard's partitions.
    """
    parts = sorted(set(partitions) | set(stored))
    old_layout = to_layout(old, Policy.PARTITION)
    ids_new = [_shard_id(new_shards, s) for s in range(len(new_shards["endpoints"]))]
    target: dict[str, Any] = {"version": int(old["version"]) + 1, **dict(new_shards), "assignment": {}}
    moves: list[dict[str, Any]] = []
    policies = {routing(old)["policy"], routing(new_shards)["policy"]}
    if policies != {Policy.PARTITION.value}:  # rows are re-spread (or the policy changed): all are affected
        moves = [{"partition": f"{t}/{p}", "from": "all", "to": "all"} for t, p in parts]
        return {"target": target, "moves": moves, "affected": [f"{t}/{p}" for t, p in parts]}
    current_old: dict[Partition, int] = {}
    current_new: dict[Partition, int] = {}
    for tp in parts:
        version, shard = stored.get(tp, (old_layout.version, old_layout.partition_shard(*tp)))
        if version != old_layout.version:  # recorded under an older layout still: the layout's own choice
            shard = old_layout.partition_shard(*tp)
        current_old[tp] = shard
        if shard < len(old["endpoints"]) and _shard_id(old, shard) in ids_new:
            current_new[tp] = ids_new.index(_shard_id(old, shard))
    assignment, _ = rebalance(parts, new_shards["weights"], current_new)
    target["assignment"] = {f"{t}/{p}": s for (t, p), s in assignment.items()}
    for tp, s in assignment.items():
        if tp not in current_new or current_new[tp] != s:
            moves.append({"partition": f"{tp[0]}/{tp[1]}", "from": shard_label(old, current_old[tp]),
                          "to": shard_label(target, s)})
    return {"target": target, "moves": moves, "affected": [m["partition"] for m in moves]}


def previous_config(layout: Mapping[str, Any]) -> dict[str, Any]:
    """A status layout as SinkConfig's sharding.previous."""
    return {"layout": int(layout["version"]), "endpoints": list(layout["endpoints"]),
            "shardDatabases": list(layout["shardDatabases"]), "weights": list(layout["weights"]),
            "assignment": dict(layout.get("assignment") or {}),
            **{k: v for k, v in routing(layout).items() if v is not None}}
