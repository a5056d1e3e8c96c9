"""Shard routing, pure: which shard a record or a whole partition goes to.

Three policies, and every decision that depends on the policy is a method of Layout:
- `partition`: every Kafka partition goes to one shard through an assignment that is recorded with
  the partition's state, so a retry always reaches the shard the first attempt reached;
- `key`: a hash of one column, computed exactly as ClickHouse computes `xxHash64(col)` or
  `cityHash64(col)`, then weighted like a Distributed table: slot = hash % sum(weights), and the
  shard is the one whose cumulative weight first exceeds the slot;
- `offsetStripe`: clickhouse_sinker's `(offset / stripe) % shards`.
A new policy is a Policy member plus its branches in Layout (and its test).
"""

from __future__ import annotations

import enum
import itertools
import json
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .records import Message


class Policy(enum.Enum):
    PARTITION = "partition"
    KEY = "key"
    OFFSET_STRIPE = "offsetStripe"


DEFAULT_STRIPE = 10_000  # offsets per stripe (policy offsetStripe)


class HashName(enum.Enum):
    XXHASH64 = "xxHash64"
    CITYHASH64 = "cityHash64"


def key_bytes(value: Any, type_name: str) -> bytes:
    """The bytes ClickHouse hashes for a value of the key column: UTF-8 for strings, little-endian for
    fixed-width integers (the column's own width)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    widths = {"Int8": "<b", "UInt8": "<B", "Int16": "<h", "UInt16": "<H", "Int32": "<i", "UInt32": "<I",
              "Int64": "<q", "UInt64": "<Q"}
    if isinstance(value, int) and type_name in widths:
        return struct.pack(widths[type_name], value)
    raise ValueError(f"cannot hash a {type(value).__name__} of type {type_name} as ClickHouse does")


def _int_hash64(x: int) -> int:
    """ClickHouse's intHash64 (MurmurHash3's fmix64); its cityHash64 applies it to numbers, salted."""
    m = (1 << 64) - 1
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & m
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & m
    x ^= x >> 33
    return x


def hash64(name: HashName, data: bytes, numeric: bool = False) -> int:
    """The 64-bit hash ClickHouse computes: over the bytes, or, for cityHash64 of a number, intHash64 of
    the value's bytes widened to 64 bits with zeros (as ClickHouse's bit_cast does)."""
    if name is HashName.CITYHASH64 and numeric:
        return _int_hash64(int.from_bytes(data.ljust(8, b"\0"), "little") ^ 0x4CF2D2BAAE6DA887)
    if name is HashName.XXHASH64:
        import xxhash

        return int(xxhash.xxh64_intdigest(data))
    from clickhouse_cityhash.cityhash import CityHash64

    return int(CityHash64(data))


def weighted_shard(h: int, weights: Sequence[int]) -> int:
    """The shard of a hash under Distributed-style weights."""
    slot = h % sum(weights)
    for shard, bound in enumerate(itertools.accumulate(weights)):
        if slot < bound:
            return shard
    raise AssertionError("unreachable")


# XXH64's primes; its one-lane step and final mix below are for inputs of 8 bytes or fewer (an integer key)
_XXH_PRIMES = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)
INT_DTYPES = {"Int8": "int8", "UInt8": "uint8", "Int16": "int16", "UInt16": "uint16", "Int32": "int32",
               "UInt32": "uint32", "Int64": "int64", "UInt64": "uint64"}


def hashes64(name: HashName, keys: Sequence[Any], type_name: str) -> Any:
    """hash64 of each key (a uint64 numpy array), as ClickHouse computes it: integers of an integer column all
    at once, from their little-endian bits (as key_bytes packs them); strings, and anything else (which then
    fails as key_bytes does), one by one."""
    import numpy as np

    dtype = INT_DTYPES.get(type_name)
    ints = np.asarray(keys) if dtype else np.empty(0, dtype=object)
    # integers (or bools, which key_bytes packs as 0 and 1) that all fit the column: numpy would wrap the others
    if dtype and ints.dtype.kind in "iub" and (
            not len(ints) or np.iinfo(dtype).min <= ints.min() <= ints.max() <= np.iinfo(dtype).max):
        width = np.dtype(dtype).itemsize
        bits = ints.astype(dtype).view(f"uint{8 * width}").astype(np.uint64)
        if name is HashName.CITYHASH64:
            return _int_hashes64(bits ^ np.uint64(0x4CF2D2BAAE6DA887))
        return _xxh64_short(bits, width)
    numeric = "Int" in type_name
    return np.fromiter((hash64(name, key_bytes(k, type_name), numeric) for k in keys), dtype=np.uint64,
                       count=len(keys))


def _rotl(x: Any, r: int) -> Any:
    import numpy as np

    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _xxh64_short(v: Any, width: int) -> Any:
    """XXH64 with seed 0 of each value's `width` (1, 2, 4 or 8) little-endian bytes, `v` their bits as uint64:
    the reference algorithm's steps for an input shorter than 32 bytes (numpy's uint64 arithmetic wraps)."""
    import numpy as np

    p1, p2, p3, p4, p5 = (np.uint64(p) for p in _XXH_PRIMES)
    h = np.full(len(v), (_XXH_PRIMES[4] + width) % 2**64, dtype=np.uint64)
    if width == 8:
        h = _rotl(h ^ (_rotl(v * p2, 31) * p1), 27) * p1 + p4
    elif width == 4:
        h = _rotl(h ^ (v * p1), 23) * p2 + p3
    else:
        for i in range(width):
            h = _rotl(h ^ (((v >> np.uint64(8 * i)) & np.uint64(0xFF)) * p5), 11) * p1
    h ^= h >> np.uint64(33)
    h *= p2
    h ^= h >> np.uint64(29)
    h *= p3
    h ^= h >> np.uint64(32)
    return h


def _int_hashes64(x: Any) -> Any:
    """_int_hash64 of each value of a uint64 numpy array."""
    import numpy as np

    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    x = x * np.uint64(0xC4CEB9FE1A85EC53)
    x ^= x >> np.uint64(33)
    return x


def weighted_shards(hashes: Any, weights: Sequence[int]) -> list[int]:
    """weighted_shard of each hash of a uint64 numpy array."""
    import numpy as np

    bounds = np.cumsum(np.asarray(weights, dtype=np.uint64))
    slots = hashes % np.uint64(sum(weights))
    shards: list[int] = np.searchsorted(bounds, slots, side="right").tolist()
    return shards


def stripe_shard(offset: int, stripe: int, shards: int) -> int:
    return (offset // stripe) % shards


HASHABLE_KEY_TYPES = ("String", "Int8", "UInt8", "Int16", "UInt16", "Int32", "UInt32", "Int64",
                      "UInt64")


def key_type_ok(type_name: str) -> bool:
    """Whether a key column's ClickHouse type is one whose hash chsink computes exactly as ClickHouse does."""
    base = type_name.removeprefix("LowCardinality(").removesuffix(")") if type_name.startswith("LowCardinality(") \
        else type_name
    return base.split("(")[0] in HASHABLE_KEY_TYPES


