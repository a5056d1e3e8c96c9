"""The job end to end on bad input, multi-table routing, state commands, and configuration errors."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from confluent_kafka import Consumer, Producer

from hack.testbed import free_port
from hack.testbed.process import REPO
from sparkapp.config import KafkaConfig
from sparkapp.edges.dlq import HEADER_OFFSET, HEADER_PARTITION, HEADER_REASON, HEADER_SINK, HEADER_TOPIC
from sparkapp.edges.kafka import commit_group_offsets
from tests.delivery.test_retention import delete_below

from .harness import SinkHarness, drained_sink, event, produce_events


def dlq_messages(bootstrap: str, topic: str, n: int) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"v-{topic}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    out = []
    while len(out) < n:
        m = c.poll(20)
        assert m is not None, f"{len(out)} of {n} dead letters"
        if not m.error():
            out.append(m)
    c.close()
    return out


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    from confluent_kafka import TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return {tp.partition: tp.offset for tp in c.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=15)}
    finally:
        c.close()


def test_bad_input_reaches_the_dlq_and_the_job_keeps_running(tmp_path, kafka, topic, ch_path):
    src, dlq = topic(2), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq, server=ch_path)
    sink.config["format"] = {"maxMessageBytes": 4096}
    group = f"lag-{src}"
    sink.config["kafka"]["consumerGroup"] = group  # for lag tools only: never read back
    sink.write_config()
    bad = {
        2: (b'{"id": 1, "name": ', "malformed JSON"),
        4: (json.dumps({**event(4), "amount": "a lot"}).encode(), "column `amount`: expected Decimal(12, 2)"),
        6: (None, "tombstone: the record has a null value"),
        8: (json.dumps({**event(8), "note": "x" * 10_000}).encode(), "oversized: "),
    }
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(40):
        value = bad[i][0] if i in bad else json.dumps(event(i)).encode()
        p.produce(src, value, key=str(i).encode(), partition=i % 2)
    assert p.flush(30) == 0
    kafka_cfg = KafkaConfig.model_validate({"bootstrapServers": kafka.bootstrap, "topics": [src]})
    commit_group_offsets(kafka_cfg, group, {(src, 0): 15, (src, 1): 15})  # where the job must not start
    sink.drain()
    assert committed(kafka.bootstrap, group, src) == {0: 20, 1: 20}, "the group says what was delivered"

    dead = dlq_messages(kafka.bootstrap, dlq, len(bad))
    by_offset = {(int(dict(m.headers())[HEADER_PARTITION]), int(dict(m.headers())[HEADER_OFFSET])): m for m in dead}
    for i, (value, reason) in bad.items():
        m = by_offset[(i % 2, i // 2)]
        h = dict(m.headers())
        assert h[HEADER_REASON].decode().startswith(reason), h[HEADER_REASON]
        assert (h[HEADER_TOPIC].decode(), h[HEADER_SINK].decode()) == (src, sink.config["name"])
        assert m.value() == value and m.key() == str(i).encode()
    report = sink.verify()
    assert report["ok"] and report["totals"]["clickhouse"] + report["totals"]["dead_lettered"] == 40
    assert report["totals"]["dead_lettered"] == len(bad)


def _routed_sink(tmp_path, kafka, topic, ch_path) -> tuple[SinkHarness, str]:
    src, dlq = topic(1), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq, server=ch_path)
    sink.sql(f"CREATE TABLE {sink.db}.clicks (id UInt64, _topic String, _partition UInt16, _offset UInt64) "
             "ENGINE = MergeTree ORDER BY _offset SETTINGS non_replicated_deduplication_window = 1000")
    sink.config["clickhouse"]["tableField"] = "table"
    sink.write_config()
    return sink, src


def _produce_routed(bootstrap: str, src: str, tables: list[str], first: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for i, table in enumerate(tables, first):
        p.produce(src, json.dumps({**event(i), "table": table}).encode(), partition=0)
    assert p.flush(30) == 0


def test_a_multi_table_topic_is_routed_by_field_and_a_quiet_table_never_holds_its_partition_back(
        tmp_path, kafka, topic, ch_path):
    """Each record goes to the table its field names, with a state row per table; a record naming no table is
    dead-lettered. The partition restarts where it was read through, not at the last range of a table that has
    had no records since: once retention deletes the records after that range, nothing is lost, nothing stops
    the run, and nothing is read twice."""
    sink, src = _routed_sink(tmp_path, kafka, topic, ch_path)
    _produce_routed(kafka.bootstrap, src, ["events", "clicks", "nope"] * 10 + ["events"] * 200)
    sink.drain()
    assert sink.sql(f"SELECT count() FROM {sink.db}.events", f"SELECT count() FROM {sink.db}.clicks") == \
        [[[210]], [[10]]]
    dead = dlq_messages(kafka.bootstrap, sink.config["dlq"]["topic"], 10)
    reasons = {dict(m.headers())[HEADER_REASON].decode().split(":")[0] for m in dead}
    assert reasons == {"unknown target table 'nope'"}
    state = run_cli("state", "list", "--config", str(sink.config_path))
    assert "clicks" in state.stdout and "events" in state.stdout and "__unroutable__" in state.stdout
    assert f"{src}/0 read through offset 229" in state.stdout, state.stdout

    delete_below(kafka.bootstrap, src, 100)  # retention: the clicks' and the dead letters' ranges are gone
    _produce_routed(kafka.bootstrap, src, ["events"] * 10, first=230)
    sink.delete_checkpoint()  # the state store alone says where the partition resumes
    sink.drain()
    assert f"starting offsets from the state store {{'{src}': {{'0': 230}}}}" in sink.log_text()
    assert sink.sql(f"SELECT count() FROM {sink.db}.events", f"SELECT count() FROM {sink.db}.clicks") == \
        [[[220]], [[10]]]
    report = sink.verify()
    assert report["ok"] and report["totals"]["clickhouse"] == 230, report  # every record once


def test_state_reset_needs_yes(tmp_path, kafka, topic):
    src, dlq = topic(1), topic(1)
    sink = drained_sink(tmp_path, kafka, src, dlq, 5)
    refused = run_cli("state", "reset", "--config", str(sink.config_path))
    assert refused.returncode == 2 and "without --yes" in refused.stderr
    done = run_cli("state", "reset", "--config", str(sink.config_path), "--partition", f"{src}:0", "--yes")
    assert done.returncode == 0 and "deleted 1 state row" in done.stdout


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sparkapp", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def _config(tmp_path, **over):
    cfg = {
        "name": "cfg-test",
        "kafka": {"bootstrapServers": over.pop("bootstrap"), "topics": [over.pop("topic", "events")]},
        "clickhouse": {"endpoints": [over.pop("endpoint", f"chdb://{tmp_path / 'chdb'}")], "database": "default",
                       "tables": {"*": over.pop("table", "events")}},
        "state": {"engine": "EmbeddedRocksDB"},
        "checkpointLocation": str(tmp_path / "ckpt"),
        **over,
    }
    path = tmp_path / "sink.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def assert_config_error(res: subprocess.CompletedProcess[str], *needles: str, code: int = 2) -> None:
    """Exit 2 for a wrong config; 6 ("unavailable") for a system that does not answer, worth a retry."""
    assert res.returncode == code, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr
    for n in needles:
        assert n in res.stderr, res.stderr[-2000:]


def test_config_errors_are_actionable(tmp_path, kafka, topic):
    src = topic(1)
    # an unknown field, named with its path
    path = _config(tmp_path, bootstrap=kafka.bootstrap, topic=src, batching={"maxOffsetsPerTriger": 10})
    assert_config_error(run_cli("run", "--config", str(path)), "batching.maxOffsetsPerTriger: unknown field")
    # a missing table
    path = _config(tmp_path, bootstrap=kafka.bootstrap, topic=src, table="missing_table")
    assert_config_error(run_cli("run", "--config", str(path)), "missing_table", "does not exist")
    # an unreachable ClickHouse
    path = _config(tmp_path, bootstrap=kafka.bootstrap, topic=src, endpoint=f"http://127.0.0.1:{free_port()}")
    assert_config_error(run_cli("run", "--config", str(path)), "chsink: unavailable: cannot reach ClickHouse endpoint "
                        "http://127.0.0.1:", code=6)
    # an unreachable Kafka
    path = _config(tmp_path, bootstrap=f"127.0.0.1:{free_port()}", topic=src)
    assert_config_error(run_cli("run", "--config", str(path)), "chsink: unavailable: cannot reach Kafka at 127.0.0.1:",
                        code=6)
    # a topic that does not exist
    path = _config(tmp_path, bootstrap=kafka.bootstrap, topic="no-such-topic")
    assert_config_error(run_cli("run", "--config", str(path)), "topic(s) ['no-such-topic'] do not exist", code=6)
    # a table whose retried inserts could not be told from first ones (no offset columns, no dedup window)
    subprocess.run([sys.executable, "-m", "hack.chsql", str(tmp_path / "chdb"),
                    "CREATE TABLE default.bare (id UInt64) ENGINE = MergeTree ORDER BY id"], cwd=REPO, check=True)
    path = _config(tmp_path, bootstrap=kafka.bootstrap, topic=src, table="bare")
    assert_config_error(run_cli("run", "--config", str(path)), "clickhouse.tables[", "deduplication window of 0")
    # a column of a type chsink cannot store exactly yet
    subprocess.run([sys.executable, "-m", "hack.chsql", str(tmp_path / "chdb"),
                    "CREATE TABLE default.dyn (id UInt64, v Array(Dynamic), _offset UInt64) ENGINE = MergeTree ORDER BY id"],
                   cwd=REPO, check=True)
    path = _config(tmp_path, bootstrap=kafka.bootstrap, topic=src, table="dyn")
    assert_config_error(run_cli("run", "--config", str(path)), "column `v` of `default`.`dyn`: a Dynamic inside Array "
                        "cannot be written")
    # an upsert sink whose table cannot say that a row is deleted
    path = _config(tmp_path, bootstrap=kafka.bootstrap, topic=src, table="bare", format={"envelope": "upsert"})
    assert_config_error(run_cli("run", "--config", str(path)), "envelope upsert needs a `_deleted` column")


def test_verifier_reports_duplicates_gaps_and_rows_outside(tmp_path, kafka, topic):
    src, dlq = topic(1), topic(1)
    sink = drained_sink(tmp_path, kafka, src, dlq, 20)
    assert sink.verify()["ok"]
    # tamper: duplicate offset 3, lose offset 7, add a row beyond the Kafka range
    sink.sql("INSERT INTO e2e.events SELECT * FROM e2e.events WHERE _offset = 3",
             "DELETE FROM e2e.events WHERE _offset = 7",
             f"INSERT INTO e2e.events (id, _topic, _partition, _offset) VALUES (999, '{src}', 0, 500)")
    report = sink.verify()
    assert report["exit"] == 1 and not report["ok"]
    [part] = report["partitions"]
    assert (part["duplicates"], part["gaps"], part["outside"]) == ([3], [7], [500])
    text = run_cli("verify", "--config", str(sink.config_path))
    assert text.returncode == 1 and "ANOMALIES: 1 duplicated, 1 missing, 1 outside" in text.stdout


def test_sigterm_finishes_the_batch_and_stops_and_metrics_are_served(tmp_path, kafka, topic):
    import os
    import re
    import signal
    import time
    import urllib.request

    from hack.testbed import free_port

    src, dlq = topic(2), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq, maxOffsetsPerTrigger=500)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(6000):
        p.produce(src, json.dumps(event(i)).encode(), partition=i % 2)
    p.flush(30)
    port = free_port()
    sink.start("--metrics-port", str(port))
    assert sink.wait_for_batches(2)
    deadline = time.monotonic() + 30  # lag is refreshed by the main loop once per batch: it may lag a poll
    while True:
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        if "chsink_partition_lag{" in metrics or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    name = sink.config["name"]
    rows_in = float(re.search(rf'chsink_rows_in_total{{sink="{name}"}} (\S+)', metrics).group(1))
    assert rows_in >= 1000 and f'chsink_batch_duration_seconds_count{{sink="{name}"}}' in metrics
    assert "chsink_partition_lag{" in metrics and "chsink_inserts_total{" in metrics
    os.kill(sink.proc.pid, signal.SIGTERM)
    assert sink.wait(120) == 0, sink.log_text()[-3000:]
    assert "done:" in sink.log_text()
    sink.drain()
    report = sink.verify()
    assert report["ok"] and report["totals"]["clickhouse"] == 6000


def test_a_schema_registry_that_does_not_answer_stalls_the_partition_and_dead_letters_nothing(
        tmp_path, kafka, topic, ch_path):
    """The job cannot read a framed record without its writer's schema: the partition stalls as on a shard outage
    (the run goes on, catch-up tries it again), nothing is inserted and no record goes to the dead-letter topic;
    on executors too."""
    from confluent_kafka import TopicPartition

    src, dlq = topic(1), topic(1)
    table = f"reg_{src.replace('-', '_')[:40]}"
    _sql(tmp_path, ch_path, f"CREATE TABLE default.{table} (a Int64, _topic String, _partition UInt32, "
         "_offset UInt64) ENGINE = MergeTree ORDER BY _offset SETTINGS non_replicated_deduplication_window = 100")
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for _ in range(3):
        p.produce(src, b"\x00\x00\x00\x00\x07\x02")  # Confluent's wire format: schema id 7, then the record
    assert p.flush(30) == 0
    registry = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    endpoint = {"endpoint": ch_path.dsn} if ch_path is not None else {}
    path = _config(tmp_path, bootstrap=kafka.bootstrap, topic=src, dlq={"topic": dlq}, table=table, **endpoint,
                   format={"type": "avro", "schemaRegistryUrl": registry})
    res = run_cli("run", "--config", str(path), "--max-seconds", "35")
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"stalls: shard schema registry unavailable: schema registry at {registry}/schemas/ids/7 did not answer" \
        in res.stderr, res.stderr[-3000:]
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "registry-test"})
    try:
        assert c.get_watermark_offsets(TopicPartition(dlq, 0), timeout=10) == (0, 0), "nothing dead-lettered"
    finally:
        c.close()
    assert _sql(tmp_path, ch_path, f"SELECT count() FROM default.{table}") == [[0]]


def _sql(tmp_path, ch_path, statement: str) -> list[list[object]]:
    """A statement run on the test's ClickHouse, the job's chdb folder or the session's server; its rows."""
    if ch_path is None:
        out = subprocess.run([sys.executable, "-m", "hack.chsql", str(tmp_path / "chdb"), statement], cwd=REPO,
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out.splitlines()[0]) if out.strip() else []
    import clickhouse_connect

    return [list(r) for r in clickhouse_connect.get_client(dsn=ch_path.dsn).query(statement).result_rows]


