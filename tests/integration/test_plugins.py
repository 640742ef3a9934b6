"""Plug-ins through entry points: a tiny package installed, then used by name.

The demo plug-in (``tests/data/plugins/vakpipe-demo-plugin``) is installed into a
temporary folder (``tests.helpers.plugins``: copied, with its dist-info) and put on
``PYTHONPATH`` of ``vakpipe`` processes: ``vakpipe plugins`` lists it, ``regress
--candidate demo-bare-cards`` runs its rule set, and its broken entry point is one line.
In-process, the registries find the summariser, the price source and the format.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from pipeline import plugins
from pipeline.errors import PluginError, UsageError
from tests.helpers.plugins import DEMO_PLUGIN, env_with, install_plugin
from tests.helpers.storage import committed_rows, small_fleet, vakpipe_exe


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo plug-in, installed into a folder of its own."""
    return install_plugin(DEMO_PLUGIN, tmp_path_factory.mktemp("site"))


@pytest.fixture
def on_path(site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The demo plug-in importable in this process (and forgotten after the test)."""
    monkeypatch.syspath_prepend(str(site))
    plugins.refresh()
    from pipeline.formats import all_formats

    all_formats.cache_clear()
    yield site
    monkeypatch.undo()
    plugins.refresh()
    all_formats.cache_clear()


def vakpipe(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([vakpipe_exe(), *args], capture_output=True, text=True,
                          timeout=300, check=False, env=env_with(site))


def test_plugins_lists_the_installed_ones_and_a_broken_one_in_one_line(site: Path) -> None:
    done = vakpipe(site, "plugins", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["schema"] == "vakpipe.plugins/1"
    rows = {(r["kind"], r["name"]): r for r in doc["plugins"]}
    assert rows["rule_sets", "v1"]["builtin"] and rows["rule_sets", "v1"]["ok"]
    for key in [("rule_sets", "demo-bare-cards"), ("summarisers", "demo-cards"),
                ("price_sources", "demo-flat"), ("formats", "demo-lines")]:
        row = rows[key]
        assert row["ok"] and not row["builtin"], row
        assert (row["distribution"], row["version"]) == ("vakpipe-demo-plugin", "0.1.0")
    broken = rows["rule_sets", "demo-broken"]
    assert not broken["ok"]
    assert "does not load: ModuleNotFoundError" in broken["error"]
    assert "\n" not in broken["error"]
    text = vakpipe(site, "plugins")
    assert text.returncode == 0 and "Traceback" not in text.stderr
    assert "demo-bare-cards" in text.stdout and "BROKEN: plug-in vakpipe.rule_sets:demo-broken" \
        in text.stdout


def test_without_the_plugin_only_the_builtins_are_listed() -> None:
    done = subprocess.run([vakpipe_exe(), "plugins", "--json"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert all(r["builtin"] for r in json.loads(done.stdout)["plugins"])


def test_an_installed_rule_set_runs_in_regress(site: Path, tmp_path_factory: pytest.TempPathFactory
                                               ) -> None:
    fleet = small_fleet(tmp_path_factory)
    out = tmp_path_factory.mktemp("reg")
    done = vakpipe(site, "regress", str(fleet), "--out", str(out), "--candidate",
                   "demo-bare-cards", "--workers", "0", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "regression v1 → demo-bare-cards" in done.stdout
    candidate = committed_rows(out / "candidate", "requests")
    assert candidate and {r["rules"] for r in candidate} == {"demo-bare-cards"}
    summary = json.loads((out / "regression-summary.json").read_text())
    assert summary["candidate"]["rules"] == "demo-bare-cards"
    # Bare Card lines are shorter than v1's: requests that send cards change, shrinking.
    pairs = committed_rows(out, "regression")
    changed = [p for p in pairs if p["changed"]]
    assert changed and all(p["token_delta"] < 0 for p in changed)


def test_a_broken_or_unknown_rule_set_is_one_line_and_exit_2(
        site: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    fleet = small_fleet(tmp_path_factory)
    for name, said in [("demo-broken", "plug-in vakpipe.rule_sets:demo-broken"),
                       ("nope", "unknown projection rule set 'nope'")]:
        done = vakpipe(site, "regress", str(fleet), "--out",
                       str(tmp_path_factory.mktemp("bad")), "--candidate", name,
                       "--workers", "0", "--no-progress")
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("vakpipe: error:"), lines
        assert said in lines[0]
        if name == "nope":
            assert "demo-bare-cards" in lines[0]  # the known names include the plug-in's


@pytest.mark.usefixtures("on_path")
def test_the_registries_find_the_other_kinds() -> None:
    from pipeline.compaction.cards import CardsSummariser
    from pipeline.compaction.registry import get_summariser, summariser_names
    from pipeline.costs.pricing import load_prices
    from pipeline.formats import all_formats, detect
    from pipeline.replay.projection import get_rule_set

    assert isinstance(get_summariser("demo-cards"), CardsSummariser)
    assert "demo-cards" in summariser_names()
    prices = load_prices("demo-flat", cache=False)
    assert "plugin-demo-flat-0.1.0" in prices.version and "plug-in demo-flat" in prices.source
    rule = prices.lookup("anthropic", "claude-opus-4-1")
    assert rule is not None and rule.base.input == Decimal(1)
    assert [f.name for f in all_formats()][-1] == "demo-lines"
    adapter, _ = detect([b'{"demo_transcript": 1}\n'])
    assert adapter is not None and adapter.name == "demo-lines"
    assert get_rule_set("demo-bare-cards").name == "demo-bare-cards"
    assert get_rule_set("v1").name == "v1"  # a built-in name is never a plug-in's
    with pytest.raises(PluginError, match="does not load"):
        get_rule_set("demo-broken")
    with pytest.raises(UsageError, match="unknown summariser"):
        get_summariser("nope")


def test_a_plugin_named_like_a_file_leaves_the_file_first(on_path: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.costs.pricing import load_prices

    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo-flat").write_text("[[model]]\n", encoding="utf-8")
    with pytest.raises(UsageError):  # read as a price file (and refused as one)
        load_prices("demo-flat", cache=False)


def test_a_plugin_is_not_needed_to_import_vakpipe() -> None:
    # The entry points are read when a name is asked for, never at import.
    done = subprocess.run([sys.executable, "-c",
                           "import pipeline.cli, pipeline.plugins as p; "
                           "print(p._entry_points.cache_info().currsize)"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "0", done.stderr
