"""Rows 5, 6 and 7: flaky storage, a denied object, objects replaced while read.

The archive is in moto's S3 server; every request of the run (the listing on the
client, the reads on the session cluster's worker processes) goes through the fault
proxy of :mod:`tests.helpers.fault_proxy`, which answers some of them with real S3 errors
(``503 SlowDown``, ``503 ServiceUnavailable``, ``403 AccessDenied``), resets their
connection, or replaces the object in moto right before forwarding them. Runs go
through the CLI (in-process, on the session's cluster), so exit codes are checked too.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from itertools import count
from pathlib import Path
from typing import Any

import pytest
import s3fs

from pipeline.cli import EXIT_OK, EXIT_PARTIAL, run
from pipeline.errors import ObjectChangedError
from pipeline.io.commit import read_manifest
from pipeline.io.storage import (
    Location,
    SessionObject,
    enumerate_sessions,
    open_lines,
    printable,
    resolve,
)
from pipeline.ledger.types import Code
from pipeline.run.batches import audit_object, read_consistently
from pipeline.synth.fleet import write_fleet
from pipeline.synth.local_s3 import LocalS3
from tests.helpers.fault_proxy import FaultProxy, Rule
from tests.helpers.ledgers import LedgerBuilder, session_key
from tests.helpers.storage import BUCKET, committed_rows

ARCHIVE = f"s3://{BUCKET}/archive"
INTEGRITY = ("integrity/sessions", "integrity/findings", "usage")
REPLAY = (*INTEGRITY, "turns", "requests")


@pytest.fixture
def fleet(s3: LocalS3) -> list[str]:
    """Six generated sessions under ``ARCHIVE`` (written straight to moto); their keys."""
    write_fleet(resolve(ARCHIVE), sessions=6, seed=5, size_scale=0.2)
    return [f"archive/{o.key.path}" for o in enumerate_sessions(resolve(ARCHIVE)).sessions]


def audit(out: str, scheduler: str, proxy: FaultProxy | None, *extra: str) -> Any:
    """``vakpipe audit ARCHIVE --out OUT`` on the session cluster, through ``proxy``."""
    via = ["--storage-option", f"endpoint_url={proxy.endpoint}"] if proxy else []
    return run(["audit", ARCHIVE, "--out", f"s3://{BUCKET}/{out}", "--scheduler", scheduler,
                "--no-progress", *via, *extra])


def tables(out: str, datasets: tuple[str, ...] = INTEGRITY) -> dict[str, list[dict[str, Any]]]:
    """The committed rows of ``datasets`` under ``s3://BUCKET/out`` (read from moto)."""
    return {d: committed_rows(resolve(f"s3://{BUCKET}/{out}"), d) for d in datasets}


def manifest(out: str) -> dict[str, Any]:
    m = read_manifest(resolve(f"s3://{BUCKET}/{out}"))
    assert m is not None
    return m


def without(rows: dict[str, list[dict[str, Any]]], keys: set[str]) -> dict[str, list[Any]]:
    """``rows`` without the rows of the sessions ``keys`` (keys relative to the bucket)."""
    paths = {k.removeprefix("archive/") for k in keys}
    return {d: [r for r in rs if r["session_path"] not in paths] for d, rs in rows.items()}


def trail(proxy: FaultProxy, key: str, method: str | None = None) -> list[tuple[str, str]]:
    """(method, action) of every request the proxy got for ``key``."""
    return [(r.method, r.action) for r in proxy.requests(key, method)]


# --- row 5: throttling and resets -------------------------------------------------------


@pytest.mark.slow
def test_throttling_and_resets_are_retried_then_succeed(
    fleet: list[str], proxy: FaultProxy, scheduler: str
) -> None:
    assert audit("reference", scheduler, None) == EXIT_OK
    faults = {fleet[0]: "slowdown", fleet[1]: "unavailable", fleet[2]: "reset"}
    for key, action in faults.items():
        proxy.add(Rule(action, re.escape(key) + "$", method="GET", times=2))
    assert audit("out", scheduler, proxy) == EXIT_OK
    # Every fault was answered by a retry, and the third try went through; each small
    # object is one GET of its listed version, no HEAD first.
    for key in fleet:
        action = faults.get(key)
        tries = [("GET", action)] * 2 if action else []
        assert trail(proxy, key) == [*tries, ("GET", "forward")]
    assert tables("out") == tables("reference")
    assert manifest("out")["partial"] is False and manifest("out")["unread_objects"] == 0


