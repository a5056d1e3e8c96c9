"""Kafka over SASL_SSL (SCRAM-SHA-512, a CA made by the test bed) with the options a user writes in
librdkafka's names: the same config reaches Spark's Java consumer (translated), the DLQ producer and the
verifier (as written), and the password comes from a secret, here an environment variable."""

from __future__ import annotations

import json

from confluent_kafka import Producer

from tests.helpers import MTLS_SPEC, strimzi_secrets

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


def delivers_once_and_dead_letters_one(sink: SinkHarness, client: dict[str, str], n: int) -> None:
    """n good records and one bad over `client`'s connection: n rows, the bad one dead-lettered (by the job's DLQ
    producer, over the sink's own security), and the verifier (likewise) finds each offset once."""
    p = Producer(client)
    for i in range(n):
        p.produce(sink.topic, json.dumps(event(i)).encode(), partition=i % 2)
    p.produce(sink.topic, b"{not json", partition=0)
    assert p.flush(30) == 0
    sink.drain()
    [[[count]]] = sink.sql(f"SELECT count() FROM {sink.db}.events")
    assert int(count) == n
    report = sink.verify()
    t = report["totals"]
    assert report["ok"] and (t["duplicates"], t["gaps"], t["dead_lettered"]) == (0, 0, 1), report


def test_sasl_ssl_with_librdkafka_option_names_delivers_exactly_once(tmp_path, kafka, topic):
    src, dlq = topic(2), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq)
    client = _secure(sink, kafka.scram_user()[1])  # a password with a double quote and a backslash
    delivers_once_and_dead_letters_one(sink, client, 500)


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


def _as_the_operator_renders_it(sink: SinkHarness, secrets: dict[str, dict[str, str]]) -> None:
    """The job's Kafka section as the operator renders it for a ClickHouseSink with Strimzi's tls and
    authentication, and the environment its pods get from the secretKeyRefs."""
    from sinkoperator.model import SinkSpec
    from sinkoperator.render import secret_refs, sink_config

    kafka = sink.kafka
    spec = SinkSpec.parse({"kafka": {"bootstrapServers": kafka.mtls_bootstrap, "topics": [sink.topic], **MTLS_SPEC},
                           "clickhouse": {"shards": [{"endpoint": "http://unused:8123"}], "tables": {"*": "events"}},
                           "checkpointLocation": "/unused"})
    rendered = sink_config("default", "mtls", spec).kafka.model_dump(by_alias=True, exclude_none=True, mode="json")
    sink.config["kafka"].update({k: rendered[k] for k in ("bootstrapServers", "options", "secretOptions",
                                                          "credentialsFrom")})
    sink.write_config()
    for _, var in secret_refs(spec):
        ref = var["valueFrom"]["secretKeyRef"]
        sink.extra_env[var["name"]] = secrets[ref["name"]][ref["key"]]


def test_mutual_tls_from_a_kafkauser_secret_delivers_exactly_once_and_dead_letters_over_it(tmp_path, kafka, topic):
    """Over the listener that requires client certificates: Spark's Java consumer (a PEM keystore, translated),
    the DLQ producer and the verifier (librdkafka) all present the KafkaUser's certificate."""
    src, dlq = topic(2), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq)
    _as_the_operator_renders_it(sink, strimzi_secrets(kafka))
    assert sink.config["kafka"]["options"] == {"security.protocol": "SSL"}
    delivers_once_and_dead_letters_one(sink, {"bootstrap.servers": kafka.bootstrap}, 300)


def test_a_certificate_the_broker_does_not_trust_fails_the_run_naming_it(tmp_path, kafka, topic):
    src, dlq = topic(1), topic(1)
    sink = SinkHarness(tmp_path, kafka, src, dlq)
    _as_the_operator_renders_it(sink, strimzi_secrets(kafka, user="rogue"))
    sink.start("--until-idle", "5", "--quiet")
    assert sink.wait(240) == 2, sink.log_text()[-3000:]  # a configuration error: retrying will not help
    log = sink.log_text()
    assert "spec.kafka.authentication.certificateAndKey (Secret my-user key user.crt, Secret my-user key " \
           "user.key)" in log and "bad certificate" in log, log[-3000:]
