"""vakpipe against ccusage on real Claude Code transcripts: daily totals and run times.

Three counts of the same files, side by side per UTC day and token kind (input, output,
cache creation, cache read) and in US dollars where both tools price the model:

* ccusage (https://github.com/ryoppippi/ccusage, pinned to :data:`CCUSAGE_VERSION`),
  ``ccusage daily --json --offline --timezone UTC`` with ``CLAUDE_CONFIG_DIR=ROOT``, its
  own bundled prices, under an empty temporary ``HOME`` (no other agent's data, no config
  file, nothing written outside it). Installed on first use with ``npm install --prefix``
  into ``bench/.cache/ccusage`` (git-ignored; ``--ccusage-dir`` elsewhere);
* vakpipe, through its CLI: ``vakpipe audit ROOT --out OUT`` then ``vakpipe cost OUT
  --by day,model --report-dir REPORT``, reading ``REPORT/costs.csv`` (billed tokens and
  dollars) and the ``usage`` Parquet dataset (per file: its request rows, and its
  ``kind = mirror`` rows, a subagent's requests as copied in its parent). Skipped, with
  the reason, until the Claude Code adapter (``pipeline/formats/claude_code.py``) is there;
* an independent recount (:func:`recount`): a small pure-Python pass over the JSONL. One
  request per ``message.id`` + ``requestId``, counted with its FINAL streamed line (Claude
  Code writes one line per content block, and only the last carries the final
  ``output_tokens``), over every session file and every ``subagents/agent-*.jsonl``
  (compaction ``agent-acompact-*`` included), plus the requests that appear only as
  ``agent_progress`` mirrors in a parent file (their subagent file is absent): what is
  billed. A request held by several files (a transcript line and its mirrors, or mirrors
  in several files) is counted once. Its dollars use vakpipe's price table, one request
  at a time, with the one-hour share of the cache writes
  (``usage.cache_creation.ephemeral_1h_input_tokens`` of the final line) passed as
  ``TokenUsage.cache_write_1h`` and so priced at the table's ``cache_write_1h`` rate, as
  vakpipe does; ``priced(..., one_hour=False)`` gives the five-minute-only figure (every
  write at ``cache_write``: vakpipe before that rate, ccusage 18.0.11).

Then every difference is attributed (progress mirrors ignored, first vs final streamed line,
one-hour cache writes priced at their own rate, models one side does not price) and
what is left unexplained is printed. Then run times, best of ``--repeats`` in this run:
ccusage (as users run it: node wrapper + native binary, and the native binary alone),
the recount, and vakpipe's audit + cost, with ratios against ccusage. On ``--copies``
copies (issue 21's target), vakpipe is timed both as two commands and as the one
``vakpipe cost ROOT --out OUT`` that audits and prices in one process, and each wall
ratio is also given round by round, with the rounds' median.

Nothing is written under ROOT: vakpipe's tables go to a temporary folder.
The findings are in ``docs/ccusage-comparison.md``.

Run: ``.venv/bin/python bench/ccusage_compare.py [--root DIR] [--repeats 5]
[--also-ccusage 18.0.11] [--markdown]`` (``--also-ccusage``: another ccusage version as an
extra column; 18.0.11, a TypeScript release, keeps the first streamed line).
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import NAMESPACE_URL, uuid5

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CCUSAGE_VERSION = "20.0.24"  # 20.0.26 (latest) names a native package npm does not have
CCUSAGE_DIR = REPO / "bench" / ".cache" / "ccusage"
# The project's own copy of the real transcripts (tests/data/README.md), so the bench runs
# in any clone.
DEFAULT_ROOT = REPO / "tests" / "data" / "real" / "claude-code"
ADAPTER = REPO / "pipeline" / "formats" / "claude_code.py"
PROVIDER = "anthropic"  # what the recount prices Claude Code's models as
#: Token kinds, in the order every tuple here holds them.
KINDS = ("input", "output", "cache_write", "cache_read")
LABELS = {"input": "input", "output": "output", "cache_write": "cache creation",
          "cache_read": "cache read", "usd": "USD"}
Tokens = tuple[int, int, int, int]
ZERO: Tokens = (0, 0, 0, 0)


def _add(a: Tokens, b: Tokens) -> Tokens:
    return a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]


def _sub(a: Tokens, b: Tokens) -> Tokens:
    return a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3]


# --------------------------------------------------------------------------- recount


@dataclass
class Request:
    """One model request, as the recount counts it (its final streamed line)."""

    key: tuple[str, str]  # message.id, requestId
    path: str  # the file, relative to the root
    source: str  # session, subagent, compaction, or progress (a mirror only)
    day: str  # UTC, of the final line's timestamp
    model: str
    tokens: Tokens  # of the final line
    first: Tokens  # of the first streamed line
    biggest: Tokens  # of the line with the most tokens (what ccusage keeps)
    lines: int  # streamed lines
    cache_1h: int  # cache writes with the one-hour TTL (usage.cache_creation)
    sidechain: bool


@dataclass
class Recount:
    """Every request of a tree of Claude Code transcripts."""

    files: list[str] = field(default_factory=list)
    lines: int = 0
    bytes: int = 0
    #: Requests in transcript lines (``type: assistant``), each in the file seen first.
    requests: list[Request] = field(default_factory=list)
    #: Requests seen only in ``agent_progress`` mirrors, never in a transcript line
    #: (counted too: their subagent file is missing), each in the file seen first.
    progress_only: list[Request] = field(default_factory=list)
    #: Every mirrored request, one per file that mirrors it (final mirrored line there).
    mirrors: list[Request] = field(default_factory=list)
    #: Requests also mirrored in ``agent_progress`` lines, and how many of those mirrors'
    #: biggest copy differs from the transcript's final line.
    mirrored: int = 0
    mirror_differs: int = 0
    #: Keys found in more than one file (counted once).
    copies: int = 0
    #: Assistant lines without a usable usage object (not counted).
    unusable: int = 0

    @property
    def counted(self) -> list[Request]:
        """What is billed: the transcript lines' requests and the mirrors-only ones."""
        return self.requests + self.progress_only


def transcript_files(root: Path) -> list[Path]:
    """What vakpipe enumerates: ``[prefix/]projects/<dir>/<session>.jsonl`` and
    ``[prefix/]projects/<dir>/<session>/subagents/agent-*.jsonl``, sorted."""
    def wanted(parts: tuple[str, ...]) -> bool:
        session = len(parts) >= 3 and parts[-3] == "projects"
        subagent = len(parts) >= 5 and parts[-5] == "projects" and parts[-2] == "subagents" \
            and parts[-1].startswith("agent-")
        return session or subagent

    return sorted(p for p in root.rglob("*.jsonl") if wanted(p.relative_to(root).parts))


def source_of(rel: str) -> str:
    """``session``, ``subagent`` or ``compaction`` (``agent-acompact-*``) for a file."""
    name = rel.rsplit("/", 1)[-1]
    if "/subagents/" not in f"/{rel}":
        return "session"
    return "compaction" if name.startswith("agent-acompact") else "subagent"


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


