"""Row 4: hostile lines (200k-deep nesting, NaN, invalid UTF-8, a 64 MiB line, ...) are
reported as the line they are, in bounded memory, and never crash anything; and the
"Also" items of the issue: the ``--max-line-bytes`` guard and the limits on what a
finding may quote.

A hostile line is never a valid entry, so spec 2.1 classifies it by its successor:
written between two entries the next one chains across (a torn write sealed by a
newline), it is ``torn_write_recovered``; written *over* an entry the next one names,
``damaged_entry``; as the last line, ``torn_tail``. Every other entry is read.

A line longer than ``--max-line-bytes`` (default 64 MiB) is never held whole: the IO
layer skips it in pieces and hands the reader a marker, reported like any line that is
not a valid entry, its detail naming the limit. The spool of a replay and a nightly
checkpoint still see its exact bytes, so compacted copies and checkpoints stay exact.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.audit.checkpoint import PrefixHasher
from pipeline.audit.session import audit_session
from pipeline.cli import run
from pipeline.io.commit import read_dataset
from pipeline.io.storage import MAX_LINE_BYTES, SessionObject, guarded_lines, resolve
from pipeline.ledger import kernel
from pipeline.ledger.layout import parse_session_path
from pipeline.ledger.reader import MAX_DETAIL_CHARS, Entry, read_ledger
from pipeline.ledger.types import OversizeLine, Severity
from pipeline.run.batches import RunContext, audit_batch
from pipeline.run.orchestrate import redacted
from pipeline.run.replay_batches import ReplayOptions, replay_batch
from tests.helpers.ledgers import LedgerBuilder, dumps, sample_session, session_key, sha

BENCH = Path(__file__).resolve().parents[2] / "bench" / "big_session.py"
ENVELOPE = (b'{"id":"0199a1f2-6a00-7000-8000-0000000000ff","parent_id":null,'
            b'"ts":"2026-09-21T14:13:20Z","kind":"message",')

HOSTILE: dict[str, bytes] = {
    "200k-deep arrays": b"[" * 200_000 + b"]" * 200_000,
    "200k-deep objects": b'{"a":' * 200_000 + b"1" + b"}" * 200_000,
    "200k-deep payload in an envelope": ENVELOPE + b'"message":' + b"[" * 200_000
    + b"]" * 200_000 + b"}",
    # under orjson's depth limit but over Python's recursion limit (the duplicate-kind
    # check parses such a line again with json)
    "1000-deep second kind": ENVELOPE.replace(b'"kind":"message",', b'"kind":"work",')
    + b'"kind":' + b'{"a":' * 1000 + b"1" + b"}" * 1001,
    "NaN": ENVELOPE + b'"x":NaN}',
    "Infinity": ENVELOPE + b'"x":-Infinity}',
    "a number past double": ENVELOPE + b'"x":1e999999}',
    "invalid UTF-8": ENVELOPE + b'"x":"\xff\xfe"}',
    "overlong UTF-8": ENVELOPE + b'"x":"\xc0\xaf"}',
    "cut UTF-8": ENVELOPE + b'"x":"\xe2\x82"}',
    "UTF-8 surrogate": ENVELOPE + b'"x":"\xed\xa0\x80"}',
    "escaped lone surrogate": ENVELOPE + b'"x":"\\ud800"}',
    "NUL and control bytes": ENVELOPE + b'"x":"\x00\x01\x1b"}',
    "byte order mark": b'\xef\xbb\xbf{"x":1}',
    "envelope prefixes, 100k times": b'{"id":"a","parent_id":null,"ts":"' * 100_000,
    "10 MB of one letter": b"A" * 10_000_000,
    "a JSON string": b'"{\\"id\\":\\"x\\"}"',
    "null": b"null",
    "blank": b"",
    "carriage return": b"\r",
}


def ledger_with(hostile: bytes, where: str) -> tuple[bytes, int]:
    """A small session with ``hostile`` as one line; the bytes and that line's number.

    ``where``: ``between`` two entries the next chains across, ``over`` an entry the
    next names, or ``last``.
    """
    b = sample_session(turns=1)
    if where == "between":
        b.raw(hostile)
        at = len(b.lines)
        b.user("and then?")
    elif where == "over":
        before = b.tail_id
        b.activity("overwritten")
        at = len(b.lines)
        b.lines[-1].data = hostile
        b.user("and then?", parent=before)
    else:
        b.raw(hostile)
        at = len(b.lines)
    return b.to_bytes(), at


EXPECTED = {"between": "torn_write_recovered", "over": "damaged_entry", "last": "torn_tail"}


@pytest.mark.parametrize("where", sorted(EXPECTED))
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_line_is_reported_as_that_line_and_nothing_else(name: str,
                                                                   where: str) -> None:
    data, at = ledger_with(HOSTILE[name], where)
    result = audit_session(session_key(), guarded_lines(io.BytesIO(data)))
    serious = [(f.line, f.code.text) for f in result.findings if f.severity >= Severity.WARNING]
    assert serious == [(at, EXPECTED[where])]
    assert all(len(f.detail) <= MAX_DETAIL_CHARS for f in result.findings)
    lines = data.split(b"\n")[:-1]
    assert result.row["entries"] == len(lines) - 1
    assert result.row["lines"] == len(lines) and result.row["bytes"] == len(data)


def big_line_session(folder: Path, body_bytes: int, *, chained_to_it: bool) -> Path:
    """An archive holding one session whose third line is an entry of ``body_bytes``
    bytes (a huge tool result), streamed to disk; the line after it chains to it (vak
    wrote it whole) or across it."""
    b = LedgerBuilder()
    b.header()
    b.user("cat the log")
    call = b.assistant("reading", tools=["call_0"])
    start, end = (dumps({**b.envelope("message", ident="0199a1f2-6a00-7000-8000-00000000b16b"),
                         "message": {"role": "user", "content": [
                             {"type": "tool_result", "tool_use_id": "call_0",
                              "content": "@", "is_error": False}]}})
                  .split(b"@"))
    fill = body_bytes - len(start) - len(end)
    path = folder / session_key().path
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(start)
    with open(path, "wb") as f:
        f.write(b.to_bytes())
        f.write(start)
        piece = b"x" * 2**20
        for i in range(0, fill, len(piece)):
            chunk = piece[: min(len(piece), fill - i)]
            f.write(chunk)
            digest.update(chunk)
        f.write(end + b"\n")
        digest.update(end)
        if chained_to_it:
            b.tail_hash, b.tail_id = digest.hexdigest(), "0199a1f2-6a00-7000-8000-00000000b16b"
        else:
            b.tail_id = call
        b.lines.clear()
        b.assistant("the log is long")
        f.write(b.to_bytes())
    return folder


def measure(root: Path, max_line_bytes: int | None = None) -> dict[str, object]:
    """Audit ``root`` in a fresh process, as one audit task does; its figures."""
    cmd = [sys.executable, str(BENCH), "--measure", str(root)]
    if max_line_bytes is not None:
        cmd += ["--max-line-bytes", str(max_line_bytes)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
    figures: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return figures


@pytest.mark.slow
def test_a_64_mib_line_over_the_default_limit_is_damaged_in_bounded_memory(
        tmp_path: Path) -> None:
    root = big_line_session(tmp_path, MAX_LINE_BYTES + 1, chained_to_it=True)
    figures = measure(root)
    codes = [(f["line"], f["code"]) for f in figures["findings"]]  # type: ignore[attr-defined]
    # the next entry names the skipped one: not a torn write; and its parent is gone
    assert codes == [(4, "damaged_entry"), (5, "orphan_parent")]
    assert "--max-line-bytes" in figures["findings"][0]["detail"]  # type: ignore[index]
    assert figures["lines"] == 5 and figures["entries"] == 4
    grown = int(figures["rss_peak"]) - int(figures["rss_before"])  # type: ignore[call-overload]
    # one limit's worth read (and joined) before the line is known to be too long
    assert grown < 3 * MAX_LINE_BYTES


@pytest.mark.slow
def test_a_line_far_over_the_limit_is_never_held(tmp_path: Path) -> None:
    root = big_line_session(tmp_path, 256 * 2**20, chained_to_it=False)
    figures = measure(root, max_line_bytes=2**20)
    codes = [(f["line"], f["code"]) for f in figures["findings"]]  # type: ignore[attr-defined]
    assert codes == [(4, "torn_write_recovered")]
    assert figures["bytes"] == (root / session_key().path).stat().st_size
    grown = int(figures["rss_peak"]) - int(figures["rss_before"])  # type: ignore[call-overload]
    assert grown < 48 * 2**20  # a 256 MiB line, read 1 MiB at a time


lines_strategy = st.lists(st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"")),
                          max_size=12)


#: The line guard's loop: the C kernel's, and the Python one that stands in where the
#: extension did not build.
GUARDS = [pytest.param("c", marks=pytest.mark.skipif(kernel.guarded_c is None,
                                                     reason="the C kernel did not build here")),
          "python"]


@pytest.mark.parametrize("guard", GUARDS)
@settings(max_examples=300, deadline=None)
@given(lines=lines_strategy, limit=st.integers(0, 40), torn=st.booleans(),
       piece=st.integers(1, 7), tap=st.booleans())
def test_the_line_guard_yields_every_line_or_a_marker_and_taps_every_byte(
        guard: str, lines: list[bytes], limit: int, torn: bool, piece: int,
        tap: bool) -> None:
    import pipeline.io.storage as storage

    data = b"\n".join(lines) + (b"" if torn or not lines else b"\n")
    tapped: list[bytes] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(storage, "SKIP_PIECE_BYTES", piece)  # many pieces for small lines
        if guard == "python":
            mp.setattr(storage, "guarded_c", None)
        it = guarded_lines(io.BytesIO(data), limit, tapped.append if tap else None)
        got = list(it)
        assert next(it, None) is None  # and stays done
    assert b"".join(tapped) == (data if tap else b"")
    physical = list(io.BytesIO(data))
    assert len(got) == len(physical)
    for line, real in zip(got, physical, strict=True):
        body = real[:-1] if real.endswith(b"\n") else real
        if len(body) > limit:
            assert isinstance(line, OversizeLine) and line.size == len(real)
            assert bytes(line) == real[len(body):]
        else:
            assert type(line) is bytes and line == real


@settings(max_examples=300, deadline=None)
@given(lines=lines_strategy, cuts=st.lists(st.integers(1, 9), max_size=20),
       check_at=st.integers(0, 400))
def test_a_checkpoint_hashed_in_pieces_is_the_one_hashed_by_line(
        lines: list[bytes], cuts: list[int], check_at: int) -> None:
    data = b"\n".join(lines) + b"\n" if lines else b""
    whole, pieces = PrefixHasher(check_at), PrefixHasher(check_at)
    for line in io.BytesIO(data):
        whole.update(line)
        i = 0
        for cut in cuts:
            if i + cut >= len(line):
                break
            pieces.update(line[i:i + cut])
            i += cut
        pieces.update(line[i:])
    for h in (whole, pieces):
        assert (h.digest, h.verified, h.total) == (hashlib.sha256(data).hexdigest(),
                                                   len(data), len(data))
    assert pieces.at_check == whole.at_check


def test_a_replay_spools_and_checkpoints_the_exact_bytes_of_a_skipped_line(
        tmp_path: Path) -> None:
    root = big_line_session(tmp_path, 5000, chained_to_it=False)
    loc = resolve(str(root))
    path = root / session_key().path
    obj = SessionObject(session_key(), str(path), path.stat().st_size)
    result = redacted(replay_batch, loc, 0, [obj], ReplayOptions(), {obj.key.path: None},
                      RunContext(max_line_bytes=1024))
    findings = result.findings.to_pylist()
    assert [(f["line"], f["code"]) for f in findings] == [(4, "torn_write_recovered")]
    assert "1,024 bytes" in findings[0]["detail"]
    checkpoint = result.extra["checkpoints"].to_pylist()[0]
    data = path.read_bytes()
    assert checkpoint["verified_bytes"] == len(data)
    assert checkpoint["prefix_sha256"] == hashlib.sha256(data).hexdigest()
    # the entries around it still replay: both requests of the session
    assert result.extra["requests"].num_rows == 2


def test_the_line_limit_reaches_every_command(tmp_path: Path, dask_scheduler: str) -> None:
    root = big_line_session(tmp_path / "archive", 3000, chained_to_it=True)
    for command in (["audit"], ["audit", "--replay"], ["replay"], ["compact"], ["nightly"]):
        out = tmp_path / "out" / "-".join(command)
        code = run([*command, str(root), "--out", str(out), "--scheduler", dask_scheduler,
                    "--max-line-bytes", "2KiB", "--no-progress"])
        assert code == 0, command
        if command == ["nightly"]:
            out = next(out.glob("date=*"))
        detail = read_dataset(resolve(str(out)), "integrity/findings").to_pylist()
        assert [(f["line"], f["code"]) for f in detail] == [(4, "damaged_entry"),
                                                          (5, "orphan_parent")], command
        assert "2,048 bytes" in detail[0]["detail"], command
    # and the default reads the line whole
    out = tmp_path / "out" / "default"
    assert run(["audit", str(root), "--out", str(out), "--scheduler", dask_scheduler,
                "--no-progress"]) == 0
    assert read_dataset(resolve(str(out)), "integrity/findings").num_rows == 0


def test_a_bad_line_limit_is_exit_2() -> None:
    assert run(["audit", "/nowhere", "--out", "/nowhere-out", "--max-line-bytes", "0"]) == 2
    assert run(["audit", "/nowhere", "--out", "/nowhere-out", "--max-line-bytes", "5TB"]) == 2


@pytest.mark.parametrize("limit", ["99999999999999999999", str(2**63 - 1), "9999999GiB"])
def test_a_line_limit_past_64_bits_reads_as_no_limit(tmp_path: Path, limit: str) -> None:
    """"No limit" to its user: every session was audit_failed (the readers ask for the
    limit plus one in a signed 64-bit count); now it reads as LARGEST_LINE_LIMIT."""
    root = big_line_session(tmp_path / "archive", 3000, chained_to_it=True)
    out = tmp_path / "out"
    assert run(["audit", str(root), "--out", str(out), "--workers", "0",
                "--max-line-bytes", limit, "--no-progress"]) == 0
    assert read_dataset(resolve(str(out)), "integrity/findings").num_rows == 0


# -- what a finding may quote ------------------------------------------------------------

LONG = "Ω" * 5000


def hostile_session() -> bytes:
    """Valid entries with hostile long ids, kinds, parents, prev_hashes and directory
    names, and a damaged line quoting nothing but what orjson says."""
    b = sample_session(turns=1)
    b.entry("x" * 3000 + "-kind", {"note": LONG}, ident="id-" + LONG)
    b.entry("activity", {"data": {}}, ident="id-" + LONG)  # duplicate id
    b.entry("activity", {"data": {}}, parent="parent-" + LONG)  # orphan
    b.entry("activity", {"data": {}}, prev_hash="hash-" + LONG)  # mismatch
    b.raw(b'{"id":"' + LONG.encode() + b'"' + b"\xff" * 3000)
    b.user("the end")
    return b.to_bytes()


def test_nothing_longer_than_the_detail_limit_reaches_the_findings(tmp_path: Path) -> None:
    data = hostile_session()
    result = audit_session(session_key(), io.BytesIO(data))
    codes = {f.code.text for f in result.findings}
    assert {"unknown_kind", "duplicate_id", "orphan_parent", "hash_mismatch",
            "torn_write_recovered"} <= codes
    assert all(len(f.detail) <= MAX_DETAIL_CHARS for f in result.findings)
    # through a task: the finding's entry id is bounded too
    path = tmp_path / session_key().path
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    obj = SessionObject(session_key(), str(path), len(data))
    table = redacted(audit_batch, resolve(str(tmp_path)), 0, [obj]).findings
    for column in ("detail", "entry_id"):
        values = [v for v in table[column].to_pylist() if v is not None]
        assert values and max(len(v) for v in values) <= MAX_DETAIL_CHARS, column


def test_the_audit_output_never_echoes_a_long_input(tmp_path: Path, dask_scheduler: str,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "archive"
    path = root / session_key().path
    path.parent.mkdir(parents=True)
    path.write_bytes(hostile_session())
    assert run(["audit", str(root), "--out", str(tmp_path / "out"), "--scheduler",
                dask_scheduler, "--no-progress"]) == 0
    out, err = capfd.readouterr()
    assert "ΩΩΩΩΩ" not in out + err and "x" * 100 not in out + err


def test_entries_around_a_skipped_line_are_the_intact_ones() -> None:
    b = sample_session(turns=1)
    b.raw(b"[" * 5000)
    b.user("after")
    data = b.to_bytes()
    guarded = [e.digest for e in read_ledger(guarded_lines(io.BytesIO(data), 1000))
               if isinstance(e, Entry)]
    assert guarded == [sha(line) for line in b.bodies() if not line.startswith(b"[")]


# -- found while building the matrix: payloads of the wrong type --------------------------

#: Values of every JSON type, and integers past what an int64 column or sum holds.
WRONG = [2**64 - 1, 2**62, -1, 1.5, True, None, [], {}, "x", [1, "a"], {"a": 1}]


def _retyped(value: object, rnd: random.Random, *, top: bool = False) -> object:
    """``value`` with about a third of its payload leaves replaced by values of other
    types (the envelope kept, so the entries stay valid)."""
    if isinstance(value, dict):
        return {k: v if top and k in ("id", "parent_id", "ts", "prev_hash", "at_turn", "kind")
                else _retyped(v, rnd) for k, v in value.items()}
    if isinstance(value, list):
        return [_retyped(v, rnd) for v in value]
    return rnd.choice(WRONG) if rnd.random() < 0.3 else value


def test_payloads_of_the_wrong_type_never_crash_a_task(tmp_path: Path) -> None:
    """Each value is read as what it is: a bad token count is no usage, a block ``type``
    that is not a string no block, a model that is not a string an unknown one, a row
    value its column cannot hold null. The session is audited and replayed in full: not
    contained as ``audit_failed`` (test_contained_errors.py), which would hide a crash."""
    from pipeline.compaction.engine import CompactionOptions
    from pipeline.compaction.registry import get_summariser
    from pipeline.synth.generator import generate_session

    options = ReplayOptions(planner=True, compaction=CompactionOptions(
        get_summariser("cards"), window=3000))
    replayed = 0
    for seed in range(8):
        rnd = random.Random(seed)
        s = generate_session(seed, turns=4)
        root = tmp_path / str(seed)
        path = root / s.path
        path.parent.mkdir(parents=True)
        lines = [dumps(_retyped(json.loads(line), rnd, top=True)) for line in s.lines()]
        path.write_bytes(b"".join(line + b"\n" for line in lines))
        key = parse_session_path(s.path)
        assert key is not None
        obj = SessionObject(key, str(path), path.stat().st_size)
        for result in (audit_batch(resolve(str(root)), 0, [obj]),
                       replay_batch(resolve(str(root)), 0, [obj], options)):
            assert "audit_failed" not in result.codes, result.findings.to_pylist()
            # every line an entry but vak's ``work`` lines, re-encoded with one ``kind``
            entries = sum(isinstance(json.loads(line)["kind"], str) for line in lines)
            assert result.sessions.select(["entries", "lines"]).to_pylist() == [
                {"entries": entries, "lines": len(lines)}]
        replayed += result.extra["requests"].num_rows
    assert replayed > 0  # what survived of the payloads was replayed


def test_values_of_another_type_are_read_as_absent() -> None:
    from pipeline.ledger.entry import is_directive, usage_of
    from pipeline.ledger.types import MAX_TOKEN_COUNT, token_count
    from pipeline.replay.catalog import load_catalog
    from pipeline.tables.schemas import REQUESTS_SCHEMA, rows_table

    good = {"input_tokens": 5, "output_tokens": 2}
    assert usage_of(good) == (5, 2, 0, 0)
    assert usage_of({**good, "input_tokens": MAX_TOKEN_COUNT}) == (MAX_TOKEN_COUNT, 2, 0, 0)
    for bad in (MAX_TOKEN_COUNT + 1, 2**64 - 1, -1, True, 1.5, "5", [5]):
        assert usage_of({**good, "input_tokens": bad}) is None, bad
        assert token_count(bad) is None, bad
    b = LedgerBuilder()
    b.header()
    b.message("user", [{"type": ["text"], "text": "x"}, {"type": {"a": 1}}, {"type": "text",
                                                                          "text": "go"}])
    b.message("user", [{"type": [1, "a"], "text": "x"}])
    directives = [is_directive(e) for e in read_ledger(io.BytesIO(b.to_bytes()))
                  if isinstance(e, Entry) and e.kind == "message"]
    assert directives == [True, False]
    catalog = load_catalog()
    assert catalog.lookup("gpt-4o") is not None
    for model in (5, ["gpt-4o"], {"gpt-4o": 1}, True, 1.5):
        assert catalog.lookup(model) is None, model
    row = {"session_path": "p", "turn": 2**31, "model": ["m"], "provider": "ollama",
           "model_known": "yes", "replayed_tokens": 2**63, "saturation": 7,
           "drift_tokens": -(2**63)}
    (got,) = rows_table([row, {"session_path": "q", "turn": 1}], REQUESTS_SCHEMA).to_pylist()[:1]
    assert {k: got[k] for k in row} == {
        "session_path": "p", "turn": None, "model": None, "provider": "ollama",
        "model_known": None, "replayed_tokens": None, "saturation": 7,
        "drift_tokens": -(2**63)}


def test_a_valid_instant_past_nanoseconds_is_a_null_timestamp(tmp_path: Path) -> None:
    b = LedgerBuilder()
    b.header(ts="9999-12-31T23:59:59Z")  # a valid RFC 3339 instant; its ns are past int64
    b.user("after")
    path = tmp_path / session_key().path
    path.parent.mkdir(parents=True)
    path.write_bytes(b.to_bytes())
    obj = SessionObject(session_key(), str(path), path.stat().st_size)
    result = audit_batch(resolve(str(tmp_path)), 0, [obj])
    assert not result.codes
    row = result.sessions.select(["entries", "first_ts", "last_ts"]).cast(pa.schema(
        [("entries", pa.int64()), ("first_ts", pa.int64()), ("last_ts", pa.int64())]))
    (got,) = row.to_pylist()
    assert got["entries"] == 2 and got["first_ts"] is None and got["last_ts"] is not None


@pytest.mark.parametrize("guard", GUARDS)
def test_the_line_guard_lets_what_its_file_and_tap_raise_through(
        guard: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A read that fails (a replaced S3 object, a dead disk) and a tap that fails (a
    # spool out of space) end the lines with their own error, as the file gives it.
    import pipeline.io.storage as storage

    if guard == "python":
        monkeypatch.setattr(storage, "guarded_c", None)

    class Failing(io.BytesIO):
        def readline(self, size: int | None = -1) -> bytes:
            if self.tell():
                raise OSError("the disk went away")
            return super().readline(size)

    it = guarded_lines(Failing(b"one\ntwo\n"), 100)
    assert next(it) == b"one\n"
    with pytest.raises(OSError, match="went away"):
        next(it)

    def full(data: bytes) -> None:
        raise OSError("no space left on the spool")

    with pytest.raises(OSError, match="no space"):
        list(guarded_lines(io.BytesIO(b"one\n"), 100, full))