def parse_assignment(assignment: Mapping[str, int]) -> dict[tuple[str, int], int]:
    """'topic/partition' -> shard (as configs and status hold it) to (topic, partition) -> shard."""
    out = {}
    for tp, shard in assignment.items():
        topic, _, partition = tp.rpartition("/")
        if not topic or not partition.isdigit():
            raise ValueError(f"assignment key {tp!r} is not 'topic/partition'")
        out[(topic, int(partition))] = int(shard)
    return out


@dataclass(frozen=True)
class Layout:
    """One shard layout version: how many shards, their weights and the routing policy over them.

    Every state row records the layout its range was sent under, so a retry is routed by the same
    layout even after the sink moved to a newer one.
    """

    version: int
    weights: tuple[int, ...]
    policy: Policy = Policy.PARTITION
    hash: HashName = HashName.XXHASH64
    key_type: str = ""  # the ClickHouse type of the key column (policy key)
    stripe: int = DEFAULT_STRIPE
    assignment: Mapping[tuple[str, int], int] = field(default_factory=dict)
    key: str = ""  # the key column (policy key)

    @property
    def shards(self) -> int:
        return len(self.weights)

    def partition_shard(self, topic: str, partition: int) -> int:
        """policy partition: the recorded assignment, else a stable weighted hash of the partition's name."""
        if (topic, partition) in self.assignment:
            return self.assignment[(topic, partition)]
        return weighted_shard(hash64(HashName.XXHASH64, f"{topic}/{partition}".encode()), self.weights)

    @property
    def per_row(self) -> bool:
        """Whether rows of one range are spread over shards (sub-blocks), not the whole partition to one."""
        return self.policy is not Policy.PARTITION

    @property
    def needs_key(self) -> bool:
        """Whether routing reads a column of each record (so records must be decoded in Python)."""
        return self.policy is Policy.KEY

    def range_shard(self, topic: str, partition: int) -> int:
        """The shard a new range's state row records: the partition's own shard, or 0 when rows are spread."""
        return 0 if self.per_row else self.partition_shard(topic, partition)

    def shards_of(self, shard: int) -> list[int]:
        """The shards a range recorded with `shard` touches: that one, or all of them when rows are spread."""
        return list(range(self.shards)) if self.per_row else [shard]

    def row_shards(self, offsets: Sequence[int], keys: Sequence[Any] | None = None) -> list[int]:
        """policy key / offsetStripe: the shard of each row (keys: the key column's values, in row order).
        Computed over whole arrays: this runs for every row routed by key, where a call per row cost more than
        the rest of the writer (the per-value functions above stay the reference, property-tested alike)."""
        import numpy as np

        if self.policy is Policy.OFFSET_STRIPE:
            shards: list[int] = (np.asarray(offsets, dtype=np.int64) // self.stripe % self.shards).tolist()
            return shards
        if self.policy is Policy.KEY:
            assert keys is not None
            base = self.key_type.removeprefix("LowCardinality(").split("(")[0].rstrip(")")
            return weighted_shards(hashes64(self.hash, keys, base), self.weights)
        raise ValueError("row_shards applies to policies key and offsetStripe")


@dataclass(frozen=True)
class Move:
    """One line of a rebalance plan: partition -> old shard -> new shard."""

    topic: str
    partition: int
    old: int | None
    new: int


def assign_partitions(partitions: Iterable[tuple[str, int]], weights: Sequence[int],
                      current: Mapping[tuple[str, int], int] | None = None) -> dict[tuple[str, int], int]:
    """A stable assignment: partitions keep a shard that still exists; the others (new partitions, or
    those of removed shards) go, in order, to the shard with the lowest load per unit of weight."""
    current = current or {}
    out = {tp: s for tp, s in current.items() if s < len(weights)}
    load = [0] * len(weights)
    for tp in sorted(partitions):
        if tp in out:
            load[out[tp]] += 1
    for tp in sorted(partitions):
        if tp not in out:
            shard = min(range(len(weights)), key=lambda s: ((load[s] + 1) / weights[s], s))
            out[tp] = shard
            load[shard] += 1
    return {tp: out[tp] for tp in sorted(partitions)}


def rebalance(partitions: Iterable[tuple[str, int]], weights: Sequence[int],
              current: Mapping[tuple[str, int], int]) -> tuple[dict[tuple[str, int], int], list[Move]]:
    """The new assignment for new weights (shards added or removed) and the plan of moves: as few as
    keep every shard within one partition of its weighted share."""
    parts = sorted(partitions)
    target = {s: len(parts) * w / sum(weights) for s, w in enumerate(weights)}
    kept = {tp: s for tp, s in current.items() if tp in set(parts) and s < len(weights)}
    by_shard: dict[int, list[tuple[str, int]]] = {s: [] for s in range(len(weights))}
    for tp, s in sorted(kept.items()):
        by_shard[s].append(tp)
    for s, tps in by_shard.items():  # shed the surplus of overfull shards (highest partitions first)
        while len(tps) > math.ceil(target[s] - 1e-9):
            kept.pop(tps.pop())
    new = assign_partitions(parts, weights, kept)
    moves = [Move(t, p, current.get((t, p)), s) for (t, p), s in new.items() if current.get((t, p)) != s]
    return new, moves


def record_table(m: Message, field_name: str | None, header: str | None, default: str | None) -> tuple[str | None, str]:
    """The table a record names (its `header`, or its JSON `field_name`), else `default`; None with the reason
    when it names none. The writer and the verifier route alike."""
    name: Any = None
    if header:
        name = next((v.decode(errors="replace") for k, v in m.headers if k == header), None)
    elif field_name and m.value is not None:
        try:
            rec = json.loads(m.value)
            name = rec.get(field_name) if isinstance(rec, dict) else None
        except ValueError:
            return None, "malformed JSON: cannot read the routing field"
    name = name or default
    if not isinstance(name, str) or not name:
        return None, f"no target table: field/header {field_name or header!r} missing"
    return name, ""
