"""Row 13: hostile keys in the archive listing are never used as local paths; they are
reported (skipped, counted, named escaped) or kept verbatim as data.

Keys are data. A key is a session only in the exact layout
``agents/<agent>/sessions/<dir>/<stem>.jsonl`` with no empty, ``.`` or ``..`` segment,
no control character and no backslash; anything else is skipped and counted, and the
summary and the manifest name a few, escaped (:func:`pipeline.io.storage.printable`).
Kept keys travel verbatim into the ``session_path`` columns and, with ``compact
--write-archive``, become the layout of ``OUT/archive``: they never climb out of it, and
one the output's filesystem cannot hold as a name (too long) is left uncopied.
Symbolic links under a local root are skipped, never followed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import fsspec
import pytest
import s3fs

from pipeline.cli import EXIT_OK, EXIT_UNUSABLE, run
from pipeline.errors import EmptyInputError, OutputInsideArchiveError
from pipeline.io.commit import read_manifest
from pipeline.io.storage import check_output, enumerate_sessions, printable, resolve
from pipeline.synth.generator import generate_session
from pipeline.synth.local_s3 import LocalS3
from tests.helpers.storage import BUCKET, committed_rows

H = "2d872b17b24e117e"
LONG = "L" * 900
#: Kept: valid layout, every segment plain data (nothing decodes or resolves them).
KEPT = [
    "agents/vak/sessions/%2e%2e/pct.jsonl",
    f"agents/vak/sessions/{H}/..%2f..%2fescape.jsonl",
    f"agents/vak/sessions/{H}/\u2024\u2024\u2215\u2024\u2024\u2215etc.jsonl",  # ․․∕ lookalikes
    f"agents/vak/sessions/{H}/\uff0e\uff0e\uff0fpasswd.jsonl",  # fullwidth ．．／
    f"agents/vak/sessions/{H}/\u202eevil.jsonl",  # a right-to-left override
    f"agents/vak/sessions/{H}/{LONG}.jsonl",  # S3 takes it; a local file name cannot
    f"agents/vak/sessions/{H}/plain.jsonl",
]
#: Skipped: not the layout, a dot segment, a control character, a backslash.
SKIPPED = [
    "agents/vak/sessions/../x.jsonl",
    f"agents/vak/sessions/{H}/../../../../etc.jsonl",
    f"agents/vak/sessions/{H}/a\\..\\..\\b.jsonl",
    f"agents/vak/sessions/{H}/tab\tname.jsonl",
    f"agents/vak/sessions/{H}/\x1b[31mred.jsonl",
    "/etc/passwd.jsonl",  # the key "archive//etc/passwd.jsonl"
    f"agents/vak/sessions/{H}//abs.jsonl",
    f"\u0430gents/vak/sessions/{H}/cyrillic.jsonl",  # а (U+0430) for a
]
#: Keys moto's server cannot hold (real S3 takes a line break): memory:// only.
SKIPPED_MEMORY = [f"agents/vak/sessions/{H}/nul\x00.jsonl",
                  f"agents/vak/sessions/{H}/line\nbreak.jsonl"]
WINDOW = 8000  # small enough that every generated session of 24 turns gets packets


def session_bytes(seed: int) -> bytes:
    return b"".join(generate_session(seed, turns=24).lines())


def tree(base: Path, skip: Path) -> dict[str, bytes]:
    """Every file under ``base`` but outside ``skip``, with its bytes."""
    out = {}
    for dirpath, _, files in os.walk(base):
        if Path(dirpath).is_relative_to(skip):
            continue
        for name in files:
            p = Path(dirpath, name)
            out[str(p.relative_to(base))] = p.read_bytes()
    return out


def only_plain_ascii(text: str) -> bool:
    return all(c == "\n" or " " <= c <= "~" for c in text)


@pytest.mark.slow
def test_hostile_s3_keys_are_reported_escaped_and_never_local_paths(
    s3: LocalS3, scheduler: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    for i, key in enumerate(KEPT):
        fs.pipe_file(f"{BUCKET}/archive/{key}", session_bytes(i))
    for key in SKIPPED:
        fs.pipe_file(f"{BUCKET}/archive/{key}", session_bytes(99))
    # Decoys where a decoded or resolved key would land, on the local disk around OUT.
    (tmp_path / "etc.jsonl").write_bytes(b"decoy")
    out = tmp_path / "reports" / "out"
    out.parent.mkdir()
    before = tree(tmp_path, out)
    capsys.readouterr()
    code = run(["compact", f"s3://{BUCKET}/archive", "--out", str(out), "--scheduler",
                scheduler, "--no-progress", "--window", str(WINDOW), "--write-archive"])
    printed = capsys.readouterr()
    assert code == EXIT_OK, printed.err
    # Nothing outside OUT was written; inside, the copies mirror the kept keys verbatim,
    # except the one too long for a local name, whose packets say so.
    assert tree(tmp_path, out) == before
    copies = {p.relative_to(out / "archive").as_posix()
              for p in (out / "archive").rglob("*") if p.is_file()}
    assert copies == set(KEPT) - {f"agents/vak/sessions/{H}/{LONG}.jsonl"}
    for p in out.rglob("*"):
        assert os.path.realpath(p).startswith(str(out) + os.sep)
    packets = committed_rows(out, "compaction")
    long_rows = [r for r in packets if LONG in r["session_path"]]
    assert long_rows and not any(r["archived"] for r in long_rows)
    assert {r["session_path"] for r in packets if r["archived"]} == copies
    # The tables name the kept sessions by their exact keys.
    sessions = committed_rows(out, "integrity/sessions")
    assert sorted(r["session_path"] for r in sessions) == sorted(KEPT)
    # The skipped ones are counted and named escaped, on the console and in the manifest.
    manifest = read_manifest(resolve(str(out)))
    assert manifest is not None and manifest["skipped_objects"] == len(SKIPPED)
    assert manifest["skipped_examples"] == [printable(k) for k in sorted(SKIPPED)[:5]]
    assert f"({len(SKIPPED)} other objects skipped)" in printed.out
    assert only_plain_ascii(printed.out) and only_plain_ascii(printed.err)
    assert "tab\\tname.jsonl" in printed.out or "\\x1b[31mred" in printed.out


def test_hostile_memory_keys_with_nul_and_line_breaks_are_skipped_and_escaped(
    memfs: fsspec.AbstractFileSystem, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = "memory://hostile/archive"
    for i, key in enumerate(KEPT[:2]):
        memfs.pipe_file(f"{root}/{key}", session_bytes(i))
    for key in SKIPPED_MEMORY:
        memfs.pipe_file(f"{root}/{key}", session_bytes(99))
    out = tmp_path / "out"
    capsys.readouterr()
    assert run(["audit", root, "--out", str(out), "--workers", "1", "--no-progress"]) == EXIT_OK
    printed = capsys.readouterr().out
    assert only_plain_ascii(printed)
    assert "nul\\x00.jsonl" in printed and "line\\nbreak.jsonl" in printed
    manifest = read_manifest(resolve(str(out)))
    assert manifest is not None and manifest["skipped_objects"] == 2
    assert manifest["skipped_examples"] == [printable(k) for k in sorted(SKIPPED_MEMORY)]
    assert all(only_plain_ascii(k) for k in manifest["skipped_examples"])


def _local_archive(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """A local archive with hostile names and symbolic links out of it; a secret outside."""
    root = tmp_path / "archive"
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    secret = session_bytes(7).replace(b"You are vak", b"SECRET-OUTSIDE")
    (outside / "secret.jsonl").write_bytes(secret)
    (outside / "sub" / "secret2.jsonl").write_bytes(secret)
    kept = [k for k in KEPT if LONG not in k] + [f"agents/vak/sessions/{H}/{'L' * 240}.jsonl"]
    skipped = [f"agents/vak/sessions/{H}/tab\tname.jsonl",
               f"agents/vak/sessions/{H}/line\nbreak.jsonl",
               f"agents/vak/sessions/{H}/a\\..\\b.jsonl",
               f"agents/vak/sessions/{H}/link.jsonl",  # -> ../../../../../outside/...
               f"agents/vak/sessions/{H}/linkdir"]  # a folder link, with a ledger in it
    for i, key in enumerate(kept):
        p = root / key
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(session_bytes(i))
    for key in skipped[:3]:
        (root / key).write_bytes(session_bytes(99))
    (root / skipped[3]).symlink_to(outside / "secret.jsonl")
    (root / skipped[4]).symlink_to(outside / "sub", target_is_directory=True)
    return root, outside, kept


def test_local_hostile_names_and_links_out_of_the_root_are_skipped(
    tmp_path: Path, scheduler: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _, kept = _local_archive(tmp_path)
    listing = enumerate_sessions(resolve(str(root)))
    assert sorted(s.key.path for s in listing.sessions) == sorted(kept)
    assert listing.skipped == 5
    for s in listing.sessions:  # every path read is the listed file itself, under root
        assert os.path.realpath(s.full_path) == s.full_path
        assert s.full_path.startswith(str(root) + os.sep)
    out = tmp_path / "out"
    capsys.readouterr()
    assert run(["audit", str(root), "--out", str(out), "--scheduler", scheduler,
                "--no-progress", "--replay"]) == EXIT_OK
    assert only_plain_ascii(capsys.readouterr().out)
    rows: list[dict[str, Any]] = []
    for dataset in ("integrity/sessions", "integrity/findings", "turns", "requests"):
        rows += committed_rows(out, dataset)
    assert "SECRET-OUTSIDE" not in repr(rows)  # the linked ledgers were never read
    assert {r["session_path"] for r in rows} == set(kept)


def test_local_names_that_are_not_utf8_are_skipped_and_the_run_finishes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A local disk's name may be any bytes (object stores' keys are UTF-8): one that is
    not UTF-8 (a Latin-1 folder copied from an old machine) cannot be a session_path, so
    it is skipped and counted as a key no layout takes. It crashed the run's table
    building with "surrogates not allowed"; in a flat folder, its sniffing too."""
    root = tmp_path / "archive"
    good = f"agents/vak/sessions/{H}/plain.jsonl"
    bad = [os.fsdecode(b"agents/vak/sessions/" + H.encode() + b"/caf\xe9.jsonl"),
           os.fsdecode(b"agents/vak/sessions/d\xe9j\xe0/s.jsonl"),
           os.fsdecode(b"notes-\xff.txt")]
    for key in (good, *bad):
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(session_bytes(3))
    listing = enumerate_sessions(resolve(str(root)))
    assert [s.key.path for s in listing.sessions] == [good] and listing.skipped == 3
    out = tmp_path / "out"
    capsys.readouterr()
    assert run(["audit", str(root), "--out", str(out), "--workers", "0",
                "--no-progress"]) == EXIT_OK
    said = capsys.readouterr().out
    assert only_plain_ascii(said) and "caf\\udce9.jsonl" in said, said
    assert {r["session_path"] for r in committed_rows(out, "integrity/sessions")} == {good}
    manifest = read_manifest(resolve(str(out)))
    assert manifest is not None and manifest["skipped_objects"] == 3
    # A flat folder of ledgers (no layout): the one with such a name is skipped unread.
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "a.jsonl").write_bytes(session_bytes(4))
    (flat / os.fsdecode(b"\xe9t\xe9.jsonl")).write_bytes(session_bytes(5))
    listing = enumerate_sessions(resolve(str(flat)))
    assert [s.full_path for s in listing.sessions] == [str(flat / "a.jsonl")]
    assert listing.skipped == 1
    # Given as the root itself: said so, not "no session ledgers found".
    with pytest.raises(EmptyInputError, match=r"\\udce9\.jsonl: a file name that is not UTF-8"):
        enumerate_sessions(resolve(str(flat / os.fsdecode(b"\xe9t\xe9.jsonl"))))


