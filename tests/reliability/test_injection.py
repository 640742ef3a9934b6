"""Issue 16, item 6: what a transcript holds never acts in what people open.

Two sessions whose model names are markup (``<a href="https://evil">x</a>``) and a
spreadsheet formula (``=HYPERLINK(...)``), one of whose messages holds terminal escapes
(a window title, a screen clear) and a line break in its model name, run through the
real CLI as a user runs it: ``audit --replay``, ``cost`` (HTML and CSV) and ``show``.
The page shows the markup as text (plotly renders a subset of HTML in legends and hover
text), the CSV cell cannot be evaluated, and nothing printed holds an ESC byte.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers.ledgers import LedgerBuilder, session_key, usage
from tests.helpers.storage import vakpipe_exe

LINK = '<a href="https://evil">x</a>'
FORMULA = '=HYPERLINK("http://x","y")'
ESCAPES = "\x1b]0;pwned\x07\x1b[2J"
#: A model name that would start a line of its own, with a C1 CSI in it.
BROKEN = "gemma\n\x9b2Jfake line"


def rechained(lines: list[bytes], edits: dict[bytes, bytes]) -> bytes:
    """``lines`` (bodies) with each key of ``edits`` replaced by its value, every
    ``prev_hash`` after an edited line updated so the chain still holds."""
    renamed: dict[str, str] = {}
    out = []
    for line in lines:
        fresh = line
        for old, new in edits.items():
            fresh = fresh.replace(old, new)
        for was, now in renamed.items():
            fresh = fresh.replace(f'"prev_hash":"{was}"'.encode(),
                                  f'"prev_hash":"{now}"'.encode())
        renamed[hashlib.sha256(line).hexdigest()] = hashlib.sha256(fresh).hexdigest()
        out.append(fresh)
    return b"\n".join(out) + b"\n"


def hostile_session(session_id: str, model: str, text: str) -> tuple[str, bytes]:
    b = LedgerBuilder()
    b.header(session_id=session_id)
    b.user(text)
    b.assistant(f"ok {text}", u=usage(120, 10))
    b.user("again")
    b.assistant("done", u=usage(160, 20))
    lines = [line.rstrip(b"\n") for line in b.physical()]
    escaped = json.dumps(model)[1:-1].encode()
    # a provider no price rule knows: the names are printed as unpriced on stderr too
    edits = {b"gemma4:e2b-mlx": escaped, b'"provider":"ollama"': b'"provider":"evilcorp"'}
    return session_key(session_id).path, rechained(lines, edits)


def vakpipe(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([vakpipe_exe(), *args], capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("injection") / "archive"
    sessions = [hostile_session("0199a1f2-5f00-7000-8000-0000000000a1", LINK, f"hi {ESCAPES}"),
                hostile_session("0199a1f2-5f00-7000-8000-0000000000a2", FORMULA, "plain"),
                hostile_session("0199a1f2-5f00-7000-8000-0000000000a3", BROKEN, ESCAPES)]
    for rel, data in sessions:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root, [rel for rel, _ in sessions]


def test_report_csv_and_terminal_show_data_as_text(
        archive: tuple[Path, list[str]], tmp_path: Path) -> None:
    root, rels = archive
    out = tmp_path / "out"
    printed = []
    done = vakpipe("audit", str(root), "--out", str(out), "--replay", "--workers", "1",
                   "--no-progress")
    printed += [done.stdout, done.stderr]
    done = vakpipe("cost", str(out), "--by", "day,model,provider,session")
    printed += [done.stdout, done.stderr]
    assert "NOT PRICED" in done.stdout + done.stderr  # the hostile names were reported

    page = (out / "cost" / "report.html").read_text()
    assert "&lt;a href=" in page, "the model name is in the page, as text"
    for raw in (LINK, '<a href="https://evil"', '<a href=\\"https://evil\\"',
                "\\u003ca href", "href=\\u0022https://evil"):
        assert raw not in page, raw

    rows = list(csv.DictReader(io.StringIO((out / "cost" / "costs.csv").read_text())))
    models = {r["model"] for r in rows}
    assert "'" + FORMULA in models and FORMULA not in models
    for row in rows:
        for value in row.values():
            if value and value[0] in "=+@\t\r":
                pytest.fail(f"a CSV cell a spreadsheet would evaluate: {value!r}")
        assert float(row["billed_usd"]) >= 0  # numbers stay numbers

    for rel, scope in ((rels[0], "t1/i1"), (rels[2], "t1/i1"), (rels[2], "t2/i1")):
        done = vakpipe("show", str(root / rel), "--scope", scope, "--full")
        printed += [done.stdout, done.stderr]
        assert "request   " in done.stdout
        assert "\\x1b]0;pwned\\x07" in done.stdout  # shown, escaped
    shown = done.stdout
    model_lines = [ln for ln in shown.splitlines() if ln.startswith("model     ")]
    assert model_lines == [ln for ln in shown.splitlines() if "fake line" in ln], \
        "a line break in a model name started a line of its own"
    everything = "".join(printed)
    for byte in ("\x1b", "\x07", "\x9b", "\r"):
        assert byte not in everything, repr(byte)
