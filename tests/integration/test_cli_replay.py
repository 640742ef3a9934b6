"""``vakpipe replay`` and ``vakpipe show`` through the CLI entry point (``run``).

The replay runs join the session's LocalCluster of worker processes (``dask_scheduler``);
one smoke test reads and writes moto's S3 server from that cluster. ``show`` must print
exactly what the replay counted: every rendered request of a generated fleet adds up to
its replayed token count, under recorded plans, planner v1, cards, packets and resets.
"""

from __future__ import annotations

import os
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipeline.audit.session import audit_session
from pipeline.cli import EXIT_OK, EXIT_UNUSABLE, run
from pipeline.io.commit import read_dataset
from pipeline.io.storage import Location, resolve
from pipeline.ledger.layout import parse_session_path
from pipeline.ledger.reader import Entry, read_ledger
from pipeline.replay.catalog import load_catalog
from pipeline.replay.projection import get_rule_set
from pipeline.replay.scopes import FOLD_KEY_GRAMMAR
from pipeline.replay.show import TEXT_LIMIT, RenderingEngine, render_request
from pipeline.replay.tokens import get_tokenizer
from pipeline.synth.fleet import write_fleet
from pipeline.synth.generator import generate_fleet
from pipeline.synth.local_s3 import LocalS3
from tests.helpers.data_paths import SPEC
from tests.helpers.storage import BUCKET, plain_rows

EXAMPLE = SPEC / "example-ledger.jsonl"
EXAMPLE_PATH = "agents/vak/sessions/2d872b17b24e117e/0199a1f2-5f00-7000-8000-00000000abcd.jsonl"
REPLAY_TABLES = ("integrity/sessions", "integrity/findings", "turns", "requests")


def one_error_line(capsys: pytest.CaptureFixture[str], *names: str) -> str:
    """The single ``vakpipe: error:`` line on stderr, naming ``names``."""
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vakpipe: error: "), err
    assert "Traceback" not in err
    for name in names:
        assert name in lines[0], (name, err)
    return lines[0]


def rows(out: Path | Location, dataset: str) -> list[dict[str, Any]]:
    loc = out if isinstance(out, Location) else resolve(str(out))
    return plain_rows(read_dataset(loc, dataset))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four generated sessions (recorded plans, cards, packets, resets) in a folder."""
    root = tmp_path_factory.mktemp("fleet")
    write_fleet(resolve(str(root)), sessions=4, seed=11, size_scale=0.5)
    return root


@pytest.fixture(scope="module")
def replayed(fleet: Path, dask_scheduler: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``vakpipe replay`` of the whole fleet."""
    out = tmp_path_factory.mktemp("replayed")
    code = run(["replay", str(fleet), "--out", str(out), "--scheduler", dask_scheduler,
                "--no-progress"])
    assert code == EXIT_OK
    return out


def session_ids(fleet: Path) -> dict[str, str]:
    """Session id -> path relative to the root."""
    return {p.stem: p.relative_to(fleet).as_posix() for p in sorted(fleet.rglob("*.jsonl"))}


# --- replay -----------------------------------------------------------------------------


def test_replay_writes_what_audit_replay_writes(fleet: Path, replayed: Path, tmp_path: Path,
                                                dask_scheduler: str) -> None:
    paths = set(session_ids(fleet).values())
    assert {r["session_path"] for r in rows(replayed, "integrity/sessions")} == paths
    assert {r["session_path"] for r in rows(replayed, "turns")} == paths
    requests = rows(replayed, "requests")
    assert {r["session_path"] for r in requests} == paths
    assert all(r["drift_tokens"] == 0 for r in requests)  # a consistent fleet
    # one code path: `audit --replay` commits the same rows
    out = tmp_path / "audit"
    assert run(["audit", str(fleet), "--out", str(out), "--replay", "--scheduler",
                dask_scheduler, "--no-progress"]) == EXIT_OK
    for dataset in REPLAY_TABLES:
        assert rows(out, dataset) == rows(replayed, dataset), dataset


def test_session_filter(fleet: Path, replayed: Path, tmp_path: Path, dask_scheduler: str,
                        capsys: pytest.CaptureFixture[str]) -> None:
    ids = session_ids(fleet)
    first, second = sorted(ids)[:2]
    out = tmp_path / "one"
    assert run(["replay", str(fleet), "--out", str(out), "--session", first,
                "--scheduler", dask_scheduler, "--no-progress"]) == EXIT_OK
    assert "1 sessions" in capsys.readouterr().out
    for dataset in REPLAY_TABLES[:1] + REPLAY_TABLES[2:]:
        got = rows(out, dataset)
        assert got and {r["session_path"] for r in got} == {ids[first]}, dataset
        assert got == [r for r in rows(replayed, dataset) if r["session_path"] == ids[first]]
    two = tmp_path / "two"
    assert run(["replay", str(fleet), "--out", str(two), "--session", first, "--session",
                second, "--scheduler", dask_scheduler, "--no-progress"]) == EXIT_OK
    assert {r["session_path"] for r in rows(two, "requests")} == {ids[first], ids[second]}