def test_protobuf_records_are_read_with_the_schemas_a_registry_holds(tmp_path, kafka, topic, ch_path,
                                                                     schema_registry):
    """The job over Protobuf records a Java producer framed, its schema registered as .proto source that imports
    another registered file: read with the registry's schemas on the driver and on executors (each compiles the
    source), every record stored, none dead-lettered."""
    from tests.formats.test_schema_registry import SOURCES
    from tests.helpers import registry_protobuf_writer

    src, dlq = topic(2), topic(1)
    table = f"pbreg_{src.replace('-', '_')[:40]}"
    _sql(tmp_path, ch_path, f"CREATE TABLE default.{table} (id Int64, total Tuple(currency String, units Int64), "
         "_topic String, _partition UInt32, _offset UInt64) ENGINE = MergeTree ORDER BY (_partition, _offset) "
         "SETTINGS non_replicated_deduplication_window = 100")
    write = registry_protobuf_writer(schema_registry.url, src, "shop.v1.Order", "proto-source", SOURCES, tmp_path)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(400):
        p.produce(src, write({"id": i, "total": {"currency": "EUR", "units": i * 3}}), partition=i % 2)
    assert p.flush(30) == 0
    endpoint = {"endpoint": ch_path.dsn} if ch_path is not None else {}
    path = _config(tmp_path, bootstrap=kafka.bootstrap, topic=src, dlq={"topic": dlq}, table=table, **endpoint,
                   format={"type": "protobuf", "schemaRegistryUrl": schema_registry.url})
    res = run_cli("run", "--config", str(path), "--until-idle", "5", "--max-seconds", "120")
    assert res.returncode == 0, res.stderr[-3000:]
    assert _sql(tmp_path, ch_path, f"SELECT count(), uniqExact(id), sum(id * 3 = total.units) FROM "
                f"default.{table} WHERE total.currency = 'EUR'") == [[400, 400, 400]], res.stderr[-3000:]
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "registry-test-up"})
    try:
        from confluent_kafka import TopicPartition

        assert c.get_watermark_offsets(TopicPartition(dlq, 0), timeout=10) == (0, 0), "nothing dead-lettered"
    finally:
        c.close()


