"""Issue 16: nothing a run writes, moves or deletes can reach the archive it reads.

Each attack an outside test reproduced (every one deleted or overwrote archive ledgers
and exited 0) runs the real ``vakpipe`` in a process of its own, on a local archive and
a local output, and proves the archive byte for byte what it was (a hash of every file,
link and folder under it):

* a crafted ``OUT/_manifest.json`` whose dataset or file names climb out of ``OUT``
  (``usage/../../archive/...``, absolute, backslashes, NUL): exit 2, one line, nothing
  deleted; ``--force`` sets it aside and deletes nothing it names;
* a corrupt manifest (not JSON, another shape, nested past the parser): exit 2, one
  line; ``--force`` sets it aside as ``_manifest.json.corrupt-<run_id>`` and commits;
* symbolic links inside ``OUT`` where vakpipe writes (``_staging``, a dataset folder,
  ``archive`` of ``compact --write-archive``, the manifest): refused, exit 2, the link
  left as it is; a stray link inside ``_staging`` is unlinked, never followed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import EXIT_OK, EXIT_UNUSABLE
from pipeline.io.commit import MANIFEST, STAGING, read_manifest
from pipeline.io.storage import resolve
from tests.helpers.fleets import copied_fleet
from tests.helpers.storage import run_vakpipe

WINDOW = "8000"  # small enough that the fleet below gets packets (compacted copies)


vakpipe = run_vakpipe


def fingerprint(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a file's SHA-256, a link's target, or ``dir``."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[rel] = f"link:{os.readlink(path)}"
            elif path.is_dir():
                found[rel] = "dir"
            else:
                found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


#: Each test attacks its own copy (an attack that worked would change it).
generated, archive = copied_fleet("fleet", sessions=6, seed=3)


def ledgers(archive: Path) -> list[Path]:
    return sorted(archive.glob("agents/*/sessions/*/*.jsonl"))


def audit(archive: Path, out: Path, scheduler: str, *extra: str,
          command: str = "audit") -> subprocess.CompletedProcess[str]:
    return vakpipe(command, str(archive), "--out", str(out), "--scheduler", scheduler,
                   "--no-progress", *extra)


def refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2, and one line on stderr saying so."""
    assert done.returncode == EXIT_UNUSABLE, (done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vakpipe: error: "), done.stderr
    for word in words:
        assert word in lines[0], lines[0]


def forced_aside(out: Path, bad: bytes) -> None:
    """The bad manifest is under ``_manifest.json.corrupt-<run_id>`` of the run that
    committed since, byte for byte."""
    manifest = read_manifest(resolve(str(out)))
    assert manifest is not None
    aside = out / f"{MANIFEST}.corrupt-{manifest['run_id']}"
    assert aside.read_bytes() == bad


# --- crafted and corrupt manifests --------------------------------------------------------


def hostile(archive: Path) -> dict[str, dict[str, Any]]:
    """Manifest ``datasets`` naming archive ledgers from ``OUT`` (beside the archive)."""
    first = ledgers(archive)[0]
    folder = first.parent.relative_to(archive).as_posix()
    up = f"../../{archive.name}/{folder}"
    return {
        "dot-dot-dataset": {f"usage/{up}": {"files": [first.name], "rows": 1}},
        "dot-dot-file": {"archive": {"files": [f"{up}/{first.name}"],
                                     "rows": 1}},
        "absolute-file": {"turns": {"files": [str(first)], "rows": 1}},
        "absolute-dataset": {str(first.parent): {"files": [first.name], "rows": 1}},
        "backslash": {"turns": {"files": [f"..\\..\\{archive.name}\\x"], "rows": 1}},
        "nul": {"turns": {"files": ["part-x\x00.parquet"], "rows": 1}},
        "nested-part": {"turns": {"files": [f"{up}/{first.name}"], "rows": 1}},
    }


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["dot-dot-dataset", "dot-dot-file", "absolute-file",
                                    "absolute-dataset", "backslash", "nul", "nested-part"])
def test_a_manifest_naming_paths_out_of_its_output_is_refused_and_nothing_is_deleted(
    attack: str, archive: Path, tmp_path: Path, scheduler: str
) -> None:
    out = tmp_path / "out"
    assert audit(archive, out, scheduler).returncode == EXIT_OK
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["datasets"].update(hostile(archive)[attack])
    bad = json.dumps(manifest).encode()
    (out / MANIFEST).write_bytes(bad)
    # A file of a dataset this run does not write, named by the bad manifest: kept.
    (out / "turns").mkdir()
    (out / "turns" / "part-old-00000.parquet").write_bytes(b"old")
    before, outputs = fingerprint(archive), fingerprint(out)

    refused(audit(archive, out, scheduler), "_manifest.json is corrupt", "--force")
    assert fingerprint(archive) == before
    assert fingerprint(out) == outputs  # refused before anything was written

    forced = audit(archive, out, scheduler, "--force")
    assert forced.returncode == EXIT_OK, forced.stderr
    assert fingerprint(archive) == before
    forced_aside(out, bad)
    assert (out / "turns" / "part-old-00000.parquet").read_bytes() == b"old"


