"""Shared test helpers: build decoders and inserters on a real chdb table."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparkapp.core.blocks import build_blocks, dedup_token
from sparkapp.core.records import Message
from sparkapp.core.state_machine import OffsetRange
from sparkapp.edges.clickhouse import load_schema
from sparkapp.edges.insert import Inserter
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from sparkapp.formats.rows import decode_batch


def msg(value: Any, offset: int = 0, topic: str = "t", partition: int = 0, key: bytes | None = None,
        headers: tuple[tuple[str, bytes], ...] = (), timestamp_type: int = 0) -> Message:
    raw = value if isinstance(value, bytes | type(None)) else json.dumps(value).encode()
    return Message(topic, partition, offset, raw, key, 1_700_000_000_000 + offset, headers, timestamp_type)


def load_rows(client: Any, db: str, table: str, messages: list[Message], spec: DecoderSpec | None = None):
    """Decodes and inserts messages in one block; returns the dead letters."""
    schema = load_schema(client, db, table)
    rows, dead = decode_batch(make_decoder(spec or DecoderSpec(Format.JSON), schema), messages)
    if rows:
        rng = OffsetRange(rows[0][0], rows[-1][0])
        for b in build_blocks(rng, rows, schema.names, 1000, lambda w: dedup_token("test", "t", 0, w)):
            Inserter(client, schema).insert(b)
    return dead


def read_dlq(bootstrap: str, topic: str, n: int, linger_s: float = 2.0) -> list[Any]:
    """Reads the dead-letter topic from the start: n messages, then waits briefly for any extra."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"dlq-{topic}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    out: list[Any] = []
    while True:
        m = c.poll(15 if len(out) < n else linger_s)
        if m is None:
            break
        if m.error() is None:
            out.append(m)
    c.close()
    assert len(out) >= n, f"only {len(out)} of {n} dead letters arrived"
    return out


class _Raw(str):
    """A JSON number written as is."""


def reference_lines(messages: list[Message], columns: tuple[str, ...], max_bytes: int = 8 << 20):
    """What `sparkapp.formats.jsoneachrow.build_lines` computes, written plainly, one record at a time."""
    import pyarrow as pa

    out = []
    for m in messages:
        v = (m.value or b"").decode("utf-8", errors="surrogateescape").strip(" \t\r\n") if m.value is not None else None
        if v is None or len(m.value or b"") > max_bytes or not (v.startswith("{") and v.endswith("}")):
            out.append(None)
            continue
        meta = {}
        for c in ("_topic", "_partition", "_offset", "_timestamp", "_key"):
            if c not in columns:
                continue
            if c == "_timestamp":
                meta[c] = _Raw(f"{m.timestamp_ms // 1000}.{m.timestamp_ms % 1000:03d}")
            elif c == "_key":
                if m.key is not None:
                    meta[c] = m.key.decode("utf-8", errors="replace")
            else:
                meta[c] = {"_topic": m.topic, "_partition": m.partition, "_offset": m.offset}[c]
        if not meta:
            out.append(v + "\n")
            continue
        head = "{" + ",".join(f"{json.dumps(k)}:{v if isinstance(v, _Raw) else json.dumps(v, ensure_ascii=False)}"
                              for k, v in meta.items())
        rest = "}" if v[1:-1].strip(" \t\r\n") == "" else "," + v[1:]
        out.append(head + rest + "\n")
    return pa.array(out, pa.string())