def usage_tokens(usage: Any) -> tuple[Tokens, int] | None:
    """(input, output, cache creation, cache read) and one-hour cache writes of a
    ``message.usage`` object; ``None`` when it is not one."""
    if not isinstance(usage, dict) or not isinstance(usage.get("input_tokens"), int) \
            or not isinstance(usage.get("output_tokens"), int):
        return None
    split = usage.get("cache_creation")
    hour = _int(split.get("ephemeral_1h_input_tokens")) if isinstance(split, dict) else 0
    return (_int(usage["input_tokens"]), _int(usage["output_tokens"]),
            _int(usage.get("cache_creation_input_tokens")),
            _int(usage.get("cache_read_input_tokens"))), hour


@dataclass
class _Seen:
    request: Request
    best: int  # total tokens of ``biggest``


def _observe(seen: dict[tuple[str, str], _Seen], key: tuple[str, str], rel: str,
             source: str, entry: dict[str, Any], message: dict[str, Any]) -> bool:
    got = usage_tokens(message.get("usage"))
    if got is None:
        return False
    tokens, hour = got
    ts = entry.get("timestamp")
    day = ts[:10] if isinstance(ts, str) else ""
    model = message.get("model") if isinstance(message.get("model"), str) else ""
    old = seen.get(key)
    if old is None:
        seen[key] = _Seen(Request(key, rel, source, day, str(model), tokens, tokens, tokens,
                                  1, hour, entry.get("isSidechain") is True), sum(tokens))
        return True
    r = old.request
    r.day, r.model, r.tokens, r.cache_1h = day, str(model), tokens, hour
    r.lines += 1
    if sum(tokens) > old.best:  # ccusage: strictly more tokens replaces
        r.biggest, old.best = tokens, sum(tokens)
    return True


def recount_files(files: Iterable[Path], root: Path) -> Recount:
    """Count the requests of ``files`` (paths under ``root``); see the module docstring."""
    out = Recount()
    top: dict[tuple[str, str], _Seen] = {}
    mirrors: dict[str, dict[tuple[str, str], _Seen]] = defaultdict(dict)
    owner: dict[tuple[str, str], str] = {}
    copied: set[tuple[tuple[str, str], str]] = set()
    for path in files:
        rel = path.relative_to(root).as_posix()
        source = source_of(rel)
        out.files.append(rel)
        with open(path, "rb") as f:
            for n, raw in enumerate(f):
                out.lines += 1
                out.bytes += len(raw)
                if b'"usage"' not in raw:
                    continue
                try:
                    entry = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(entry, dict):
                    continue
                kind = entry.get("type")
                if kind == "assistant" and isinstance(entry.get("message"), dict):
                    msg = entry["message"]
                    mid, req = msg.get("id"), entry.get("requestId")
                    key = (mid, req) if isinstance(mid, str) and isinstance(req, str) \
                        else (f"{rel}:{n}", "")  # no pair: the line is its own request
                    if owner.setdefault(key, rel) != rel:
                        copied.add((key, rel))  # a response copied into another file:
                        continue  # counted once, where first seen
                    if not _observe(top, key, rel, source, entry, msg):
                        out.unusable += 1
                elif kind == "progress" and isinstance(entry.get("data"), dict):
                    data = entry["data"]
                    inner = data.get("message")
                    if data.get("type") != "agent_progress" or not isinstance(inner, dict) \
                            or inner.get("type") != "assistant" \
                            or not isinstance(inner.get("message"), dict):
                        continue
                    msg = inner["message"]
                    mid, req = msg.get("id"), inner.get("requestId")
                    if isinstance(mid, str) and isinstance(req, str):
                        _observe(mirrors[rel], (mid, req), rel, "progress", inner, msg)
    out.requests = [s.request for s in top.values()]
    only: dict[tuple[str, str], Request] = {}
    for per_file in mirrors.values():  # files in order: a key's first file holds it
        for k, s in per_file.items():
            out.mirrors.append(s.request)
            if k not in top:
                only.setdefault(k, s.request)
    out.progress_only = list(only.values())
    keys = {k for per_file in mirrors.values() for k in per_file}
    out.mirrored = sum(k in top for k in keys)
    out.mirror_differs = sum(k in top and s.request.biggest != top[k].request.tokens
                             for per_file in mirrors.values() for k, s in per_file.items())
    out.copies = len(copied)
    return out


def recount(root: Path) -> Recount:
    """:func:`recount_files` over every transcript file under ``root``."""
    return recount_files(transcript_files(root), root)


def by_day(requests: Iterable[Request], pick: Callable[[Request], Tokens] | None = None,
           ) -> dict[str, dict[str, Tokens]]:
    """day -> model -> summed tokens (``pick``: which tokens of a request; the final)."""
    days: dict[str, dict[str, Tokens]] = defaultdict(dict)
    for r in requests:
        t = r.tokens if pick is None else pick(r)
        days[r.day][r.model] = _add(days[r.day].get(r.model, ZERO), t)
    return days


def day_totals(days: dict[str, dict[str, Tokens]]) -> dict[str, Tokens]:
    """day -> tokens summed over models."""
    out: dict[str, Tokens] = {}
    for day, models in days.items():
        total = ZERO
        for t in models.values():
            total = _add(total, t)
        out[day] = total
    return out


def priced(requests: Iterable[Request], *, one_hour: bool,
           pick: Callable[[Request], Tokens] | None = None,
           models: set[str] | None = None) -> tuple[dict[str, float], set[str]]:
    """USD per day at vakpipe's price table, each request priced alone (``pick``: which
    tokens of it; ``models``: only these). With ``one_hour`` (what vakpipe does), the
    request's one-hour cache writes go to ``TokenUsage.cache_write_1h`` and are priced at
    the table's ``cache_write_1h`` rate (Anthropic: 2x input); without it every write is
    priced at the five-minute ``cache_write`` rate. Also the models the table does not
    price."""
    from decimal import Decimal

    from pipeline.costs.pricing import TokenUsage, load_prices, price

    prices = load_prices()
    usd: dict[str, Decimal] = defaultdict(Decimal)
    unknown: set[str] = set()
    for r in requests:
        if models is not None and r.model not in models:
            continue
        rule = prices.lookup(PROVIDER, r.model)
        if rule is None:
            unknown.add(r.model)
            continue
        i, o, w, c = r.tokens if pick is None else pick(r)
        usage = TokenUsage(input=i, output=o, cache_read=c, cache_write=w,
                           cache_write_1h=min(r.cache_1h, w) if one_hour else 0)
        usd[r.day] += price(usage, rule).total
    return {d: float(v) for d, v in usd.items()}, unknown


# --------------------------------------------------------------------------- ccusage


@dataclass
class Ccusage:
    """Where the pinned ccusage is, and how to run it."""

    wrapper: Path  # node_modules/.bin/ccusage: node, which starts the native binary
    native: Path | None  # the native binary itself, when found
    version: str


