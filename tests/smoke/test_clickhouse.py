"""chdb is the real ClickHouse engine: KeeperMap lands in the real ZooKeeper; tokens deduplicate."""

from kazoo.client import KazooClient


def test_keepermap_rows_are_znodes(ch_db, zookeeper):
    client, db = ch_db
    assert client.query("SELECT version()").result_rows[0][0].startswith("26.")
    client.command(f"CREATE TABLE kv (k String, v String) ENGINE = KeeperMap('/smoke_{db}') PRIMARY KEY k")
    client.command("INSERT INTO kv VALUES ('alpha', '1'), ('beta', '2')")
    zk = KazooClient(hosts=zookeeper.hosts)
    zk.start(timeout=10)
    try:
        children = zk.get_children(f"/chsink_keeper_map/smoke_{db}/data")
        assert len(children) == 2
        values = sorted(zk.get(f"/chsink_keeper_map/smoke_{db}/data/{c}")[0] for c in children)
        assert any(b"alpha" in v or b"1" in v for v in values)
    finally:
        zk.stop()
    client.command("DROP TABLE kv SYNC")


def _dedup_table(client):
    client.command(
        "CREATE TABLE t (x UInt32) ENGINE = MergeTree ORDER BY x "
        "SETTINGS non_replicated_deduplication_window = 100"
    )


def test_same_token_deduplicates(ch_db):
    client, _ = ch_db
    _dedup_table(client)
    for _ in range(2):
        client.insert("t", [[1], [2], [3]], column_names=["x"], settings={"insert_deduplication_token": "tok-a"})
    assert client.query("SELECT count() FROM t").result_rows[0][0] == 3


def test_different_tokens_keep_both(ch_db):
    client, _ = ch_db
    _dedup_table(client)
    for tok in ("tok-a", "tok-b"):
        client.insert("t", [[1], [2], [3]], column_names=["x"], settings={"insert_deduplication_token": tok})
    assert client.query("SELECT count() FROM t").result_rows[0][0] == 6


def test_a_server_stopped_before_its_query_opened_the_stop_fifo_still_stops(tmp_path):
    """ClickHouseServer.stop writes a line into the fifo its blocked query reads. Stopped right after its first
    ping, the server may not have opened the fifo yet, and opening a fifo without a reader fails (ENXIO): stop
    waits for the reader a while and writes the line when it comes, else it leaves the process to SIGTERM.
    A real process and a real fifo stand in for the server's, since the race is hard to hit on purpose."""
    import os
    import subprocess
    import threading
    import time

    from hack.testbed.servers import ClickHouseServer

    server = ClickHouseServer(tmp_path)
    os.mkfifo(tmp_path / "stop.fifo")
    server.proc = subprocess.Popen(["sleep", "60"], start_new_session=True)  # as the testbed starts it
    t0 = time.monotonic()
    server.stop(timeout=10)  # nobody ever reads: given up on, then SIGTERM
    assert server.proc is None and time.monotonic() - t0 < 10

    got: list[bytes] = []

    def late_reader() -> None:
        time.sleep(1.0)
        with open(tmp_path / "stop.fifo", "rb") as f:
            got.append(f.readline())

    reader = threading.Thread(target=late_reader)
    reader.start()
    server.proc = subprocess.Popen(["sleep", "60"], start_new_session=True)  # as the testbed starts it
    server.stop(timeout=10)
    reader.join(10)
    assert got == [b"stop\n"]