def messages_table(messages: list[Message]):
    """Messages as the Arrow table Spark's Kafka source hands over."""
    import datetime as dt

    import pyarrow as pa

    return pa.table({
        "topic": [m.topic for m in messages], "partition": pa.array([m.partition for m in messages], pa.int32()),
        "offset": pa.array([m.offset for m in messages], pa.int64()),
        "key": pa.array([m.key for m in messages], pa.binary()), "value": pa.array([m.value for m in messages], pa.binary()),
        "timestamp": pa.array([dt.datetime.fromtimestamp(m.timestamp_ms / 1000, dt.UTC) for m in messages],
                              pa.timestamp("us", "UTC")),
        "timestampType": pa.array([m.timestamp_type for m in messages], pa.int32()),
        "headers": pa.array([[{"key": k, "value": v} for k, v in m.headers] for m in messages],
                            pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    })


def line_batch(messages: list[Message], columns: tuple[str, ...]):
    """A fast-path LineBatch of messages, its lines built as the job builds them."""
    from sparkapp.formats.jsoneachrow import LineBatch, build_lines

    lines = build_lines(messages_table(messages), columns, 8 << 20)
    by_offset = {m.offset: m for m in messages}
    return LineBatch([m.offset for m in messages], lines, lambda: list(messages),
                     lambda at: [by_offset[o] for o in sorted(set(at)) if o in by_offset])


def write_file(path: Any, text: str) -> None:
    """`text` into `path`, its folders made first (an imported .proto's name may hold a folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def compile_proto(text: str, tmp: Any, name: str = "test.proto", include_imports: bool = True) -> str:
    """A .proto file compiled by protoc (grpcio-tools) as a user would: the FileDescriptorSet with its imports,
    as base64 (what `format.protobufDescriptorSet` takes)."""
    import base64
    from importlib.resources import files

    from grpc_tools import protoc

    write_file(tmp / name, text)
    out = tmp / f"{name}.pb"
    include = str(files("grpc_tools") / "_proto")
    rc = protoc.main(["protoc", f"-I{tmp}", f"-I{include}", *(["--include_imports"] if include_imports else []),
                      f"--descriptor_set_out={out}", str(tmp / name)])
    assert rc == 0, f"protoc failed on {name}"
    return base64.b64encode(out.read_bytes()).decode()


def proto_message(descriptor_set: str, name: str, fields: dict[str, Any]) -> bytes:
    """A message of the set built from its JSON mapping (json_format), serialized."""
    from google.protobuf import json_format

    from sparkapp.formats.protobuf import load_descriptor_set, message_class

    cls = message_class(load_descriptor_set(descriptor_set), name)
    return bytes(json_format.ParseDict(fields, cls()).SerializeToString())


def registry_client(url: str) -> Any:
    """Confluent's registry client, with a timeout: against Apicurio's registry it now and then waits forever for
    the answer to a request sent on a connection it kept open (the one after its `associations` lookup's 404);
    its retry, on a new connection, is answered."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": url, "timeout": 5})


