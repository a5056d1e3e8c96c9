"""A peer's run as the benchmark watches it land its rows (bench.peers._until_landed), on a real chdb table while a
real process runs: a run that lands everything within its warm-up gives no rate but an error naming the cause
(run_peers reports a ValueError as the peer's reason instead of figures), never a rate over the warm-up."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from bench import peers


def test_a_peer_that_lands_every_row_within_the_warm_up_is_an_error_not_a_rate(ch_db, tmp_path):
    client, db = ch_db
    client.command(f"CREATE TABLE {db}.events (id UInt64) ENGINE = MergeTree ORDER BY id")
    client.command(f"INSERT INTO {db}.events SELECT number FROM numbers(500)")
    log = tmp_path / "peer.log"
    log.write_text("running\n")

    def rest() -> None:  # the peer's second batch, found by a later poll
        time.sleep(2.0)
        client.command(f"INSERT INTO {db}.events SELECT number + 500 FROM numbers(500)")

    proc = subprocess.Popen(["sleep", "60"])
    later = threading.Thread(target=rest)
    later.start()
    try:
        with pytest.raises(ValueError, match="give the run more events"):
            peers._until_landed(client, db, 1000, proc, log, None, None, warm_s=3600)
    finally:
        later.join()
        proc.kill()
        proc.wait()


def test_the_columns_clickhouse_computes_are_the_ones_a_peer_leaves_out(ch_db):
    """bench.peers.computed: what clickhouse_sinker's autoSchema must not send (it would fill `ingested` itself)."""
    client, db = ch_db
    client.command(f"CREATE TABLE {db}.events (id UInt64, ingested DateTime64(3) DEFAULT now64(3), day Date "
                   "MATERIALIZED toDate(ingested), name String) ENGINE = MergeTree ORDER BY id")
    assert peers.computed(client, db) == ["ingested", "day"]