def ensure_ccusage(folder: Path, version: str = CCUSAGE_VERSION) -> Ccusage:
    """ccusage ``version`` under ``folder``, installed with npm when missing or another
    version; checked by running ``ccusage --version``.

    Exits with a message when npm is not on PATH, the install fails or ccusage cannot
    start (no native package for this platform, Node.js too old).
    """
    wrapper = folder / "node_modules" / ".bin" / "ccusage"
    meta = folder / "node_modules" / "ccusage" / "package.json"

    def installed() -> str | None:
        found: str | None = json.loads(meta.read_text()).get("version") \
            if wrapper.exists() and meta.exists() else None
        return found

    if installed() != version:
        npm = shutil.which("npm")
        if npm is None:
            sys.exit(f"ccusage {version} is not installed under {folder} and npm is not on "
                     "PATH: install Node.js and npm (https://nodejs.org), or pass "
                     "--ccusage-dir to a folder holding node_modules/.bin/ccusage")
        print(f"installing ccusage {version} into {folder} (npm) ...", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [npm, "install", "--prefix", str(folder), "--no-save", "--no-package-lock",
             "--no-audit", "--no-fund", "--loglevel=error", f"ccusage@{version}"],
            capture_output=True, text=True, check=False)
        if done.returncode != 0 or installed() != version:
            sys.exit(f"npm install ccusage@{version} failed (exit {done.returncode}):\n"
                     f"{done.stderr.strip() or done.stdout.strip()}")
    check = subprocess.run([str(wrapper), "--version"], capture_output=True, text=True,
                           check=False)
    if check.returncode != 0 or version not in check.stdout:
        sys.exit(f"ccusage {version} under {folder} does not start: "
                 f"{(check.stderr or check.stdout).strip()}")
    # 20.x: the npm package is a node wrapper that starts a native binary.
    natives = sorted((folder / "node_modules" / "@ccusage").glob("ccusage-*/bin/ccusage"))
    native = natives[0] if natives and os.access(natives[0], os.X_OK) else None
    return Ccusage(wrapper, native, version)


def installed_ccusage(folder: Path, version: str = CCUSAGE_VERSION) -> Ccusage | None:
    """ccusage as :func:`ensure_ccusage` finds it, but never installed: the one under
    ``folder`` if it is ``version`` and starts, else a ``ccusage`` on PATH that starts
    (any version); ``None`` when neither."""
    wrapper = folder / "node_modules" / ".bin" / "ccusage"
    meta = folder / "node_modules" / "ccusage" / "package.json"
    if wrapper.exists() and meta.exists() \
            and json.loads(meta.read_text()).get("version") == version:
        natives = sorted((folder / "node_modules" / "@ccusage").glob("ccusage-*/bin/ccusage"))
        native = natives[0] if natives and os.access(natives[0], os.X_OK) else None
        if _starts(wrapper):
            return Ccusage(wrapper, native, version)
    on_path = shutil.which("ccusage")
    if on_path is not None and (found := _starts(Path(on_path))):
        return Ccusage(Path(on_path), None, found)
    return None


def _starts(binary: Path) -> str | None:
    """``binary --version``'s output when it runs, else ``None``."""
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                              check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or "?" if done.returncode == 0 else None


def find_ccusage(folder: Path, *, install: bool, version: str = CCUSAGE_VERSION
                 ) -> Ccusage | None:
    """ccusage ``version``: installed with npm when ``install`` and npm is on PATH (see
    :func:`ensure_ccusage`), else only one already there (:func:`installed_ccusage`)."""
    if install and shutil.which("npm") is not None:
        return ensure_ccusage(folder, version)
    return installed_ccusage(folder, version)


def ccusage_env(root: Path, home: Path) -> dict[str, str]:
    """A minimal environment: only ``root``'s Claude data, nothing of this machine's."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "CLAUDE_CONFIG_DIR": str(root), "TZ": "UTC", "NO_COLOR": "1", "LANG": "C.UTF-8"}


def run_ccusage(binary: Path, args: Sequence[str], env: dict[str, str]) -> Any:
    """Run ccusage with ``args`` (``--json`` among them); its parsed output."""
    done = subprocess.run([str(binary), *args], capture_output=True, text=True, env=env,
                          check=False)
    if done.returncode != 0:
        sys.exit(f"ccusage {' '.join(args)} failed (exit {done.returncode}): "
                 f"{done.stderr.strip()}")
    return json.loads(done.stdout)


DAILY_ARGS = ("daily", "--json", "--offline", "--timezone", "UTC")


@dataclass
class CcusageDay:
    """One day of ``ccusage daily --json``."""

    tokens: Tokens
    usd: float
    models: dict[str, tuple[Tokens, float, bool]]  # tokens, cost, priced


def parse_daily(report: Any) -> tuple[dict[str, CcusageDay], list[str]]:
    """day -> totals and per-model breakdown; and the agents ccusage detected."""
    days: dict[str, CcusageDay] = {}
    agents: set[str] = set()
    for row in report.get("daily", []):
        day = row.get("period") or row.get("date")
        agents.update(row.get("metadata", {}).get("agents", []))
        models = {
            m["modelName"]: ((m["inputTokens"], m["outputTokens"], m["cacheCreationTokens"],
                              m["cacheReadTokens"]), float(m["cost"]),
                             not m.get("missingPricing", False))
            for m in row.get("modelBreakdowns", [])}
        days[day] = CcusageDay((row["inputTokens"], row["outputTokens"],
                                row["cacheCreationTokens"], row["cacheReadTokens"]),
                               float(row["totalCost"]), models)
    return days, sorted(agents)


# --------------------------------------------------------------------------- vakpipe


@dataclass
class Vakpipe:
    """vakpipe's figures: costs.csv per (day, model) and the usage rows per file."""

    by_day_model: dict[tuple[str, str], tuple[Tokens, float, bool]]  # tokens, USD, unknown
    by_file: dict[str, Tokens]  # billed tokens per session_path, mirrors left out
    hour_by_file: dict[str, int]  # billed one-hour cache writes per session_path, the same
    rows: int  # billed usage rows, mirrors left out
    #: ``kind = mirror`` rows (a subagent's requests copied in its parent file), per
    #: session_path: tokens, one-hour writes, rows. Priced once with any other copy.
    mirror_by_file: dict[str, Tokens]
    mirror_hour_by_file: dict[str, int]
    mirror_rows: int
    waste: dict[str, int]  # billed tokens by waste reason (abandoned, retry)
    audit_exit: int


def vakpipe_cli() -> Path:
    return Path(sys.executable).with_name("vakpipe")


def vakpipe_missing() -> str | None:
    """Why vakpipe cannot audit Claude Code transcripts yet, or ``None`` (a dry check; a
    failing ``vakpipe audit`` is reported by :func:`run_vakpipe`)."""
    if not ADAPTER.exists():
        return f"no Claude Code adapter yet ({ADAPTER.relative_to(REPO)} is missing)"
    return None


def audit_cmd(root: Path, out: Path, workers: int | None,
              scheduler: str | None = None) -> list[str]:
    cmd = [str(vakpipe_cli()), "audit", str(root), "--out", str(out), "--no-progress"]
    if scheduler:
        return [*cmd, "--scheduler", scheduler]
    return [*cmd, "--workers", str(workers)] if workers else cmd


def cost_cmd(out: Path, report: Path) -> list[str]:
    return [str(vakpipe_cli()), "cost", str(out), "--by", "day,model", "--report-dir",
            str(report)]


