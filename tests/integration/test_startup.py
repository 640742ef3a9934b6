"""Small runs start fast (issue 17, item 7): what each command imports, and the cache of
genai-prices' resolved rules that lets a report skip importing genai-prices.

The import checks run the real CLI in a fresh interpreter (``pipeline.cli.run``) and
read its ``sys.modules`` afterwards: the in-process audit imports no dask or
distributed, and ``vakpipe cost`` imports neither plotly's Python package nor aiohttp,
nor, once the prices of the models it meets are cached, genai-prices.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.costs.pricing import GenaiPriceTable, PriceCache, load_genai_prices, load_toml_prices
from tests.helpers.data_paths import REAL
from tests.helpers.storage import vakpipe_exe

_AS_OF = load_toml_prices().as_of
assert _AS_OF is not None
AS_OF: date = _AS_OF
HEAVY = ("dask", "distributed", "plotly", "genai_prices", "aiohttp", "pydantic")

_PROBE = f"""
import json, sys
from pipeline.cli import run
code = run(sys.argv[1:])
print(json.dumps({{"code": code, "loaded": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def _loaded(args: list[str], cache: Path) -> tuple[int, set[str]]:
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True,
                          text=True, check=False, timeout=300,
                          env={**_env(), "VAKPIPE_CACHE_DIR": str(cache)})
    assert done.stdout, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["code"], set(result["loaded"])


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}


def test_a_small_run_imports_only_what_it_uses(tmp_path: Path) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    code, loaded = _loaded(["audit", str(REAL / "claude-code"), "--out", str(out),
                            "--no-progress"], cache)
    assert code in (0, 3)
    assert not loaded & {"dask", "distributed", "plotly", "genai_prices", "aiohttp"}, loaded

    code, loaded = _loaded(["cost", str(out)], cache)  # first report: fills the cache
    assert code in (0, 3)
    assert "plotly" not in loaded and "aiohttp" not in loaded, loaded
    assert (out / "cost" / "report.html").stat().st_size > 1_000_000  # plotly.js inlined
    first = (out / "cost" / "costs.csv").read_bytes()

    code, loaded = _loaded(["cost", str(out)], cache)  # every model cached now
    assert code in (0, 3)
    assert not loaded & {"plotly", "genai_prices", "pydantic", "aiohttp"}, loaded
    assert (out / "cost" / "costs.csv").read_bytes() == first  # the same prices


_MODELS = [("anthropic", "claude-opus-4-6"), ("anthropic", "claude-sonnet-4-5-20250929"),
           ("anthropic", "claude-haiku-4-5"), ("anthropic", "claude-3-5-sonnet"),
           ("openai", "gpt-5.3-codex"), ("openai", "gpt-5.5"), ("openai", "gpt-4o"),
           ("google", "gemini-2.5-pro"), ("deepseek", "deepseek-chat"),
           ("anthropic", "no-such-model"), ("nobody", "gpt-4o")]


@settings(max_examples=20, deadline=None)
@given(st.lists(st.sampled_from(_MODELS), min_size=1, max_size=6))
def test_a_cached_rule_is_the_rule(tmp_path_factory: pytest.TempPathFactory,
                                   models: list[tuple[str, str]]) -> None:
    folder = tmp_path_factory.mktemp("cache")
    fresh = load_genai_prices(AS_OF, None)
    first = load_genai_prices(AS_OF, folder)
    for provider, model in models:
        assert first.lookup(provider, model) == fresh.lookup(provider, model)
    first.save_cache()
    again = load_genai_prices(AS_OF, folder)
    assert again.version == fresh.version
    for provider, model in models:  # from the file, not genai-prices
        held, rule = again._cache.get(provider, model)
        assert held and rule == fresh.lookup(provider, model)
        assert again.lookup(provider, model) == rule


def test_a_damaged_cache_is_ignored(tmp_path: Path) -> None:
    table = load_genai_prices(AS_OF, tmp_path)
    table.lookup("anthropic", "claude-opus-4-6")
    table.save_cache()
    (path,) = tmp_path.glob("genai-prices-*.json")
    raw = json.loads(path.read_text())
    (key,) = raw["prices"]
    raw["prices"][key]["base"]["input"] = "not a number"
    path.write_text(json.dumps(raw))
    again = load_genai_prices(AS_OF, tmp_path)
    assert again.lookup("anthropic", "claude-opus-4-6") == load_genai_prices(
        AS_OF, None).lookup("anthropic", "claude-opus-4-6")
    path.write_text("{not json")
    assert isinstance(load_genai_prices(AS_OF, tmp_path), GenaiPriceTable)


def test_another_as_of_or_vakpipe_is_another_file(tmp_path: Path) -> None:
    from datetime import timedelta

    one = PriceCache.open(tmp_path, AS_OF)
    other = PriceCache.open(tmp_path, AS_OF - timedelta(days=1))
    assert one.path is not None and other.path is not None and one.path != other.path
    assert PriceCache.open(None, AS_OF).path is None  # VAKPIPE_CACHE_DIR="": no cache


def test_an_unwritable_cache_leaves_the_run_alone(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    table = load_genai_prices(AS_OF, blocker / "cache")  # its parent is a file
    assert table.lookup("openai", "gpt-4o") is not None
    table.save_cache()  # no error


def test_dask_config_is_read_only_when_a_file_may_name_a_scheduler(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.run import orchestrate

    commented = tmp_path / "templates.yaml"
    commented.write_text("# scheduler-address: tcp://10.0.0.5:8786\nkubernetes: {}\n")
    assert not orchestrate._may_set_address(str(commented))
    named = tmp_path / "cluster.yaml"
    named.write_text("scheduler-address: tcp://10.0.0.5:8786  # ours\n")
    assert orchestrate._may_set_address(str(named))
    monkeypatch.setenv("DASK_CONFIG", str(tmp_path))
    assert orchestrate._dask_yaml_present()  # dask is asked
    named.unlink()
    monkeypatch.setattr("os.path.expanduser", lambda p: str(tmp_path / "none"))
    assert not orchestrate._dask_yaml_present() or Path("/etc/dask").is_dir()


def _vakpipe(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([vakpipe_exe(), *args], capture_output=True, text=True, timeout=300,
                          check=False, env={**_env(), "VAKPIPE_CACHE_DIR": str(cache)})


def test_cost_in_one_step_is_audit_then_cost(tmp_path: Path) -> None:
    root, cache = str(REAL / "claude-code"), tmp_path / "cache"
    two, one = tmp_path / "two", tmp_path / "one"
    assert _vakpipe("audit", root, "--out", str(two), "--no-progress",
                    cache=cache).returncode == 0
    priced = _vakpipe("cost", str(two), cache=cache)
    assert priced.returncode == 0, priced.stderr
    done = _vakpipe("cost", root, "--out", str(one), cache=cache)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("run ") and "tables: " in done.stdout  # the audit's summary
    for name in ("costs.csv", "costs.parquet"):
        assert (one / "cost" / name).read_bytes() == (two / "cost" / name).read_bytes()
    # the cost summary (its table, then the totals), but for the run id
    def same(text: str, out: Path) -> str:
        return re.sub(r"^run \S+:", "run ID:", text.replace(str(out), "OUT"), flags=re.M)

    assert same(done.stdout.split("tables: ")[1].split("\n", 1)[1], one) == same(
        priced.stdout, two)


def test_cost_in_one_step_refuses_a_run_and_a_bad_window_before_reading(tmp_path: Path) -> None:
    root, cache, out = str(REAL / "claude-code"), tmp_path / "cache", tmp_path / "out"
    bad = _vakpipe("cost", root, "--out", str(out), "--since", "2026-02-01",
                   "--until", "2026-01-01", cache=cache)
    assert bad.returncode == 2 and "is after --until" in bad.stderr and not out.exists()
    assert _vakpipe("audit", root, "--out", str(out), "--no-progress",
                    cache=cache).returncode == 0
    again = _vakpipe("cost", str(out), "--out", str(tmp_path / "other"), cache=cache)
    assert again.returncode == 2 and "is a run's output, not an archive" in again.stderr
    assert again.stderr.count("\n") == 1 and not (tmp_path / "other").exists()


def test_cost_in_one_step_takes_the_audits_options(tmp_path: Path) -> None:
    root, cache, out = str(REAL / "claude-code"), tmp_path / "cache", tmp_path / "out"
    # In this process, no bar, and every line over 1 KiB reported damaged, as `vakpipe
    # audit` would with the same options.
    done = _vakpipe("cost", root, "--out", str(out), "--workers", "0", "--no-progress",
                    "--max-line-bytes", "1KiB", cache=cache)
    assert done.returncode == 0, done.stderr
    assert "damaged_entry" in done.stdout and (out / "cost" / "costs.csv").is_file()
    # Without --out nothing is audited: an audit's option there is a usage error, before
    # anything is written; the reporter's options and the environment's scheduler are not.
    refused = _vakpipe("cost", str(out), "--workers", "2", "--max-line-bytes", "1MiB",
                       "--report-dir", str(tmp_path / "report"), cache=cache)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "--workers, --max-line-bytes: options of the audit, only with --out" in refused.stderr
    assert not (tmp_path / "report").exists()
    priced = subprocess.run(
        [vakpipe_exe(), "cost", str(out), "--no-progress", "--report-dir",
         str(tmp_path / "report")], capture_output=True, text=True, timeout=300, check=False,
        env={**_env(), "VAKPIPE_CACHE_DIR": str(cache),
             "DASK_SCHEDULER_ADDRESS": "tcp://127.0.0.1:9"})
    assert priced.returncode == 0, priced.stderr
