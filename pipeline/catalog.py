"""The model catalog: which capacity a model has, from a TOML file. Pure but for the
catalog file read in :func:`load_catalog`.
"""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pipeline.errors import UsageError


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


@dataclass(frozen=True)
class ModelCatalog:
    """Ordered model rules: the first whose pattern matches a model name wins."""

    rules: tuple[ModelRule, ...]
    version: str = ""

    def lookup(self, model: str | None) -> Capacity | None:
        """Capacity of ``model``, or ``None`` when no rule matches (an unknown model)."""
        if not model:
            return None
        name = model.lower()
        for rule in self.rules:
            if fnmatch.fnmatchcase(name, rule.pattern.lower()):
                return Capacity(model, rule.input_limit, rule.output_reserve, rule.tokenizer)
        return None

    def with_window(self, window: int) -> ModelCatalog:
        """A what-if catalog: every model gets ``window`` input tokens (``--window``)."""
        rules = tuple(ModelRule(r.pattern, window, min(r.output_reserve, window // 4), r.tokenizer)
                      for r in self.rules)
        return ModelCatalog((*rules, ModelRule("*", window, window // 16, "cl100k_base")),
                            f"{self.version}+window={window}")


def _rules(doc: dict[str, Any], source: str) -> tuple[ModelRule, ...]:
    out = []
    for i, entry in enumerate(doc.get("model", [])):
        try:
            out.append(ModelRule(str(entry["pattern"]), int(entry["input_limit"]),
                                 int(entry.get("output_reserve", 0)),
                                 str(entry.get("tokenizer", "cl100k_base"))))
        except (KeyError, TypeError, ValueError) as err:
            raise UsageError(f"{source}: [[model]] #{i + 1} is invalid: {err}") from err
    return tuple(out)


def load_catalog(override: str | Path | None = None) -> ModelCatalog:
    """The shipped catalog, with the rules of ``override`` (a TOML file) put first."""
    shipped = tomllib.loads(
        resources.files("pipeline.data").joinpath("models.toml").read_text("utf-8")
    )
    rules = _rules(shipped, "models.toml")
    version = str(shipped.get("version", ""))
    if override is not None:
        try:
            user = tomllib.loads(Path(override).read_text("utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise UsageError(f"cannot read model catalog {override}: {err}") from err
        rules = _rules(user, str(override)) + rules
        version = f"{version}+{Path(override).name}"
    return ModelCatalog(rules, version)