def one_step_cmd(root: Path, out: Path, workers: int | None) -> list[str]:
    """``vakpipe cost ROOT --out OUT``: the audit and the pricing in one process (its
    report under OUT/cost), as one ccusage command does both."""
    cmd = [str(vakpipe_cli()), "cost", str(root), "--out", str(out), "--by", "day,model",
           "--no-progress"]
    return [*cmd, "--workers", str(workers)] if workers else cmd


def run_vakpipe(root: Path, scratch: Path, workers: int | None) -> Vakpipe | str:
    """Audit ``root`` and price it, through the CLI; the figures, or why not."""
    out, report = scratch / "out", scratch / "report"
    shutil.rmtree(scratch, ignore_errors=True)
    audit = subprocess.run(audit_cmd(root, out, workers), capture_output=True, text=True,
                           check=False)
    if audit.returncode not in (0, 1, 3):  # 1: --fail-on (unused), 3: partial
        return f"vakpipe audit exited {audit.returncode}: {audit.stderr.strip()[-400:]}"
    cost = subprocess.run(cost_cmd(out, report), capture_output=True, text=True, check=False)
    if cost.returncode != 0:
        return f"vakpipe cost exited {cost.returncode}: {cost.stderr.strip()[-400:]}"

    from pipeline.io.commit import read_dataset
    from pipeline.io.storage import resolve

    table: dict[tuple[str, str], tuple[Tokens, float, bool]] = {}
    with open(report / "costs.csv", newline="") as f:
        for row in csv.DictReader(f):
            t = tuple(int(row[f"billed_{k}_tokens"]) for k in KINDS)
            table[(row["day"], row["model"])] = (
                (t[0], t[1], t[2], t[3]), float(row["billed_usd"]),
                row["unknown_model"].lower() == "true")
    usage = read_dataset(resolve(str(out)), "usage").to_pylist()
    files: dict[str, Tokens] = defaultdict(lambda: ZERO)
    hours: dict[str, int] = defaultdict(int)
    m_files: dict[str, Tokens] = defaultdict(lambda: ZERO)
    m_hours: dict[str, int] = defaultdict(int)
    waste: dict[str, int] = defaultdict(int)
    rows = m_rows = 0
    for u in usage:
        if not u["billed"]:
            continue
        mirror = u.get("kind") == "mirror"
        rows += not mirror
        m_rows += mirror
        t = (u["input_tokens"] or 0, u["output_tokens"] or 0, u["cache_write_tokens"] or 0,
             u["cache_read_tokens"] or 0)
        where, hour = (m_files, m_hours) if mirror else (files, hours)
        where[u["session_path"]] = _add(where[u["session_path"]], t)
        hour[u["session_path"]] += u.get("cache_write_1h_tokens") or 0  # column: newer
        if u["waste"]:
            waste[u["waste"]] += sum(t)
    return Vakpipe(table, dict(files), dict(hours), rows, dict(m_files), dict(m_hours),
                   m_rows, dict(waste), audit.returncode)


# --------------------------------------------------------------------------- printing


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool,
          left: int = 2) -> str:
    """Rows as an aligned plain-text table (the first ``left`` columns left-aligned, the
    rest right-aligned) or as a Markdown table."""
    if markdown:
        lines = ["| " + " | ".join(headers) + " |",
                 "|" + "|".join(["---"] * left + ["---:"] * (len(headers) - left)) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    return "\n".join([fmt(headers), fmt(["-" * w for w in widths]), *map(fmt, rows)])


def _n(v: int | None) -> str:
    return "—" if v is None else f"{v:,}"


def _d(v: int | None) -> str:
    return "—" if v is None else ("0" if v == 0 else f"{v:+,}")


def _usd(v: float | None) -> str:
    return "—" if v is None else f"{v:,.4f}"


def _dusd(v: float | None) -> str:
    return "—" if v is None else ("0" if abs(v) < 5e-7 else f"{v:+,.4f}")


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """The best wall time of ``repeats`` calls of ``fn``, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


# --------------------------------------------------------------------------- report


@dataclass
class Side:
    """One count's daily figures: tokens, and USD on the models every side prices."""

    name: str
    tokens: dict[str, Tokens]
    usd: dict[str, float]


#: Which streamed line of a request a counter keeps.
LINE_RULES: dict[str, Callable[[Request], Tokens]] = {
    "final": lambda r: r.tokens, "first": lambda r: r.first, "biggest": lambda r: r.biggest}
LINE_WORDS = {"final": "the final streamed line", "first": "the FIRST streamed line",
              "biggest": "the streamed line with the most tokens"}


@dataclass
class Behaviour:
    """A hypothesis on how a counter reads these files, and what it predicts per day."""

    line: str
    mirrors: bool
    one_hour: bool
    tokens: dict[str, Tokens]
    usd: dict[str, float]

    def words(self, ties: Sequence[str] = ()) -> str:
        """The hypothesis in words; ``ties``: other line rules that fit as well."""
        line = " = ".join(LINE_WORDS[x] for x in [self.line, *ties])
        same = " (the same lines in these files)" if ties else ""
        return (f"keeps {line}{same} of a message.id + requestId; "
                f"{'reads' if self.mirrors else 'ignores'} agent_progress mirrors; prices "
                "one-hour cache writes at "
                f"{'the one-hour rate, 2x input' if self.one_hour else 'the 5-minute rate'}")


def behaviours(rc: Recount, both: set[str]) -> list[Behaviour]:
    """Every combination of the known causes of difference, with its predicted days."""
    out = []
    for line, pick in LINE_RULES.items():
        for mirrors in (False, True):
            reqs = rc.requests + (rc.progress_only if mirrors else [])
            tokens = day_totals(by_day(reqs, pick))
            for one_hour in (False, True):
                usd, _ = priced(reqs, one_hour=one_hour, pick=pick, models=both)
                out.append(Behaviour(line, mirrors, one_hour, tokens, usd))
    return out


def residual(side: Side, b: Behaviour) -> tuple[int, float]:
    """Tokens and dollars of ``side`` that behaviour ``b`` does not predict."""
    days = set(side.tokens) | set(b.tokens)
    tok = sum(sum(abs(x) for x in _sub(side.tokens.get(d, ZERO), b.tokens.get(d, ZERO)))
              for d in days)
    usd = sum(abs(side.usd.get(d, 0.0) - b.usd.get(d, 0.0)) for d in days)
    return tok, usd


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT,
                    help="a Claude config folder: ROOT/projects/<dir>/<session>.jsonl")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of each tool")
    ap.add_argument("--ccusage-dir", type=Path, default=CCUSAGE_DIR,
                    help="where ccusage is (or gets) installed")
    ap.add_argument("--also-ccusage", metavar="VERSION", action="append", default=[],
                    help="also compare this ccusage version (repeatable; e.g. 18.0.11, "
                         "a TypeScript release), installed next to the pinned one")
    ap.add_argument("--workers", type=int, default=None,
                    help="vakpipe audit --workers (default: its own, one per core)")
    ap.add_argument("--wait-vakpipe", type=float, default=0, metavar="SECONDS",
                    help="poll this long for the Claude Code adapter before giving up")
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables")
    ap.add_argument("--copies", type=int, default=200, metavar="N",
                    help="time both tools on N id-rewritten copies of ROOT (0: not)")
    ap.add_argument("--no-install", action="store_true",
                    help="never run npm: use a ccusage already installed, or skip it")
    ap.add_argument("--quick", action="store_true",
                    help="for make test: --copies 2 --repeats 1 --no-install, no run-time "
                         "table; prints the same comparisons, asserts nothing")
    args = ap.parse_args()
    if args.quick:
        args.copies, args.repeats, args.no_install = min(args.copies, 2), 1, True
    root: Path = args.root.resolve()
    md = args.markdown

    pinned = find_ccusage(args.ccusage_dir, install=not args.no_install)
    tools = [] if pinned is None else [pinned] + [
        ensure_ccusage(args.ccusage_dir.with_name(f"{args.ccusage_dir.name}-{v}"), v)
        for v in args.also_ccusage]
    if pinned is None:
        print(f"ccusage: no binary found (not under {args.ccusage_dir}, none on PATH"
              f"{', npm not run' if args.no_install else ', no npm'}): skipped")
    home = Path(tempfile.mkdtemp(prefix="vakpipe-bench-ccusage-home-"))
    scratch = Path(tempfile.mkdtemp(prefix="vakpipe-bench-ccusage-"))
    try:
        env = ccusage_env(root, home)
        daily = [parse_daily(run_ccusage(t.wrapper, DAILY_ARGS, env)) for t in tools]
        sessions = run_ccusage(tools[0].wrapper, ("claude", "session", "--json",
                                                  "--offline", "--timezone", "UTC"),
                               env) if tools else None
        rc = recount(root)
        deadline = time.monotonic() + args.wait_vakpipe
        while (why := vakpipe_missing()) and time.monotonic() < deadline:
            time.sleep(min(30.0, max(0.0, deadline - time.monotonic())))
        vk: Vakpipe | str = why or run_vakpipe(root, scratch / "run", args.workers)

        print(f"corpus: {root}: {len(rc.files)} transcript files "
              f"({sum(source_of(f) != 'session' for f in rc.files)} under subagents/), "
              f"{rc.lines:,} lines, {rc.bytes / 1e6:.1f} MB; recount: {len(rc.requests)} "
              f"requests in {sum(r.lines for r in rc.requests):,} assistant lines, "
              f"{len(rc.progress_only)} more only in agent_progress mirrors, "
              f"{rc.copies} copied across files, {rc.unusable} lines without usage")
        for t, (_, agents) in zip(tools, daily, strict=True):
            found = ", ".join(agents) or "not reported"
            print(f"ccusage {t.version}: ccusage {' '.join(DAILY_ARGS)} "
                  f"(CLAUDE_CONFIG_DIR={root}); agents found: {found}")
        print("vakpipe: " + (vk if isinstance(vk, str) else
                             "vakpipe audit, then vakpipe cost --by day,model (costs.csv's "
                             "billed columns)"))
        print()
        report(rc, [(t.version, d) for t, (d, _) in zip(tools, daily, strict=True)],
               sessions, vk, md)
        if tools and not args.quick:
            print()
            timings(tools, env, root, scratch, vk, args, md)
        if args.copies > 0:
            print()
            copies_timings(tools[0] if tools else None, root, home, scratch, rc, daily[0][0]
                           if daily else None, vk, args)
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


