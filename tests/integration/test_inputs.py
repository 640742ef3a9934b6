"""Issue 18 (items 3, 4) and issue 17 (item 8): the inputs a user has, through the real CLI.

A single ledger file, a flat folder of Codex rollouts or of Claude Code transcripts,
gzip- and zstd-compressed ledgers are audited (and replayed) like the same files in the
archive layouts; a root that does not exist, an empty one and one of other files each
get their own one line naming the layouts read; a dangling symbolic link named like a
ledger is a finding on its row; a Claude Code subagent transcript whose parent is not in
the archive gets ``subagent_parent_missing``. Each command runs in a process of its own.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cli import EXIT_OK, EXIT_PARTIAL, EXIT_UNUSABLE
from pipeline.io.commit import read_manifest
from pipeline.io.storage import resolve
from pipeline.ledger.layout import cwd_hash, flat_session_key, ledger_stem, parse_session_path
from tests.helpers.data_paths import REAL, SPEC
from tests.helpers.storage import committed_rows, vakpipe_exe

CODEX = REAL / "codex" / "sessions"
CLAUDE = REAL / "claude-code" / "projects"
EXAMPLE = SPEC / "example-ledger.jsonl"
#: Columns that depend on where and how a file is stored, not on what it holds.
STORAGE_COLUMNS = {"session_path", "bytes", "etag", "parent_session_path"}


def vakpipe(*args: str) -> subprocess.CompletedProcess[str]:
    """``vakpipe ARGS`` in a process of its own."""
    return subprocess.run([vakpipe_exe(), *args], capture_output=True, text=True,
                          timeout=300, check=False, env=dict(os.environ))


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """Exit 2 and a single ``vakpipe: error:`` line on stderr; that line."""
    assert done.returncode == EXIT_UNUSABLE, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.startswith("vakpipe: error:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def by_session(out: Path) -> dict[str, dict[str, Any]]:
    """``integrity/sessions`` rows of the top-level transcripts by file name (without a
    compression suffix), without the storage columns."""
    return {r["session_path"].rsplit("/", 1)[-1].removesuffix(".gz").removesuffix(".zst"):
            {k: v for k, v in r.items() if k not in STORAGE_COLUMNS}
            for r in committed_rows(out, "integrity/sessions") if r["subagent"] is None}


def audit(root: Path | str, out: Path, *more: str) -> subprocess.CompletedProcess[str]:
    done = vakpipe("audit", str(root), "--out", str(out), "--no-progress", *more)
    assert done.returncode == EXIT_OK, done.stderr
    return done


def rollouts() -> list[Path]:
    return sorted(CODEX.rglob("rollout-*.jsonl"))


def transcripts() -> list[Path]:
    """The top-level Claude Code transcripts (not subagents)."""
    return sorted(p for p in CLAUDE.glob("*/*.jsonl"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The rows of the real Codex and Claude Code transcripts in their layouts."""
    base = tmp_path_factory.mktemp("reference")
    rows = {}
    for name, root in (("codex", REAL / "codex"), ("claude", REAL / "claude-code")):
        audit(root, base / name)
        rows.update(by_session(base / name))
    return rows


def test_a_single_ledger_file_is_audited_and_replayed(tmp_path: Path) -> None:
    audit(EXAMPLE, tmp_path / "a")
    (row,) = committed_rows(tmp_path / "a", "integrity/sessions")
    assert row["session_path"] == "example-ledger.jsonl"
    assert (row["source"], row["agent"]) == ("vak", "vak")
    # The directory the layout would give: the FNV-1a of the header's cwd, so no
    # cwd_hash_mismatch; the file's stem is its id, not the header's (reported).
    assert row["cwd_hash"] == cwd_hash("/home/me/proj")
    codes = {f["code"] for f in committed_rows(tmp_path / "a", "integrity/findings")}
    assert "cwd_hash_mismatch" not in codes and "session_id_mismatch" in codes
    assert row["entries"] > 0 and row["requests"] > 0
    done = vakpipe("replay", str(EXAMPLE), "--out", str(tmp_path / "r"), "--no-progress")
    assert done.returncode == EXIT_OK, done.stderr
    assert len(committed_rows(tmp_path / "r", "requests")) == row["requests"]


@pytest.mark.parametrize("kind", ["codex", "claude"])
def test_a_flat_folder_of_transcripts_reads_as_their_layout_does(
        kind: str, tmp_path: Path, reference: dict[str, dict[str, Any]]) -> None:
    flat = tmp_path / "flat"
    flat.mkdir()
    files = rollouts() if kind == "codex" else transcripts()
    for path in files:
        shutil.copy(path, flat / path.name)
    audit(flat, tmp_path / "out")
    rows = by_session(tmp_path / "out")
    assert len(rows) == len(files)
    for name, row in rows.items():
        expected = reference[name]
        if kind == "claude":
            # The project directory of the layout; flat, the folder's name.
            assert row.pop("cwd_hash") == "flat"
            expected = {k: v for k, v in expected.items() if k != "cwd_hash"}
        assert row == expected, name


