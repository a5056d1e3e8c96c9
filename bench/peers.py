"""The peers `make bench` runs beside chsink, on the same topic, table DDL and ClickHouse server process:
the ClickHouse Kafka Connect sink on Apache Kafka Connect (exactly-once with KeeperMap state, and without), and
clickhouse_sinker (at-least-once). Built by `hack/peers.sh`; a peer that is not there is reported as such.

Each is timed by polling its table's row count, from the first poll that found rows to the last (its start-up and
consumer-group join excluded, as chsink's first batch is), and with `--warm-up S` from the first poll S seconds
later (the Kafka Connect worker is a JVM too), with the CPU its process tree and the server used meanwhile.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from hack.testbed.process import cache_dir, free_port, versions
from hack.testbed.servers import ClickHouseServer, _java

from . import stop_child
from .data import TABLE
from .measure import as_batches, rate, steady


class PeerMissingError(RuntimeError):
    """The peer was not built (hack/peers.sh says why)."""


# why a peer's run gives no figures: not built, failed, or (ValueError) too short for the warm-up; the run is
# reported with the reason instead
NOT_MEASURED = (PeerMissingError, RuntimeError, ValueError)


def _connect_home() -> Path:
    v = versions()
    home = cache_dir() / f"kafka-connect-{v['KAFKA_VERSION']}-ch-{v['CLICKHOUSE_KAFKA_CONNECT_VERSION']}"
    if not home.exists():
        raise PeerMissingError(f"{home} missing: run `hack/peers.sh kafka-connect`")
    return home


def _sinker_bin() -> Path:
    path = cache_dir() / f"clickhouse_sinker-{versions()['CLICKHOUSE_SINKER_VERSION']}" / "clickhouse_sinker"
    if not path.exists():
        raise PeerMissingError(f"{path} missing: run `hack/peers.sh sinker`")
    return path


def require(key: str) -> None:
    """PeerMissingError unless peer `key` is built: "g" and "h" are the Kafka Connect sink, "i" clickhouse_sinker."""
    if key == "i":
        _sinker_bin()
    else:
        _connect_home()


def _table(server: ClickHouseServer, db: str, ddl: str) -> Any:
    import clickhouse_connect

    client = clickhouse_connect.get_client(dsn=server.dsn)
    client.command(f"DROP DATABASE IF EXISTS {db} SYNC")
    client.command(f"CREATE DATABASE {db}")
    client.command(ddl.format(db=db, table="events"))
    return client


def computed(client: Any, db: str) -> list[str]:
    """The events table's columns ClickHouse computes itself (a DEFAULT or MATERIALIZED expression), which a peer
    must leave out of its inserts, as chsink does (bench.latency's `ingested`)."""
    rows = client.query("SELECT name FROM system.columns WHERE database = {db:String} AND table = 'events' "
                        "AND default_kind != '' ORDER BY position", parameters={"db": db}).result_rows
    return [str(r[0]) for r in rows]


def _until_landed(client: Any, db: str, n: int, proc: subprocess.Popen[bytes], log: Path, sampler: Any,
                  served: Any, fatal: str | None = None, timeout: float = 1800, warm_s: float = 0.0) -> dict[str, Any]:
    """Waits until n rows are in the table, polling its count; rows/s over the polls after the first one that
    found rows, leaving out those that start within `warm_s` seconds of it, as chsink's batches are
    (bench.measure.steady)."""
    started, count = time.time(), 0
    polls = [(started, 0)]
    deadline = time.monotonic() + timeout
    while count < n:
        if proc.poll() is not None or (fatal and fatal in log.read_text(errors="replace")):
            raise RuntimeError(f"peer failed (exit {proc.poll()}) with {count} of {n} rows:\n"
                               f"{log.read_text(errors='replace')[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"peer landed {count} of {n} rows in {timeout}s:\n"
                               f"{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.25)
        count = int(client.query(f"SELECT count() FROM {db}.events").result_rows[0][0])
        polls.append((time.time(), count))
    batches = as_batches(polls)
    kept = steady(batches, warm_s)
    first, end = kept[0][0], kept[-1][1]
    [[unique]] = client.query(f"SELECT uniqExact(id) FROM {db}.events").result_rows
    return {"rows": count, "unique_ids": int(unique), "duplicates": count - int(unique),
            "seconds": end - first, "rows_per_s": rate(kept),
            "start_to_first_row_s": batches[0][1] - started, "from_start_rows_per_s": count / (end - started),
            "steady_polls": len(kept),
            "cpu_cores_used": {"peer": sampler.cores_used(first, end)["total"],
                               "clickhouse_server": served.cores_used(first, end)["total"] if served else 0.0},
            "peak_rss_mb": round(sampler.peak_total, 1)}


def database(work: Path) -> str:
    """The database a peer's run in `work` writes its events table in."""
    return f"peer_{work.name}"


def _fresh(work: Path, server: ClickHouseServer, ddl: str) -> tuple[str, Any]:
    """An empty work dir, and the table (`ddl`) in a database of its own: (database, client)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    db = database(work)
    return db, _table(server, db, ddl)


def _run(cmd: list[str], work: Path, server: ClickHouseServer, db: str, client: Any, n: int, sample: Any,
         fatal: str | None = None, warm_s: float = 0.0) -> dict[str, Any]:
    """Starts the peer in `work`, measures it until n rows landed, and stops it."""
    log = work / "peer.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=work, stdout=out, stderr=subprocess.STDOUT)
    sampler, served = sample(proc), sample(server.proc)
    try:
        return {**_until_landed(client, db, n, proc, log, sampler, served, fatal=fatal, warm_s=warm_s),
                **served_by(server)}
    finally:
        sampler.done.set()
        if served:
            served.done.set()
        stop_child(proc)


def served_by(server: ClickHouseServer | None) -> dict[str, int]:
    """Which ClickHouse server process a run wrote to, for its results (none: the embedded chdb)."""
    return {"clickhouse_server_pid": server.proc.pid} if server is not None and server.proc else {}


def run_connect(work: Path, bootstrap: str, topic: str, n: int, server: ClickHouseServer, exactly_once: bool,
                sample: Any, warm_s: float = 0.0, table: str = TABLE) -> dict[str, Any]:
    """The ClickHouse Kafka Connect sink in a standalone Kafka Connect worker, one task per core, into the events
    table `table` makes (it leaves a column with a DEFAULT the records lack to ClickHouse)."""
    home = _connect_home()
    db, client = _fresh(work, server, table)
    (work / "worker.properties").write_text("\n".join([
        f"bootstrap.servers={bootstrap}", "key.converter=org.apache.kafka.connect.storage.StringConverter",
        "value.converter=org.apache.kafka.connect.json.JsonConverter", "value.converter.schemas.enable=false",
        f"offset.storage.file.filename={work / 'offsets'}", f"plugin.path={home / 'plugins'}",
        f"listeners=http://127.0.0.1:{free_port()}", "consumer.auto.offset.reset=earliest",
        "consumer.max.poll.records=10000", "consumer.fetch.max.bytes=67108864",
        "consumer.max.partition.fetch.bytes=16777216", "offset.flush.interval.ms=1000", ""]))
    (work / "sink.properties").write_text("\n".join([
        f"name=ch-{work.name}", "connector.class=com.clickhouse.kafka.connect.ClickHouseSinkConnector",
        f"tasks.max={os.cpu_count() or 1}", f"topics={topic}", f"topic2TableMap={topic}=events",
        "hostname=127.0.0.1", f"port={server.http_port}", f"database={db}", "username=default", "password=",
        "ssl=false", f"exactlyOnce={'true' if exactly_once else 'false'}", f"zkPath=/peer_{work.name}",
        # ClickHouse 26 compresses HTTP answers in ZSTD by default (network_compression_method); the sink's default
        # (V1) client reads only LZ4 and fails every request ("Magic is not correct"): uncompressed answers
        "jdbcConnectionProperties=?compress=0", "errors.tolerance=none", ""]))
    (work / "log4j.properties").write_text("log4j.rootLogger=WARN, stdout\nlog4j.appender.stdout="
                                          "org.apache.log4j.ConsoleAppender\nlog4j.appender.stdout.layout="
                                          "org.apache.log4j.PatternLayout\n")
    cmd = [*_java(work), "-Xmx1g", f"-Dlog4j.configuration=file:{work / 'log4j.properties'}",
           "-cp", f"{home / 'libs'}/*", "org.apache.kafka.connect.cli.ConnectStandalone",
           str(work / "worker.properties"), str(work / "sink.properties")]
    res = _run(cmd, work, server, db, client, n, sample, fatal="Task is being killed", warm_s=warm_s)
    return {**res, "peer": f"ClickHouse Kafka Connect sink {versions()['CLICKHOUSE_KAFKA_CONNECT_VERSION']} "
                           f"on Kafka Connect {versions()['KAFKA_VERSION']}", "exactly_once": exactly_once}


def run_sinker(work: Path, bootstrap: str, topic: str, n: int, server: ClickHouseServer,
               sample: Any, warm_s: float = 0.0, table: str = TABLE) -> dict[str, Any]:
    """clickhouse_sinker over ClickHouse's native TCP protocol, the schema of the events table `table` makes
    detected; the columns chsink fills and those ClickHouse computes left out (its autoSchema would send them)."""
    binary = _sinker_bin()
    db, client = _fresh(work, server, table)
    exclude = json.dumps(["_offset", "_topic", "_partition", *computed(client, db)])
    (work / "sinker.hjson").write_text(f"""{{
  clickhouse: {{ hosts: [["127.0.0.1"]], port: {server.tcp_port}, db: "{db}", username: "default", password: "",
                protocol: "native", maxOpenConns: {os.cpu_count() or 1}, retryTimes: 0 }}
  kafka: {{ brokers: "{bootstrap}" }}
  task: {{ name: "peer-{work.name}", topic: "{topic}", earliest: true, consumerGroup: "peer-{work.name}",
          parser: "fastjson", tableName: "events", autoSchema: true,
          excludeColumns: {exclude}, bufferSize: 262144, flushInterval: 1 }}
  logLevel: "warn"
}}
""")
    # --http-host: without it the sinker finds the address to bind to by dialing a public one
    res = _run([str(binary), "--local-cfg-file", str(work / "sinker.hjson"), "--log-paths", "stdout",
                "--http-host", "127.0.0.1", "--http-port", str(free_port())], work, server, db, client, n, sample,
               warm_s=warm_s)
    return {**res, "peer": f"clickhouse_sinker {versions()['CLICKHOUSE_SINKER_VERSION']}", "exactly_once": False}
