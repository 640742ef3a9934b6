"""A session whose audit or replay *raises* (a bug, or an input no test foresaw) is one
finding on that session's row, ``audit_failed`` (error, no figures, the exception and
where it was raised as its detail); the rest of its batch and of the run are audited,
and the run is partial (exit 3), like an unreadable object.

Not contained: the errors vakpipe raises on purpose (``PipelineError``: a summariser
that fails, the output's storage), which stop the run as before; ``MemoryError``; and
anything outside ``Exception`` (``KeyboardInterrupt``, ``SystemExit``). A worker that
dies is row 9's business (``worker_crashed``).

The runs are on ``memory://`` archives: a LocalCluster of threads in this process, so
the monkeypatched functions are the ones the tasks call.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import fsspec
import pytest

import pipeline.run.batches as batches
import pipeline.run.replay_batches as replay_batches
from pipeline.audit.checkpoint import Checkpoint
from pipeline.cli import EXIT_PARTIAL, run
from pipeline.compaction.summaries import SummariserError
from pipeline.io.commit import read_manifest
from pipeline.io.storage import Location, enumerate_sessions, resolve
from pipeline.ledger.types import Code, Severity
from pipeline.run.batches import NOT_READ_CODES, audit_batch
from pipeline.run.replay_batches import ReplayOptions, replay_batch
from tests.helpers.ledgers import sample_session, session_key
from tests.helpers.storage import committed_rows

ARCHIVE = "memory://contained/archive"
NAMES = ("a", "boom", "z")


@pytest.fixture
def archive(memfs: fsspec.AbstractFileSystem) -> Location:
    """Three copies of a small session; the one named ``boom`` is made to raise."""
    root = resolve(ARCHIVE)
    data = sample_session().to_bytes()
    base = session_key().path.rsplit("/", 1)[0]
    for name in NAMES:
        memfs.pipe_file(root.join(base, f"{name}.jsonl"), data)
    return root


def raise_on_boom(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str,
                  error: BaseException) -> None:
    """Make ``module.name`` (called with a session key first) raise ``error`` for the
    session named ``boom``, and do its work for the others."""
    real = getattr(module, name)

    def wrapper(key: Any, *args: Any, **kwargs: Any) -> Any:
        if key.session_id == "boom":
            raise error
        return real(key, *args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)


def name_of(path: str) -> str:
    return path.rsplit("/", 1)[-1].removesuffix(".jsonl")


def test_the_new_code_is_an_error_of_a_session_not_audited() -> None:
    assert Code.AUDIT_FAILED.text == "audit_failed"
    assert Code.AUDIT_FAILED.severity is Severity.ERROR
    assert "audit_failed" in NOT_READ_CODES


@pytest.mark.parametrize("command", [["audit"], ["audit", "--replay"]])
def test_an_audit_that_raises_on_one_object_is_a_finding_and_the_run_completes(
        archive: Location, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
        command: list[str]) -> None:
    error = TypeError("unhashable type: 'list'")
    raise_on_boom(monkeypatch, batches, "audit_lines", error)
    out = tmp_path / "out"
    code = run([*command, ARCHIVE, "--out", str(out), "--workers", "1", "--no-progress"])
    assert code == EXIT_PARTIAL

    findings = [f for f in committed_rows(out, "integrity/findings")
                if f["code"] == "audit_failed"]
    assert len(findings) == 1
    (failed,) = findings
    assert name_of(failed["session_path"]) == "boom"
    assert failed["severity"] == "error" and failed["line"] is None
    # the exception, where it was raised (the innermost frame of vakpipe's own code)
    assert failed["detail"].startswith("TypeError at pipeline/")
    assert failed["detail"].endswith(": unhashable type: 'list'")

    rows = {name_of(r["session_path"]): r for r in committed_rows(out, "integrity/sessions")}
    assert sorted(rows) == sorted(NAMES)
    assert (rows["boom"]["status"], rows["boom"]["errors"], rows["boom"]["lines"]) == (
        "error", 1, None)
    for name in ("a", "z"):  # audited in full, in the same batch
        assert rows[name]["lines"] == rows[name]["entries"] > 0
        assert rows[name]["requests"] == 4
    assert {name_of(r["session_path"]) for r in committed_rows(out, "usage")} == {"a", "z"}
    if "--replay" in command:
        assert {name_of(r["session_path"]) for r in committed_rows(out, "requests")} == {
            "a", "z"}

    manifest = read_manifest(resolve(str(out)))
    assert manifest is not None
    assert manifest["partial"] is True and manifest["unread_objects"] == 1
    assert manifest["findings_by_code"]["audit_failed"] == 1


def test_a_replay_that_raises_on_one_object_is_a_finding_and_keeps_its_checkpoint(
        archive: Location, monkeypatch: pytest.MonkeyPatch) -> None:
    raise_on_boom(monkeypatch, replay_batches, "replay_session",
                  ZeroDivisionError("division by zero"))
    batch = enumerate_sessions(archive).sessions
    by_name = {name_of(o.key.path): o for o in batch}
    before = Checkpoint(by_name["boom"].key.path, 10, "0" * 64, 1, "1" * 64, "etag-1", 10)
    previous: dict[str, Checkpoint | None] = {o.key.path: None for o in batch}
    previous[before.session_path] = before

    result = replay_batch(archive, 4, batch, ReplayOptions(), previous)

    assert result.index == 4 and result.sessions.num_rows == 3
    assert result.codes["audit_failed"] == 1 and result.statuses["error"] == 1
    (failed,) = [f for f in result.findings.to_pylist() if f["code"] == "audit_failed"]
    assert name_of(failed["session_path"]) == "boom"
    assert failed["detail"].startswith("ZeroDivisionError at pipeline/run/replay_batches.py")
    # nothing of it kept: no figures, no usage without its requests, no turns
    for dataset in ("usage", "turns", "requests"):
        paths = {name_of(p) for p in result.extra[dataset]["session_path"].to_pylist()}
        assert paths == {"a", "z"}, dataset
    # like an unreadable object: its old checkpoint stays, to be read again next run
    checkpoints = {name_of(r["session_path"]): r
                   for r in result.extra["checkpoints"].to_pylist()}
    assert checkpoints["boom"] == {**before.as_row(), "etag": None}
    assert checkpoints["a"]["verified_bytes"] == by_name["a"].size


@pytest.mark.parametrize("error", [
    MemoryError(),
    KeyboardInterrupt(),
    SystemExit(1),
    SummariserError("http://127.0.0.1:9/summarise: HTTP 502 (after 3 attempts)"),
], ids=lambda e: type(e).__name__)
def test_errors_raised_on_purpose_and_interrupts_are_not_contained(
        archive: Location, monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    batch = enumerate_sessions(archive).sessions
    raise_on_boom(monkeypatch, batches, "audit_lines", error)
    with pytest.raises(type(error)):
        audit_batch(archive, 0, batch)
    monkeypatch.undo()
    raise_on_boom(monkeypatch, replay_batches, "replay_session", error)
    with pytest.raises(type(error)):
        replay_batch(archive, 0, batch, ReplayOptions())
