"""A schema registry that does not answer is an outage: the partition waits for it (delivery/runtime.py stalls it
as on a shard outage), and no record is dead-lettered for it (before, every framed record became a dead letter while the registry was down). One that
answers that it has no such schema (404) makes the record a dead letter with that reason.

No Confluent-compatible registry runs here (see the README's test bed), so these tests cover what needs none: a
port nobody listens on, and a real HTTP server (Python's own, over an empty folder) answering 404."""

from __future__ import annotations

import http.server
import struct
import threading

import pytest

from hack.testbed.process import free_port
from sparkapp.edges.insert import worth_retrying
from sparkapp.formats.avro import AvroReader
from sparkapp.formats.protobuf import ProtobufReader
from sparkapp.formats.registry import DecoderSpec, Format, make_decoder
from sparkapp.formats.rows import DecodeError, decode_batch
from sparkapp.formats.schema import build_schema
from sparkapp.formats.schema_registry import RegistryUnavailableError
from tests.helpers import msg

FRAMED = {"avro": b"\x00" + struct.pack(">I", 7) + b"\x02", "protobuf": b"\x00" + struct.pack(">I", 7) + b"\x00\x08\x01"}


def reader(fmt: str, url: str):
    return AvroReader(None, url) if fmt == "avro" else ProtobufReader(None, None, url)


@pytest.fixture
def empty_http_server(tmp_path):
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("fmt", ["avro", "protobuf"])
def test_a_registry_that_does_not_answer_is_an_outage_not_a_dead_letter(fmt):
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    with pytest.raises(RegistryUnavailableError, match="did not answer") as e:
        reader(fmt, url)(FRAMED[fmt])
    assert worth_retrying(e.value), "the job waits for it as for any outage"
    schema = build_schema("d", "t", [("a", "Int64", "", None), ("_offset", "UInt64", "", None)])
    spec = DecoderSpec(Format(fmt), schema_registry_url=url)
    with pytest.raises(RegistryUnavailableError):  # not caught as the record's fault: the batch fails, and waits
        decode_batch(make_decoder(spec, schema), [msg(FRAMED[fmt])])


@pytest.mark.parametrize("fmt", ["avro", "protobuf"])
def test_a_registry_without_the_schema_dead_letters_the_record(fmt, empty_http_server):
    with pytest.raises(DecodeError, match=r"not found at http://127\.0\.0\.1:\d+/.*7.* \(404\)"):
        reader(fmt, empty_http_server)(FRAMED[fmt])
