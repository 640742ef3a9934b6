"""Where prices come from (docs/cost-rules.md, "Where prices come from"): vakpipe's TOML
rules, genai-prices' bundled data, and the layered table a report uses (a user's file,
then vakpipe's overrides, then genai-prices).

Every table runs the same contract; genai-prices' rates carried into vakpipe's
convention are checked against genai-prices' own arithmetic; nothing reaches the network;
and ``vakpipe cost --fail-on unpriced`` runs as a separate process.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import genai_prices
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cli import EXIT_FINDINGS, EXIT_OK
from pipeline.costs.pricing import (
    GenaiPriceTable,
    LayeredPriceTable,
    Price,
    PriceTable,
    Rates,
    TokenUsage,
    TomlPriceTable,
    load_genai_prices,
    load_prices,
    load_toml_prices,
    price,
)
from pipeline.errors import UsageError
from tests.helpers.data_paths import REAL
from tests.helpers.storage import run_vakpipe

D = Decimal
OWN = load_toml_prices()
assert OWN.as_of is not None
GENAI = load_genai_prices(OWN.as_of)
LAYERED = load_prices()


def _tables() -> dict[str, tuple[PriceTable, tuple[str, str]]]:
    """Each implementation, with a model it knows."""
    return {"toml": (OWN, ("anthropic", "claude-sonnet-4-0")),
            "genai": (GENAI, ("openai", "gpt-5.3-codex")),
            "layered": (LAYERED, ("anthropic", "claude-opus-4-6"))}


@pytest.fixture(params=sorted(_tables()))
def table(request: pytest.FixtureRequest) -> tuple[PriceTable, tuple[str, str]]:
    return _tables()[request.param]


# ---- the contract every PriceTable keeps


def _decimals(r: Rates) -> bool:
    return all(isinstance(getattr(r, k), Decimal)
               for k in ("input", "output", "cache_read", "cache_write")) and (
        r.cache_write_1h is None or isinstance(r.cache_write_1h, Decimal))


def test_contract_a_known_model_has_decimal_rates(
        table: tuple[PriceTable, tuple[str, str]]) -> None:
    prices, (provider, model) = table
    rule = prices.lookup(provider, model)
    assert isinstance(rule, Price)
    assert _decimals(rule.base) and (rule.tier is None or _decimals(rule.tier.rates))
    cost = price(TokenUsage(1_000_000, 1_000_000, 1_000_000, 1_000_000), rule)
    assert isinstance(cost.total, Decimal) and cost.total > 0 and not cost.unknown_model


@pytest.mark.parametrize(("provider", "model"), [
    ("acme", "mystery-1"),           # no layer knows it
    ("openai", "gpt-5.5-mini"),      # a sibling of known models is not priced as them
    ("anthropic", "gpt-5"),          # the model, from a provider that does not sell it
    ("anthropic", ""),
    ("anthropic", None),
])
def test_contract_an_unknown_model_is_none(table: tuple[PriceTable, tuple[str, str]],
                                           provider: str, model: str | None) -> None:
    prices, _ = table
    assert prices.lookup(provider, model) is None


def test_contract_without_a_provider_only_wildcard_rules_match(
        table: tuple[PriceTable, tuple[str, str]]) -> None:
    prices, (_, model) = table
    assert prices.lookup(None, model) is None
    assert prices.lookup("", model) is None


def test_contract_provider_and_model_are_case_insensitive(
        table: tuple[PriceTable, tuple[str, str]]) -> None:
    prices, (provider, model) = table
    rule = prices.lookup(provider, model)
    for p, m in ((provider.upper(), model), (provider.title(), model.upper())):
        other = prices.lookup(p, m)
        assert other is not None and (other.base, other.tier) == (rule.base, rule.tier)  # type: ignore[union-attr]


def test_contract_lookups_are_stable(table: tuple[PriceTable, tuple[str, str]]) -> None:
    prices, (provider, model) = table
    assert prices.lookup(provider, model) == prices.lookup(provider, model)


# ---- what the layered table prices


def _real_models() -> set[tuple[str, str]]:
    """(provider, model) of every request in the real transcripts (tests/data/real)."""
    found: set[tuple[str, str]] = set()
    for path in sorted((REAL / "claude-code").rglob("*.jsonl")):
        for line in path.read_text("utf-8").splitlines():
            obj = json.loads(line)
            msg = obj.get("message") if obj.get("type") == "assistant" else None
            if isinstance(msg, dict) and isinstance(msg.get("usage"), dict):
                found.add(("anthropic", msg["model"]))
    for path in sorted((REAL / "codex").rglob("*.jsonl")):
        provider, models = None, set()
        for line in path.read_text("utf-8").splitlines():
            obj = json.loads(line)
            if obj.get("type") == "session_meta":
                provider = obj["payload"]["model_provider"]
            elif obj.get("type") == "turn_context":
                models.add(obj["payload"]["model"])
        assert provider is not None, path
        found |= {(provider, m) for m in models}
    return found


def test_every_model_of_the_real_transcripts_is_priced() -> None:
    models = _real_models()
    assert {("openai", "gpt-5.3-codex"), ("anthropic", "claude-opus-4-6"),
            ("anthropic", "claude-sonnet-4-5-20250929"),
            ("anthropic", "claude-haiku-4-5-20251001")} <= models
    assert {m for m in models if LAYERED.lookup(*m) is None} == set()


def test_gpt_5_3_codex_is_priced_at_openai_list_rates() -> None:
    rule = LAYERED.lookup("openai", "gpt-5.3-codex")
    assert rule is not None and rule.tier is None
    assert rule.base == Rates(D("1.75"), D("14"), D("0.175"), D("1.75"))  # no write surcharge
    # 1,000 uncached + 9,000 cached input, 500 output: cached tokens at the read rate only
    assert price(TokenUsage(1000, 500, 9000), rule).total == D("0.010325")


def test_the_override_layer_wins_and_a_users_file_wins_over_it(tmp_path: Path) -> None:
    # genai-prices prices Claude Sonnet 4 flat; Anthropic lists a tier above 200K prompt
    # tokens for it (as for 4.5), which vakpipe's own rule keeps.
    assert GENAI.lookup("anthropic", "claude-sonnet-4-20250514").tier is None  # type: ignore[union-attr]
    ours = LAYERED.lookup("anthropic", "claude-sonnet-4-20250514")
    assert ours is not None and ours.tier is not None
    assert (ours.tier.above, ours.tier.rates.input, ours.tier.rates.output) == (
        200_000, D(6), D("22.50"))
    assert ours == OWN.lookup("anthropic", "claude-sonnet-4-20250514")
    mine = tmp_path / "mine.toml"
    mine.write_text('[[model]]\nprovider = "openai"\npattern = "gpt-5.3-codex"\n'
                    'input = 1\noutput = 2\n')
    users = load_prices(mine)
    assert users.lookup("openai", "gpt-5.3-codex").base.input == 1  # type: ignore[union-attr]
    assert users.lookup("anthropic", "claude-opus-4-6") == LAYERED.lookup(
        "anthropic", "claude-opus-4-6")
    assert users.version == f"{LAYERED.version}+mine.toml"
    assert users.source.endswith(" + your mine.toml")


def test_the_layers_name_their_source_and_version() -> None:
    assert isinstance(LAYERED, LayeredPriceTable)
    assert isinstance(LAYERED.layers[0], TomlPriceTable)
    assert isinstance(LAYERED.layers[1], GenaiPriceTable)
    assert LAYERED.as_of == OWN.as_of
    version = genai_prices.__version__
    assert LAYERED.source == (f"genai-prices {version} (bundled data, prices in force on "
                              f"{OWN.as_of}) + vakpipe overrides {OWN.version}")
    assert LAYERED.version == f"{OWN.version}+genai-prices-{version}"


def test_each_built_in_price_source_vakpipe_plugins_lists_is_a_prices_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `vakpipe plugins` lists prices.toml and genai-prices as price sources: --prices
    # takes either name (it once read each as a missing file, exit 2).
    monkeypatch.chdir(tmp_path)
    assert load_prices("prices.toml", cache=False) == load_prices(None, cache=False)
    genai_first = load_prices("genai-prices", cache=False)
    assert [type(t) for t in genai_first.layers] == [GenaiPriceTable, TomlPriceTable]
    assert genai_first.version == f"{LAYERED.version}+genai-prices-first"
    assert genai_first.source == f"{LAYERED.source}, genai-prices tried first"
    # vakpipe's override keeps the long-context tier genai-prices lacks; genai-prices
    # first prices by its own rule.
    model = ("anthropic", "claude-sonnet-4-20250514")
    assert genai_first.lookup(*model) == GENAI.lookup(*model) != LAYERED.lookup(*model)


def test_a_prices_name_that_is_no_file_and_no_source_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"^cannot read price table genai-price: no such "
                       r"file, and no price source of that name \(vakpipe plugins lists "
                       r"them\)$"):
        load_prices("genai-price", cache=False)
    # A file of a built-in source's name is the user's file, read as one.
    (tmp_path / "genai-prices").write_text('[[model]]\nprovider = "openai"\n'
                                           'pattern = "gpt-4o"\ninput = 1\noutput = 2\n')
    mine = load_prices("genai-prices", cache=False)
    assert mine.version == f"{LAYERED.version}+genai-prices"
    assert mine.lookup("openai", "gpt-4o").base.input == 1  # type: ignore[union-attr]


def test_what_a_price_cannot_hold_is_unknown_not_mispriced() -> None:
    # DeepSeek's prices depend on the hour of the request, which a ledger does not give.
    assert GENAI.lookup("deepseek", "deepseek-chat") is None


# ---- genai-prices' rates, carried into the ledger's convention


_MODELS = [("anthropic", "claude-opus-4-6"), ("anthropic", "claude-sonnet-4-5"),
           ("anthropic", "claude-haiku-5-5"), ("anthropic", "claude-opus-5-5"),
           ("openai", "gpt-5.3-codex"), ("openai", "gpt-5.5"), ("openai", "gpt-4o")]
_counts = st.integers(0, 400_000)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(_MODELS), _counts, _counts, _counts, _counts, st.integers(0, 100))
def test_our_price_of_genai_rates_is_genai_prices_own_price(
        model: tuple[str, str], inp: int, out: int, read: int, write: int,
        hour_pct: int) -> None:
    hour = write * hour_pct // 100
    rule = GENAI.lookup(*model)
    assert rule is not None
    ours = price(TokenUsage(inp, out, read, write, hour), rule)
    # genai-prices counts input the OpenTelemetry way: cache reads and writes included.
    theirs = genai_prices.calc_price(
        genai_prices.Usage(input_tokens=inp + read + write, output_tokens=out,
                           cache_read_tokens=read, cache_write_tokens=write,
                           cache_write_1h_tokens=hour),
        model[1], provider_id=model[0],
        genai_request_timestamp=datetime.combine(OWN.as_of, datetime.min.time(), UTC))  # type: ignore[arg-type]
    assert ours.total == theirs.total_price
    assert ours.input + ours.cache_read + ours.cache_write == theirs.input_price
    assert ours.output == theirs.output_price


def test_the_bundled_snapshot_is_read_whatever_the_process_wide_one() -> None:
    from genai_prices.data_snapshot import DataSnapshot, set_custom_snapshot

    before = GENAI.lookup("openai", "gpt-5.3-codex")
    fresh = load_genai_prices(GENAI.as_of)
    set_custom_snapshot(DataSnapshot(providers=[], from_auto_update=True))
    try:  # what genai-prices' UpdatePrices would install after a download
        assert fresh.lookup("openai", "gpt-5.3-codex") == before
    finally:
        set_custom_snapshot(None)


# ---- no network


@pytest.fixture
def no_sockets(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    import socket

    tried: list[object] = []

    def refuse(*args: object, **kwargs: object) -> None:
        tried.append(args)
        raise OSError("network use in a pricing test")

    for name in ("connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    yield tried


def test_pricing_works_with_sockets_blocked(no_sockets: list[object]) -> None:
    table = load_prices()
    for provider, model in sorted(_real_models()):
        assert price(TokenUsage(10, 10, 10, 10), table.lookup(provider, model)).total > 0
    assert no_sockets == []


_OFFLINE = textwrap.dedent("""
    import socket, sys, threading
    def refuse(*a, **k):
        raise OSError("network")
    socket.socket.connect = refuse
    socket.socket.connect_ex = refuse
    socket.getaddrinfo = refuse
    socket.create_connection = refuse
    from pipeline.costs.pricing import TokenUsage, load_prices, price
    table = load_prices()
    cost = price(TokenUsage(1000, 500, 9000), table.lookup("openai", "gpt-5.3-codex"))
    names = sorted(t.name for t in threading.enumerate())
    print(cost.total, names)
