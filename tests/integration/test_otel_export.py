"""``vakpipe export otel``: a run's usage as GenAI spans, sent to a local OTLP/HTTP
receiver on 127.0.0.1 (a tiny server in this module, parsing the protobuf bodies with
``opentelemetry-proto``), or written as OTLP JSON and Parquet.

The run is the real Claude Code transcripts of ``tests/data/real`` audited in process:
they have cache reads, five-minute and one-hour cache writes, and subagents.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline.cli import EXIT_OK, EXIT_UNUSABLE, run
from pipeline.costs.otel import SEMCONV_VERSION
from pipeline.costs.report import drop_copies
from pipeline.io.commit import read_dataset
from pipeline.io.storage import resolve
from tests.helpers.data_paths import REAL

trace_service = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2")


@dataclass
class Receiver:
    """An OTLP/HTTP traces receiver: what it was sent, and the status it answers."""

    url: str
    bodies: list[bytes] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    status: int = 200

    def spans(self) -> list[dict[str, Any]]:
        """Every span received, its attributes as a dict (values unwrapped)."""
        out = []
        for body in self.bodies:
            req = trace_service.ExportTraceServiceRequest.FromString(body)
            for rs in req.resource_spans:
                resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        out.append({"trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                                    "name": s.name, "kind": s.kind, "resource": resource,
                                    "schema_url": rs.schema_url,
                                    "attributes": {a.key: _value(a.value)
                                                   for a in s.attributes}})
        return out


def _value(v: Any) -> Any:
    return getattr(v, v.WhichOneof("value"))


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    box: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got = box["r"]
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/v1/traces" and got.status == 200:
                got.bodies.append(body)
                got.headers.append(dict(self.headers))
            self.send_response(got.status if self.path == "/v1/traces" else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    box["r"] = Receiver(f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield box["r"]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("claude-run")
    assert run(["audit", str(REAL / "claude-code" / "projects"), "--out", str(out),
                "--workers", "0", "--no-progress"]) == EXIT_OK
    return out


def billed(out: Path) -> list[dict[str, Any]]:
    usage, _ = drop_copies(read_dataset(resolve(str(out)), "usage"))
    return usage.filter(pc.fill_null(usage["billed"], False)).to_pylist()


def test_spans_reach_an_otlp_http_receiver(audited: Path, receiver: Receiver,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["export", "otel", str(audited), "--endpoint", receiver.url,
                "--header", "x-api-key=sekrit-123", "--json"]) == EXIT_OK
    printed = capsys.readouterr()
    doc = json.loads(printed.out)
    assert "sekrit" not in printed.out + printed.err
    assert doc["schema"] == "vakpipe.export-otel/1" and doc["format"] == "otlp-http"
    assert doc["destination"] == receiver.url + "/v1/traces"
    rows = billed(audited)
    spans = receiver.spans()
    assert len(spans) == len(rows) == doc["spans"] > 0
    assert all(h.get("x-api-key") == "sekrit-123" for h in receiver.headers)
    assert all(s["kind"] == 3 for s in spans)  # SPAN_KIND_CLIENT
    assert {s["resource"]["service.name"] for s in spans} == {"vakpipe"}
    assert {s["schema_url"] for s in spans} == {
        f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"}
    by_entry = {(s["attributes"]["vakpipe.session_path"], s["attributes"]["vakpipe.entry_id"],
                 s["attributes"]["vakpipe.record.kind"]): s["attributes"] for s in spans}
    for r in rows:
        a = by_entry[r["session_path"], r["entry_id"], r["kind"]]
        assert a["gen_ai.usage.input_tokens"] == (
            r["input_tokens"] + r["cache_read_tokens"] + r["cache_write_tokens"])
        assert a["gen_ai.usage.cache_read.input_tokens"] == r["cache_read_tokens"]
        assert a["gen_ai.usage.cache_creation.input_tokens"] == r["cache_write_tokens"]
        assert a["gen_ai.usage.output_tokens"] == r["output_tokens"]
        assert a["gen_ai.provider.name"] == "anthropic"
        assert a["gen_ai.request.model"] == r["model"]
        assert a["gen_ai.conversation.id"] == r["session_id"]
        assert a["vakpipe.usage.cache_creation.1h.input_tokens"] == \
            (r["cache_write_1h_tokens"] or 0)
    # these transcripts have one-hour writes: the split is not all five-minute
    assert sum(a["vakpipe.usage.cache_creation.1h.input_tokens"] for a in by_entry.values())
    assert all(a["vakpipe.cost.priced"] for a in by_entry.values())
    assert sum(a["vakpipe.cost.usd"] for a in by_entry.values()) > 0


def test_many_spans_go_in_several_requests(audited: Path, receiver: Receiver,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import pipeline.io.otel as io_otel

    monkeypatch.setattr(io_otel, "BATCH", 7)
    assert run(["export", "otel", str(audited), "--endpoint", receiver.url + "/v1/traces"]) \
        == EXIT_OK
    n = len(billed(audited))
    assert len(receiver.bodies) == -(-n // 7) and len(receiver.spans()) == n


def test_a_refusing_or_dead_endpoint_is_one_line_and_exit_2(
        audited: Path, receiver: Receiver, capsys: pytest.CaptureFixture[str]) -> None:
    receiver.status = 500
    assert run(["export", "otel", str(audited), "--endpoint", receiver.url,
                "--timeout", "1"]) == EXIT_UNUSABLE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vakpipe: error: OTLP endpoint"), err
    assert "0 of" in err[0]
    from pipeline.synth.local_s3 import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    assert run(["export", "otel", str(audited), "--endpoint", dead, "--timeout", "1"]) \
        == EXIT_UNUSABLE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did not take the spans" in err[0], err
    # A password in the endpoint's URL is never printed.
    assert run(["export", "otel", str(audited), "--endpoint",
                dead.replace("http://", "http://user:hunter2@"), "--timeout", "1"]) \
        == EXIT_UNUSABLE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "user:***@" in err[0] and "hunter2" not in err[0], err
    for bad in (["--endpoint", "ftp://x"], [], ["--endpoint", dead, "--file", "x.json"]):
        assert run(["export", "otel", str(audited), *bad]) == EXIT_UNUSABLE
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("bad, said", [
    (["--endpoint", "http://[::1"], "--endpoint 'http://[::1': Invalid IPv6 URL"),
    (["--endpoint", "http://h:99999"], "Port out of range"),
    (["--endpoint", "http://h:x"], "Port could not be cast"),
    (["--endpoint", "http://h:0"], "not an http(s) URL"),
    (["--endpoint", "http://:80"], "not an http(s) URL"),
    (["--endpoint", "http://h", "--header", "a b=c"], "--header 'a b': not an HTTP header"),
    (["--endpoint", "http://h", "--header", "x-key=sek\r\nX-Evil: 1"],
     "--header x-key: its value holds a line break"),
    (["--file", "x.json", "--since", "2026-12-01", "--until", "2026-11-01"],
     "--since 2026-12-01 is after --until 2026-11-01"),
    (["--endpoint", "http://h", "--timeout", "nan"], "nan is not a number of seconds"),
    (["--endpoint", "http://h", "--timeout", "inf"], "not in the range"),
])
def test_a_malformed_option_is_one_line_and_exit_2_before_anything_is_sent(
        audited: Path, capsys: pytest.CaptureFixture[str], bad: list[str], said: str) -> None:
    # Each once failed late (a traceback, or every attempt refused and reported as the
    # endpoint not taking the spans) or, for the window, exported nothing with exit 0.
    assert run(["export", "otel", str(audited), *bad]) == EXIT_UNUSABLE
    err = capsys.readouterr().err.strip().splitlines()
    assert said in err[-1] and "Traceback" not in "".join(err), err
    assert "sek" not in "".join(err)  # a header's value is never printed


def test_otlp_json_and_parquet_files(audited: Path, tmp_path: Path) -> None:
    doc_path, pq_path = tmp_path / "x" / "spans.json", tmp_path / "spans.parquet"
    assert run(["export", "otel", str(audited), "--file", str(doc_path)]) == EXIT_OK
    assert run(["export", "otel", str(audited), "--file", str(pq_path)]) == EXIT_OK
    doc = json.loads(doc_path.read_text())
    spans = [s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    n = len(billed(audited))
    assert len(spans) == n
    # OTLP JSON: hex ids, enum numbers, 64-bit integers as strings
    assert all(len(s["traceId"]) == 32 and len(s["spanId"]) == 16 for s in spans)
    assert all(int(s["traceId"], 16) and s["kind"] == 3 for s in spans)
    first = {a["key"]: a["value"] for a in spans[0]["attributes"]}
    assert "intValue" in first["gen_ai.usage.input_tokens"]
    assert isinstance(first["gen_ai.usage.input_tokens"]["intValue"], str)
    table = pq.read_table(pq_path)
    assert table.num_rows == n
    assert table.schema.metadata[b"otel.semconv.version"] == SEMCONV_VERSION.encode()
    assert sorted(table["span_id"].to_pylist()) == sorted(s["spanId"] for s in spans)


def test_the_json_file_is_the_sdk_request_as_json(audited: Path) -> None:
    # otlp_json writes the document straight from the rows; it must be what the SDK's
    # encoder sends, turned into OTLP JSON by protobuf (ids from base64 to hex).
    import base64

    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from pipeline.costs.otel import otel_table
    from pipeline.costs.pricing import load_prices
    from pipeline.io.otel import otlp_json, spans

    table = otel_table(read_dataset(resolve(str(audited)), "usage"), load_prices()).slice(0, 40)
    extra = {"vakpipe.run_id": "r1"}
    theirs = MessageToDict(encode_spans(spans(table, extra)), use_integers_for_enums=True)
    for rs in theirs["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId"):
                    span[key] = base64.b64decode(span[key]).hex()
    assert json.loads(otlp_json(table, extra)) == theirs
    assert json.loads(otlp_json(table.slice(0, 0))) == {"resourceSpans": []}
