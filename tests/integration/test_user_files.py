"""The small files a user names as input (``--keys``, ``--vak-key-file``, ``--budgets``,
``--prices``, ``--catalog``; docs/reliability.md): read through a pipe of the shell's
``<(...)`` (a secret never written to disk), and never read whole when they are not
small (``/dev/zero`` was read until the kernel killed the process)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pipeline.cli import EXIT_OK, EXIT_UNUSABLE, run
from pipeline.errors import UsageError
from pipeline.io.storage import read_user_file, resolve
from pipeline.ledger.types import USER_FILE_LIMIT
from pipeline.synth.fleet import write_fleet
from pipeline.synth.local_s3 import LocalS3
from pipeline.synth.segments import keys_json, segment_ledger, write_segment_ledger
from tests.helpers.storage import BUCKET

PRICES = b'[[model]]\nprovider = "anthropic"\npattern = "claude-*"\ninput = 1\noutput = 2\n'
BUDGETS = b'[[budget]]\nperiod = "month"\nlimit = 1000\n'
CATALOG = b'[[model]]\npattern = "claude-*"\ninput_limit = 200000\n'


@contextmanager
def piped(data: bytes, tmp_path: Path) -> Iterator[str]:
    """A FIFO a thread writes ``data`` into, as ``<(...)`` gives a command."""
    fifo = tmp_path / f"fifo-{len(list(tmp_path.iterdir()))}"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as sink:
            sink.write(data)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        yield str(fifo)
    finally:
        if writer.is_alive():  # never opened for reading: let the writer go
            with open(fifo, "rb") as drain:
                drain.read()
        writer.join(timeout=10)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """A small archive with a sealed segment ledger, audited; and its keys."""
    base = tmp_path_factory.mktemp("user-files")
    led = segment_ledger(700, sealed=True)
    write_fleet(resolve(str(base / "archive")), sessions=2, seed=7, size_scale=0.2)
    write_segment_ledger(resolve(str(base / "archive")), led)
    assert run(["audit", str(base / "archive"), "--out", str(base / "out"), "--workers", "0",
                "--no-progress"]) == EXIT_OK
    return base, keys_json([led])


@pytest.mark.parametrize("option, command", [
    ("--keys", "audit"), ("--catalog", "replay"), ("--budgets", "cost"),
    ("--prices", "cost"), ("--vak-key-file", "audit")])
def test_a_device_named_as_a_small_file_is_one_line_never_read_whole(
        archive: tuple[Path, bytes], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, option: str, command: str) -> None:
    base, _ = archive
    monkeypatch.setenv("VAKPIPE_KEY_PASSPHRASE", "x")
    more = ["--vak-tenant", str(tmp_path)] if option == "--vak-key-file" else []
    args = ([command, str(base / "out")] if command == "cost" else
            [command, str(base / "archive"), "--out", str(tmp_path / "o"), "--workers", "0"])
    assert run([*args, option, "/dev/zero", *more]) == EXIT_UNUSABLE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vakpipe: error: cannot read "), err
    assert "/dev/zero" in err[0] and f": larger than {USER_FILE_LIMIT >> 20} MiB" in err[0]


def test_each_small_file_reads_from_a_pipe(archive: tuple[Path, bytes], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    # fsspec's local file seeks to its end when opened: a pipe was "UnsupportedOperation".
    base, keys = archive
    with piped(keys, tmp_path) as k, piped(CATALOG, tmp_path) as c:
        assert run(["replay", str(base / "archive"), "--out", str(tmp_path / "r"),
                    "--workers", "0", "--keys", k, "--catalog", c]) == EXIT_OK
    with piped(BUDGETS, tmp_path) as b, piped(PRICES, tmp_path) as p:
        assert run(["cost", str(base / "out"), "--report-dir", str(tmp_path / "c"),
                    "--budgets", b, "--prices", p]) == EXIT_OK
    assert "Traceback" not in capsys.readouterr().err


def test_the_limit_is_the_last_byte_read(tmp_path: Path) -> None:
    at, past = tmp_path / "at", tmp_path / "past"
    at.write_bytes(b"x" * USER_FILE_LIMIT)
    past.write_bytes(b"x" * (USER_FILE_LIMIT + 1))
    assert len(read_user_file(str(at), "the file 'at'")) == USER_FILE_LIMIT
    with pytest.raises(UsageError, match=r"^cannot read the file 'past': larger than 16 MiB"):
        read_user_file(str(past), "the file 'past'")
    with pytest.raises(UsageError, match=r"^cannot read the file 'gone': FileNotFoundError$"):
        read_user_file(str(tmp_path / "gone"), "the file 'gone'")
    with pytest.raises(UsageError, match=r"^cannot read the folder: IsADirectoryError$"):
        read_user_file(str(tmp_path), "the folder")


def test_a_small_file_on_s3_is_read_and_bounded_the_same(
        s3: LocalS3, monkeypatch: pytest.MonkeyPatch) -> None:
    import s3fs

    import pipeline.ledger.types as types

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.pipe_file(f"{BUCKET}/budgets.toml", BUDGETS)
    url = f"s3://{BUCKET}/budgets.toml"
    assert read_user_file(url, "--budgets") == BUDGETS
    monkeypatch.setattr(types, "USER_FILE_LIMIT", len(BUDGETS) - 1)
    with pytest.raises(UsageError, match=r"^cannot read --budgets: larger than 0 MiB"):
        read_user_file(url, "--budgets")
    with pytest.raises(UsageError, match=r"^cannot read --budgets: FileNotFoundError$"):
        read_user_file(f"s3://{BUCKET}/nope.toml", "--budgets")
