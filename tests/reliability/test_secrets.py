"""Row 14: secrets in transcripts never reach an output or a log.

Two sessions are stuffed with credentials of every kind :mod:`pipeline.ledger.redact` knows:
a generated 24-turn session with them in every prompt, tool result, answer and turn
card (so compaction summarises them), and a small one with them in entry ids, kinds,
model and provider names, receipt fields, a ``prev_hash`` and the header. Every command
that writes or prints runs on them as a user runs it (the installed script, its workers
and their logs): ``audit --replay --planner``, ``compact`` with the cards summariser and
``--write-archive``, ``compact`` with the HTTP summariser (whose requests are recorded:
a secret must not be sent to an endpoint either, and one the model echoes back is
redacted), ``nightly``, ``cost`` (CSV and HTML) and ``show --full``. No secret may be in
any Parquet column, any other output file, stdout or stderr.

Decided (docs/reliability.md): a compacted archive (``--write-archive``) is a copy of the
user's own ledger plus packets; the ledger's bytes are copied verbatim (anything else
would break its hash chain), only the appended packets are held to the rule. Object keys
(``session_path``) name the archive's objects and are not redacted either.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.ledger.redact import RULES, TRIGGER, quote, redact, redact_value
from pipeline.synth.generator import generate_session
from pipeline.tables.redact import redact_table
from tests.helpers.http import Reply, Server
from tests.helpers.ledgers import LedgerBuilder, attempt, session_key, usage
from tests.helpers.storage import vakpipe_exe

#: kind -> (text as it appears in a transcript, the part that must never be output)
SECRETS: dict[str, tuple[str, str]] = {
    "aws_access_key": ("AKIAZ7Q3XAMPLE7KEY42", "AKIAZ7Q3XAMPLE7KEY42"),
    "aws_secret_key": ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYzSECRET99",
                       "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzSECRET99"),
    "github_token": ("ghp_R3aLL0ngT0kenF0rTheTest5uite12345678",
                     "ghp_R3aLL0ngT0kenF0rTheTest5uite12345678"),
    "openai_key": ("OPENAI_API_KEY=sk-proj-Tq9vXw2LmN8pR4sT6uV0yZ1aB3cD5eF7gH9",
                   "sk-proj-Tq9vXw2LmN8pR4sT6uV0yZ1aB3cD5eF7gH9"),
    "anthropic_key": ("sk-ant-api03-Zx8Cv7Bn6Mm5Ll4Kk3Jj2Hh1Gg0Ff9Dd8Ss7Aa6",
                      "sk-ant-api03-Zx8Cv7Bn6Mm5Ll4Kk3Jj2Hh1Gg0Ff9Dd8Ss7Aa6"),
    "slack_token": ("xoxb-2481632641-1357911131517-QwErTyUiOpAsDfGh",
                    "xoxb-2481632641-1357911131517-QwErTyUiOpAsDfGh"),
    "jwt": ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ2YWtwaXBlIn0.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg",
            "eyJzdWIiOiJ2YWtwaXBlIn0.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg"),
    "private_key": ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAE"
                    "bm9uZQAAAAAAAAAB\nAAAAMwAAAAtzc2gtZWQyNTUxOQ\n"
                    "-----END OPENSSH PRIVATE KEY-----",
                    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAE"),
    "url_password": ("postgres://admin:Hunter2Tr0ub4dorX@db.internal:5432/app",
                     "Hunter2Tr0ub4dorX"),
    "password": ("https://api.example.com/login?user=me&password=CorrectHorse42Battery",
                 "CorrectHorse42Battery"),
    "bearer_token": ("Authorization: Bearer 7f3a9c2e5b8d4f1a6c0e9b2d7a4f8c1e",
                     "7f3a9c2e5b8d4f1a6c0e9b2d7a4f8c1e"),
}
NEEDLES = [needle for _, needle in SECRETS.values()]
ALL = " | ".join(text for text, _ in SECRETS.values())


def leaked(text: str) -> list[str]:
    return [n for n in NEEDLES if n in text]


# -- the redaction itself ------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(SECRETS))
def test_each_kind_is_redacted_in_prose_json_and_env_files(kind: str) -> None:
    text, needle = SECRETS[kind]
    for carrier in (text, f"see {text} here", json.dumps({"output": text}),
                    f"export X={text}\n", f"'{text}'", f"`{text}`"):
        out = redact(carrier)
        assert needle not in out, (carrier, out)
        assert "[REDACTED:" in out
        assert redact(out) == out  # idempotent


def test_every_rule_is_exercised() -> None:
    # here or in tests/unit/ledger/test_redact.py's corpus
    kinds = {kind for kind, _, _ in RULES}
    assert set(SECRETS) | {"stripe_key", "slack_webhook", "google_api_key", "secret_value",
                           "gitlab_token", "huggingface_token", "npm_token", "pypi_token",
                           "sendgrid_key", "google_oauth", "auth_header", "basic_auth",
                           "user_password"} == kinds
    for kind, sample in [("pypi_token", "pypi-AgEIcHlwaS5vcmcCJDk0ZmM3ZDg1LWE3YjUtNGI"),
                         ("sendgrid_key", "SG.ngeVfQFYQlKU0ufo8x5d1A.TwL2iGABf9DHoTf-09kq"
                                          "eF8tAmbihYzrnopKc-1s5cr"),
                         ("stripe_key", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
                         ("slack_webhook", "https://hooks.slack.com/services/T00/B00/XXXXXX")]:
        assert redact(sample) == f"[REDACTED:{kind}]", sample


@pytest.mark.parametrize("text", [
    "task-abcdefghijklmnopqrstuvwxyz0123", "max_tokens: 4096", "the key is in the drawer",
    "https://example.com/path?q=1", "sha256 946f0e1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e",
    "0199a1f2-6a00-7000-8000-00000000abcd", "context 81% · saved 3/12 (25%, ~4000 tok)",
])
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact(text) is text


def test_what_is_kept_around_a_secret() -> None:
    assert redact("postgres://admin:s3cr3t@db:5432") == \
        "postgres://admin:[REDACTED:url_password]@db:5432"
    assert redact("DB_PASSWORD=hunter2 next") == "DB_PASSWORD=[REDACTED:password] next"
    assert redact("x AKIAZ7Q3XAMPLE7KEY42 y") == "x [REDACTED:aws_access_key] y"


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=300), st.sampled_from([""] + [t for t, _ in SECRETS.values()]))
def test_redaction_never_fails_and_trigger_covers_every_rule(noise: str, secret: str) -> None:
    text = noise[: len(noise) // 2] + secret + noise[len(noise) // 2:]
    out = redact(text)
    assert redact(out) == out
    if out != text:  # Arrow picks out the cells to redact with TRIGGER: it must see them
        assert re.search(TRIGGER, text)
    if secret:
        assert SECRETS_BY_TEXT[secret] not in out


SECRETS_BY_TEXT = {text: needle for text, needle in SECRETS.values()}

#: Secrets placed where the audit quotes a bounded piece of the input, past the cut: a
#: cut made before redaction leaves fragments no rule knows (``sk-proj-Tq9v…``).
LONG_KIND = "x" * 30 + SECRETS["openai_key"][1]
LONG_PARENT = "p" * 33 + SECRETS["github_token"][1]
#: Secrets in the carriers issue 16 found getting past the redactor.
CARRIED = {
    "json_escaped": (json.dumps(json.dumps({"password": "pa ss&#@word42"}))[1:-1],
                     "pa ss&#@word42"),
    "api_key": ('{"api_key": "Ak9Ak9Ak9Ak9Ak9x"}', "Ak9Ak9Ak9Ak9Ak9x"),
    "key_colon": ("client_secret: Cs7Cs7Cs7Cs7Cs7", "Cs7Cs7Cs7Cs7Cs7"),
    "basic": ("Authorization: Basic dXNlcjpodW50ZXIyaHVudGVyMg==", "dXNlcjpodW50ZXIyaHVudGVy"),
    "hf": ("hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"),
    "gitlab": ("glpat-Zx8Cv7Bn6Mm5Ll4Kk3Jj", "glpat-Zx8Cv7Bn6Mm5Ll4Kk3Jj"),
    "npm": ("npm_Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2", "npm_Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2"),
    "azure": ("AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6I==;",
              "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6I"),
    "flag": ("aws configure --aws-secret-access-key Fl4gFl4gFl4gFl4gFl4g", "Fl4gFl4gFl4gFl4gFl4g"),
    "userinfo": ("https://bob:s3cr&t#p@ss@git.example.com/r.git", "s3cr&t#p@ss"),
}
FRAGMENT = 10


def fragments_leaked(text: str) -> list[str]:
    """Pieces of :data:`FRAGMENT` characters of the new needles (and of the secrets put past
    a cut) found in ``text``."""
    needles = [n for _, n in CARRIED.values()] + [SECRETS["openai_key"][1],
                                                  SECRETS["github_token"][1]]
    return sorted({n[i:i + FRAGMENT] for n in needles for i in range(len(n) - FRAGMENT + 1)
                   if n[i:i + FRAGMENT] in text})


def test_finding_details_redact_before_they_cut() -> None:
    """``unknown_kind`` and ``logical_parent_missing`` quote 40 characters of the input:
    redacted first, so no piece of a key is left past the cut."""
    from pipeline.audit.session import audit_session
    from pipeline.ledger.layout import parse_session_path
    from tests.helpers.ledgers import audit_bytes

    b = LedgerBuilder()
    b.header()
    b.user("hi")
    b.entry(LONG_KIND, {"note": "x"})
    details = [f.detail for f in audit_bytes(b.to_bytes()).findings
               if f.code.text == "unknown_kind"]
    assert details and not fragments_leaked(str(details)), details
    lines = [json.dumps({"uuid": "u1", "parentUuid": None, "logicalParentUuid": LONG_PARENT,
                         "sessionId": "s1", "cwd": "/w", "type": "user",
                         "timestamp": "2026-02-11T20:31:53.375Z",
                         "message": {"role": "user", "content": "hello"}}).encode() + b"\n"]
    key = parse_session_path("projects/-w/s1.jsonl")
    assert key is not None
    details = [f.detail for f in audit_session(key, lines).findings
               if f.code.text == "logical_parent_missing"]
    assert details and not fragments_leaked(str(details)), details


def test_compaction_packets_redact_the_model_name() -> None:
    from pipeline.compaction.engine import PlannedPacket, packet_lines
    from pipeline.compaction.summaries import Summary

    fields = {f.name for f in dataclasses.fields(PlannedPacket)}
    assert {"model", "summary"} <= fields
    summary = Summary("the summary", 3, "cards", "v1")
    packet = PlannedPacket(1, 2, "a", "b", 100, 10, summary, "t3/i1", "e", True, "",
                           SECRETS["anthropic_key"][0])
    [line] = packet_lines([packet], "s", head_id="h", head_hash="0" * 64, now_ns=10**18)
    assert not leaked(line.decode())
    assert orjson.loads(line)["model"] == "[REDACTED:anthropic_key]"


@pytest.mark.parametrize("name", sorted(CARRIED))
def test_the_carriers_found_in_issue_16(name: str) -> None:
    text, _ = CARRIED[name]
    for carrier in (text, json.dumps({"t": text}), f"... {text} ..."):
        out = redact(carrier)
        assert not fragments_leaked(out), (carrier, out)


def test_tables_are_redacted_cell_by_cell_and_cut() -> None:
    table = pa.table({"session_path": ["a/AKIAZ7Q3XAMPLE7KEY42.jsonl", "b"],
                      "entry_id": [SECRETS["github_token"][0], None],
                      "detail": ["x" * 500, f"bad {ALL}"], "n": [1, 2]})
    out = redact_table(table, limits={"detail": 200})
    assert out["session_path"].to_pylist() == table["session_path"].to_pylist()
    assert out["entry_id"].to_pylist() == ["[REDACTED:github_token]", None]
    assert max(pc.utf8_length(out["detail"]).to_pylist()) <= 200
    assert not leaked(str(out["detail"].to_pylist()))
    assert out["n"].to_pylist() == [1, 2] and out.schema == table.schema
    clean = pa.table({"entry_id": ["a", "b"]})
    assert redact_table(clean) is clean


def test_structures_sent_whole_are_redacted_keys_and_all() -> None:
    card = {"asked": ALL, "did": [{"tool": "bash", ALL: [ALL]}], "n": 3}
    assert not leaked(json.dumps(redact_value(card)))
    assert quote("abcdef", 4) == "abc…" and quote("abc", 4) == "abc"


# -- every command on sessions stuffed with secrets -----------------------------------------


def _rechain(lines: list[bytes], edit: dict[int, bytes]) -> list[bytes]:
    """``lines`` (bodies) with some replaced, every ``prev_hash`` after them updated so the
    chain still holds (byte-level: vak's duplicate-``kind`` lines stay as written)."""
    renamed: dict[str, str] = {}
    out = []
    for i, line in enumerate(lines):
        new = edit.get(i, line)
        for old, fresh in renamed.items():
            new = new.replace(f'"prev_hash":"{old}"'.encode(), f'"prev_hash":"{fresh}"'.encode())
        renamed[hashlib.sha256(line).hexdigest()] = hashlib.sha256(new).hexdigest()
        out.append(new)
    return out


def stuffed_generated() -> tuple[str, bytes]:
    """A generated session with every secret in every prompt, tool result, answer and
    card field; still a valid chain."""
    s = generate_session(5, turns=24)
    lines = [line.rstrip(b"\n") for line in s.lines()]
    inject = json.dumps(f" [{ALL}] ")[1:-1].encode()
    edit = {}
    for i, line in enumerate(lines):
        new = line
        for anchor in (b'"type":"text","text":"', b'"content":"', b'"asked":"',
                       b'"narration":"', b'"title":"'):
            new = new.replace(anchor, anchor + inject)
        if new != line:
            edit[i] = new
    return s.path, b"\n".join(_rechain(lines, edit)) + b"\n"


def stuffed_small() -> bytes:
    """Secrets where the audit copies input verbatim: ids, kinds, names, a prev_hash."""
    s = {k: text for k, (text, _) in SECRETS.items()}
    b = LedgerBuilder()
    b.header(session_id=s["aws_access_key"], cwd=f"/home/me/{s['github_token']}")
    head = b.lines[0].data.replace(b'"model":"gemma4:e2b-mlx"',
                                   json.dumps({"model": s["slack_token"]})[1:-1].encode())
    head = head.replace(b'"provider":"ollama"', b'"provider":"' + s["jwt"].encode() + b'"')
    b.lines[0].data, b.tail_hash = head, hashlib.sha256(head).hexdigest()
    b.user(f"deploy with {s['password']}; config: "
           + " ".join(text for text, _ in CARRIED.values()), ident=s["github_token"])
    a = b.assistant("on it", tools=["call_0"], u=usage(120, 10), ident=s["anthropic_key"])
    b.receipt([attempt(0, u=usage(120, 10))], winning=0, parent=a)
    b.lines[-1].data = b.lines[-1].data.replace(b'"provider":"ollama"', json.dumps(
        {"provider": s["openai_key"]})[1:-1].encode())
    b.tail_hash = hashlib.sha256(b.lines[-1].data).hexdigest()
    b.tool_results("call_0", content=ALL)
    b.assistant(f"done; key was {s['aws_secret_key']}", u=usage(160, 20))
    b.entry(s["aws_access_key"], {"note": ALL})  # unknown kind
    b.entry("activity", {"data": {}}, prev_hash=s["slack_token"])  # hash mismatch
    b.raw(f'{{"id":"{s["bearer_token"]}", "broken'.encode())  # damaged
    b.user(f"and {s['url_password']}")
    b.entry(LONG_KIND, {"note": "x"})  # unknown kind, the key past the 40-character cut
    b.assistant("bye", u=usage(200, 5))
    return b.to_bytes()


def vakpipe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([vakpipe_exe(), *args], capture_output=True, text=True,
                          timeout=600, check=False, env=env)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done


def parquet_text(path: Path) -> str:
    table = pq.read_table(path)
    parts: list[str] = []
    for column in table.columns:
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            parts.extend(v for v in column.to_pylist() if v is not None)
    return "\n".join(parts)


def output_text(out: Path, sources: dict[str, bytes]) -> tuple[str, list[str]]:
    """Everything a run wrote under ``out`` as text (Parquet string columns, other files
    whole; a compacted ledger's appended packets only), and the files read."""
    texts, files = [], []
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = path.relative_to(out).as_posix()
        files.append(rel)
        if path.suffix == ".parquet":
            texts.append(parquet_text(path))
            continue
        data = path.read_bytes()
        if rel.startswith("archive/"):
            source = sources[rel.removeprefix("archive/")]
            assert data.startswith(source), rel  # the user's own bytes, verbatim
            data = data[len(source):]
            assert data, rel  # packets were appended
            for packet in data.splitlines():
                orjson.loads(packet)
        texts.append(data.decode("utf-8", "replace"))
    return "\n".join(texts), files


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path_factory.mktemp("secrets") / "archive"
    path, data = stuffed_generated()
    sources = {path: data, session_key().path: stuffed_small()}
    for rel, content in sources.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content)
    return root, sources


