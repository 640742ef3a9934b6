"""The model catalog: which capacity a model has, from a TOML file. Pure but for the
catalog file read in :func:`load_catalog`.

The file shape (a ``version`` key, ordered ``[[model]]`` rules matched by fnmatch
pattern, a user's file put first) is shared with the price table
(:mod:`pipeline.costs.pricing`): :func:`load_rule_file` and :func:`name_matches` serve both.
"""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Generic, TypeVar

from pipeline.errors import UsageError
from pipeline.ledger.types import LARGEST_WINDOW, read_user_bytes
from pipeline.replay.tokens import OFFLINE_ENCODINGS

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Capacity:
    """A model's capacity profile as the planner and utilization use it."""

    model: str
    input_limit: int
    output_reserve: int
    tokenizer: str = "cl100k_base"


@dataclass(frozen=True, slots=True)
class ModelRule:
    """One ``[[model]]`` entry of a catalog."""

    pattern: str
    input_limit: int
    output_reserve: int
    tokenizer: str


def name_matches(pattern: str, name: str) -> bool:
    """Whether ``name`` matches the fnmatch ``pattern``, ignoring case.

    Parameters
    ----------
    pattern : str
        An fnmatch pattern (``*``, ``?``, ``[...]``) from a rule file.
    name : str
        A model or provider name as the ledger spells it.

    Returns
    -------
    bool
        ``True`` when the whole name matches.
    """
    # Providers and users spell model ids with varying case; the rule files do not.
    return fnmatch.fnmatchcase(name.lower(), pattern.lower())


#: Model names whose capacity one catalog keeps (:meth:`ModelCatalog.lookup`).
MAX_LOOKUPS_KEPT = 4096