""")


def test_no_update_thread_and_no_connection_from_import_to_price() -> None:
    """In a fresh process whose sockets refuse from the start: importing genai-prices,
    loading the tables and pricing touch no network and start no update thread."""
    done = subprocess.run([sys.executable, "-c", _OFFLINE], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    total, threads = done.stdout.split(" ", 1)
    assert D(total) == D("0.010325")
    assert "genai_prices" not in threads and "MainThread" in threads


# ---- vakpipe cost --fail-on unpriced, as a separate process


def _unknown_model_transcript(dest: Path) -> None:
    """A copy of the one-request transcript, its model renamed to one nobody prices (and
    its ids changed, so it is not dropped as a copy of the original request)."""
    src = REAL / "claude-code" / "projects" / "-home-marco-projects-spotter" / "short.jsonl"
    text = (src.read_text("utf-8")
            .replace("claude-opus-4-6", "claude-nonexistent-9")
            .replace("msg_01MKH1ccEGrZGNPvu8pYiiQa", "msg_01TestUnknownModel000000")
            .replace("req_011CY15QS2LGwAeBxdfa6e1V", "req_011TestUnknownModel00000")
            .replace("55604662-cf2a-4331-851a-ec234028f8ca",
                     "55604662-cf2a-4331-851a-000000000009"))
    dest.write_text(text, "utf-8")


@pytest.fixture(scope="module")
def audited_real(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real transcripts plus one request of an unknown model, audited by the CLI."""
    root = tmp_path_factory.mktemp("real-archive")
    shutil.copytree(REAL / "claude-code", root / "claude-code")
    shutil.copytree(REAL / "codex", root / "codex")
    _unknown_model_transcript(
        root / "claude-code" / "projects" / "-home-marco-projects-spotter" / "unknown.jsonl")
    out = tmp_path_factory.mktemp("real-out")
    done = _vakpipe("audit", str(root), "--out", str(out), "--workers", "1", "--no-progress")
    assert done.returncode == EXIT_OK, done.stderr
    return out