def report(rc: Recount, ccusages: list[tuple[str, dict[str, CcusageDay]]], sessions: Any,
           vk: Vakpipe | str, md: bool) -> None:
    """The side-by-side table, then every difference with its cause."""
    _, rc_unknown = priced(rc.requests + rc.progress_only, one_hour=True)
    models = {r.model for r in rc.requests + rc.progress_only}
    for _, cc in ccusages:
        models -= {m for d in cc.values() for m, (_, _, ok) in d.models.items() if not ok}
    if isinstance(vk, Vakpipe):
        models -= {m for (_, m), (_, _, unknown) in vk.by_day_model.items() if unknown}
    both = models - rc_unknown  # dollars only on models every side prices

    sides = []
    for version, cc in ccusages:
        sides.append(Side(f"ccusage {version}", {d: v.tokens for d, v in cc.items()},
                          {d: sum(c for m, (_, c, _) in v.models.items() if m in both)
                           for d, v in cc.items()}))
    if isinstance(vk, Vakpipe):
        vt: dict[str, Tokens] = {}
        vu: dict[str, float] = defaultdict(float)
        for (day, model), (t, usd, _) in vk.by_day_model.items():
            vt[day] = _add(vt.get(day, ZERO), t)
            vu[day] += usd if model in both else 0.0
        sides.append(Side("vakpipe", vt, dict(vu)))
    truth = Side("recount", day_totals(by_day(rc.counted)),
                 priced(rc.counted, one_hour=True, models=both)[0])
    days: list[str] = sorted(set().union(*(s.tokens for s in [*sides, truth])))

    print("Daily totals, UTC days. recount: final streamed line per message.id + requestId, "
          "every transcript file (subagents and compactions included), and the requests "
          "only in agent_progress mirrors, each once; USD at vakpipe's price table, one-hour "
          "cache writes at its cache_write_1h rate. vakpipe: billed.")
    rows = []
    for day in days:
        t = truth.tokens.get(day, ZERO)
        for i, k in enumerate(KINDS):
            vals = [s.tokens.get(day, ZERO)[i] for s in sides]
            rows.append([day if i == 0 else "", LABELS[k], *map(_n, vals), _n(t[i]),
                         *(_d(v - t[i]) for v in vals)])
        vals_usd = [s.usd.get(day, 0.0) for s in sides]
        tu = truth.usd.get(day, 0.0)
        rows.append(["", "USD", *map(_usd, vals_usd), _usd(tu),
                     *(_dusd(v - tu) for v in vals_usd)])
    names = [s.name for s in sides]
    print(table(["day", "kind", *names, "recount", *(f"{n} − recount" for n in names)],
                rows, md))
    print(f"USD: on the models every side prices ({', '.join(sorted(both))}).")
    unpriced = sorted({r.model for r in rc.requests + rc.progress_only} - both)
    if unpriced:
        print(f"left out of USD (unpriced by one side): {', '.join(unpriced)}")
    print()
    explain(rc, [s for s in sides if s.name != "vakpipe"], both, md)
    notes(rc, sides[0] if ccusages else None, sessions)
    if isinstance(vk, Vakpipe):
        print()
        vakpipe_differences(rc, vk, md)


