"""Production's path: a real ClickHouse server process reached over HTTP, every partition written by its own
executor task (Spark's Python workers), with the job SIGKILLed and the ClickHouse server itself killed and
restarted while a producer keeps writing. Every offset must be in ClickHouse or the DLQ exactly once."""

from __future__ import annotations

import random
import time

from .harness import BackgroundProducer, SinkHarness
from .test_faults import check_exactly_once

KILLS = 6


def test_http_executor_path_storm_with_clickhouse_killed(tmp_path, kafka, topic, clickhouse_server):
    src, dlq = topic(4), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq, engine="KeeperMap", server=clickhouse_server)
    producer = BackgroundProducer(kafka, src, total=10**9, per_second=400)
    producer.start()
    rnd = random.Random(13)
    faults = []
    for i in range(KILLS):
        sink.start("--quiet")
        if not sink.wait_for_batches(rnd.randint(1, 3), timeout=240):
            faults.append(f"run {i}: exited by itself ({sink.proc.returncode})")
            continue
        time.sleep(rnd.uniform(0.0, 2.5))
        if i in (1, 4):  # the server dies under the executors' inserts; the job must fail, not lose or double
            clickhouse_server.kill()
            faults.append("clickhouse sigkill")
            time.sleep(rnd.uniform(0.5, 3.0))
            clickhouse_server.start()
        sink.kill()
        faults.append("job sigkill")
        if i % 3 == 2:
            sink.delete_checkpoint()
    producer.finish()
    sink.drain()
    report = check_exactly_once(sink, producer.sent, producer.bad)
    assert "; writer on executors" in sink.logs[0].read_text(errors="replace")
    print(f"HTTP/executor path survived {faults}; totals {report['totals']}")