CORRUPT = {
    "truncated": b'{"run_id": "r", "datasets": {"usage": {"fil',
    "not-an-object": b"[]",
    "no-datasets": b'{"run_id": "r"}',
    "files-not-a-list": b'{"datasets": {"usage": {"files": "part-1.parquet"}}}',
    "not-utf8": b"\xff\xfe\x00{",
    "nested-past-the-parser": b"[" * 200_000 + b"]" * 200_000,
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_a_corrupt_manifest_is_one_line_exit_2_and_force_sets_it_aside(
    kind: str, archive: Path, tmp_path: Path, scheduler: str
) -> None:
    out = tmp_path / "out"
    assert audit(archive, out, scheduler, "--replay").returncode == EXIT_OK
    old_parts = sorted(p.relative_to(out) for p in out.rglob("part-*.parquet"))
    (out / MANIFEST).write_bytes(CORRUPT[kind])
    (out / "usage" / "notes.txt").write_text("mine")  # not a part: never vakpipe's
    before, outputs = fingerprint(archive), fingerprint(out)

    refused(audit(archive, out, scheduler), "_manifest.json is corrupt", "--force")
    assert fingerprint(out) == outputs and fingerprint(archive) == before

    forced = audit(archive, out, scheduler, "--force")
    assert forced.returncode == EXIT_OK, forced.stderr
    forced_aside(out, CORRUPT[kind])
    assert fingerprint(archive) == before
    # The parts of the audit's own datasets were cleaned (part names only); the replay
    # tables the bad manifest may have named are left, and so is a file of the user's.
    new = read_manifest(resolve(str(out)))
    assert new is not None
    parts = sorted(p.relative_to(out) for p in out.rglob("part-*.parquet"))
    assert {p.parent.as_posix() for p in parts if new["run_id"] not in p.name} == \
        {"turns", "requests"}
    assert {p for p in old_parts if p.parent.as_posix() in ("turns", "requests")} <= \
        set(parts)
    assert (out / "usage" / "notes.txt").read_text() == "mine"


# --- symbolic links inside OUT ----------------------------------------------------------


def link_targets(archive: Path) -> dict[str, Path]:
    first = ledgers(archive)[0]
    return {"_staging": first.parent.parent, "usage": first.parent,
            "integrity": archive / "agents", "archive": archive, MANIFEST: first}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["_staging", "usage", "integrity", "archive", MANIFEST])
def test_a_symbolic_link_inside_the_output_is_refused(
    name: str, archive: Path, tmp_path: Path, scheduler: str
) -> None:
    command = "compact" if name == "archive" else "audit"
    extra = ("--window", WINDOW, "--write-archive") if name == "archive" else ()
    if name == "archive":  # the run would write compacted copies there
        clean = audit(archive, tmp_path / "clean", scheduler, *extra, command=command)
        assert clean.returncode == EXIT_OK, clean.stderr
        assert list((tmp_path / "clean" / "archive").rglob("*.jsonl"))
    out = tmp_path / "out"
    out.mkdir()
    target = link_targets(archive)[name]
    (out / name).symlink_to(target, target_is_directory=target.is_dir())
    before = fingerprint(archive)

    refused(audit(archive, out, scheduler, *extra, command=command), "symbolic link")
    assert fingerprint(archive) == before
    assert fingerprint(out) == {name: f"link:{target}"}  # nothing written, link kept
    # --force is about manifests: links are refused all the same.
    refused(audit(archive, out, scheduler, *extra, "--force", command=command),
            "symbolic link")
    assert fingerprint(archive) == before


@pytest.mark.slow
def test_a_link_among_stale_staging_folders_is_unlinked_never_followed(
    archive: Path, tmp_path: Path, scheduler: str
) -> None:
    out = tmp_path / "out"
    (out / STAGING).mkdir(parents=True)
    # What a staging folder of an older run would be called: the clean-up removes those.
    stale = out / STAGING / "20000101T000000000000Z-00000000"
    stale.symlink_to(ledgers(archive)[0].parent, target_is_directory=True)
    before = fingerprint(archive)
    done = audit(archive, out, scheduler)
    assert done.returncode == EXIT_OK, done.stderr
    assert not os.path.lexists(stale)
    assert fingerprint(archive) == before


@pytest.mark.slow
def test_a_previous_run_s_file_reached_through_a_link_is_never_deleted(
    archive: Path, tmp_path: Path, scheduler: str
) -> None:
    """A valid manifest naming compacted copies, with ``OUT/archive`` replaced by a link
    to the archive: the clean-up would delete the source ledgers. Refused."""
    out = tmp_path / "out"
    done = audit(archive, out, scheduler, "--window", WINDOW, "--write-archive",
                 command="compact")
    assert done.returncode == EXIT_OK, done.stderr
    shutil.rmtree(out / "archive")
    (out / "archive").symlink_to(archive, target_is_directory=True)
    before = fingerprint(archive)
    refused(audit(archive, out, scheduler), "symbolic link")
    assert fingerprint(archive) == before


# --- files a user names (--file, --html) that are not files ------------------------------


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_a_named_file_that_is_a_fifo_or_a_socket_is_refused_and_kept(
    archive: Path, tmp_path: Path, kind: str
) -> None:
    """The write renames a new file onto the name: a FIFO, a socket or a device there
    became a regular file (as root, ``--file /dev/full`` replaced the device node; a
    device is not made here, which needs root). Now refused, the special file kept."""
    import socket
    import stat

    out = tmp_path / "out"
    done = vakpipe("audit", str(archive), "--out", str(out), "--workers", "0", "--no-progress")
    assert done.returncode == EXIT_OK, done.stderr
    target = tmp_path / "special"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(target))
    try:
        said = "a FIFO" if kind == "fifo" else "a socket"
        refused(vakpipe("export", "otel", str(out), "--file", str(target)), said)
        refused(vakpipe("dashboard", str(out), "--html", str(target)), said)
        mode = target.lstat().st_mode
        assert stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISSOCK(mode)
    finally:
        if kind == "socket":
            server.close()
