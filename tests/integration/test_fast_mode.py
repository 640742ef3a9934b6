"""Claude Code's fast mode (``message.usage.speed``) from the transcript to the price:
the ``usage`` table's ``speed``, ``vakpipe cost`` (its rows ``--by model,speed``, its
unpriced lines) and the OpenTelemetry export, through the CLI in a process of its own,
with each per-line reader (the C kernel, pysimdjson, orjson): the same figures."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import EXIT_OK
from tests.helpers.storage import run_vakpipe

SESSION = "0f0f0f0f-1111-4222-8333-444455556666"
#: ``VAKPIPE_KERNEL`` of each reader ("": the C kernel where it built).
READERS = {"c": "", "simdjson": "simdjson", "orjson": "orjson"}


def _line(**fields: Any) -> str:
    return json.dumps({"sessionId": SESSION, "cwd": "/p", "version": "2.1.80",
                       "timestamp": "2026-11-20T10:00:00.000Z", **fields})


def _assistant(uuid: str, parent: str, request: str, model: str, usage: dict[str, Any],
               text: str = "ok") -> str:
    return _line(type="assistant", uuid=uuid, parentUuid=parent, requestId=f"req_{request}",
                 message={"id": f"msg_{request}", "model": model, "role": "assistant",
                          "content": [{"type": "text", "text": text}], "usage": usage})


def _usage(output: int, speed: str | None) -> dict[str, Any]:
    usage: dict[str, Any] = {"input_tokens": 10, "output_tokens": output,
                             "cache_read_input_tokens": 1000,
                             "cache_creation_input_tokens": 0, "service_tier": "standard"}
    if speed is not None:
        usage["speed"] = speed
    return usage


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One transcript: a fast request of Opus 4.8 streamed over two lines (the first's
    output a running count), a standard one, a fast one of Sonnet 4.6 (no fast price
    anywhere) and a fast one of Opus 4.6 (the shipped table's 6x)."""
    root = tmp_path_factory.mktemp("fast-archive")
    lines = [
        _line(type="user", uuid="u1", parentUuid=None, message={"role": "user",
                                                                 "content": "go"}),
        _assistant("a1", "u1", "1", "claude-opus-4-8", _usage(1, "fast"), "thinking"),
        _assistant("a2", "a1", "1", "claude-opus-4-8", _usage(100, "fast")),
        _line(type="user", uuid="u2", parentUuid="a2", message={"role": "user",
                                                                 "content": "more"}),
        _assistant("a3", "u2", "2", "claude-opus-4-8", _usage(100, "standard")),
        _assistant("a4", "a3", "3", "claude-sonnet-4-6", _usage(100, "fast")),
        _assistant("a5", "a4", "4", "claude-opus-4-6", _usage(100, "fast")),
    ]
    folder = root / "projects" / "-p"
    folder.mkdir(parents=True)
    (folder / f"{SESSION}.jsonl").write_text("\n".join(lines) + "\n", "utf-8")
    return root


def _cost(archive: Path, out: Path, reader: str) -> dict[str, Any]:
    env = {**os.environ, "VAKPIPE_KERNEL": READERS[reader]}
    done = run_vakpipe("cost", str(archive), "--out", str(out), "--by", "model,speed",
                       "--workers", "0", "--no-progress", "--json", env=env)
    assert done.returncode == EXIT_OK, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


@pytest.mark.parametrize("reader", list(READERS))
def test_claude_code_fast_mode(archive: Path, tmp_path: Path, reader: str) -> None:
    doc = _cost(archive, tmp_path / "out", reader)
    rows = {(r["model"], r["speed"]): r for r in doc["rows"]}
    assert set(rows) == {("claude-opus-4-8", "fast"), ("claude-opus-4-8", "standard"),
                         ("claude-sonnet-4-6", "fast"), ("claude-opus-4-6", "fast")}
    # One request of the two streamed lines: the final line's usage, at the fast rates
    # (10 / 50 / 1 per MTok: 10 input, 100 output, 1,000 cache reads).
    fast = rows[("claude-opus-4-8", "fast")]
    assert fast["records"] == 1 and fast["billed_output_tokens"] == 100
    assert fast["billed_usd"] == pytest.approx(0.0001 + 0.005 + 0.001, abs=1e-12)
    assert rows[("claude-opus-4-8", "standard")]["billed_usd"] == \
        pytest.approx(0.00005 + 0.0025 + 0.0005, abs=1e-12)
    # Opus 4.6 at 6x: 30 / 150 / 3.
    assert rows[("claude-opus-4-6", "fast")]["billed_usd"] == \
        pytest.approx(0.0003 + 0.015 + 0.003, abs=1e-12)
    # No fast price: unpriced and said so, never priced at the standard rates.
    unpriced = rows[("claude-sonnet-4-6", "fast")]
    assert unpriced["unknown_model"] and unpriced["billed_usd"] == 0
    assert [m["model"] for m in doc["unknown_models"]] == ["claude-sonnet-4-6 (fast)"]


def test_every_reader_gives_the_same_usage_and_spans(archive: Path, tmp_path: Path) -> None:
    """The speed column and the spans' prices alike from each reader; a span says its
    speed."""
    seen = []
    for reader in READERS:
        out = tmp_path / reader
        doc = _cost(archive, out, reader)
        spans = tmp_path / f"{reader}.json"
        done = run_vakpipe("export", "otel", str(out), "--file", str(spans))
        assert done.returncode == EXIT_OK, done.stderr
        attributes = []
        for resource in json.loads(spans.read_text("utf-8"))["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    attrs = {a["key"]: next(iter(a["value"].values()))
                             for a in span["attributes"]}
                    attributes.append((attrs["gen_ai.request.model"],
                                       attrs.get("vakpipe.request.speed"),
                                       float(attrs["vakpipe.cost.usd"]),
                                       attrs["vakpipe.cost.priced"]))
        seen.append((doc["rows"], doc["totals"], sorted(attributes, key=repr)))
    assert seen[0] == seen[1] == seen[2]
    spans_of = {(m, s): (usd, priced) for m, s, usd, priced in seen[0][2]}
    assert spans_of[("claude-opus-4-8", "fast")] == (pytest.approx(0.0061, abs=1e-12), True)
    assert spans_of[("claude-opus-4-8", None)][1] is True
    assert spans_of[("claude-sonnet-4-6", "fast")] == (0.0, False)
