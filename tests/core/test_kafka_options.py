"""librdkafka option names translated for Spark's Java consumer (the real listener: tests/e2e/test_kafka_security.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkapp.core.kafka_options import UNTRANSLATED, KafkaOptionError, java_consumer_options


def test_scram_over_tls_becomes_a_jaas_line_and_a_pem_truststore():
    got = java_consumer_options({"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
                                 "sasl.username": "chsink", "sasl.password": "pw", "ssl.ca.location": "/ca.pem",
                                 "ssl.endpoint.identification.algorithm": "none", "client.id": "x"})
    assert got == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                   "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                       'username="chsink" password="pw";',
                   "ssl.truststore.type": "PEM", "ssl.truststore.location": "/ca.pem",
                   "ssl.endpoint.identification.algorithm": "", "client.id": "x"}


def _unquote(token: str) -> str:
    """Kafka's JAAS tokenizer on one double-quoted value."""
    assert token[0] == token[-1] == '"'
    out, i, body = [], 0, token[1:-1]
    while i < len(body):
        if body[i] == "\\":
            i += 1
        out.append(body[i])
        i += 1
    return "".join(out)


@given(st.text(min_size=1), st.text(min_size=1))
def test_any_credentials_round_trip_through_the_jaas_quoting(user, password):
    line = java_consumer_options({"sasl.mechanism": "PLAIN", "sasl.username": user,
                                  "sasl.password": password})["sasl.jaas.config"]
    head = "org.apache.kafka.common.security.plain.PlainLoginModule required username="
    assert line.startswith(head) and line.endswith('";')
    rest = line[len(head):-1]
    # split at the unescaped quote that ends the username
    i, escaped = 1, False
    while escaped or rest[i] != '"':
        escaped = not escaped and rest[i] == "\\"
        i += 1
    assert _unquote(rest[:i + 1]) == user
    assert rest[i + 1:].startswith(" password=") and _unquote(rest[i + 1 + len(" password="):]) == password


@pytest.mark.parametrize(("options", "named"), [
    ({"sasl.username": "u"}, "sasl.username and sasl.password"),
    ({"sasl.username": "u", "sasl.password": "p"}, "GSSAPI"),
    ({"sasl.mechanism": "OAUTHBEARER", "sasl.username": "u", "sasl.password": "p"}, "sasl.mechanism OAUTHBEARER"),
    ({"sasl.mechanism": "PLAIN", "sasl.mechanisms": "SCRAM-SHA-256"}, "differ"),
    ({"ssl.ca.location": "/a", "ssl.ca.pem": "x"}, "give one"),
    ({"enable.ssl.certificate.verification": "false"}, "cannot skip"),
    ({"ssl.key.location": "/k", "ssl.certificate.location": "/c"}, "ssl.certificate.location, ssl.key.location"),
])
def test_what_cannot_be_translated_is_named(options, named):
    with pytest.raises(KafkaOptionError, match=named):
        java_consumer_options(options)


def test_librdkafka_only_options_are_left_out_when_the_java_side_is_given():
    got = java_consumer_options({"ssl.key.location": "/k", "security.protocol": "SSL"}, ["ssl.keystore.location"])
    assert got == {"security.protocol": "SSL"}


@given(st.dictionaries(st.sampled_from([*sorted(UNTRANSLATED), "client.id", "security.protocol", "fetch.min.bytes"]),
                       st.text(max_size=5)))
def test_no_librdkafka_only_name_reaches_the_java_consumer(options):
    try:
        got = java_consumer_options(options, ["sasl.jaas.config"])
    except KafkaOptionError:
        return
    assert not set(got) & set(UNTRANSLATED)