def explain(rc: Recount, sides: list[Side], both: set[str], md: bool) -> None:
    """For each ccusage, the behaviour that predicts its figures best, and per day the
    difference from the recount split into its causes, with what is left unexplained.

    The recount keeps the final line, counts the mirrors-only requests and prices
    one-hour writes at their own rate; each cause is the step from it towards the
    behaviour: the line kept, then one-hour writes at the 5-minute rate (if the behaviour
    does so), then the mirrors-only requests left out (if it ignores mirrors). A cause
    column that is 0 on every day is left out."""
    candidates = behaviours(rc, both)
    final = day_totals(by_day(rc.counted))
    mirrors = {m: day_totals(by_day(rc.progress_only, LINE_RULES[m])) for m in LINE_RULES}
    base_usd = priced(rc.counted, one_hour=True, models=both)[0]
    for side in sides:
        best = min(candidates, key=lambda b: residual(side, b))
        tok_left, usd_left = residual(side, best)
        ties = [b.line for b in candidates if b.line != best.line and b.mirrors == best.mirrors
                and b.one_hour == best.one_hour and residual(side, b) == (tok_left, usd_left)]
        print(f"{side.name} − recount, explained: it {best.words(ties)} "
              f"(unexplained: {tok_left:,} tokens, ${usd_left:.4f})")
        pick = LINE_RULES[best.line]
        line_only = day_totals(by_day(rc.counted, pick))
        line_usd = priced(rc.counted, one_hour=True, pick=pick, models=both)[0]
        line_ttl = priced(rc.counted, one_hour=best.one_hour, pick=pick, models=both)[0]
        cols: dict[str, list[str]] = defaultdict(list)
        zero: dict[str, bool] = defaultdict(lambda: True)
        for day in sorted(set(side.tokens) | set(final)):
            gap = _sub(side.tokens.get(day, ZERO), final.get(day, ZERO))
            m = _sub(ZERO, mirrors[best.line].get(day, ZERO)) if not best.mirrors else ZERO
            ln = _sub(line_only.get(day, ZERO), final.get(day, ZERO))
            usd_gap = side.usd.get(day, 0.0) - base_usd.get(day, 0.0)
            usd_line = line_usd.get(day, 0.0) - base_usd.get(day, 0.0)
            usd_1h = line_ttl.get(day, 0.0) - line_usd.get(day, 0.0)
            usd_m = best.usd.get(day, 0.0) - line_ttl.get(day, 0.0)
            cells = {
                "day": (day, False),
                "tokens (in/out/write/read)": ("/".join(map(_d, gap)), False),
                "tokens: mirrors ignored": ("/".join(map(_d, m)), m != ZERO),
                "tokens: line kept": ("/".join(map(_d, ln)), ln != ZERO),
                "tokens: unexplained": ("/".join(map(_d, _sub(_sub(gap, m), ln))), False),
                "USD": (_dusd(usd_gap), False),
                "USD: mirrors ignored": (_dusd(usd_m), _dusd(usd_m) != "0"),
                "USD: line kept": (_dusd(usd_line), _dusd(usd_line) != "0"),
                "USD: 1h writes at the 5-minute rate": (_dusd(usd_1h), _dusd(usd_1h) != "0"),
                "USD: unexplained": (_dusd(usd_gap - usd_m - usd_line - usd_1h), False)}
            for name, (cell, nonzero) in cells.items():
                cols[name].append(cell)
                if nonzero:
                    zero[name] = False
        keep = [n for n in cols if ":" not in n or n.endswith("unexplained") or not zero[n]]
        print(table(keep, [list(r) for r in zip(*(cols[n] for n in keep), strict=True)], md,
                    left=1))
        print()


def notes(rc: Recount, pinned: Side | None, sessions: Any) -> None:
    """The facts behind the causes, counted in these files."""
    first = day_totals(by_day(rc.requests, LINE_RULES["first"]))
    final = day_totals(by_day(rc.requests))
    multi = sum(r.lines > 1 for r in rc.requests)
    lost = sum(final[d][1] - first.get(d, ZERO)[1] for d in final)
    out_total = sum(t[1] for t in final.values())
    print(f"- streamed lines: {multi} of {len(rc.requests)} requests span several lines; "
          f"the first line's usage differs from the final one in "
          f"{sum(r.first != r.tokens for r in rc.requests)} (output_tokens only: "
          f"{sum(r.first[0] != r.tokens[0] or r.first[2:] != r.tokens[2:] for r in rc.requests)}"
          f" differ in another kind); keeping the first line loses {lost:,} output tokens "
          f"({lost / max(1, out_total):.0%}): " + ", ".join(
              f"{d} {final[d][1] - first.get(d, ZERO)[1]:,}" for d in sorted(final)))
    print(f"- the line with the most tokens differs from the final line in "
          f"{sum(r.biggest != r.tokens for r in rc.requests)} requests")
    print(f"- agent_progress mirrors: {rc.mirrored} requests of subagent files are mirrored "
          f"in their parent file ({rc.mirror_differs} mirrors differ from the final line); "
          f"{len(rc.progress_only)} requests exist only as mirrors: " + "; ".join(
              f"{r.day} {r.path.rsplit('/', 1)[-1]} {r.model} "
              f"{'/'.join(map(_n, r.tokens))}" for r in sorted(rc.progress_only,
                                                            key=lambda r: r.key)))
    hour: dict[str, int] = defaultdict(int)
    write: dict[str, int] = defaultdict(int)
    for r in rc.counted:
        hour[r.day] += min(r.cache_1h, r.tokens[2])
        write[r.day] += r.tokens[2]
    print("- one-hour cache writes (usage.cache_creation.ephemeral_1h_input_tokens) of all "
          "cache writes, mirrors-only requests included: " + ", ".join(
              f"{d} {hour[d]:,} of {write[d]:,}" for d in sorted(hour)))
    at_1h, _ = priced(rc.counted, one_hour=True)
    at_5m, _ = priced(rc.counted, one_hour=False)
    print(f"- recount USD (mirrors-only requests included) with one-hour writes at their "
          f"rate (vakpipe now): "
          f"${sum(at_1h.values()):,.4f}; every write at the 5-minute rate (vakpipe before "
          f"cache_write_1h, ccusage 18.0.11): ${sum(at_5m.values()):,.4f}, short by "
          f"${sum(at_1h.values()) - sum(at_5m.values()):,.4f}: " + ", ".join(
              f"{d} {at_1h[d] - at_5m.get(d, 0.0):,.4f}" for d in sorted(at_1h)))
    by_src: dict[str, Tokens] = defaultdict(lambda: ZERO)
    n_src: dict[str, int] = defaultdict(int)
    for r in rc.counted:
        by_src[r.source] = _add(by_src[r.source], r.tokens)
        n_src[r.source] += 1
    side = sum(r.sidechain for r in rc.requests)
    print("- by file kind (progress: mirrors only): " + "; ".join(
        f"{s}: {n_src[s]} requests, {sum(t):,} tokens" for s, t in sorted(by_src.items())) +
        f"; {side} requests are isSidechain lines, all in subagents/ files")
    if pinned is None or sessions is None:
        return
    s_tot = sessions.get("totals", {})
    s_t = (s_tot.get("inputTokens", 0), s_tot.get("outputTokens", 0),
           s_tot.get("cacheCreationTokens", 0), s_tot.get("cacheReadTokens", 0))
    d_t = ZERO
    for t in pinned.tokens.values():
        d_t = _add(d_t, t)
    print(f"- {pinned.name} session report: {'/'.join(map(_n, s_t))}, its daily report: "
          f"{'/'.join(map(_n, d_t))}, daily − session: {'/'.join(map(_d, _sub(d_t, s_t)))} "
          "(the session report's loader does not read agent_progress mirrors)")


