"""Kafka authentication as Strimzi spells it (`spec.kafka.tls`, `spec.kafka.authentication`), as the job's
librdkafka options (pure).

Every secret value reaches the pods as an environment variable from a secretKeyRef, like the sink's other
Secrets: a KafkaUser's Secret and a cluster CA Secret are used as Strimzi writes them, and a rotation restarts the
job. The Java consumer's options follow from the librdkafka ones (core/kafka_options.py): PEM certificates and keys
as inline values, which both clients take.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import KafkaSpec

# librdkafka's SASL mechanism per Strimzi authentication type
MECHANISMS = {"scram-sha-512": "SCRAM-SHA-512", "scram-sha-256": "SCRAM-SHA-256", "plain": "PLAIN"}


@dataclass(frozen=True)
class SecretOption:
    """A librdkafka option whose value comes from a Secret's key; several keys (trusted certificates) are joined."""

    option: str
    field: str  # the spec field that names it, for errors
    keys: tuple[tuple[str, str], ...]  # (secret, key)


def security(k: KafkaSpec) -> tuple[dict[str, str], list[SecretOption]]:
    """The librdkafka options and the Secret-backed ones that `tls` and `authentication` stand for ({}, [] when
    neither is set)."""
    auth = k.authentication
    if k.tls is None and auth is None:
        return {}, []
    sasl = auth is not None and auth.type in MECHANISMS
    protocol = ("SASL_SSL" if sasl else "SSL") if k.tls is not None else "SASL_PLAINTEXT"
    options: dict[str, str] = {"security.protocol": protocol}
    secrets: list[SecretOption] = []
    if k.tls is not None:
        secrets.append(SecretOption("ssl.ca.pem", "spec.kafka.tls.trustedCertificates",
                                    tuple((c.secret_name, c.certificate) for c in k.tls.trusted_certificates)))
    if auth is not None and auth.certificate_and_key is not None:
        ck = auth.certificate_and_key
        secrets += [SecretOption("ssl.certificate.pem", "spec.kafka.authentication.certificateAndKey.certificate",
                                 ((ck.secret_name, ck.certificate),)),
                    SecretOption("ssl.key.pem", "spec.kafka.authentication.certificateAndKey.key",
                                 ((ck.secret_name, ck.key),))]
    if auth is not None and sasl:
        assert auth.username is not None and auth.password_secret is not None  # the model requires them
        options.update({"sasl.mechanism": MECHANISMS[auth.type], "sasl.username": auth.username})
        ps = auth.password_secret
        secrets.append(SecretOption("sasl.password", "spec.kafka.authentication.passwordSecret",
                                    ((ps.secret_name, ps.password),)))
    return options, secrets


def credentials_from(secrets: list[SecretOption]) -> str | None:
    """Where the credentials (`security`'s Secret-backed options) come from, as a refused connection names it:
    the fields and their Secrets."""
    if not secrets:
        return None
    by_field: dict[str, list[str]] = {}
    for s in secrets:
        field = s.field.rsplit(".", 1)[0] if s.field.endswith((".certificate", ".key")) else s.field
        by_field.setdefault(field, []).extend(f"Secret {name} key {key}" for name, key in s.keys)
    return "; ".join(f"{field} ({', '.join(dict.fromkeys(keys))})" for field, keys in by_field.items())
