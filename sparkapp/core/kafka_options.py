"""Kafka client options as the sink's config gives them (librdkafka's names, which the operator, the DLQ
producer and the range reader use as they are) translated for Spark's Kafka source, whose Java consumer
names security differently: SASL credentials are one JAAS line, a PEM CA file is a truststore.

Pure: it names what it cannot translate instead of passing it on, because the Java client only warns about
an option it does not know and then connects without it (no TLS trust, no credentials).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# librdkafka-only names with no one-to-one Java option: named in the error, with what to give instead
UNTRANSLATED = {
    "ssl.certificate.location": "mutual TLS from files (give ssl.certificate.pem and ssl.key.pem, or a PKCS#12 "
                                "ssl.keystore.location)",
    "ssl.key.location": "mutual TLS from files (give ssl.certificate.pem and ssl.key.pem, or a PKCS#12 "
                        "ssl.keystore.location)",
    "sasl.kerberos.service.name": "Kerberos",
    "sasl.kerberos.keytab": "Kerberos",
    "sasl.kerberos.principal": "Kerberos",
    "sasl.oauthbearer.config": "OAUTHBEARER",
    "sasl.oauthbearer.method": "OAUTHBEARER",
    "sasl.oauthbearer.client.id": "OAUTHBEARER",
    "sasl.oauthbearer.client.secret": "OAUTHBEARER",
    "sasl.oauthbearer.token.endpoint.url": "OAUTHBEARER",
}


class KafkaOptionError(ValueError):
    """An option Spark's Java consumer cannot be given as written; the message names it."""


def _jaas_quoted(value: str) -> str:
    # Kafka parses JAAS values with a tokenizer that reads \\ and \" inside double quotes
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_consumer_options(options: Mapping[str, str], java_given: Collection[str] = ()) -> dict[str, str]:
    """The Java consumer's options for librdkafka-named `options` (unprefixed); the others pass as they are.
    `java_given`: Java option names the config sets itself (sourceOptions); with any of them, librdkafka-only
    options are left to the librdkafka clients instead of being refused."""
    opts = dict(options)
    out: dict[str, str] = {}
    mechanism, alias = opts.pop("sasl.mechanism", None), opts.pop("sasl.mechanisms", None)
    if mechanism is not None and alias is not None and mechanism != alias:
        raise KafkaOptionError("sasl.mechanism and sasl.mechanisms differ; give one")
    mechanism = mechanism or alias
    if mechanism is not None:
        out["sasl.mechanism"] = mechanism
    user, password = opts.pop("sasl.username", None), opts.pop("sasl.password", None)
    if (user is None) != (password is None):
        raise KafkaOptionError("sasl.username and sasl.password: give both (the password may come from "
                               "secretOptions)")
    if user is not None and password is not None:
        module = LOGIN_MODULES.get((mechanism or "GSSAPI").upper())
        if module is None:
            raise KafkaOptionError(
                f"sasl.mechanism {mechanism or '(unset: GSSAPI)'}: a username and password are translated for "
                f"{', '.join(LOGIN_MODULES)}; set sasl.mechanism, or give the Java client's JAAS line as "
                "sourceOptions kafka.sasl.jaas.config")
        out["sasl.jaas.config"] = f"{module} required username={_jaas_quoted(user)} password={_jaas_quoted(password)};"
    if "ssl.ca.location" in opts and "ssl.ca.pem" in opts:
        raise KafkaOptionError("ssl.ca.location and ssl.ca.pem: give one")
    if "ssl.ca.location" in opts:  # a PEM file of CA certificates: Java reads it as a PEM truststore
        out.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": opts.pop("ssl.ca.location")})
    if "ssl.ca.pem" in opts:
        out.update({"ssl.truststore.type": "PEM", "ssl.truststore.certificates": opts.pop("ssl.ca.pem")})
    cert, key = opts.pop("ssl.certificate.pem", None), opts.pop("ssl.key.pem", None)
    if (cert is None) != (key is None):
        raise KafkaOptionError("ssl.certificate.pem and ssl.key.pem: give both for mutual TLS")
    if cert is not None and key is not None:  # the client's certificate and key, inline: a PEM keystore in Java
        out.update({"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": cert, "ssl.keystore.key": key})
    if "ssl.keystore.location" in opts:  # librdkafka's keystore is PKCS#12 (a KafkaUser's user.p12)
        if cert is not None:
            raise KafkaOptionError("ssl.keystore.location and ssl.certificate.pem: give one client certificate")
        out["ssl.keystore.type"] = "PKCS12"
    if "ssl.endpoint.identification.algorithm" in opts:  # librdkafka's "none" is Java's empty string
        algo = opts.pop("ssl.endpoint.identification.algorithm")
        out["ssl.endpoint.identification.algorithm"] = "" if algo.lower() == "none" else algo
    if opts.pop("enable.ssl.certificate.verification", "true").lower() == "false":
        raise KafkaOptionError("enable.ssl.certificate.verification=false: Spark's Java consumer cannot skip "
                               "certificate checks; give the broker's CA as ssl.ca.location instead")
    bad = sorted(k for k in opts if k in UNTRANSLATED)
    if bad and not java_given:
        what = sorted({UNTRANSLATED[k] for k in bad})
        raise KafkaOptionError(
            f"{', '.join(bad)} ({', '.join(what)}): not translated for Spark's Java consumer; give its own options "
            "as sourceOptions too (kafka.ssl.keystore.*, kafka.sasl.jaas.config, ...)")
    return {**{k: v for k, v in opts.items() if k not in UNTRANSLATED}, **out}