def test_the_last_ranges_are_confirmed_when_idle_and_when_stopped(tmp_path, kafka, topic, ch_path):
    """Each range's AFTER is left to its partition's next BEFORE (on the driver, or in the next batch's executor
    task). With no new records no batch follows, so an idle run writes them itself: killed (SIGKILL, nothing runs
    at exit) a few seconds after its last batch, it left no range BEFORE, which the operator would read as a
    stall. A stopped run (SIGTERM) confirms them on its way out."""
    import os
    import signal
    import time

    src, dlq = topic(2), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq, server=ch_path)
    produce_events(kafka, src, 2000)
    sink.start("--quiet")
    assert sink.wait_for_batches(1)
    time.sleep(6)  # idle: the job confirms after a second without a batch
    sink.kill()

    def phases() -> list[str]:
        [rows] = sink.sql(f"SELECT phase FROM {sink.db}.chsink_state WHERE kind = 'partition'")
        return sorted(r[0] for r in rows)

    assert phases() and set(phases()) == {"AFTER"}, sink.log_text()[-3000:]
    produce_events(kafka, src, 2000)
    sink.start("--quiet")
    assert sink.wait_for_batches(1)
    os.kill(sink.proc.pid, signal.SIGTERM)  # type: ignore[union-attr]
    assert sink.wait(120) == 0, sink.log_text()[-3000:]
    assert phases() and set(phases()) == {"AFTER"}, sink.log_text()[-3000:]
    report = sink.verify()
    assert report["ok"] and report["totals"]["clickhouse"] == 4000