_vakpipe = functools.partial(run_vakpipe, timeout=600)


def _cost(out: Path, report: Path, *args: str) -> Callable[[], subprocess.CompletedProcess[str]]:
    return lambda: _vakpipe("cost", str(out), "--report-dir", str(report), *args)


def test_fail_on_unpriced_exits_1_naming_the_models(audited_real: Path, tmp_path: Path) -> None:
    plain = _cost(audited_real, tmp_path / "plain")()
    assert plain.returncode == EXIT_OK, plain.stderr
    assert ("vakpipe: warning: unknown model anthropic/claude-nonexistent-9"
            in plain.stderr)
    assert "gpt-5.3-codex" not in plain.stderr  # priced now
    page = (tmp_path / "plain" / "report.html").read_text()
    assert f"genai-prices {genai_prices.__version__}" in page
    assert "vakpipe overrides" in page

    strict = _cost(audited_real, tmp_path / "strict", "--fail-on", "unpriced")()
    assert strict.returncode == EXIT_FINDINGS, strict.stderr
    last = strict.stderr.strip().splitlines()[-1]
    assert last == ("vakpipe: --fail-on unpriced: 1 unpriced model(s): "
                    "anthropic/claude-nonexistent-9 (add a rule in a --prices file)")
    assert "Traceback" not in strict.stderr
    assert (tmp_path / "strict" / "report.html").exists()  # the report is still written


