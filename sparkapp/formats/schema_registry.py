"""Reading a schema from a Confluent-compatible schema registry, for the Avro and Protobuf readers.

A registry that does not answer is an outage, not the record's fault: the error propagates and the batch is
tried again later, so no record is dead-lettered because the registry was down. Only a registry that answers
that it has no such schema (404) makes the record a dead letter.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from .rows import DecodeError


class RegistryUnavailableError(ConnectionError):
    """The schema registry did not answer, or answered with an error of its own (5xx): try again later.
    `status` is the HTTP status of an answer, None when there was none."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def fetch(url: str, what: str, timeout: float = 10) -> dict[str, Any]:
    """The registry's JSON answer at `url`; DecodeError when it has no such schema (`what` names it)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            doc = json.load(r)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise DecodeError(f"{what} not found at {url} (404)") from None
        raise RegistryUnavailableError(f"schema registry at {url} answered {e.code}: {e.reason}", e.code) from None
    except (OSError, TimeoutError) as e:  # refused, unreachable, timed out
        raise RegistryUnavailableError(f"schema registry at {url} did not answer: {e}") from None
    except ValueError as e:
        raise RegistryUnavailableError(f"schema registry at {url} answered something that is not JSON: {e}") from None
    if not isinstance(doc, dict) or "schema" not in doc:
        raise RegistryUnavailableError(f"schema registry at {url} answered without a schema: {str(doc)[:200]}")
    return doc


def reference_url(base: str, ref: dict[str, Any]) -> str:
    """Where a schema's reference is: its subject, escaped (Confluent's clients name the subject of an imported
    Protobuf file after its path, `common/money.proto`), at its version."""
    return f"{base}/subjects/{urllib.parse.quote(str(ref['subject']), safe='')}/versions/{ref['version']}"
