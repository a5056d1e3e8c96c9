"""Protobuf records: a descriptor set with one message type, or Confluent's wire format with a schema registry.

A value becomes the dict of its message's fields, as the JSON and Avro readers give theirs, so the table's
columns, the decoder's strict conversion and the dead-letter reasons are the same for every format:
- a field without presence (a proto3 scalar, a repeated field) always has a value, its default when the
  sender left it out, as protobuf itself reads it; a field with presence (a message, `optional`, a oneof member,
  proto2) that is not set is left out, so its column takes its DEFAULT (NULL when Nullable);
- enums are their names (String, LowCardinality(String) and Enum columns take them), their numbers for a column
  of an integer type, and the number where the sender's enum had a value this schema does not know;
- bytes as they are (String, FixedString), messages as dicts (Tuple, Map, JSON), repeated fields as lists, maps
  as dicts; the well-known types as their values: Timestamp as its instant with all nine digits, the wrappers
  (Int64Value, StringValue, ...) as the value they wrap, Struct/Value/ListValue as the JSON they stand for.

A value that starts with a zero byte is in Confluent's wire format (no protobuf message starts with one: field
number 0 does not exist): magic byte, 4-byte schema id, the message's indexes in its file. With a registry the
id names the writer's schema, fetched once with its references, and the indexes the message in it; with a
descriptor set, the framing is stripped and the value read as the configured message.

A registry keeps a schema as its producer registered it: Confluent's Python and .NET clients send a serialized
descriptor (base64), its Java client and people the .proto source. Confluent's registry serializes either on
request (`?format=serialized`); not every Confluent-compatible one does (Apicurio's fails on a serialized schema
and mangles the bytes of a source one). So the serialized form is asked for first and taken only when it is one;
otherwise the schema as registered is, and a source is compiled (protoc, from grpcio-tools) against the files it
imports.
"""

from __future__ import annotations

import base64
import binascii
import struct
import threading
from collections.abc import Callable
from typing import Any

from .rows import DecodeError
from .schema_registry import RegistryUnavailableError, fetch, reference_url

ValueFn = Callable[[Any], Any]
_INT_TYPES = {f"{p}Int{n}" for p in ("", "U") for n in (8, 16, 32, 64, 128, 256)}
_WRAPPERS = {f"google.protobuf.{n}Value" for n in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool",
                                                     "String", "Bytes")}


class ProtobufSchemaError(ValueError):
    """The configured descriptor set or message cannot be used (a config error, not a record's)."""


def _pool_with(files: list[Any]) -> Any:
    """A descriptor pool holding `files` (FileDescriptorProtos, dependencies first); a dependency none of them
    gives (the well-known types, when the set was made without --include_imports) comes from protobuf's own."""
    from google.protobuf import (  # noqa: F401  (the well-known types' modules put them in protobuf's own pool)
        any_pb2,
        descriptor_pb2,
        descriptor_pool,
        duration_pb2,
        empty_pb2,
        struct_pb2,
        timestamp_pb2,
        wrappers_pb2,
    )

    pool = descriptor_pool.DescriptorPool()
    given = {f.name for f in files}
    added: set[str] = set()

    def add_builtin(name: str) -> None:
        if name in added or name in given:
            return
        try:
            builtin = descriptor_pool.Default().FindFileByName(name)
        except KeyError:
            raise ProtobufSchemaError(f"protobuf: import {name!r} is neither in the descriptor set nor a "
                                      "well-known type (make the set with protoc --include_imports)") from None
        proto = descriptor_pb2.FileDescriptorProto()
        builtin.CopyToProto(proto)
        for dep in proto.dependency:
            add_builtin(dep)
        pool.Add(proto)
        added.add(name)

    for f in files:
        for dep in f.dependency:
            add_builtin(dep)
        try:
            pool.Add(f)
        except Exception as e:  # a conflicting or broken file: the schema's fault, said with protobuf's words
            raise ProtobufSchemaError(f"protobuf: cannot load {f.name!r}: {e}") from None
        added.add(f.name)
    return pool


def load_descriptor_set(encoded: str) -> Any:
    """A FileDescriptorSet given as base64 text (`protoc --include_imports --descriptor_set_out`) as a pool."""
    from google.protobuf import descriptor_pb2

    try:
        raw = base64.b64decode(encoded, validate=True)
        fds = descriptor_pb2.FileDescriptorSet.FromString(raw)
    except (binascii.Error, ValueError) as e:
        raise ProtobufSchemaError(f"protobufDescriptorSet is not a base64 FileDescriptorSet: {e}") from None
    except Exception as e:  # protobuf's DecodeError
        raise ProtobufSchemaError(f"protobufDescriptorSet is not a FileDescriptorSet: {e}") from None
    if not fds.file:
        raise ProtobufSchemaError("protobufDescriptorSet holds no file")
    return _pool_with(list(fds.file))