def test_fail_on_unpriced_passes_once_a_users_file_prices_the_model(
        audited_real: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text('[[model]]\nprovider = "anthropic"\npattern = "claude-nonexistent-*"\n'
                    'input = 1\noutput = 2\n')
    done = _cost(audited_real, tmp_path / "r", "--fail-on", "unpriced", "--prices",
                 str(mine))()
    assert done.returncode == EXIT_OK, done.stderr
    assert "unknown model" not in done.stderr
    assert "+ your mine.toml" in (tmp_path / "r" / "report.html").read_text()


def test_prices_takes_a_built_in_source_by_name(audited_real: Path, tmp_path: Path) -> None:
    done = _cost(audited_real, tmp_path / "r", "--prices", "genai-prices")()
    assert done.returncode == EXIT_OK, done.stderr
    assert "genai-prices tried first" in (tmp_path / "r" / "report.html").read_text()


def test_every_anthropic_rate_keeps_anthropics_cache_write_multipliers() -> None:
    """Anthropic's rule (docs/cost-rules.md): a five-minute write is 1.25x input, a
    one-hour write 2x input, at the base rates and at a tier's."""
    from genai_prices.data import providers

    anthropic = next(p for p in providers if p.id == "anthropic")
    checked = 0
    for info in anthropic.models:
        rule = LAYERED.lookup("anthropic", info.id)
        assert rule is not None, info.id
        if rule.base.cache_read == rule.base.input:
            continue  # Claude 1 and 2: no prompt caching
        for r in (rule.base, *([rule.tier.rates] if rule.tier else [])):
            # Claude 3 Haiku's five-minute write is listed rounded: $0.30, not $0.3125.
            five = D("0.30") if info.id == "claude-3-haiku" else r.input * D("1.25")
            assert (r.cache_write, r.cache_write_1h) == (five, r.input * 2), info.id
        checked += 1
    assert checked > 20