@dataclass(frozen=True)
class ModelCatalog:
    """Ordered model rules: the first whose pattern matches a model name wins."""

    rules: tuple[ModelRule, ...]
    version: str = ""
    #: Capacities already looked up, by model name: the replay asks once per request, a
    #: fleet names a handful of models, and the rules are glob patterns tried in turn.
    _found: dict[str, Capacity | None] = field(default_factory=dict, init=False,
                                               repr=False, compare=False, hash=False)

    def lookup(self, model: object) -> Capacity | None:
        """Capacity of ``model``, or ``None`` when no rule matches (an unknown model);
        a model that is not a string (no name vak writes) is unknown too."""
        if not model or not isinstance(model, str):
            return None
        try:
            return self._found[model]
        except KeyError:
            pass
        found = next((Capacity(model, rule.input_limit, rule.output_reserve, rule.tokenizer)
                      for rule in self.rules if name_matches(rule.pattern, model)), None)
        if len(self._found) < MAX_LOOKUPS_KEPT:  # model names are data: bound the cache
            self._found[model] = found
        return found

    def with_window(self, window: int) -> ModelCatalog:
        """A what-if catalog: every model gets ``window`` input tokens (``--window``)."""
        rules = tuple(ModelRule(r.pattern, window, min(r.output_reserve, window // 4), r.tokenizer)
                      for r in self.rules)
        return ModelCatalog((*rules, ModelRule("*", window, window // 16, "cl100k_base")),
                            f"{self.version}+window={window}")


@dataclass(frozen=True, slots=True)
class RuleFile(Generic[R]):
    """The rules of a shipped TOML file, a user's rules first, and its top-level keys."""

    rules: tuple[R, ...]
    version: str
    shipped: Mapping[str, Any]


def _parse_rules(doc: Mapping[str, Any], table: str, parse: Callable[[Mapping[str, Any]], R],
                 source: str) -> tuple[R, ...]:
    entries = doc.get(table, [])
    if not isinstance(entries, list):
        raise UsageError(f"{source}: key {table!r} must be an array of tables ([[{table}]])")
    out = []
    for i, entry in enumerate(entries):
        try:
            if not isinstance(entry, dict):
                raise TypeError(f"expected a table, got {entry!r}")
            out.append(parse(entry))
        except KeyError as err:
            raise UsageError(f"{source}: [[{table}]] #{i + 1} is invalid: "
                             f"missing key {err}") from err
        except (TypeError, ValueError) as err:
            raise UsageError(f"{source}: [[{table}]] #{i + 1} is invalid: {err}") from err
    return tuple(out)


def load_rule_file(resource: str, table: str, parse: Callable[[Mapping[str, Any]], R],
                   override: str | Path | None, what: str) -> RuleFile[R]:
    """Rules of the shipped ``pipeline/data/<resource>``, those of ``override`` first.

    Parameters
    ----------
    resource : str
        File name of the shipped TOML file inside ``pipeline.data``.
    table : str
        Name of the array of tables holding the rules (``model`` for ``[[model]]``).
    parse : callable
        Turns one entry into a rule; raises ``KeyError``, ``TypeError`` or
        ``ValueError`` (whose text names the key) on a bad entry.
    override : str or Path or None
        A user's TOML file of the same shape, whose rules are tried first.
    what : str
        What the file is, for error messages (``"model catalog"``).

    Returns
    -------
    RuleFile
        The rules in match order, the version (``<shipped>+<override file name>``)
        and the shipped file's top-level keys.

    Raises
    ------
    UsageError
        A file cannot be read or parsed, or an entry is invalid; the message names
        the file, the entry and the key.
    """
    shipped = tomllib.loads(resources.files("pipeline.data").joinpath(resource)
                            .read_text("utf-8"))
    rules = _parse_rules(shipped, table, parse, resource)
    version = str(shipped.get("version", ""))
    if override is not None:
        try:
            with open(override, "rb") as stream:  # a pipe of the shell's <(...) too
                data = read_user_bytes(stream, f"{what} {override}")
            user = tomllib.loads(data.decode("utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
            raise UsageError(f"cannot read {what} {override}: {err}") from err
        # A misspelt table ([models.x], [[modle]]) would otherwise be read as no rule at
        # all: every request priced or sized as if the file had not been given.
        try:
            only_keys(user, frozenset(shipped) | {table})
        except ValueError as err:
            raise UsageError(f"{override}: {err}") from err
        own = _parse_rules(user, table, parse, str(override))
        if not own:
            raise UsageError(f"{override}: no [[{table}]] rule; a {what} of your own holds "
                             f"[[{table}]] tables, tried before vakpipe's")
        rules = own + rules
        version = f"{version}+{Path(override).name}"
    return RuleFile(rules, version, shipped)


def only_keys(entry: Mapping[str, Any], allowed: frozenset[str], where: str = "") -> None:
    """Refuse a key of ``entry`` outside ``allowed`` (``where``: the table's dotted name
    and a dot, for the message).

    Raises
    ------
    ValueError
        The first unknown key, named with the keys expected.
    """
    # A misspelt optional key (cache_raed, output_reserv) would otherwise be read as
    # absent: its default, silently.
    extra = sorted(set(entry) - allowed)
    if extra:
        raise ValueError(f"unknown key '{where}{extra[0]}' (expected {', '.join(sorted(allowed))})")


_MODEL_RULE_KEYS = frozenset({"pattern", "input_limit", "output_reserve", "tokenizer"})


def _count(entry: Mapping[str, Any], key: str, least: int) -> int:
    value = entry[key]
    # int() would take 1.5 as 1 and true as 1; a window of 0 has no utilization.
    if type(value) is not int or not least <= value <= LARGEST_WINDOW:
        raise ValueError(f"key '{key}' must be an integer from {least} to 2^62, "
                         f"got {value!r}")
    return value


def _model_rule(entry: Mapping[str, Any]) -> ModelRule:
    only_keys(entry, _MODEL_RULE_KEYS)
    tokenizer = entry.get("tokenizer", "cl100k_base")
    if type(tokenizer) is not str or tokenizer not in OFFLINE_ENCODINGS:
        # The replay counts with these only: another name would be read as cl100k_base.
        raise ValueError(f"key 'tokenizer' must be one the replay counts with "
                         f"({', '.join(sorted(OFFLINE_ENCODINGS))}), got {tokenizer!r}")
    return ModelRule(str(entry["pattern"]), _count(entry, "input_limit", 1),
                     _count(entry, "output_reserve", 0) if "output_reserve" in entry else 0,
                     tokenizer)


def load_catalog(override: str | Path | None = None) -> ModelCatalog:
    """The shipped catalog, with the rules of ``override`` (a TOML file) put first."""
    loaded = load_rule_file("models.toml", "model", _model_rule, override, "model catalog")
    return ModelCatalog(loaded.rules, loaded.version)
