"""Kafka over SASL_SSL (SCRAM-SHA-512, a CA made by the test bed) with the options a user writes in
librdkafka's names: the same config reaches Spark's Java consumer (translated), the DLQ producer and the
verifier (as written), and the password comes from a secret, here an environment variable."""

from __future__ import annotations

import json

from confluent_kafka import Producer

from .harness import SinkHarness, event

PASSWORD_ENV = "CHSINK_TEST_KAFKA_PASSWORD"


def _secure(sink: SinkHarness, password: str) -> dict[str, str]:
    kafka = sink.kafka
    user, _ = kafka.scram_user()
    options = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user,
               "ssl.ca.location": str(kafka.ca_file)}
    sink.config["kafka"].update(bootstrapServers=kafka.secure_bootstrap, options=options,
                                secretOptions={"sasl.password": {"env": PASSWORD_ENV}})
    sink.write_config()
    sink.extra_env[PASSWORD_ENV] = password
    return {"bootstrap.servers": kafka.secure_bootstrap, **options, "sasl.password": password}


def test_sasl_ssl_with_librdkafka_option_names_delivers_exactly_once(tmp_path, kafka, topic):
    src, dlq = topic(2), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq)
    client = _secure(sink, kafka.scram_user()[1])  # a password with a double quote and a backslash
    p = Producer(client)
    for i in range(500):
        p.produce(src, json.dumps(event(i)).encode(), partition=i % 2)
    p.produce(src, b"{not json", partition=0)  # dead-lettered by the DLQ producer, over SASL_SSL too
    assert p.flush(30) == 0
    sink.drain()
    [[[count]]] = sink.sql(f"SELECT count() FROM {sink.db}.events")
    assert int(count) == 500
    report = sink.verify()
    t = report["totals"]
    assert report["ok"] and (t["duplicates"], t["gaps"], t["dead_lettered"]) == (0, 0, 1), report


def test_a_wrong_password_fails_the_run_and_says_why(tmp_path, kafka, topic):
    src, dlq = topic(1), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq)
    _secure(sink, "not-the-password")
    sink.start("--until-idle", "5", "--quiet")
    assert sink.wait(240) == 2, sink.log_text()[-3000:]  # a configuration error: retrying will not help
    assert "refused the connection" in sink.log_text() and "SASL authentication" in sink.log_text(), \
        sink.log_text()[-3000:]
    [[[count]]] = sink.sql(f"SELECT count() FROM {sink.db}.events")
    assert int(count) == 0
