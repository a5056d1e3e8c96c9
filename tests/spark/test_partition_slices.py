"""How a micro-batch's Arrow rows are split into Kafka partitions (partition_slices): whatever order and chunking
Spark hands them over in, each topic-partition comes out once, its rows offset-ordered, none lost or repeated."""

from __future__ import annotations

import random

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkapp.spark.batches import partition_slices

_ROWS = st.lists(st.tuples(st.sampled_from(["t", "u", "topic-é", "t2"]), st.integers(0, 3), st.integers(0, 10**12)),
                 max_size=60, unique_by=lambda r: (r[0], r[1], r[2]))


@given(rows=_ROWS, grouped=st.booleans(), chunk=st.integers(1, 7), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=300, deadline=None)
def test_each_partition_comes_out_once_in_offset_order(rows, grouped, chunk, seed):
    rows = sorted(rows) if grouped else random.Random(seed).sample(rows, len(rows))
    tbl = pa.table({"topic": pa.array([r[0] for r in rows], pa.string()),
                    "partition": pa.array([r[1] for r in rows], pa.int32()),
                    "offset": pa.array([r[2] for r in rows], pa.int64()),
                    "value": pa.array([f"{r}".encode() for r in rows], pa.binary())})
    tbl = pa.Table.from_batches(tbl.to_batches(max_chunksize=chunk), tbl.schema) if rows else tbl
    out = [(t, p, s) for t, p, s in partition_slices(tbl)]
    assert len({(t, p) for t, p, _ in out}) == len(out)  # each partition once
    got = []
    for t, p, s in out:
        assert isinstance(t, str) and isinstance(p, int)
        assert s.column("topic").to_pylist() == [t] * s.num_rows and s.column("partition").to_pylist() == [p] * s.num_rows
        offsets = s.column("offset").to_pylist()
        assert offsets == sorted(offsets)
        assert s.column("value").to_pylist() == [f"{(t, p, o)}".encode() for o in offsets]  # rows kept whole
        got += [(t, p, o) for o in offsets]
    assert sorted(got) == sorted(rows)