def vakpipe_differences(rc: Recount, vk: Vakpipe, md: bool) -> None:
    """vakpipe − recount per file (the usage table's session_path vs the file): the four
    token kinds and the one-hour share of the cache writes, for the requests of the
    file's own lines (usage rows of any kind but ``mirror``) and, apart, for the
    subagents' requests it mirrors (``kind = mirror`` rows vs the recount's mirrors)."""

    def per_file(reqs: Iterable[Request]) -> tuple[dict[str, Tokens], dict[str, int]]:
        toks: dict[str, Tokens] = defaultdict(lambda: ZERO)
        hours: dict[str, int] = defaultdict(int)
        for r in reqs:
            toks[r.path] = _add(toks[r.path], r.tokens)
            hours[r.path] += min(r.cache_1h, r.tokens[2])
        return toks, hours

    def theirs_of(by_file: dict[str, Tokens], hour_by_file: dict[str, int],
                  names: Iterable[str]) -> tuple[dict[str, Tokens], dict[str, int]]:
        toks: dict[str, Tokens] = defaultdict(lambda: ZERO)
        hours: dict[str, int] = defaultdict(int)
        known = list(names)
        for path, t in by_file.items():  # session_path may carry a prefix: match the tail
            rel = next((f for f in known if path == f or path.endswith("/" + f)), path)
            toks[rel] = _add(toks[rel], t)
            hours[rel] += hour_by_file.get(path, 0)
        return toks, hours

    rows = []
    sums: dict[str, tuple[int, int]] = {}
    for what, reqs, by_file, hour_by_file in (
            ("requests", rc.requests, vk.by_file, vk.hour_by_file),
            ("mirrors", rc.mirrors, vk.mirror_by_file, vk.mirror_hour_by_file)):
        mine, mine_1h = per_file(reqs)
        theirs, theirs_1h = theirs_of(by_file, hour_by_file, rc.files)
        sums[what] = (sum(theirs_1h.values()), sum(mine_1h.values()))
        rows += [[f, what, _n(sum(theirs.get(f, ZERO))), _n(sum(mine.get(f, ZERO))),
                  "/".join(_d(x) for x in _sub(theirs.get(f, ZERO), mine.get(f, ZERO))),
                  _d(theirs_1h.get(f, 0) - mine_1h.get(f, 0))]
                 for f in sorted(set(mine) | set(theirs))
                 if theirs.get(f, ZERO) != mine.get(f, ZERO)
                 or theirs_1h.get(f, 0) != mine_1h.get(f, 0)]
    print(f"vakpipe − recount per file: {vk.rows} billed usage rows (not mirrors) vs "
          f"{len(rc.requests)} requests in transcript lines, {sums['requests'][0]:,} vs "
          f"{sums['requests'][1]:,} one-hour cache-write tokens; {vk.mirror_rows} "
          f"kind = mirror rows vs {len(rc.mirrors)} mirrored requests "
          f"({len(rc.progress_only)} of them only mirrored), {sums['mirrors'][0]:,} vs "
          f"{sums['mirrors'][1]:,} one-hour cache-write tokens; audit exit {vk.audit_exit}; "
          f"billed tokens on waste: {dict(vk.waste) or 'none'}")
    if rows:
        print(table(["file", "rows", "vakpipe", "recount", "in/out/write/read", "1h writes"],
                    rows, md, left=2))
    else:
        print("every file agrees, token for token, one-hour writes included, for its own "
              "requests and for the subagents' requests it mirrors")


def timings(tools: list[Ccusage], env: dict[str, str], root: Path, scratch: Path,
            vk: Vakpipe | str, args: argparse.Namespace, md: bool) -> None:
    """Best-of run times, the tools interleaved in each round (load on a shared machine
    hits them alike), with ratios against the pinned ccusage."""

    def cc(binary: Path) -> Callable[[], object]:
        return lambda: subprocess.run([str(binary), *DAILY_ARGS], env=env, check=True,
                                      capture_output=True)

    pinned = tools[0]
    runs: list[tuple[str, Callable[[], object]]] = [
        (f"ccusage {pinned.version} daily (npm command: node wrapper + native binary)",
         cc(pinned.wrapper))]
    if pinned.native is not None:
        runs.append((f"ccusage {pinned.version} daily (native binary alone)",
                     cc(pinned.native)))
    runs += [(f"ccusage {t.version} daily", cc(t.wrapper)) for t in tools[1:]]
    runs.append(("recount (pure Python, in process)", lambda: recount(root)))
    if isinstance(vk, Vakpipe):
        out, report = scratch / "t" / "out", scratch / "t" / "report"

        def audit(scheduler: str | None = None) -> Callable[[], object]:
            def run() -> None:
                shutil.rmtree(out, ignore_errors=True)
                subprocess.run(audit_cmd(root, out, args.workers, scheduler), check=True,
                               capture_output=True)
            return run

        def cost() -> None:
            subprocess.run(cost_cmd(out, report), check=True, capture_output=True)

        workers = f"--workers {args.workers}" if args.workers else "default workers"
        runs += [(f"vakpipe audit ({workers}, CLI)", audit()),
                 ("vakpipe cost --by day,model (CLI)", cost)]
    best = dict.fromkeys((name for name, _ in runs), float("inf"))
    for _ in range(args.repeats):
        for name, fn in runs:
            best[name] = min(best[name], best_of(fn, 1))
    rows = list(best.items())
    if isinstance(vk, Vakpipe):
        rows.append(("vakpipe audit + cost", rows[-2][1] + rows[-1][1]))
        # vakpipe's fixed costs on a corpus this small: importing Dask, distributed and
        # pyarrow, and starting a cluster (the next row leaves that out).
        rows.append(("vakpipe's imports alone (python -c 'import pipeline.run.orchestrate')",
                     best_of(lambda: subprocess.run(
                         [sys.executable, "-c", "import pipeline.run.orchestrate"], check=True,
                         cwd=REPO), args.repeats)))
        # What the audit costs without starting its cluster: the same CLI joining a
        # running one (--scheduler), as a deployment or the nightly job does.
        # distributed's constructors are untyped for mypy --strict: take the module as
        # Any. Its scratch space is under ours, removed at the end.
        dist = importlib.import_module("distributed")
        with dist.LocalCluster(n_workers=args.workers or os.cpu_count() or 1,
                               threads_per_worker=1, processes=True,
                               dashboard_address="127.0.0.1:0",
                               local_directory=str(scratch / "dask")) as running:
            rows.append(("vakpipe audit (CLI, --scheduler of a running cluster)",
                         best_of(audit(running.scheduler_address), args.repeats)))
    base = rows[0][1]
    print(f"Run times on the same files ({root}), best of {args.repeats} rounds, tools "
          f"interleaved; ratio: time / ccusage {pinned.version} daily")
    print(table(["tool", "best s", "ratio"],
                [[name, f"{s:.3f}", f"{s / base:.2f}"] for name, s in rows], md, left=1))



# --------------------------------------------------------------------------- copies