def message_class(pool: Any, name: str) -> Any:
    from google.protobuf import message_factory

    try:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
    except KeyError:
        raise ProtobufSchemaError(f"protobufMessage {name!r} is not a message of the descriptor set") from None


def check(descriptor_set: str, message: str) -> None:
    """Raises ProtobufSchemaError when the set cannot be read or lacks the message (at config load)."""
    message_class(load_descriptor_set(descriptor_set), message)


class _Converter:
    """Message -> dict, one function per field built once per message type (the per-record work is a walk)."""

    def __init__(self, numeric_enums: frozenset[str]) -> None:
        self.numeric_enums = numeric_enums  # top-level fields whose column takes numbers
        # by the descriptor itself, not its name: a registry's versions of one message share the name
        self._plans: dict[tuple[Any, bool], list[tuple[str, bool, ValueFn]]] = {}

    def record(self, m: Any) -> dict[str, Any]:
        return self._message(m, top=True)

    def _message(self, m: Any, top: bool = False) -> dict[str, Any]:
        plan = self._plan(m.DESCRIPTOR, top)
        return {name: fn(getattr(m, name)) for name, presence, fn in plan if not presence or m.HasField(name)}

    def _plan(self, desc: Any, top: bool) -> list[tuple[str, bool, ValueFn]]:
        key = (desc, top)
        if key not in self._plans:
            self._plans[key] = [(f.name, f.has_presence and not f.is_repeated,
                                 self._field(f, top and f.name in self.numeric_enums)) for f in desc.fields]
        return self._plans[key]

    def _field(self, f: Any, numeric_enum: bool) -> ValueFn:
        one = self._single(f, numeric_enum)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key_f, value_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            k, v = self._single(key_f, False), self._single(value_f, False)
            # protobuf maps have no order: by key, so that every read of a record stores the same Map
            return lambda m: {k(a): v(m[a]) for a in sorted(m)}
        if f.is_repeated:
            return lambda xs: [one(x) for x in xs]
        return one

    def _single(self, f: Any, numeric_enum: bool) -> ValueFn:
        if f.enum_type is not None:
            if numeric_enum:
                return lambda v: v
            names = {number: value.name for number, value in f.enum_type.values_by_number.items()}
            return lambda v: names.get(v, v)
        if f.message_type is None:
            return lambda v: v
        name = f.message_type.full_name
        if name == "google.protobuf.Timestamp":
            return _timestamp
        if name in _WRAPPERS:
            return lambda m: m.value
        if name in ("google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"):
            from google.protobuf import json_format

            return lambda m: json_format.MessageToDict(m)
        return self._message


