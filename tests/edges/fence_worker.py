"""A writer process for the fencing test: its own chdb engine, the shared ZooKeeper-backed KeeperMap state.

usage: python -m tests.edges.fence_worker ROLE CHDB_PATH CONFIG KEEPER_PATH SIGNAL_DIR
ROLE is `stale` (takes an epoch, pauses after BEFORE until the other writer is done, then resumes)
or `fresh` (waits until the stale one paused, then delivers everything). Prints a JSON report.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import clickhouse_connect

from sparkapp.config import Engine
from sparkapp.core.records import Message
from sparkapp.delivery.context import WriterContext
from sparkapp.delivery.writer import write_partition
from sparkapp.edges.clickhouse import load_schema
from sparkapp.edges.insert import Inserter
from sparkapp.edges.store import FencedError, PartitionKey, StateStore
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder

SINK = "fence-sink"
LOG = {p: [Message("src", p, o, json.dumps({"id": p * 1000 + o}).encode()) for o in range(200)] for p in (0, 1)}


def wait_for(path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.05)


def main() -> None:
    role, chdb_path, config, keeper_path, signals = sys.argv[1:6]
    sig = Path(signals)
    client = clickhouse_connect.get_client(dsn=f"chdb://{chdb_path}", chdb_options={"config-file": config})
    client.command("CREATE TABLE IF NOT EXISTS ev (id UInt32, _topic String, _partition UInt32, _offset UInt64) "
                   "ENGINE = MergeTree ORDER BY (_partition, _offset) SETTINGS non_replicated_deduplication_window = 100")
    schema = load_schema(client, "default", "ev")
    store = StateStore(client, "fence_state", Engine.KEEPER_MAP, keeper_path=keeper_path)
    store.ensure_schema()
    if role == "fresh":
        wait_for(sig / "stale_paused")
    epoch = store.acquire_epoch(SINK, owner=role)

    def fault(step: str) -> None:
        if role == "stale" and step == "after_begin" and not (sig / "stale_paused").exists():
            (sig / "stale_paused").touch()
            wait_for(sig / "fresh_done")

    ctx = WriterContext(SINK, store, Inserter(client, schema), make_decoder(DecoderSpec(Format.JSON), schema), epoch,
                        block_offsets=25, fault=fault)
    fenced: list[str] = []
    for p, log in LOG.items():
        for i in range(0, len(log), 50):
            try:
                write_partition(ctx, PartitionKey(SINK, "src", p), log[i:i + 50])
            except FencedError as e:
                fenced.append(str(e))
                break
    if role == "fresh":
        (sig / "fresh_done").touch()
    rows = client.query("SELECT _partition, _offset FROM ev ORDER BY _partition, _offset").result_rows
    print(json.dumps({"role": role, "epoch": epoch, "fenced": fenced, "rows": [list(r) for r in rows]}))


if __name__ == "__main__":
    main()