def register_schema(url: str, subject: str, schema: str, references: list[dict[str, object]] | None = None,
                    schema_type: str = "PROTOBUF") -> int:
    """Registers a schema through the registry's REST API, with its references (a Protobuf schema as Confluent's
    Java client registers it: its .proto source); its id."""
    import json
    import urllib.request

    body = {"schema": schema, "schemaType": schema_type, "references": references or []}
    req = urllib.request.Request(f"{url}/subjects/{subject}/versions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return int(json.load(r)["id"])


def registry_protobuf_writer(url: str, subject: str, message: str, form: str, sources: dict[str, str],
                             tmp_path: Any) -> Callable[[dict[str, Any]], bytes]:
    """Messages (from their JSON mapping) framed as a producer with a registry frames them. `python-client`:
    Confluent's Python serializer registers the schema (and each file it imports, as a reference) itself;
    `proto-source`: each file's .proto source is registered, its imports first, as Confluent's Java serializer
    registers them. `sources`: file name -> source, the message's file last."""
    from confluent_kafka.schema_registry.common.serde import SchemaId
    from google.protobuf import json_format

    from sparkapp.formats.protobuf import load_descriptor_set, message_class

    *deps, (root_name, root_source) = sources.items()
    for name, text in deps:  # the files it imports; compile_proto writes its own
        write_file(tmp_path / name, text)
    cls = message_class(load_descriptor_set(compile_proto(root_source, tmp_path, root_name)), message)
    if form == "python-client":
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        serializer = ProtobufSerializer(cls, registry_client(url), {"use.deprecated.format": False})
        ctx = SerializationContext(subject, MessageField.VALUE)
        return lambda fields: bytes(serializer(json_format.ParseDict(fields, cls()), ctx))
    refs: list[dict[str, object]] = []
    for name, text in deps:
        dep_subject = f"{subject}-{name.replace('/', '.')}"
        register_schema(url, dep_subject, text, list(refs))
        refs.append({"name": name, "subject": dep_subject, "version": 1})
    schema_id = register_schema(url, f"{subject}-value", root_source, refs)
    index = [m.name for m in cls.DESCRIPTOR.file.message_types_by_name.values()].index(cls.DESCRIPTOR.name)
    frame = bytes(SchemaId("PROTOBUF", schema_id, message_indexes=[index]).id_to_bytes())
    return lambda fields: frame + json_format.ParseDict(fields, cls()).SerializeToString()


def sink_config(checkpoint: str = "/tmp/unused", spark_conf: dict[str, str] | None = None) -> dict[str, Any]:
    """A sink's config (as SinkConfig validates it) for building the job's Spark session only: nothing it names
    is reached but the checkpoint."""
    return {"name": "s", "kafka": {"bootstrapServers": "127.0.0.1:9", "topics": ["t"]},
            "clickhouse": {"endpoints": ["chdb:///tmp/unused"], "database": "d", "tables": {"t": "t"}},
            "checkpointLocation": checkpoint, "sparkConf": spark_conf or {}}


def mimalloc_verbose_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without any setting of Arrow's allocator (mimalloc), which prints the options it took
    (MIMALLOC_VERBOSE), plus `extra`: a child process's allocator is then what chsink or `extra` sets."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MIMALLOC_")}
    return {**clean, "MIMALLOC_VERBOSE": "1", **(extra or {})}


def events_oldest_first(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Kubernetes Events in the order they were posted. lastTimestamp has whole seconds, so two Events of one
    second (Pausing, then Paused) would tie and keep the API's order, which is by their random names; kopf gives
    each an eventTime in microseconds, and etcd's resourceVersion breaks what is left."""
    def key(e: dict[str, Any]) -> tuple[str, int]:
        rv = str(e.get("metadata", {}).get("resourceVersion", "0"))
        return (e.get("eventTime") or e.get("lastTimestamp") or "", int(rv) if rv.isdigit() else 0)
    return sorted(items, key=key)


def checkpoint_deletions(tmp_path: Path, delete: Callable[[str, str], str]) -> None:
    """What a checkpoint deletion takes, whichever file system it goes through: only what chsink marked and wrote."""
    user = tmp_path / "data"  # a user's directory given as checkpointLocation: no marker, nothing deleted
    (user / "offsets").mkdir(parents=True)
    assert "no _chsink_sink file" in delete(str(user), "ns.a") and (user / "offsets").exists()
    other = tmp_path / "other"  # another sink's
    (other / "run-3").mkdir(parents=True)
    (other / "_chsink_sink").write_text("ns.b")
    assert "names sink 'ns.b'" in delete(f"file://{other}", "ns.a") and (other / "run-3").exists()
    mixed = tmp_path / "mixed"  # ours, with a user's file beside it
    for d in ("run-7/offsets", "commits", "sources"):
        (mixed / d).mkdir(parents=True)
    (mixed / "metadata").write_text("{}")
    (mixed / "notes.txt").write_text("mine")
    (mixed / "_chsink_sink").write_text("ns.a")
    assert "kept what else is there: ['notes.txt']" in delete(str(mixed), "ns.a")
    assert sorted(p.name for p in mixed.iterdir()) == ["notes.txt"]
    ours = tmp_path / "ours"
    (ours / "run-2" / "commits").mkdir(parents=True)
    (ours / "_chsink_sink").write_text("ns.a")
    (ours / "._chsink_sink.crc").write_bytes(b"crc\x00")  # as Hadoop's local file system writes one beside it
    assert delete(f"file://{ours}", "ns.a") == f"deleted checkpoint file://{ours}" and not ours.exists()


def strimzi_secrets(kafka: Any, user: str = "user") -> dict[str, dict[str, str]]:
    """A KafkaUser's Secret and the cluster CA Secret, with the keys Strimzi writes."""
    return {"my-user": {"ca.crt": kafka.tls_file("clients-ca.pem").read_text(),
                        "user.crt": kafka.tls_file(f"{user}.crt").read_text(),
                        "user.key": kafka.tls_file(f"{user}.key").read_text()},
            "my-cluster-cluster-ca-cert": {"ca.crt": kafka.tls_file("ca.pem").read_text()}}


MTLS_SPEC = {"tls": {"trustedCertificates": [{"secretName": "my-cluster-cluster-ca-cert", "certificate": "ca.crt"}]},
             "authentication": {"type": "tls", "certificateAndKey": {
                 "secretName": "my-user", "certificate": "user.crt", "key": "user.key"}}}