#: Ids a tool could merge two copies of a request or a session by: Claude Code's
#: message, request and tool-use ids, and every UUID (session ids, ``uuid`` and
#: ``parentUuid``, file and folder names). Byte patterns: copies are rewritten as bytes.
_IDS = re.compile(rb"\b(?:msg|req|toolu)_[A-Za-z0-9]+|"
                  rb"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


def copy_ids(copy: int) -> Callable[[bytes], bytes]:
    """The rewrite of copy number ``copy``: every id of :data:`_IDS` mapped to one of
    its own, the same way everywhere in the copy (so links between lines and files
    hold), and differently in every copy (so nothing links or merges across copies).
    A UUID stays a UUID (v5 of the copy and the original); other ids get a suffix."""
    memo: dict[bytes, bytes] = {}

    def new(m: re.Match[bytes]) -> bytes:
        old = m.group()
        got = memo.get(old)
        if got is None:
            if old[:4] in (b"msg_", b"req_") or old.startswith(b"toolu_"):
                got = old + b"c%d" % copy
            else:
                got = str(uuid5(NAMESPACE_URL, f"copy-{copy}/{old.decode()}")).encode()
            memo[old] = got
        return got

    return lambda data: _IDS.sub(new, data)


def make_copies(src: Path, n: int, dest: Path) -> Path:
    """``dest``: ``n`` copies of the Claude config folder ``src`` (every transcript file
    of :func:`transcript_files`), each under ``projects/<dir>-copy<k>/`` with its ids
    rewritten (:func:`copy_ids`); made once and reused (``dest/.complete``)."""
    marker = dest / ".complete"
    if marker.exists() and marker.read_text() == str(n):
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    files = transcript_files(src)
    for k in range(n):
        rewrite = copy_ids(k)
        for path in files:
            parts = list(path.relative_to(src).parts)
            at = parts.index("projects") + 1
            parts[at] = f"{parts[at]}-copy{k}"
            rel = rewrite("/".join(parts).encode()).decode()
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(rewrite(path.read_bytes()))
    marker.write_text(str(n))
    return dest


def _cpu_all() -> float:
    """CPU seconds of this process and of its finished children (their children too:
    vakpipe's Dask workers are waited for by the CLI that started them)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _scaled(t: Tokens, n: int) -> Tokens:
    return t[0] * n, t[1] * n, t[2] * n, t[3] * n


def _total(days: Iterable[Tokens]) -> Tokens:
    out = ZERO
    for t in days:
        out = _add(out, t)
    return out


def copies_timings(cc: Ccusage | None, src: Path, home: Path, scratch: Path, rc: Recount,
                   daily: dict[str, CcusageDay] | None, vk: Vakpipe | str,
                   args: argparse.Namespace) -> None:
    """Wall and CPU time of ccusage's native binary (``daily --json``), vakpipe's audit +
    cost (two CLI commands, as a user runs them, and the one command that does both) and
    the recount on ``--copies`` copies of ``src`` (:func:`make_copies`), interleaved,
    best of ``--repeats``; their ratios; and whether each tool's totals on the copies
    are N times its totals on one (no copy merged with another)."""
    from bench.common import BENCH_DIR, best, rounds_of, spread

    n = args.copies
    root = make_copies(src, n, BENCH_DIR / f"claude-code-copies-{n}")
    size = sum(p.stat().st_size for p in transcript_files(root))
    print(f"copies: {n} id-rewritten copies of {src.name} ({size / 1e6:,.1f} MB) in {root}")
    out, report = scratch / "copies" / "out", scratch / "copies" / "report"
    one_step = scratch / "copies-one-step" / "out"
    results: dict[str, Any] = {}

    def ccusage_run() -> None:
        assert cc is not None
        binary = cc.native or cc.wrapper
        results["ccusage"] = run_ccusage(binary, DAILY_ARGS, ccusage_env(root, home))

    def vakpipe_run() -> None:
        shutil.rmtree(out.parent, ignore_errors=True)
        audit = subprocess.run(audit_cmd(root, out, args.workers), capture_output=True,
                               check=False)
        if audit.returncode not in (0, 1, 3):
            sys.exit(f"vakpipe audit on the copies exited {audit.returncode}: "
                     f"{audit.stderr.decode(errors='replace')[-400:]}")
        subprocess.run(cost_cmd(out, report), capture_output=True, check=True)

    def one_step_run() -> None:
        shutil.rmtree(one_step.parent, ignore_errors=True)
        done = subprocess.run(one_step_cmd(root, one_step, args.workers), capture_output=True,
                              check=False)
        if done.returncode not in (0, 3):  # 3: partial
            sys.exit(f"vakpipe cost --out on the copies exited {done.returncode}: "
                     f"{done.stderr.decode(errors='replace')[-400:]}")

    def recount_run() -> None:
        results["recount"] = recount(root)

    runs: list[tuple[str, Callable[[], None]]] = []
    if cc is not None:
        kind = "native binary" if cc.native is not None else "npm command"
        runs.append((f"ccusage {cc.version} daily ({kind})", ccusage_run))
    if isinstance(vk, Vakpipe):
        workers = f"--workers {args.workers}" if args.workers else "default workers"
        runs.append((f"vakpipe audit + cost ({workers}, CLI)", vakpipe_run))
        runs.append((f"vakpipe cost ROOT --out ({workers}, one step)", one_step_run))
    runs.append(("recount (pure Python, in process)", recount_run))
    rounds = rounds_of(args.repeats, *(fn for _, fn in runs), cpu=_cpu_all)
    timing = dict(zip((name for name, _ in runs), best(rounds), strict=True))
    for name, t in timing.items():
        print(f"  {name:52s} wall {t.wall:7.2f} s ({size / 1e6 / t.wall:6.1f} MB/s), "
              f"CPU {t.cpu:7.2f} s ({size / 1e6 / max(t.cpu, 1e-9):6.1f} MB/s)")
    names = list(timing)
    b = 0 if cc is not None else len(names) - 1  # ccusage, else the recount
    base = names[b]
    for i, name in enumerate(names):
        if i == b:
            continue
        print(f"  ratio {name.split(' (')[0]} / {base.split(' (')[0]}: wall "
              f"{timing[name].wall / timing[base].wall:.2f} x, CPU "
              f"{timing[name].cpu / max(timing[base].cpu, 1e-9):.2f} x; wall by round "
              f"{spread([r[i].wall / r[b].wall for r in rounds])}")
    if cc is None:
        print("  ratio against ccusage: skipped (no ccusage binary)")

    # No tool may merge the copies: each one's totals are n times its totals on one.
    checks = []
    one = _total(day_totals(by_day(rc.counted)).values())
    copied = results["recount"]
    checks.append(("recount", _total(day_totals(by_day(copied.counted)).values()), one))
    if cc is not None and daily is not None:
        many, _ = parse_daily(results["ccusage"])
        checks.append((f"ccusage {cc.version}", _total(d.tokens for d in many.values()),
                       _total(d.tokens for d in daily.values())))
    for name, table in (("vakpipe", report / "costs.csv"),
                        ("vakpipe one step", one_step / "cost" / "costs.csv")):
        if isinstance(vk, Vakpipe) and table.exists():
            with open(table, newline="") as f:
                rows = [[int(row[f"billed_{k}_tokens"]) for k in KINDS]
                        for row in csv.DictReader(f)]
            mine = _total((r[0], r[1], r[2], r[3]) for r in rows)
            checks.append((name, mine, _total(t for t, _, _ in vk.by_day_model.values())))
    for name, got, single in checks:
        verdict = "= N x one copy" if got == _scaled(single, n) else \
            f"!= N x one copy ({'/'.join(map(_n, _scaled(single, n)))}): copies merged?"
        print(f"  totals on the copies, {name}: {'/'.join(map(_n, got))} {verdict}")

if __name__ == "__main__":
    main()