def test_the_stuffed_sessions_hold_every_secret_where_intended(
        archive: tuple[Path, dict[str, bytes]]) -> None:
    from tests.helpers.ledgers import audit_bytes

    _, sources = archive
    for rel, data in sources.items():
        text = data.decode()
        assert not [n for n in NEEDLES if n.replace("/", "\\/") not in text
                    and n not in text], rel
    small = audit_bytes(sources[session_key().path])
    assert {f.code.text for f in small.findings} >= {"unknown_kind", "hash_mismatch",
                                                     "torn_write_recovered"}


@pytest.mark.slow
def test_no_command_copies_a_secret_into_an_output_or_a_log(
        archive: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    root, sources = archive
    env = {**os.environ, "VAKPIPE_SUMMARISER_API_KEY": "not-a-real-key"}
    common = ["--workers", "1", "--no-progress"]
    logs: list[str] = []

    def run(*args: str) -> None:
        done = vakpipe(*args, env=env)
        logs.extend([done.stdout, done.stderr])

    run("audit", str(root), "--out", str(tmp_path / "audit"), "--replay", "--planner",
        *common)
    run("compact", str(root), "--out", str(tmp_path / "compact"), "--window", "8000",
        "--write-archive", *common)
    server = Server()
    # the model echoes a secret back: the summary written must not keep it
    server.replies = [Reply(text=f"Summary. Use {SECRETS['github_token'][0]} to push.")]
    try:
        run("compact", str(root), "--out", str(tmp_path / "http"), "--window", "8000",
            "--summariser", "http", "--summariser-url", server.base,
            "--summariser-model", "m", *common)
    finally:
        server.close()
    run("nightly", str(root), "--out", str(tmp_path / "nightly"), "--compaction", *common)
    run("cost", str(tmp_path / "audit"), "--by", "day,model,provider,session")
    generated = next(p for p in sources if p != session_key().path)
    run("show", str(root / generated), "--scope", "t3/i1", "--full")
    run("show", str(root / session_key().path), "--scope", "t1/i1", "--full")

    # the runs did what they do (the checks below are not vacuous)
    assert server.seen, "the HTTP summariser was asked"
    sent = json.dumps([s.body for s in server.seen])
    assert not leaked(sent), "a secret was sent to the summariser endpoint"
    assert "[REDACTED:" in sent
    everything, files = [], []
    for name in ("audit", "compact", "http", "nightly"):
        text, written = output_text(tmp_path / name, sources)
        everything.append(text)
        files += [f"{name}/{f}" for f in written]
    assert any(f.startswith("compact/archive/") for f in files)
    assert any(f.endswith(".csv") for f in files) and any(f.endswith(".html") for f in files)
    out = "\n".join(everything)
    for dataset in ("compaction", "requests", "turns", "usage", "integrity/findings"):
        assert any(f"/{dataset}/" in f for f in files), dataset
    assert "[REDACTED:" in out and "Summary. Use [REDACTED:github_token]" in out
    assert not leaked(out), "a secret reached an output file"
    assert not fragments_leaked(out), "part of a secret reached an output file"
    printed = "\n".join(logs)
    assert "request   t3/i1" in printed and "[REDACTED:" in printed
    assert not leaked(printed), "a secret was printed"
    assert not fragments_leaked(printed), "part of a secret was printed"