def gzip_file(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(target, "wb") as f:
        f.write(source.read_bytes())


def zstd_file(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with pa.CompressedOutputStream(str(target), "zstd") as f:
        f.write(source.read_bytes())


def test_compressed_ledgers_read_as_the_plain_ones(
        tmp_path: Path, reference: dict[str, dict[str, Any]]) -> None:
    # Codex rollouts gzip-compressed in their layout, Claude Code transcripts
    # zstd-compressed in a flat folder.
    archive = tmp_path / "archive"
    for path in rollouts():
        gzip_file(path, archive / path.relative_to(REAL / "codex").with_suffix(".jsonl.gz"))
    audit(archive, tmp_path / "gz")
    gz = by_session(tmp_path / "gz")
    assert gz == {name: reference[name] for name in gz} and len(gz) == len(rollouts())
    paths = {r["session_path"] for r in committed_rows(tmp_path / "gz", "integrity/sessions")}
    assert all(p.endswith(".jsonl.gz") for p in paths)

    flat = tmp_path / "flat"
    for path in transcripts():
        zstd_file(path, flat / f"{path.name}.zst")
    audit(flat, tmp_path / "zst", "--replay")
    zst = by_session(tmp_path / "zst")
    assert len(zst) == len(transcripts())
    for name, row in zst.items():
        expected = {k: v for k, v in reference[name].items() if k != "cwd_hash"}
        assert {k: v for k, v in row.items() if k != "cwd_hash"} == expected
    assert committed_rows(tmp_path / "zst", "requests")


def test_compressed_ledgers_through_nightly_checkpoints(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    for path in rollouts():
        gzip_file(path, archive / path.relative_to(REAL / "codex").with_suffix(".jsonl.gz"))
    for day in ("2026-12-01", "2026-12-02"):
        done = vakpipe("nightly", str(archive), "--out", str(tmp_path / "n"), "--date", day,
                       "--no-progress")
        assert done.returncode == EXIT_OK, done.stderr
    night = tmp_path / "n" / "date=2026-12-02"
    codes = {f["code"] for f in committed_rows(night, "integrity/findings")}
    assert not codes & {"history_truncated", "history_rewritten", "session_missing"}
    # Checkpoints count the ledger's own (decompressed) bytes.
    checkpoints = {c["session_path"]: c for c in committed_rows(night, "checkpoints")}
    for path in rollouts():
        key = path.relative_to(REAL / "codex").as_posix() + ".gz"
        assert checkpoints[key]["verified_bytes"] == path.stat().st_size


def test_a_damaged_gzip_is_unreadable_not_a_crash(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    (first, second, *_) = rollouts()
    gzip_file(first, archive / first.name.replace(".jsonl", ".jsonl.gz"))
    data = gzip.compress(second.read_bytes())
    (archive / second.name.replace(".jsonl", ".jsonl.gz")).write_bytes(data[: len(data) // 2])
    done = vakpipe("audit", str(archive), "--out", str(tmp_path / "out"), "--no-progress")
    assert done.returncode == EXIT_PARTIAL, done.stderr
    findings = committed_rows(tmp_path / "out", "integrity/findings")
    assert [f["code"] for f in findings if f["code"] == "unreadable_object"] == [
        "unreadable_object"]


def test_a_root_that_does_not_exist_and_an_empty_one_say_so(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    line = one_error_line(vakpipe("audit", str(missing), "--out", str(tmp_path / "o1")))
    assert f"root {missing} does not exist" in line
    empty = tmp_path / "empty"
    empty.mkdir()
    line = one_error_line(vakpipe("audit", str(empty), "--out", str(tmp_path / "o2")))
    assert "no session ledgers found (nothing under it)" in line
    assert "agents/<agent>/sessions/<cwd hash>/<session>.jsonl" in line
    others = tmp_path / "others"
    others.mkdir()
    (others / "notes.txt").write_text("hello")
    (others / "data.jsonl").write_text('{"a": 1}\n')  # JSON no format claims
    line = one_error_line(vakpipe("replay", str(others), "--out", str(tmp_path / "o3")))
    assert "no session ledgers found (2 other objects under it)" in line
    assert "'data.jsonl'" in line and "rollout-*.jsonl (Codex)" in line
    assert "projects/<dir>/<session>.jsonl (Claude Code)" in line
    assert not any((tmp_path / name).exists() for name in ("o1", "o2", "o3"))


def test_a_dangling_link_named_like_a_ledger_is_a_finding(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    folder = archive / "agents" / "vak" / "sessions" / cwd_hash("/home/me/proj")
    folder.mkdir(parents=True)
    shutil.copy(EXAMPLE, folder / "0199a1f2-5f00-7000-8000-00000000abcd.jsonl")
    link = folder / "0199a1f2-5f00-7000-8000-00000000dead.jsonl"
    link.symlink_to(tmp_path / "gone.jsonl")
    done = vakpipe("audit", str(archive), "--out", str(tmp_path / "out"), "--no-progress")
    assert done.returncode == EXIT_PARTIAL, done.stderr
    rows = {r["session_path"]: r for r in committed_rows(tmp_path / "out",
                                                         "integrity/sessions")}
    rel = link.relative_to(archive).as_posix()
    assert rows[rel]["status"] == "error" and len(rows) == 2
    (finding,) = [f for f in committed_rows(tmp_path / "out", "integrity/findings")
                  if f["session_path"] == rel]
    assert finding["code"] == "unreadable_object"
    assert "dangling symbolic link" in finding["detail"]
    # Never followed nor created: the link is as it was, its target still absent.
    assert link.is_symlink() and not (tmp_path / "gone.jsonl").exists()
    assert (read_manifest(resolve(str(tmp_path / "out"))) or {})["partial"] is True


def claude_archive(tmp_path: Path, *, parent: bool) -> tuple[Path, str, str]:
    """A Claude Code project holding one subagent transcript, with or without its
    parent; the subagent's id and its parent's."""
    subagent = next(CLAUDE.glob("*/*/subagents/agent-a*.jsonl"))
    session_dir = subagent.parent.parent
    project = session_dir.parent
    root = tmp_path / "archive" / "projects" / project.name
    target = root / session_dir.name / "subagents" / subagent.name
    target.parent.mkdir(parents=True)
    shutil.copy(subagent, target)
    if parent:
        shutil.copy(project / f"{session_dir.name}.jsonl", root / f"{session_dir.name}.jsonl")
    return tmp_path / "archive", subagent.stem[len("agent-"):], session_dir.name


@pytest.mark.parametrize("parent", [False, True])
def test_a_subagent_without_its_parent_is_reported(tmp_path: Path, parent: bool) -> None:
    archive, agent_id, parent_id = claude_archive(tmp_path, parent=parent)
    audit(archive, tmp_path / "out")
    orphans = [f for f in committed_rows(tmp_path / "out", "integrity/findings")
               if f["code"] == "subagent_parent_missing"]
    if parent:
        assert orphans == []
    else:
        (finding,) = orphans
        assert finding["severity"] == "info" and parent_id in finding["detail"]
    # --session picks the subagent alone: the flag still comes from the whole listing.
    done = vakpipe("replay", str(archive), "--out", str(tmp_path / "r"), "--session",
                   agent_id, "--no-progress")
    assert done.returncode == EXIT_OK, done.stderr
    codes = [f["code"] for f in committed_rows(tmp_path / "r", "integrity/findings")]
    assert codes.count("subagent_parent_missing") == (0 if parent else 1)


# --- keys of flat and compressed files (pure) ---------------------------------------------

_NAMES = st.text(st.characters(codec="utf-8"), max_size=30)


@settings(max_examples=300, deadline=None)
@given(name=_NAMES, suffix=st.sampled_from(["", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".gz"]),
       source=st.sampled_from(["vak", "claude-code", "codex"]))
def test_flat_keys_are_plain_names(name: str, suffix: str, source: str) -> None:
    relative = name + suffix
    key = flat_session_key(relative, "folder", source)
    if key is None:
        return
    assert ledger_stem(relative.rsplit("/", 1)[-1]) is not None
    assert key.path == relative and key.agent == {"vak": "vak"}.get(source, source)
    for segment in relative.split("/"):
        assert segment not in ("", ".", "..")
        assert not any(ord(c) < 0x20 or c == "\\" for c in segment)
    assert key.compression == {".jsonl.gz": "gzip", ".jsonl.zst": "zstd"}.get(suffix)


@settings(max_examples=200, deadline=None)
@given(stem=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e,
                                  exclude_characters="/\\."), min_size=1, max_size=20),
       suffix=st.sampled_from([".gz", ".zst"]))
def test_a_compressed_ledger_keys_as_the_plain_one(stem: str, suffix: str) -> None:
    for plain in (f"agents/vak/sessions/h/{stem}.jsonl", f"projects/p/{stem}.jsonl",
                  f"projects/p/s/subagents/agent-{stem}.jsonl"):
        key, packed = parse_session_path(plain), parse_session_path(plain + suffix)
        assert key is not None and packed is not None
        assert (packed.agent, packed.cwd_hash, packed.session_id) == (
            key.agent, key.cwd_hash, key.session_id)
        assert packed.path == plain + suffix
        assert packed.parent == (key.parent + suffix if key.parent else None)