# --- outputs through symbolic links -------------------------------------------------------


def test_check_output_resolves_symbolic_links(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    archive.mkdir()
    (tmp_path / "into-archive").symlink_to(archive, target_is_directory=True)
    with pytest.raises(OutputInsideArchiveError, match="inside the archive"):
        check_output(resolve(str(archive)), resolve(str(tmp_path / "into-archive" / "out")))
    # The other way round: the archive reached through a link into the output.
    out = tmp_path / "out"
    (out / "data").mkdir(parents=True)
    (tmp_path / "archive-link").symlink_to(out / "data", target_is_directory=True)
    with pytest.raises(OutputInsideArchiveError, match="inside the output"):
        check_output(resolve(str(tmp_path / "archive-link")), resolve(str(out)))
    check_output(resolve(str(archive)), resolve(str(tmp_path / "elsewhere")))


def test_cli_refuses_an_output_linked_into_the_archive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _, _ = _local_archive(tmp_path)
    (tmp_path / "reports").symlink_to(root / "agents", target_is_directory=True)
    before = tree(root, tmp_path / "nowhere")
    capsys.readouterr()
    assert run(["audit", str(root), "--out", str(tmp_path / "reports" / "out"),
                "--workers", "1", "--no-progress"]) == EXIT_UNUSABLE
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "inside the archive" in err
    assert tree(root, tmp_path / "nowhere") == before