def test_unknown_session_id_is_exit_2(fleet: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    known = sorted(session_ids(fleet))[0]
    code = run(["replay", str(fleet), "--out", str(tmp_path / "out"), "--session", known,
                "--session", "no-such-session"])
    assert code == EXIT_UNUSABLE
    line = one_error_line(capsys, "'no-such-session'", str(fleet))
    assert known not in line
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_scope_filter(fleet: Path, replayed: Path, tmp_path: Path, dask_scheduler: str) -> None:
    out = tmp_path / "scoped"
    assert run(["replay", str(fleet), "--out", str(out), "--scope", "t2/i1-t3",
                "--scheduler", dask_scheduler, "--no-progress"]) == EXIT_OK
    got = rows(out, "requests")
    assert got and {r["scope"].split("/")[0] for r in got} == {"t2", "t3"}
    # the same rows as the whole replay's: figures carried across (hint, turn totals)
    # do not depend on the filter; the turns table is never filtered
    assert got == [r for r in rows(replayed, "requests") if r["turn"] in (2, 3)]
    assert rows(out, "turns") == rows(replayed, "turns")


@pytest.mark.parametrize(("flag", "names"), [
    (["--scope", "t3/x"], ["--scope 't3/x'", FOLD_KEY_GRAMMAR]),
    (["--scope", "t0"], [FOLD_KEY_GRAMMAR]),
    (["--rules", "v9"], ["'v9'", "v1"]),
])
def test_bad_replay_flags_are_exit_2(fleet: Path, tmp_path: Path, flag: list[str],
                                     names: list[str],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code = run(["replay", str(fleet), "--out", str(tmp_path / "out"), *flag])
    assert code == EXIT_UNUSABLE
    one_error_line(capsys, *names)


# --- show -------------------------------------------------------------------------------


def show(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert run(["show", *args]) == EXIT_OK, capsys.readouterr().err
    return capsys.readouterr().out


def message_tokens(text: str) -> list[int]:
    return [int(m.replace(",", "")) for m in re.findall(r"^\[\d+\] \w+ · ([\d,]+) tok", text,
                                                          re.MULTILINE)]


def test_show_a_generated_request(fleet: Path, replayed: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    row = next(r for r in rows(replayed, "requests")
               if r["plan_card"] and r["plan_source"] != "none" and r["iteration"] > 1)
    text = show(capsys, str(fleet / row["session_path"]), "--scope", row["scope"])
    lines = text.splitlines()
    assert lines[0] == f"session   {fleet / row['session_path']}"
    assert lines[2].startswith(f"request   {row['scope']} · entry {row['entry_id']} · ")
    assert f"replayed {row['replayed_tokens']:,} · provider-reported " in text
    assert f"hint {row['hint_level']}" in text and f"now       {row['now_line']}" in text
    assert f"plan      recorded context_selection {row['plan_source']}" in lines
    assert any(ln.startswith("  Card      t") for ln in lines)
    assert f"  open      t{row['turn']}" in lines
    prefix = row["replayed_prefix_tokens"]
    assert any(ln.startswith(f"prefix    {prefix:,} tok from the ") for ln in lines)
    tokens = message_tokens(text)
    assert tokens and 3 + prefix + sum(tokens) == row["replayed_tokens"]
    assert f"request {row['replayed_tokens']:,} = 3 + prefix {prefix:,} + messages" in text
    assert "WARNING" not in text
    # the open turn: its directive, then its earlier iterations, up to this request
    opened = [ln for ln in lines if ln.startswith("[") and ln.endswith(" open")]
    assert opened[0].endswith(f"t{row['turn']} open") and " user · " in opened[0]
    assert any(f"· t{row['turn']}/i{row['iteration'] - 1} open" in ln for ln in opened)
    assert any(" · Card t" in ln for ln in lines if ln.startswith("["))


def test_show_cuts_long_texts_unless_full(fleet: Path, replayed: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    row = max(rows(replayed, "requests"), key=lambda r: r["replayed_tokens"])
    path = str(fleet / row["session_path"])
    cut = show(capsys, path, "--scope", row["scope"])
    whole = show(capsys, path, "--scope", row["scope"], "--full")
    assert re.search(r"… \(\d+ more chars\)", cut) and "more chars)" not in whole
    assert len(whole) > len(cut)
    assert max(len(ln) for ln in cut.splitlines()) < TEXT_LIMIT + 200
    assert message_tokens(cut) == message_tokens(whole)


def place_example(root: Path) -> Path:
    path = root / EXAMPLE_PATH
    path.parent.mkdir(parents=True)
    shutil.copyfile(EXAMPLE, path)
    return path


def test_show_the_example_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(place_example(tmp_path))
    first = show(capsys, path, "--scope", "t1/i1")
    assert "audit     ok · 0 errors, 0 warnings · active chain 22 of 22 entries" in first
    assert "model     gemma4:e2b-mlx (ollama) · window 32,768 input tokens" in first
    assert "provider-reported 812 (drift +794) · output 41" in first
    assert "plan      none: closed turns verbatim (derive_messages)" in first
    assert "[1] user · 11 tok · t1 open\n       7 | what is the weather in delhi" in first
    assert "messages  1 · 11 tok · request 18 = 3 + prefix 4 + messages" in first
    second = show(capsys, path, "--scope", "t1/i2")
    assert "[2] assistant · 27 tok · t1/i1 open" in second
    assert "      20 | webfetch\n         | {\"url\":\"https://example.com/delhi\"}" in second
    assert "       8 | Delhi: 31C, haze" in second
    assert "[4] user · 14 tok · t1 open\n      10 | [freshness-check]" in second  # control
    assert "messages  4 · 64 tok · request 71 = 3 + prefix 4 + messages" in second
    # a form names its iteration
    form = show(capsys, path, "--scope", "t1/i1/f1")
    assert "note      t1/i1/f1 is a tool call (form) of request t1/i1" in form
    # outside the archive layout: shown, the directory reported by the audit
    loose = tmp_path / "loose.jsonl"
    shutil.copyfile(EXAMPLE, loose)
    elsewhere = show(capsys, str(loose), "--scope", "t1/i1")
    assert "audit     warning" in elsewhere and "what is the weather in delhi" in elsewhere


@pytest.mark.parametrize(("scope", "names"), [
    ("t1/i3", ["no request at t1/i3", "nearest: t1/i2", "t1 has t1/i1-i2"]),
    ("t1", ["t1 is a turn, not a request", "t1 has t1/i1-i2"]),
    ("t2", ["no request in t2 of", "nearest: t1/i2"]),
    ("t9/i1", ["nearest: t1/i2"]),
    ("i1", ["not a request scope", "tN/iM"]),
])
def test_show_without_such_request_is_exit_2(tmp_path: Path, scope: str, names: list[str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = str(place_example(tmp_path))
    assert run(["show", path, "--scope", scope]) == EXIT_UNUSABLE
    one_error_line(capsys, *names)


def test_show_what_is_not_a_ledger_is_exit_2(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["show", str(tmp_path / "nothing.jsonl"), "--scope", "t1/i1"]) == EXIT_UNUSABLE
    one_error_line(capsys, "no such bucket or path")
    assert run(["show", str(tmp_path), "--scope", "t1/i1"]) == EXIT_UNUSABLE
    one_error_line(capsys, "a folder, not one ledger")
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)  # never opened: it would wait for a writer (it was called a folder)
    assert run(["show", str(fifo), "--scope", "t1/i1"]) == EXIT_UNUSABLE
    one_error_line(capsys, "not a regular file (a FIFO, a device or a socket)")


def test_rendered_requests_are_what_replay_counted() -> None:
    """Every request of a fleet, rendered, adds up to its replayed tokens: with recorded
    plans and under planner v1 (a small window, so it cards and packs)."""
    seen: Counter[str] = Counter()
    capacity = load_catalog().with_window(3000)
    for s in generate_fleet(4, 7, consistent=False):  # a seed with all of them
        lines = list(s.lines())
        key = parse_session_path(s.path)
        assert key is not None
        audit = audit_session(key, lines)
        chain = [e for e in read_ledger(lines)
                 if isinstance(e, Entry) and (e.line, e.id) in audit.active]
        for planner in (None, capacity.lookup(audit.row["model"])):
            engine = RenderingEngine(get_rule_set("v1"), get_tokenizer(), planner=planner)
            for entry in chain:
                rendered = render_request(engine, entry)
                if rendered is not None:
                    assert rendered.total == rendered.request.replayed_tokens, (s.path, entry)
                    seen.update(k for k, v in [
                        ("request", True), ("reset", rendered.reset_turns),
                        ("packet", rendered.packet_found), ("card", rendered.card_turns),
                        ("tail", rendered.messages[-1].source.startswith("tail"))] if v)
                for _ in engine.feed(entry):
                    pass
    assert set(seen) == {"request", "reset", "packet", "card", "tail"}, seen


# --- on S3, on a cluster ----------------------------------------------------------------


def test_replay_and_show_on_s3_on_a_cluster(s3: LocalS3, scheduler: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    archive = f"s3://{BUCKET}/archive"
    write_fleet(resolve(archive), sessions=3, seed=12, size_scale=0.3)
    out = resolve(f"s3://{BUCKET}/replay")
    assert run(["replay", archive, "--out", out.url, "--scheduler", scheduler,
                "--no-progress"]) == EXIT_OK
    assert "3 sessions" in capsys.readouterr().out
    requests = rows(out, "requests")
    assert len({r["session_path"] for r in requests}) == 3 and rows(out, "turns")
    row = requests[0]
    text = show(capsys, f"{archive}/{row['session_path']}", "--scope", row["scope"])
    assert f"request   {row['scope']} · entry {row['entry_id']}" in text
