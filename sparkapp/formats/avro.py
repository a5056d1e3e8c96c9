"""Avro records: an inline writer schema, or Confluent's wire format with a schema registry.

A registry's schema may name types another subject's schema defines (its references): those are fetched first,
each after its own, and the record read with all of them."""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable
from typing import Any

from .rows import DecodeError
from .schema_registry import fetch, reference_url


class AvroReader:
    """Reads one record per value; registry schemas are fetched once per id and cached."""

    def __init__(self, inline_schema: str | None, registry_url: str | None) -> None:
        import fastavro

        self.inline = fastavro.parse_schema(json.loads(inline_schema)) if inline_schema else None
        self.registry_url = registry_url
        self._registry: dict[int, Any] = {}

    def __call__(self, value: bytes) -> dict[str, Any]:
        import fastavro

        schema, payload = self.inline, value
        if self.registry_url:
            if len(value) < 5 or value[0] != 0:
                raise DecodeError("avro: not in Confluent wire format (magic byte 0 + 4-byte schema id)")
            (schema_id,) = struct.unpack(">I", value[1:5])
            schema, payload = self._registry_schema(self.registry_url, schema_id), value[5:]
        if schema is None:
            raise DecodeError("avro: no writer schema configured (inline schema or schema registry URL)")
        buf = io.BytesIO(payload)
        try:
            rec = fastavro.schemaless_reader(buf, schema, None)
        except (EOFError, StopIteration, struct.error, IndexError) as e:
            raise DecodeError(f"avro: truncated record ({type(e).__name__}: {e or 'end of data'})") from None
        except Exception as e:
            raise DecodeError(f"avro: cannot decode record ({type(e).__name__}: {e})") from None
        if buf.tell() != len(payload):
            raise DecodeError(f"avro: {len(payload) - buf.tell()} trailing bytes after the record")
        if not isinstance(rec, dict):
            raise DecodeError("avro: top-level schema must be a record")
        return rec

    def _registry_schema(self, url_base: str, schema_id: int) -> Any:
        import fastavro

        if schema_id not in self._registry:
            base = url_base.rstrip("/")
            url = f"{base}/schemas/ids/{schema_id}"
            doc = fetch(url, f"avro: schema id {schema_id}")
            named: dict[str, Any] = {}
            try:
                self._referenced(base, doc, named, set())
                self._registry[schema_id] = fastavro.parse_schema(json.loads(doc["schema"]), named_schemas=named)
            except DecodeError:
                raise
            except Exception as e:  # the registry's schema for this id is not Avro: every record naming it is bad
                raise DecodeError(f"avro: schema id {schema_id} at {url} is no Avro schema: {e}") from None
        return self._registry[schema_id]

    def _referenced(self, base: str, doc: dict[str, Any], named: dict[str, Any], seen: set[str]) -> None:
        """Adds the named types of every schema `doc` references to `named`, each after those it references."""
        import fastavro

        for ref in doc.get("references") or []:
            if ref["name"] not in seen:
                seen.add(ref["name"])
                url = reference_url(base, ref)
                dep = fetch(url, f"avro: schema {ref['name']}")
                self._referenced(base, dep, named, seen)
                try:
                    fastavro.parse_schema(json.loads(dep["schema"]), named_schemas=named)
                except Exception as e:
                    raise DecodeError(f"avro: the schema {ref['name']} at {url} is no Avro schema: {e}") from None


def avro_reader(inline_schema: str | None, registry_url: str | None) -> Callable[[bytes], dict[str, Any]]:
    return AvroReader(inline_schema, registry_url)