def _timestamp(m: Any) -> str:
    """RFC 3339 with every digit the message has (DateTime64(9) keeps nanoseconds), out-of-range refused."""
    try:
        return str(m.ToJsonString())
    except ValueError as e:
        raise DecodeError(f"protobuf: Timestamp {m.seconds}s {m.nanos}ns: {e}") from None


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at pos -> (value, next pos)."""
    shift = value = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise DecodeError("protobuf: truncated Confluent wire format (message indexes)")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return (value >> 1) ^ -(value & 1), pos


def unframe(value: bytes) -> tuple[int, list[int], bytes]:
    """Confluent's wire format -> (schema id, message indexes, the message's bytes)."""
    if len(value) < 6:
        raise DecodeError("protobuf: truncated Confluent wire format (magic byte, schema id, message indexes)")
    (schema_id,) = struct.unpack(">I", value[1:5])
    count, pos = _varint(value, 5)
    if count < 0 or count > 64:
        raise DecodeError(f"protobuf: bad Confluent message index count {count}")
    indexes = []
    for _ in range(count):
        i, pos = _varint(value, pos)
        indexes.append(i)
    return schema_id, indexes or [0], value[pos:]


class ProtobufReader:
    """Reads one message per value (bytes -> dict of its fields, DecodeError on bad input)."""

    def __init__(self, descriptor_set: str | None, message: str | None, registry_url: str | None,
                 numeric_enums: frozenset[str] = frozenset()) -> None:
        self.default = message_class(load_descriptor_set(descriptor_set), message) \
            if descriptor_set and message else None
        self.registry_url = registry_url.rstrip("/") if registry_url else None
        self._by_schema: dict[tuple[int, tuple[int, ...]], Any] = {}
        self._convert = _Converter(numeric_enums)

    def __call__(self, value: bytes) -> dict[str, Any]:
        cls, payload = self.default, value
        if value[:1] == b"\0":
            schema_id, indexes, payload = unframe(value)
            if self.registry_url:
                cls = self._registry_class(schema_id, indexes)
        elif self.registry_url and cls is None:
            raise DecodeError("protobuf: not in Confluent wire format (magic byte 0, 4-byte schema id, message "
                              "indexes), and no protobufMessage to read it as")
        if cls is None:
            raise DecodeError("protobuf: no descriptor set and message configured to read a plain message")
        try:
            m = cls.FromString(payload)
        except Exception as e:  # protobuf's DecodeError (its message says what was wrong), nothing else is raised
            raise DecodeError(f"protobuf: cannot parse {cls.DESCRIPTOR.full_name} ({e})") from None
        if not m.IsInitialized():
            raise DecodeError(f"protobuf: {cls.DESCRIPTOR.full_name} lacks required field(s) "
                              f"{', '.join(m.FindInitializationErrors())}")
        return self._convert.record(m)

    def _registry_class(self, schema_id: int, indexes: list[int]) -> Any:
        key = (schema_id, tuple(indexes))
        if key not in self._by_schema:
            from google.protobuf import descriptor_pb2

            files: list[Any] = []
            root = self._fetch_file(f"/schemas/ids/{schema_id}", f"schema-{schema_id}.proto", files, set())
            desc: Any = root
            names = []
            for depth, i in enumerate(indexes):
                kids = desc.message_type if depth == 0 else desc.nested_type
                if not 0 <= i < len(kids):
                    raise DecodeError(f"protobuf: schema id {schema_id} has no message at indexes {indexes}")
                desc = kids[i]
                names.append(desc.name)
            assert isinstance(root, descriptor_pb2.FileDescriptorProto)
            full = ".".join(([root.package] if root.package else []) + names)
            try:
                self._by_schema[key] = message_class(_pool_with(files), full)
            except ProtobufSchemaError as e:
                raise DecodeError(f"protobuf: schema id {schema_id}: {e}") from None
        return self._by_schema[key]

    def _fetch_file(self, path: str, name: str, files: list[Any], seen: set[str]) -> Any:
        """Fetches a schema and, first, every schema it references (appended to files in order)."""
        url = f"{self.registry_url}{path}"
        doc, proto = _schema_doc(url, f"protobuf: schema {name}")
        seen.add(name)
        for ref in doc.get("references") or []:
            if ref["name"] not in seen:
                self._fetch_file(reference_url("", ref), ref["name"], files, seen)
        if proto is None:  # as registered: serialized by the producer's client, or source
            proto = _serialized(doc["schema"])
        if proto is None:
            proto = _compiled(doc["schema"], name, files, url)
        proto.name = proto.name or name
        seen.add(proto.name)
        files.append(proto)
        return proto


def _schema_doc(url: str, what: str) -> tuple[dict[str, Any], Any]:
    """The registry's answer for a schema and the FileDescriptorProto its serialized form holds, when the registry
    gives one; else the schema as it was registered, and None. A registry that answers nothing is an outage,
    whichever form was asked for."""
    try:
        doc = fetch(f"{url}?format=serialized", what)
        proto = _serialized(doc["schema"])
        if proto is not None:
            return doc, proto
    except RegistryUnavailableError as e:
        if e.status is None:
            raise
    return fetch(url, what), None


def _serialized(schema: str) -> Any:
    """The FileDescriptorProto a base64 schema holds, or None when it holds none."""
    from google.protobuf import descriptor_pb2

    try:
        return descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema, validate=True))
    except Exception:  # not base64 (a source never is), or not a descriptor: the registry gave something else
        return None


_PROTOC = threading.Lock()  # protoc runs in this process, and keeps state of its own


def _compiled(source: str, name: str, files: list[Any], url: str) -> Any:
    """The FileDescriptorProto of a .proto source, its imports taken from `files` (the references fetched
    before it) and from protobuf's own well-known types."""
    import tempfile
    from importlib.resources import files as package_files
    from pathlib import Path

    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    with _PROTOC, tempfile.TemporaryDirectory(prefix="chsink-proto-") as d:
        root = Path(d)
        (root / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "src" / name).write_text(source)
        deps, out = root / "deps.pb", root / "out.pb"
        deps.write_bytes(descriptor_pb2.FileDescriptorSet(file=files).SerializeToString())
        rc = protoc.main(["protoc", f"-I{root / 'src'}", f"-I{package_files('grpc_tools') / '_proto'}",
                          *([f"--descriptor_set_in={deps}"] if files else []), f"--descriptor_set_out={out}", name])
        if rc != 0:
            raise DecodeError(f"protobuf: the schema at {url} is .proto source that protoc cannot compile "
                              f"(exit {rc})")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]


def numeric_columns(types: dict[str, str]) -> frozenset[str]:
    """The columns (name -> ClickHouse type) of an integer type: an enum field of that name gives its number."""
    def base(t: str) -> str:
        for wrapper in ("Nullable(", "LowCardinality("):
            if t.startswith(wrapper):
                t = t[len(wrapper):-1]
        return t

    return frozenset(name for name, t in types.items() if base(t) in _INT_TYPES)


def protobuf_reader(descriptor_set: str | None, message: str | None, registry_url: str | None,
                    numeric_enums: frozenset[str] = frozenset()) -> Callable[[bytes], dict[str, Any]]:
    return ProtobufReader(descriptor_set, message, registry_url, numeric_enums)