@pytest.mark.slow
def test_exhausted_retries_make_the_object_unreadable_and_the_run_partial(
    fleet: list[str], proxy: FaultProxy, scheduler: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert audit("reference", scheduler, None) == EXIT_OK
    throttled, dropped = fleet[1], fleet[4]
    proxy.add(Rule("slowdown", re.escape(throttled) + "$", method="GET", times=None))
    proxy.add(Rule("reset", re.escape(dropped) + "$", method="GET", times=None))
    capsys.readouterr()
    # A smaller retry budget than the default (5 tries with adaptive backoff, which takes
    # minutes to exhaust under a steady SlowDown), through the documented option.
    code = audit("out", scheduler, proxy, "--fail-on", "error",
                 "--storage-option", "config_kwargs.retries.max_attempts=2",
                 "--storage-option", "config_kwargs.retries.mode=standard")
    assert code == EXIT_PARTIAL  # partial before --fail-on: the verdict is incomplete
    printed = capsys.readouterr().out
    assert "the run is partial: 2 sessions not read" in printed
    assert printable(throttled.removeprefix("archive/"), 160) in printed
    # Retried (more than one GET), never answered, then given up.
    for key, action in ((throttled, "slowdown"), (dropped, "reset")):
        gets = trail(proxy, key, "GET")
        assert len(gets) > 1 and set(gets) == {("GET", action)}
    got = tables("out")
    unread = {throttled, dropped}
    assert without(got, unread) == without(tables("reference"), unread)
    findings = {r["session_path"]: r for r in got["integrity/findings"]
                if r["code"] == "unreadable_object"}
    assert set(findings) == {k.removeprefix("archive/") for k in unread}
    assert "reduce your request rate" in findings[throttled.removeprefix("archive/")]["detail"]
    assert "connect" in findings[dropped.removeprefix("archive/")]["detail"].lower()
    rows = {r["session_path"]: r for r in got["integrity/sessions"]}
    for key in unread:
        row = rows[key.removeprefix("archive/")]
        assert row["status"] == "error" and row["lines"] is None and row["bytes"] > 0
    m = manifest("out")
    assert m["partial"] is True and m["unread_objects"] == 2
    assert m["unread_examples"] == sorted(k.removeprefix("archive/") for k in unread)
    assert m["findings_by_code"]["unreadable_object"] == 2


# --- row 6: access denied ---------------------------------------------------------------


@pytest.mark.slow
def test_access_denied_on_one_object_is_reported_once_and_never_retried(
    fleet: list[str], proxy: FaultProxy, scheduler: str
) -> None:
    assert audit("reference", scheduler, None) == EXIT_OK
    denied = fleet[2]
    proxy.add(Rule("denied", re.escape(denied) + "$", times=None))
    assert audit("out", scheduler, proxy) == EXIT_PARTIAL
    # One request met the denial (the object's one GET), and nothing asked again.
    assert trail(proxy, denied) == [("GET", "denied")]
    got = tables("out")
    assert without(got, {denied}) == without(tables("reference"), {denied})
    (finding,) = [r for r in got["integrity/findings"]
                  if r["session_path"] == denied.removeprefix("archive/")]
    assert finding["code"] == "unreadable_object" and finding["severity"] == "error"
    assert finding["detail"].startswith("PermissionError:")
    assert re.search("Access Denied|Forbidden", finding["detail"])
    assert manifest("out")["unread_examples"] == [denied.removeprefix("archive/")]


# --- row 7: objects replaced while the run reads them -------------------------------------


def ledger(turns: int, big: bool = False, session_id: str = "s") -> bytes:
    """A valid session of ``turns`` turns; ``big``: a 6 MB entry first, so s3fs
    reads it in two ranged GETs (a first read of 1 MiB plus its 4 MiB read-ahead, then the rest)."""
    b = LedgerBuilder()
    b.header(session_id=session_id)
    if big:
        # An entry of a kind no replay reads (an info finding only): 6 MB read, none of
        # it tokenized.
        b.entry("attachment", {"data": "x" * 6_000_000})
    for t in range(turns):
        b.user(f"what now #{t}")
        b.assistant(f"answer #{t}")
    return b.to_bytes()


@pytest.fixture
def live(s3: LocalS3) -> dict[str, str]:
    """Three sessions under ``ARCHIVE``, a small one (read in one GET of its listed
    version) and two of 6 MB (a HEAD, then ranged GETs); {name: key relative to the
    bucket}."""
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    keys = {}
    for name, big in (("listed", False), ("headed", True), ("ranged", True)):
        sid = f"0199a1f2-5f00-7000-8000-{name:0>12}"
        key = f"archive/{session_key(sid).path}"
        fs.pipe_file(f"{BUCKET}/{key}", ledger(1, big, sid))
        keys[name] = key
    return keys


def replacer(big: dict[str, bool]) -> Callable[[str], None]:
    """A proxy callback that replaces the object of ``key`` in moto by a longer version
    (a session that grew), a new one each call."""
    fs = s3fs.S3FileSystem(skip_instance_cache=True)  # straight to moto, not the proxy
    turns = count(2)

    def replace(key: str) -> None:
        sid = key.rsplit("/", 1)[-1].removesuffix(".jsonl")
        fs.pipe_file(f"{BUCKET}/{key}", ledger(next(turns), big.get(key, False), sid))

    return replace


@pytest.mark.slow
@pytest.mark.parametrize("replay", [False, True], ids=["audit", "audit-replay"])
def test_an_object_replaced_once_is_read_again_as_it_is_now(
    replay: bool, live: dict[str, str], proxy: FaultProxy, scheduler: str
) -> None:
    replace = replacer({live["headed"]: True, live["ranged"]: True})
    # After the listing, before the small object's GET (If-Match fails); between the
    # HEAD of 6 MB and its first GET (If-Match fails); between the two ranged GETs of
    # 6 MB.
    proxy.add(Rule("call", re.escape(live["listed"]), "GET", callback=replace))
    proxy.add(Rule("call", re.escape(live["headed"]), "GET", callback=replace))
    proxy.add(Rule("call", re.escape(live["ranged"]), "GET", after=1, callback=replace))
    extra = ("--replay",) if replay else ()
    assert audit("out", scheduler, proxy, *extra) == EXIT_OK
    # Each was looked up (a HEAD) and read once more, whole.
    assert trail(proxy, live["listed"]) == [("GET", "call"), ("HEAD", "forward"),
                                            ("GET", "forward")]
    assert trail(proxy, live["headed"], "GET") == [("GET", "call")] + [("GET", "forward")] * 2
    assert len(trail(proxy, live["ranged"], "GET")) == 2 + 2
    for key in (live["headed"], live["ranged"]):
        assert len(trail(proxy, key, "HEAD")) >= 2
    # What was committed is the audit of the objects as they are now: same rows (ETag,
    # bytes and lines of the new version) as an undisturbed run over the final state.
    assert audit("reference", scheduler, None, *extra) == EXIT_OK
    datasets = REPLAY if replay else INTEGRITY
    assert tables("out", datasets) == tables("reference", datasets)
    rows = tables("out")["integrity/sessions"]
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    for row in rows:
        info = fs.info(f"{BUCKET}/archive/{row['session_path']}")
        assert (row["etag"], row["bytes"]) == (info["ETag"].strip('"'), info["size"])
        assert row["status"] == "ok"
    assert not any(r["code"] == "changed_during_audit"
                   for r in tables("out")["integrity/findings"])


@pytest.mark.slow
@pytest.mark.parametrize(("name", "detail"), [("listed", "changed since it was listed"),
                                              ("headed", "changed while it was read")])
def test_an_object_that_changes_under_both_reads_is_changed_during_audit(
    live: dict[str, str], proxy: FaultProxy, scheduler: str, name: str, detail: str
) -> None:
    key = live[name]
    # Replaced by a version of its size each time: the second read takes the first's way.
    proxy.add(Rule("call", re.escape(key), "GET", times=None,
                   callback=replacer({live["headed"]: True})))
    assert audit("out", scheduler, proxy, "--fail-on", "error") == EXIT_PARTIAL
    assert trail(proxy, key, "GET") == [("GET", "call")] * 2  # read twice, no more
    got = tables("out")
    path = key.removeprefix("archive/")
    (finding,) = [r for r in got["integrity/findings"] if r["session_path"] == path]
    assert (finding["code"], finding["severity"]) == ("changed_during_audit", "warning")
    assert finding["detail"].startswith(f"ObjectChangedError: {detail}")
    row = next(r for r in got["integrity/sessions"] if r["session_path"] == path)
    assert row["status"] == "warning" and row["lines"] is None  # nothing of a torn read
    others = [r for r in got["integrity/sessions"] if r["session_path"] != path]
    assert len(others) == 2 and all(r["status"] == "ok" for r in others)
    m = manifest("out")
    assert m["partial"] is True and m["unread_examples"] == [path]


# --- row 7 on a local disk ----------------------------------------------------------------


def local_session(tmp_path: Path, turns: int = 1) -> tuple[Location, SessionObject, Path]:
    root = resolve(str(tmp_path / "archive"))
    key = session_key()
    file = tmp_path / "archive" / key.path
    file.parent.mkdir(parents=True)
    file.write_bytes(ledger(turns, session_id=key.session_id))
    (obj,) = enumerate_sessions(root).sessions
    return root, obj, file


def grow(file: Path, turns: int) -> None:
    """Rewrite ``file`` longer, with another modification time (a session vak grew)."""
    file.write_bytes(ledger(turns, session_id=file.stem))
    st = file.stat()
    os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_a_local_file_changed_after_the_listing_is_read_as_it_is_now(tmp_path: Path) -> None:
    root, obj, file = local_session(tmp_path)
    grow(file, 3)
    result = audit_object(root, obj)
    assert result.row["bytes"] == file.stat().st_size != obj.size
    assert result.row["etag"].startswith(f"mtime:{file.stat().st_mtime!r};") \
        and result.row["etag"] != obj.etag
    assert result.row["entries"] == 1 + 2 * 3 and result.row["status"] == "ok"


def test_a_local_file_appended_while_read_raises_and_is_read_again(tmp_path: Path) -> None:
    root, obj, file = local_session(tmp_path)
    appends = count(3)

    def appending_read(version: SessionObject) -> Any:
        # A writer appends while the reader is at its first line.
        first = []

        def tap(data: bytes) -> None:
            if not first:
                first.append(data)
                grow(file, next(appends))

        with open_lines(root, version, tap=tap) as lines:
            return [*lines]

    with pytest.raises(ObjectChangedError, match="while it was read"):
        appending_read(obj)
    # Twice in a row: changed_during_audit, with no figures.
    audit_, was_read = read_consistently(root, obj, appending_read)
    assert not was_read and [f.code for f in audit_.findings] == [Code.CHANGED_DURING_AUDIT]
    assert audit_.row["status"] == "warning" and "entries" not in audit_.row


def test_manifest_and_summary_quote_unread_keys_escaped() -> None:
    from pipeline.run.orchestrate import RunSummary

    summary = RunSummary("r", "s3://b/a", "s3://b/o", sessions=2)
    summary.unread = ["agents/vak/sessions/h/\u202eevil\x00.jsonl", "agents/a/sessions/h/ok.jsonl"]
    summary.skipped_examples = ("x/\x1b[31mred", "y\\z")
    d = json.loads(json.dumps(summary.as_dict()))
    assert d["partial"] is True and d["unread_objects"] == 2
    assert d["unread_examples"] == ["agents/a/sessions/h/ok.jsonl",
                                    "agents/vak/sessions/h/\\u202eevil\\x00.jsonl"]
    assert d["skipped_examples"] == ["x/\\x1b[31mred", "y\\\\z"]
