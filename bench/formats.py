"""One batch of the benchmark's events sent to one real ClickHouse server over HTTP in each candidate format:
the client's CPU to build it, the server's CPU to parse and store it, and the wall time, per row, side by side.

It answers whether a binary format built on the writer beats the fast path's JSONEachRow, which the server
parses itself (ClickHouse's own format benchmarks put JSONEachRow parsing far below Native's):
- jsoneachrow: the product's fast path (build_lines, the guard's pass, one insert with a token);
- native: the product's decoder path (each record decoded in Python, one Native insert with a token);
- arrow: pyarrow's C++ JSON reader building Arrow columns, sent as ArrowStream. Not in the product: nothing
  proves its values equal the decoder's, and it cannot build a Map, so the `attrs` column is left out (it
  takes its default): a lower bound on that format's cost.

`python -m bench.formats` prints one JSON object and writes bench/results/<date>-formats.json."""

from __future__ import annotations

import argparse
import datetime as dt
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hack.testbed.process import REPO
from hack.testbed.servers import ClickHouseServer

from . import entry, publish
from .__main__ import _cpu_seconds
from .data import TABLE, encoded


def candidates(client: Any, database: str, values: list[bytes]) -> dict[str, tuple[Callable[[int], Any],
                                                                                      Callable[[Any], Any]]]:
    """name -> (build(run) -> payload, send(payload)); each run inserts under its own token."""
    import pyarrow as pa
    import pyarrow.json as pj

    from sparkapp.config import FormatConfig
    from sparkapp.core.blocks import LineBlock, build_blocks, dedup_token
    from sparkapp.core.records import Message
    from sparkapp.core.state_machine import OffsetRange
    from sparkapp.edges.clickhouse import load_schema
    from sparkapp.edges.insert import Inserter
    from sparkapp.formats.jsoneachrow import build_lines, guard
    from sparkapp.formats.registry import make_decoder

    n = len(values)
    schema = load_schema(client, database, "events")
    inserter = Inserter(client, schema)
    rng = OffsetRange(0, n - 1)
    offsets = tuple(range(n))
    source = pa.table({"topic": pa.array(["bench"] * n), "partition": pa.array([0] * n, pa.int32()),
                       "offset": pa.array(offsets, pa.int64()), "key": pa.array([None] * n, pa.binary()),
                       "value": pa.array(values, pa.binary()), "timestamp": pa.array([0] * n, pa.timestamp("ms")),
                       "timestampType": pa.array([0] * n, pa.int32())})
    check = guard(schema)
    decode = make_decoder(FormatConfig().decoder_spec(), schema)

    def token(run: int) -> str:
        return dedup_token(f"formats-{run}", "bench", 0, rng)

    def lines(run: int) -> LineBlock:
        ls = build_lines(source, schema.names, 1 << 20)
        suspect, refused = check.hits(ls)
        assert not suspect and not refused, "the benchmark's events are all clean"
        return LineBlock(rng, token(run), offsets, ls)

    def native(run: int) -> Any:
        rows = [(i, decode(Message("bench", 0, i, v))) for i, v in enumerate(values)]
        [block] = build_blocks(rng, rows, schema.names, n, lambda w: token(run))
        return block

    arrow_schema = pa.schema([("id", pa.uint64()), ("ts", pa.string()), ("user_id", pa.uint64()),
                              ("event", pa.string()), ("country", pa.string()), ("amount", pa.string()),
                              ("score", pa.float64()), ("session", pa.string()), ("tags", pa.list_(pa.string())),
                              ("referrer", pa.string())])

    def arrow(run: int) -> tuple[str, bytes]:
        t = pj.read_json(pa.BufferReader(b"\n".join(values)),
                         parse_options=pj.ParseOptions(explicit_schema=arrow_schema,
                                                       unexpected_field_behavior="ignore"),
                         read_options=pj.ReadOptions(use_threads=False, block_size=1 << 26))
        t = (t.append_column("_offset", pa.array(offsets, pa.uint64()))
             .append_column("_topic", source["topic"]).append_column("_partition", pa.array([0] * n, pa.uint16())))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        return token(run), sink.getvalue().to_pybytes()

    def send_arrow(built: tuple[str, bytes]) -> None:
        settings = inserter._settings(LineBlock(rng, built[0], offsets, None))
        for key in inserter.line_settings:  # JSON parsing's settings mean nothing to ArrowStream
            settings.pop(key, None)
        client.raw_insert(schema.fqn, None, built[1], settings=settings, fmt="ArrowStream")

    return {"jsoneachrow": (lines, inserter.insert), "native": (native, inserter.insert), "arrow": (arrow, send_arrow)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.formats")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3, help="runs per format; the fastest counts")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    a = ap.parse_args(argv)
    import clickhouse_connect

    rnd = random.Random(7)  # the events `produce` sends
    values = [encoded(rnd, i) for i in range(a.rows)]
    results: dict[str, Any] = {"date": dt.date.today().isoformat(), "rows": a.rows,
                               "mean_value_bytes": sum(map(len, values)) / len(values)}
    with tempfile.TemporaryDirectory(prefix="chsink-formats-") as tmp, ClickHouseServer(Path(tmp)) as server:
        assert isinstance(server, ClickHouseServer) and server.proc is not None
        client = clickhouse_connect.get_client(host="127.0.0.1", port=server.http_port)
        client.command("CREATE DATABASE bench")
        client.command(TABLE.format(db="bench", table="events"))
        run = 0
        for name, (build, send) in candidates(client, "bench", values).items():
            best: dict[str, float] | None = None
            for _ in range(a.runs):
                run += 1
                before = client.command("SELECT count() FROM bench.events")
                c0, s0, t0 = time.process_time(), _cpu_seconds(server.proc.pid), time.perf_counter()
                built = build(run)
                c1 = time.process_time()
                send(built)
                t1, s1, c2 = time.perf_counter(), _cpu_seconds(server.proc.pid), time.process_time()
                stored = int(client.command("SELECT count() FROM bench.events")) - int(before)  # type: ignore[arg-type]
                assert stored == a.rows, f"{name}: {stored} rows stored of {a.rows}"
                us = 1e6 / a.rows
                r = {"build_us_per_row": (c1 - c0) * us, "send_us_per_row": (c2 - c1) * us,
                     "server_us_per_row": (s1 - s0) * us, "wall_us_per_row": (t1 - t0) * us}
                r["cpu_us_per_row"] = r["build_us_per_row"] + r["send_us_per_row"] + r["server_us_per_row"]
                best = r if best is None or r["wall_us_per_row"] < best["wall_us_per_row"] else best
            results[name] = {k: round(v, 3) for k, v in (best or {}).items()}
    for name in ("native", "arrow"):
        results[f"cpu_ratio_{name}_jsoneachrow"] = round(results[name]["cpu_us_per_row"]
                                                        / results["jsoneachrow"]["cpu_us_per_row"], 3)
    return publish(results, a.out, "formats")


if __name__ == "__main__":
    entry(main)
