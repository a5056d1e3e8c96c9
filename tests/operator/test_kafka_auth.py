"""Kafka authentication as Strimzi spells it, through the operator on the real API server: a KafkaUser's Secret and
the cluster CA Secret, used as they are, reach the job as env vars from secretKeyRefs; the operator's own Kafka
calls (lag) go over mutual TLS with them; a certificate the broker does not trust is a condition and an Event
that name it."""

from __future__ import annotations

import json
from typing import Any

import yaml

from tests.helpers import MTLS_SPEC, strimzi_secrets

from .test_operator import app_of, condition, cr_status, get, report, wait_for


def apply_secrets(kube: Any, secrets: dict[str, dict[str, str]]) -> None:
    for name, data in secrets.items():
        kube.kubectl("apply", "-f", "-", input=yaml.safe_dump({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "default"},
            "type": "Opaque", "stringData": data}))


def test_a_kafkauser_secret_and_the_cluster_ca_give_mutual_tls_and_a_wrong_certificate_is_named(sink, kafka):
    s = sink
    apply_secrets(s["kube"], strimzi_secrets(kafka))
    cr = s["apply"](kafka={"bootstrapServers": kafka.mtls_bootstrap, "topics": [s["topic"]], **MTLS_SPEC})
    app = wait_for("SparkApplication", lambda: app_of(s))
    env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in app["spec"]["driver"]["env"]}
    assert env["CHSINK_KAFKA_SSL_CA_PEM"] == {"name": "my-cluster-cluster-ca-cert", "key": "ca.crt"}
    assert env["CHSINK_KAFKA_SSL_CERTIFICATE_PEM"] == {"name": "my-user", "key": "user.crt"}
    assert env["CHSINK_KAFKA_SSL_KEY_PEM"] == {"name": "my-user", "key": "user.key"}
    job = yaml.safe_load(get(s["kube"], "configmap", f"chsink-{s['name']}")["data"]["sink.yaml"])["kafka"]
    assert job["options"] == {"security.protocol": "SSL"} and job["secretOptions"]["ssl.key.pem"] == {
        "env": "CHSINK_KAFKA_SSL_KEY_PEM"}, job
    report(s, "RUNNING")
    # Ready means the operator's own Kafka calls (the lag from the watermarks) went through over mutual TLS
    wait_for("Ready", lambda: condition(s, "Ready").get("status") == "True")
    wait_for("the lag read", lambda: cr_status(s).get("lag") == 0)

    apply_secrets(s["kube"], {"rogue-user": strimzi_secrets(kafka, user="rogue")["my-user"]})
    cr["spec"]["kafka"]["authentication"]["certificateAndKey"]["secretName"] = "rogue-user"
    s["kube"].kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))
    cond = wait_for("KafkaRefused", lambda: (c := condition(s, "Degraded")).get("reason") == "KafkaRefused" and c)
    named = ("spec.kafka.authentication.certificateAndKey (Secret rogue-user key user.crt, Secret rogue-user key "
             "user.key)")
    assert named in cond["message"] and "bad certificate" in cond["message"], cond
    events = json.loads(s["kube"].kubectl("get", "events", "-o", "json", "--field-selector",
                                          f"involvedObject.name={s['name']},reason=KafkaRefused").stdout)["items"]
    assert events and named in events[0]["message"] and events[0]["type"] == "Warning", events


def test_strimzi_authentication_fields_are_checked_naming_them(operator):
    from sinkoperator.model import SinkSpec
    from sparkapp.config import ConfigError

    base = {"clickhouse": {"shards": [{"endpoint": "http://ch:8123"}], "tables": {"*": "t"}},
            "checkpointLocation": "/c"}

    def refused(kafka: dict[str, Any]) -> str:
        try:
            SinkSpec.parse({**base, "kafka": {"bootstrapServers": "k:9093", "topics": ["t"], **kafka}})
        except ConfigError as e:
            return str(e)
        raise AssertionError(f"accepted: {kafka}")

    assert "type oauth: not supported" in refused({"authentication": {"type": "oauth"}})
    assert "needs tls.trustedCertificates" in refused({"authentication": MTLS_SPEC["authentication"]})
    assert "give username and passwordSecret" in refused({"authentication": {"type": "scram-sha-512"}})
    assert "set by tls and authentication" in refused({**MTLS_SPEC, "options": {"security.protocol": "SSL"}})
    # SCRAM over TLS, with a KafkaUser's password Secret
    from sinkoperator.render import sink_config

    spec = SinkSpec.parse({**base, "kafka": {"bootstrapServers": "k:9093", "topics": ["t"], "tls": MTLS_SPEC["tls"],
                                             "authentication": {"type": "scram-sha-512", "username": "my-user",
                                                                "passwordSecret": {"secretName": "my-user",
                                                                                   "password": "password"}}}})
    k = sink_config("ns", "s", spec).kafka
    assert k.options == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "my-user"}
    assert {o: r.env for o, r in k.secret_options.items()} == {"ssl.ca.pem": "CHSINK_KAFKA_SSL_CA_PEM",
                                                               "sasl.password": "CHSINK_KAFKA_SASL_PASSWORD"}
    # the API server refuses what its schema can tell
    bad = {"apiVersion": "chsink.io/v1alpha1", "kind": "ClickHouseSink", "metadata": {"name": "bad-auth",
                                                                                       "namespace": "default"},
           "spec": {**base, "kafka": {"bootstrapServers": "k:9093", "topics": ["t"],
                                      "authentication": {"type": "tls"}}}}
    res = operator.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert res.returncode != 0 and "authentication type tls needs certificateAndKey" in res.stderr, res.stderr
