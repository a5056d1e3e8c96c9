"""What went wrong in a reconcile, as a Problem a user can act on: which object or field, and whether only a
change to the spec helps (permanent) or the operator keeps trying (everything outside the spec: Secrets,
Kafka, ClickHouse, the spark-operator)."""

from __future__ import annotations

import json
import re

from kubernetes.client.exceptions import ApiException

from sparkapp.config import ConfigError
from sparkapp.edges.clickhouse import ClickHouseRejectedError, EndpointUnreachableError
from sparkapp.edges.kafka import KafkaRefusedError, KafkaUnavailableError

from .kube import SecretUnavailableError, SparkOperatorMissingError
from .lifecycle import Problem
from .spec import Reason


def invalid_spec(e: ConfigError) -> Problem:
    return Problem(Reason.INVALID_SPEC, str(e), permanent=True)


def classify(e: BaseException) -> Problem:
    """A failure after the spec validated: always retried, since what fixes it lies outside the spec."""
    p = _classify(e)
    return Problem(p.reason, _OBJECT_ADDRESS.sub("", p.message), p.permanent)  # the same failure, the same words


_OBJECT_ADDRESS = re.compile(r" (object )?at 0x[0-9a-fA-F]+")


def _classify(e: BaseException) -> Problem:
    if isinstance(e, SecretUnavailableError):
        return Problem(Reason.SECRET_UNAVAILABLE, str(e))
    if isinstance(e, SparkOperatorMissingError):
        return Problem(Reason.SPARK_OPERATOR_MISSING, str(e))
    if isinstance(e, KafkaRefusedError):  # a Secret's new password or certificate helps, so retried; the message
        text = str(e)                     # names the fields and Secrets the credentials come from
        return Problem(Reason.KAFKA_REFUSED, text if text.startswith("spec.") else f"spec.kafka: {text}")
    if isinstance(e, KafkaUnavailableError):
        return Problem(Reason.KAFKA_UNAVAILABLE, f"spec.kafka: {e}")
    if isinstance(e, (EndpointUnreachableError, ClickHouseRejectedError)) or \
            type(e).__module__.startswith("clickhouse_connect"):
        return Problem(Reason.CLICKHOUSE_UNAVAILABLE, f"spec.clickhouse: {e}")
    if isinstance(e, ApiException):
        what = _api_message(e)
        if e.status == 403:
            return Problem(Reason.FORBIDDEN, f"the operator's ServiceAccount may not do this: {what}")
        return Problem(Reason.RECONCILE_FAILED, f"Kubernetes API {e.status} {e.reason}: {what}")
    first = (str(e).splitlines() or [""])[0][:500]
    return Problem(Reason.RECONCILE_FAILED, f"{type(e).__name__}: {first}" if first else type(e).__name__)


def _api_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except ValueError:
        return str(e.body or e.reason)
