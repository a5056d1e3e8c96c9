"""`python -m bench --quick`, `python -m bench.formats`, `python -m bench.writer` and the other harnesses: only that
they work end to end (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys

from hack.testbed.process import REPO
from tests.helpers import mimalloc_verbose_env


def test_bench_quick_writes_json_and_chart(tmp_path):
    res = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    [out] = list(tmp_path.glob("*-quick.json"))
    data = json.loads(out.read_text())
    for key in ("rows_per_s_per_core", "ratio_c_d", "ratio_c_min_ab", "ratio_c_a", "ratio_c_b", "ratio_c_a_stream",
                "ratio_e_a_stream"):
        assert data[key] > 0
    for k in ("a", "a_stream", "b", "c", "d", "e", "f"):
        assert data[k]["rows_per_s"] > 0
    assert data["c"]["rows"] == data["d"]["rows"] == data["e"]["rows"] == data["f"]["rows"] == data["events"]
    assert data["e"]["path"] == "http, executors"
    assert data["c_dirty"]["rows"] == data["d_dirty"]["rows"] == data["events"]  # bad records dead-lettered
    assert data["ratio_c_dirty_clean"] > 0 and data["ratio_c_d_dirty"] > 0
    assert data["k"]["rows"] == data["events"] and data["ratio_k_c"] > 0  # key routing, sub-blocks per shard
    cpu = data["e"]["cpu_cores_used"]  # per component: Spark, Python workers, the server, Kafka
    assert cpu["clickhouse_server"] > 0 and cpu["python_workers"] > 0 and cpu["driver_jvm"] > 0 and "kafka" in cpu
    assert data["ratio_e_f"] > 0 and data["ratio_e_c"] > 0
    # and per thread group within each (the JIT and the collector beside Spark's tasks, merges beside inserts); a
    # short window may have too few of the sampler's once-a-second thread readings to show any
    for k in ("a_stream", "c", "e"):
        assert isinstance(data[k]["cpu_cores_by_thread"], dict)
    for peer in ("g", "h", "i"):  # measured, or the reason it could not be (hack/peers.sh builds them)
        got = data[peer]
        assert ("unavailable" in got) != ("rows_per_s" in got), got
        if "rows_per_s" in got:
            assert got["rows"] == data["events"] and data[f"ratio_e_{peer}"] > 0
    # each run over HTTP, chsink's and the peers', on a ClickHouse server of its own (bench.__main__.own_server)
    servers = [data[k]["clickhouse_server_pid"] for k in ("e", "f", "g", "h", "i") if "rows_per_s" in data[k]]
    assert len(set(servers)) == len(servers) >= 2, servers
    assert data["c"]["peak_rss"]["driver_jvm_mb"] > 0 and data["c"]["peak_rss"]["driver_python_mb"] > 0
    assert data["c"]["batch_p99_s"] >= data["c"]["batch_p50_s"] > 0
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert data["rounds"] == 1 and data["per_round_rows_per_s"]["c"] == [round(data["c"]["rows_per_s"])]
    assert data["per_round_ratios"]["c/d"] == [round(data["ratio_c_d"], 3)]
    # Spark's source as the job runs it: every record read, in batches of the job's size
    assert data["a_stream"]["rows"] == data["events"] and data["a_stream"]["batches"] > 1
    # with the CPU Spark and the broker used over its steady batches (a short window may show none)
    assert set(data["a_stream"]["cpu_cores_used"]) == {"spark", "kafka"}


def test_formats_quick_writes_json(tmp_path):
    """`python -m bench.formats`: every candidate format stores the whole batch (the module asserts the count)."""
    res = subprocess.run([sys.executable, "-m", "bench.formats", "--rows", "20000", "--runs", "1", "--out",
                          str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    [out] = list(tmp_path.glob("*-formats.json"))
    data = json.loads(out.read_text())
    for name in ("jsoneachrow", "native", "arrow"):
        # the server's CPU is read in clock ticks (10 ms): a small batch may show none
        assert data[name]["server_us_per_row"] >= 0 and data[name]["wall_us_per_row"] > 0
    assert data["cpu_ratio_native_jsoneachrow"] > 0 and data["cpu_ratio_arrow_jsoneachrow"] > 0


def test_writer_alone_writes_json(tmp_path):
    """`python -m bench.writer`: the writer's delivery without Spark stores every row (the module asserts the
    count), with its CPU split into stages, its state store's round trips and the GIL probe's rates; with
    `--dirty`, the same batches with bad records beside them, dead-lettered to a real broker (the module asserts
    every other row is stored). `--after immediate` writes each AFTER at once, as every batch did before."""
    res = subprocess.run([sys.executable, "-m", "bench.writer", "--events", "16000", "--batches", "2", "--dirty",
                          "0.02", "--after", "immediate", "--out", str(tmp_path)], cwd=REPO, capture_output=True,
                         text=True, timeout=600, env=mimalloc_verbose_env())
    assert res.returncode == 0, res.stderr[-3000:]
    [out] = list(tmp_path.glob("*-writer.json"))
    data = json.loads(out.read_text())
    # Arrow's allocator as the job's driver sets it, in what mimalloc itself read
    assert data["arrow_allocator"] == {"MIMALLOC_PURGE_DELAY": "10000"}, data
    assert "option 'purge_delay': 10000" in res.stderr
    assert data["deliver_all"]["rows_per_s"] > 0 and data["deliver_all"]["cpu_us_per_row"] > 0
    # a steady batch's state transitions: one read to plan, BEFORE and AFTER each written and read back
    assert data["state_store"]["round_trips"] == 5 and data["state_store"]["write_ms"] > 0, data["state_store"]
    assert set(data["stages_cpu_us_per_row"]) == {"build_lines", "guard", "insert", "parse_null"}
    # the CPU clock ticks in 10 ms: a small batch's stage may show none
    assert all(v >= 0 for v in data["stages_cpu_us_per_row"].values())
    assert data["gil"]["spin_alone_per_s"] > 0 and data["gil"]["ratio_during_alone"] >= 0
    dirty = data["deliver_all_dirty"]
    assert dirty["dirty_share"] == 0.02 and 0.01 * 32000 < dirty["dead_lettered"] < 0.04 * 32000, dirty
    assert dirty["cpu_us_per_row"] > 0 and "dirty_extra_cpu_us_per_row" in data


def test_writer_alone_on_keeper_map_as_the_driver_writes(tmp_path):
    """`python -m bench.writer --engine KeeperMap`: the state table on KeeperMap, a real ZooKeeper beside it; by
    default each range's AFTER waits for its partition's next BEFORE, as on the driver: a steady batch's state
    transitions are one write (read back) that confirms the last range and begins the next, planned from the rows
    the last read back gave, with no read of its own.
    With `--key-shards 2` the rows are routed by key over two shards (the module asserts every row stored on one):
    a range's sub-blocks share its transitions."""
    res = subprocess.run([sys.executable, "-m", "bench.writer", "--events", "16000", "--batches", "3", "--engine",
                          "KeeperMap", "--key-shards", "2", "--out", str(tmp_path)], cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    [out] = list(tmp_path.glob("*-writer.json"))
    data = json.loads(out.read_text())
    assert (data["engine"], data["after"], data["key_shards"]) == ("KeeperMap", "waiting", 2), data
    assert data["state_store"]["round_trips"] == 2 and data["state_store"]["write_ms"] > 0, data["state_store"]


def test_jvm_profile_summary_counts_a_real_recordings_samples_within_its_window(tmp_path):
    """`bench.profile.summarize_jfr` (what `python -m bench --profile` writes as profile-c-jvm.txt) on a flight
    recording of a real JVM: every sample attributed, none outside the window asked for."""
    import time

    from bench.profile import summarize_jfr

    src = tmp_path / "Spin.java"
    src.write_text("public class Spin { public static void main(String[] a) { long t = System.nanoTime(), s = 0;"
                   " while (System.nanoTime() - t < 1_500_000_000L) { s += new StringBuilder().append(s).length(); }"
                   " System.out.println(s); } }")
    rec = tmp_path / "spin.jfr"
    t0 = time.time()
    subprocess.run(["java", f"-XX:StartFlightRecording=filename={rec},settings=profile,dumponexit=true", str(src)],
                   check=True, capture_output=True, timeout=120)
    t1 = time.time()
    whole = summarize_jfr(str(rec), t0, t1)
    head, *rows = whole.splitlines()
    assert int(head.split(": ")[1].split()[0]) > 10, whole
    assert abs(sum(float(r.split("%")[0]) for r in rows) - 100) < 1, whole
    assert summarize_jfr(str(rec), t0 - 3600, t0 - 3000).startswith("== driver JVM: 0 samples"), "window ignored"


def test_latency_quick_writes_json(tmp_path):
    """`python -m bench.latency`: a live producer while the job runs on both paths; every row's latency is read
    from the column ClickHouse fills at insert (the module asserts the job delivered every record)."""
    res = subprocess.run([sys.executable, "-m", "bench.latency", "--rate", "2000", "--seconds", "10", "--warmup", "2",
                          "--reps", "1", "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    [out] = list(tmp_path.glob("*-latency.json"))
    data = json.loads(out.read_text())
    assert {(r["path"], r["variant"]) for r in data["runs"]} == {("c", "default"), ("e", "default")}
    for r in data["runs"]:
        assert r["rows"] == 20_000 and 0 < r["measured_rows"] <= 20_000, r
        lat = r["latency_ms"]
        assert 0 <= lat["0.5"] <= lat["0.99"] <= lat["1.0"], lat  # ClickHouse filled it after the record was made


def test_latency_quick_with_a_peer_writes_json(tmp_path):
    """`python -m bench.latency --paths c,i`: clickhouse_sinker under the same live producer, into the same table on
    a server of its own, leaving `ingested` to ClickHouse as the job does (a peer that sent it would store 1970 and
    fail the check below), after the job in the first rep; recorded as unavailable where hack/peers.sh did not
    build it."""
    res = subprocess.run([sys.executable, "-m", "bench.latency", "--rate", "2000", "--seconds", "10", "--warmup", "2",
                          "--reps", "1", "--paths", "c,i", "--out", str(tmp_path)], cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    [out] = list(tmp_path.glob("*-latency.json"))
    data = json.loads(out.read_text())
    assert [r["path"] for r in data["runs"]] == ["c", "i"]
    sinker = data["runs"][1]
    if "unavailable" in sinker:
        assert "hack/peers.sh" in sinker["unavailable"] and set(data["medians_latency_ms"]) == {"c/default"}
        return
    assert sinker["rows"] == 20_000 and sinker["duplicates"] == 0 and 0 < sinker["measured_rows"] <= 20_000, sinker
    lat = sinker["latency_ms"]
    assert 0 <= lat["0.5"] <= lat["0.99"] <= lat["1.0"] < 60_000, lat
    assert set(data["medians_latency_ms"]) == {"c/default", "i"}


def test_commits_quick_writes_json(tmp_path):
    """`python -m bench.commits`: two checkouts (here both HEAD's, as two refs) on one data set and, with `--dirty`,
    on a dirty one too, each run of (c) beside one of (d) with `--with-d`, each run from its own worktree, every
    record delivered or dead-lettered, exactly once for (c) (run_job asserts the count); the worktrees are removed.
    The order of the runs over several reps is test_round_order's."""
    before = subprocess.run(["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True).stdout
    res = subprocess.run([sys.executable, "-m", "bench.commits", "HEAD", "HEAD~0", "--path", "c", "--with-d",
                          "--reps", "1", "--dirty", "0.05", "--events", "20000", "--batch", "5000", "--block", "5000",
                          "--partitions", "2", "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    [out] = list(tmp_path.glob("*-commits.json"))
    data = json.loads(out.read_text())
    assert data["commits"]["HEAD"] == data["commits"]["HEAD~0"]
    assert [(r["ref"], r["data"], r["path"]) for r in data["runs"]] == [
        (ref, kind, path) for ref in ("HEAD", "HEAD~0") for kind in ("clean", "dirty") for path in "cd"]
    assert all(r["rows_per_s"] > 0 for r in data["runs"]) and len(data["ratios_to_first"]["HEAD~0"]) == 1
    assert {ref: len(v) for ref, v in data["dirty_clean"].items()} == {"HEAD": 1, "HEAD~0": 1}
    c, d = ({r["ref"]: r["rows_per_s"] for r in data["runs"] if r["path"] == p and r["data"] == "clean"} for p in "cd")
    assert data["c_d"] == {ref: [round(c[ref] / d[ref], 3)] for ref in ("HEAD", "HEAD~0")}
    assert data["d_medians"] == d
    assert subprocess.run(["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True).stdout == before


def test_variants_quick_writes_json(tmp_path):
    """`python -m bench.variants`: (c) with each variant of its sparkConf, alternated, with the driver JVM's
    collections read from its own GC log (run_job asserts every record was delivered)."""
    res = subprocess.run([sys.executable, "-m", "bench.variants", '{"default": {}, "young": {"spark.driver.'
                          'extraJavaOptions": "-XX:NewRatio=1"}}', "--reps", "1", "--events", "20000", "--batch", "5000",
                          "--block", "5000", "--partitions", "2", "--out", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    [out] = list(tmp_path.glob("*-variants.json"))
    data = json.loads(out.read_text())
    assert [r["variant"] for r in data["runs"]] == ["default", "young"]
    assert all(r["rows_per_s"] > 0 and r["gc"]["pauses"] >= 0 for r in data["runs"])
    assert set(data["medians"]) == {"default", "young"}


def test_versus_quick_writes_json(tmp_path):
    """`python -m bench.versus`: (e) alternated with clickhouse_sinker, each run on a ClickHouse server of its own,
    the order reversed every other rep; the sinker recorded as unavailable where hack/peers.sh did not build it."""
    res = subprocess.run([sys.executable, "-m", "bench.versus", "--peers", "i", "--reps", "2", "--events", "20000",
                          "--batch", "5000", "--block", "5000", "--partitions", "2", "--out", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    [out] = list(tmp_path.glob("*-versus.json"))
    data = json.loads(out.read_text())
    built = "i" not in data["unavailable"]
    order = [("e", 0), ("i", 0), ("i", 1), ("e", 1)] if built else [("e", 0), ("e", 1)]
    assert [(r["key"], r["rep"]) for r in data["runs"]] == order
    # the CPU clock ticks in 10 ms and is sampled: a peer's short run may show none
    assert all(r["rows_per_s"] > 0 and r["cpu_us_per_row"] >= 0 for r in data["runs"])
    assert len({r["clickhouse_server_pid"] for r in data["runs"]}) == len(order)
    if built:
        assert len(data["ratios_e_to"]["i"]) == 2 and all(r["duplicates"] == 0 for r in data["runs"] if r["key"] == "i")
