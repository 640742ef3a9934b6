"""What a model request costs: layered price tables and the pricing of token usage.
Pure but for the price files read in :func:`load_prices` and genai-prices' resolved rules
cached in the user's cache folder (:class:`PriceCache`).

The prices come in layers, the first that knows a model wins (:class:`LayeredPriceTable`):

1. a user's ``--prices`` file;
2. vakpipe's own rules (``pipeline/data/prices.toml``): only where genai-prices does not
   know a model or gets its rates wrong;
3. genai-prices (Pydantic's maintained price data, :class:`GenaiPriceTable`), read from
   the snapshot inside the installed package: never updated, nothing fetched.

The TOML files have the model catalog's shape and share its loader and pattern matching
(:func:`pipeline.replay.catalog.load_rule_file`): ordered ``[[model]]`` rules, the first whose
``provider`` and ``pattern`` match wins. Every layer hands back the same :class:`Price`
(rates per token kind in the ledger's convention, an optional long-context tier, optional
fast-mode rates), so
:func:`price` is the one place amounts are computed. Amounts are exact
:class:`~decimal.Decimal` US dollars, so sums over a fleet do not drift; convert to float
only when writing a table. The rules are in ``docs/cost-rules.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, time
from decimal import Context, Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # imported when a table is built: a second of import the audit never needs
    from genai_prices.types import ModelInfo, ModelPrice, Provider

from pipeline import plugins
from pipeline.errors import PluginError, UsageError
from pipeline.ledger.entry import Usage, input_and_output, usage_of
from pipeline.replay.catalog import load_rule_file, name_matches, only_keys

# Wide enough that no product or sum of ledger-sized counts is ever rounded; a fixed
# context also keeps results independent of the caller's thread-local decimal context.
_CTX = Context(prec=60)
_ZERO = Decimal(0)
_MEMO_MAX = 4096
_RATES = ("input", "output", "cache_read", "cache_write")
_RULE_KEYS = frozenset(("provider", "pattern", "tier", "fast", "cache_write_1h", *_RATES))
_TIER_KEYS = frozenset(("above", "cache_write_1h", *_RATES))
_FAST_KEYS = frozenset(("cache_write_1h", *_RATES))
#: The rate an omitted optional rate of a rule is charged at (named in the message of
#: :func:`_rates_above`).
_DEFAULTS_TO = {"cache_read": "input", "cache_write": "input", "cache_write_1h": "cache_write"}
#: The request context of genai-prices' fast-mode price variants (Anthropic's ``speed``).
_FAST_WHEN = {"speed": "fast"}


@dataclass(frozen=True, slots=True)
class Rates:
    """USD per million tokens of each kind."""

    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal
    #: One-hour cache writes (where a transcript says which writes were); omitted in a
    #: table: the ``cache_write`` rate.
    cache_write_1h: Decimal | None = None


@dataclass(frozen=True, slots=True)
class Tier:
    """Rates for a whole request whose prompt tokens are strictly above ``above``."""

    above: int
    rates: Rates


@dataclass(frozen=True, slots=True)
class Price:
    """One ``[[model]]`` rule of a price table: what matched, and its rates."""

    provider: str
    pattern: str
    base: Rates
    tier: Tier | None = None
    #: The rates of a request the provider served in fast mode (Anthropic's
    #: ``usage.speed == "fast"``), for the whole request: no tier applies to them.
    #: ``None``: the rule has no fast price (such a request is unpriced, :func:`price`).
    fast: Rates | None = None

    def rates_for(self, prompt_tokens: int) -> Rates:
        """The rates of a request with ``prompt_tokens`` (input + cache read + write)."""
        if self.tier is not None and prompt_tokens > self.tier.above:
            return self.tier.rates
        return self.base


class PriceTable(Protocol):
    """Anything that prices a provider's model (the shipped TOML table, a test's dict)."""

    def lookup(self, provider: str | None, model: str | None) -> Price | None:
        """The price rule for ``model`` served by ``provider``; ``None`` when unknown."""
        ...


@dataclass(frozen=True)
class TomlPriceTable:
    """Ordered price rules from TOML files: the first rule that matches wins."""

    rules: tuple[Price, ...]
    version: str = ""
    as_of: date | None = None
    # A fleet names a handful of models; matching ~60 patterns per request is not free.
    _memo: dict[tuple[str, str], Price | None] = field(
        default_factory=dict, compare=False, repr=False)

    def lookup(self, provider: str | None, model: str | None) -> Price | None:
        """The first rule whose provider and model patterns both match.

        Parameters
        ----------
        provider : str or None
            The provider as the ledger names it (a receipt's ``provider``, else the
            header contract's). Without one, only rules for provider ``*`` can match:
            the same model name is sold at other prices elsewhere.
        model : str or None
            The model name (``meta.model``, a receipt's ``model``).

        Returns
        -------
        Price or None
            ``None`` when no rule matches: an unknown model, which the caller reports.
        """
        if not model:
            return None
        key = (provider or "", model)
        if key in self._memo:
            return self._memo[key]
        found = next((r for r in self.rules if name_matches(r.provider, key[0])
                      and name_matches(r.pattern, model)), None)
        if len(self._memo) < _MEMO_MAX:  # model names are archive data: bound the memo
            self._memo[key] = found
        return found


#: genai-prices' names of the per-million-token prices a ledger's four (five) counts take.
_GENAI_KEYS = {"input": "input_mtok", "output": "output_mtok", "cache_read": "cache_read_mtok",
               "cache_write": "cache_write_mtok", "cache_write_1h": "cache_write_1h_mtok"}
#: Per-million-token prices of other media: a ledger's tokens are text, so they never apply.
_OTHER_MEDIA = ("audio", "image", "video")


def _genai_rule(provider: str, model: str, prices: ModelPrice) -> Price | None:
    """One genai-prices price set as a :class:`Price`; ``None`` when it cannot be one.

    genai-prices counts input the OpenTelemetry way (``input_tokens`` includes cache reads
    and writes) and prices what is left of it after the cache parts at ``input_mtok``;
    the ledger's ``input`` is that rest already, so the rates carry over as they are: an
    absent cache rate is the input rate, an absent one-hour write rate the write rate, in
    both. Its tiers are judged on that inclusive input, our ``prompt``, strictly above
    ``start``, for the whole request: our :class:`Tier`. What a :class:`Price` cannot say
    gives ``None`` (reported as an unknown model, never mispriced): several tiers or
    thresholds, a text token price split further (reasoning, citations, text vs other
    media), a per-request fee. Tool fees (web search) are not modelled, as in the TOML.
    """
    from genai_prices.types import TieredPrices

    stated: dict[str, Any] = {k: getattr(prices, key) for k, key in _GENAI_KEYS.items()}
    if stated["input"] is None or stated["output"] is None:
        return None
    for key, value in vars(prices).items():
        if value is None or key.startswith("_") or key in _GENAI_KEYS.values():
            continue
        if key == "requests_kcount" or (key.endswith("_mtok") and not any(
                m in key for m in _OTHER_MEDIA)):
            return None
    tiers = [v.tiers for v in stated.values() if isinstance(v, TieredPrices) and v.tiers]
    starts = {tuple(t.start for t in ts) for ts in tiers}
    if len(starts) > 1 or any(len(s) != 1 for s in starts):
        return None

    def rates(tiered: bool) -> Rates:
        def pick(kind: str) -> Decimal | None:
            v = stated[kind]
            if isinstance(v, TieredPrices):
                return v.tiers[0].price if tiered and v.tiers else v.base
            return None if v is None else Decimal(v)

        inp, out = pick("input"), pick("output")
        assert inp is not None and out is not None
        read, write = pick("cache_read"), pick("cache_write")
        return Rates(inp, out, inp if read is None else read, inp if write is None else write,
                     pick("cache_write_1h"))

    tier = Tier(next(iter(starts))[0], rates(True)) if starts else None
    return Price(provider, model, rates(False), tier)


def _genai_fast(info: ModelInfo, when: datetime) -> Rates | None:
    """The fast-mode rates genai-prices gives ``info`` on ``when``; ``None`` when it has none
    or they cannot be :class:`Rates`.

    Fast mode is a price variant of the model (``when={'speed': 'fast'}``), partial prices
    laid over its standard ones by :meth:`ModelInfo.get_prices`. Fast rates are flat over
    the context (genai-prices' comments), so a tier in them (one inherited from tiered
    standard prices) is dropped: its base rates are taken. A fast variant in force only at
    some hours gives ``None``, as time-of-day standard prices do (:meth:`GenaiPriceTable._find`).
    """
    from genai_prices.types import StartDateConstraint

    variants = [v for v in info.price_variants or () if v.when == _FAST_WHEN]
    if any(v.constraint is not None and not isinstance(v.constraint, StartDateConstraint)
           for v in variants):
        return None
    if not any(v.constraint is None or v.constraint.active(when) for v in variants):
        return None
    fast = _genai_rule("", info.id, info.get_prices(when, _FAST_WHEN))
    return None if fast is None else fast.base


class _GenaiData:
    """genai-prices' bundled providers, imported on first use (its data module and the
    pydantic types under it take ~0.25 s to import, which a cached price never needs)."""

    def __init__(self) -> None:
        self._providers: list[Provider] | None = None

    @property
    def providers(self) -> list[Provider]:
        if self._providers is None:
            from genai_prices.data import providers

            self._providers = providers
        return self._providers


class PriceCache:
    """genai-prices' rules already resolved (one per provider and model seen), in a JSON
    file of the user's cache folder (:func:`price_cache_dir`), so that a report whose
    models were all seen before does not import genai-prices at all.

    The file's name is a digest of everything a resolved rule depends on: the ``as_of``
    date, genai-prices' version and its data file (path, size, modification time), and
    this module's own file (so a change to :func:`_genai_rule` is never served stale).
    Rates are kept as the decimal strings they are, so a cached price is the price. A
    file that cannot be read or does not parse is ignored (the prices are looked up
    again); one that cannot be written leaves the run as it is.
    """

    def __init__(self, path: Path | None, version: str | None = None,
                 entries: dict[str, Any] | None = None) -> None:
        self.path = path
        self.version = version
        self.entries: dict[str, Any] = entries or {}
        self.dirty = False

    @classmethod
    def open(cls, folder: Path | None, as_of: date) -> PriceCache:
        """The cache of prices in force on ``as_of`` under ``folder`` (``None``: none)."""
        import hashlib
        import importlib.util
        import json

        spec = importlib.util.find_spec("genai_prices")  # finds it, does not import it
        if folder is None or spec is None or not spec.submodule_search_locations:
            return cls(None)
        parts = [_CACHE_SCHEMA, as_of.isoformat()]
        for path in (Path(spec.submodule_search_locations[0]) / "data.py", Path(__file__)):
            try:
                st = path.stat()
            except OSError:
                return cls(None)
            parts += [str(path), str(st.st_size), str(st.st_mtime_ns)]
        digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
        path = folder / f"genai-prices-{digest}.json"
        try:
            raw = json.loads(path.read_bytes())
            version, entries = raw["version"], raw["prices"]
            if not isinstance(version, str) or not isinstance(entries, dict):
                raise ValueError(path)
        except (OSError, ValueError, KeyError, TypeError):
            return cls(path)
        return cls(path, version, entries)

    def get(self, provider: str, model: str) -> tuple[bool, Price | None]:
        """``(True, rule)`` when the cache holds ``model`` (``rule`` may be ``None``: a
        model genai-prices does not price), else ``(False, None)``."""
        key = f"{provider}\t{model}"
        if key not in self.entries:
            return False, None
        try:
            return True, _price_from_json(self.entries[key])
        except (ArithmeticError, ValueError, KeyError, TypeError):
            return False, None  # a damaged entry: looked up again

    def put(self, provider: str, model: str, rule: Price | None) -> None:
        """Remember ``rule`` (bounded: model names are archive data)."""
        if self.path is not None and len(self.entries) < _MEMO_MAX:
            self.entries[f"{provider}\t{model}"] = None if rule is None else _price_json(rule)
            self.dirty = True

    def save(self, version: str) -> None:
        """Write the file when it learnt something (a temporary file renamed onto it)."""
        import json
        import os
        import tempfile

        if self.path is None or not self.dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".prices-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump({"version": version, "prices": self.entries}, f, sort_keys=True)
                os.replace(tmp, self.path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except OSError:
            return  # a cache that cannot be written only costs the next run its time
        self.dirty = False


#: Bumped when the cache file's shape changes: part of the file's name (:meth:`PriceCache.open`),
#: so a file of another schema is never read. 2: a price's ``fast`` rates.
_CACHE_SCHEMA = "2"


def _rates_json(r: Rates) -> dict[str, str | None]:
    return {k: None if getattr(r, k) is None else str(getattr(r, k))
            for k in (*_RATES, "cache_write_1h")}


def _rates_from_json(obj: dict[str, Any]) -> Rates:
    one_hour = obj["cache_write_1h"]
    return Rates(Decimal(obj["input"]), Decimal(obj["output"]), Decimal(obj["cache_read"]),
                 Decimal(obj["cache_write"]), None if one_hour is None else Decimal(one_hour))


def _price_json(rule: Price) -> dict[str, Any]:
    tier = (None if rule.tier is None
            else {"above": rule.tier.above, "rates": _rates_json(rule.tier.rates)})
    return {"provider": rule.provider, "pattern": rule.pattern, "base": _rates_json(rule.base),
            "tier": tier, "fast": None if rule.fast is None else _rates_json(rule.fast)}


def _price_from_json(obj: dict[str, Any] | None) -> Price | None:
    if obj is None:
        return None
    tier = obj["tier"]
    if tier is not None and (not isinstance(tier["above"], int) or isinstance(
            tier["above"], bool)):
        raise TypeError("tier.above")
    fast = obj["fast"]
    return Price(str(obj["provider"]), str(obj["pattern"]), _rates_from_json(obj["base"]),
                 None if tier is None else Tier(tier["above"], _rates_from_json(tier["rates"])),
                 None if fast is None else _rates_from_json(fast))


def price_cache_dir() -> Path | None:
    """Where resolved prices are cached: ``VAKPIPE_CACHE_DIR`` (empty: no cache), else
    ``$XDG_CACHE_HOME/vakpipe``, else ``~/.cache/vakpipe``."""
    import os

    chosen = os.environ.get("VAKPIPE_CACHE_DIR")
    if chosen is not None:
        return Path(chosen) if chosen else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vakpipe"


@dataclass(frozen=True)
class GenaiPriceTable:
    """Prices from genai-prices' bundled data, as in force on ``as_of``.

    Offline and pinned: the snapshot inside the installed package is read directly,
    never the process-wide one genai-prices' ``UpdatePrices`` may replace, and nothing is
    fetched. Its prices are dated; those in force on ``as_of`` (00:00 UTC) price every
    request, whatever its own date (as the TOML's list prices do). A rule resolved before
    comes from the :class:`PriceCache`; the package is imported only for a model the cache
    does not hold.
    """

    as_of: date
    version: str
    _data: _GenaiData = field(default_factory=_GenaiData, compare=False, repr=False)
    _memo: dict[tuple[str, str], Price | None] = field(
        default_factory=dict, compare=False, repr=False)
    _cache: PriceCache = field(default_factory=lambda: PriceCache(None), compare=False,
                               repr=False)

    @property
    def source(self) -> str:
        """What the prices are, for a report."""
        return f"genai-prices {self.version} (bundled data, prices in force on {self.as_of})"

    def lookup(self, provider: str | None, model: str | None) -> Price | None:
        """genai-prices' price of ``model`` from ``provider`` (or the providers it resells).

        Parameters
        ----------
        provider : str or None
            The ledger's provider, matched case-insensitively to genai-prices' provider
            ids. Without one, nothing matches: the same model name is sold at other
            prices elsewhere (the TOML's rule too).
        model : str or None
            The model name, matched case-insensitively by genai-prices' own rules.

        Returns
        -------
        Price or None
            ``None`` for an unknown provider or model, or prices a :class:`Price` cannot
            hold (:func:`_genai_rule`).
        """
        if not provider or not model:
            return None
        key = (provider, model)
        if key in self._memo:
            return self._memo[key]
        cached, found = self._cache.get(provider, model)
        if not cached:
            found = self._find(provider, model)
            self._cache.put(provider, model, found)
        if len(self._memo) < _MEMO_MAX:  # model names are archive data: bound the memo
            self._memo[key] = found
        return found

    def save_cache(self) -> None:
        """Write the rules resolved in this process to the :class:`PriceCache`."""
        self._cache.save(self.version)

    def _find(self, provider: str, model: str) -> Price | None:
        from genai_prices.data_snapshot import find_provider_by_id
        from genai_prices.types import StartDateConstraint

        providers = self._data.providers
        seller = find_provider_by_id(providers, provider)
        info = None if seller is None else seller.find_model(model, all_providers=providers)
        if seller is None or info is None:
            return None
        when = datetime.combine(self.as_of, time(), UTC)
        if not isinstance(info.prices, list):
            prices = info.prices
        elif any(c.constraint is not None and not isinstance(c.constraint, StartDateConstraint)
                 for c in info.prices):
            return None  # time-of-day prices: a request's hour is not in the ledger
        else:
            prices = info.get_prices(when)
        rule = _genai_rule(seller.id, info.id, prices)
        fast = None if rule is None else _genai_fast(info, when)
        return rule if rule is None or fast is None else replace(rule, fast=fast)


@dataclass(frozen=True)
class LayeredPriceTable:
    """Price tables tried in order: the first that knows a model prices it."""

    layers: tuple[PriceTable, ...]
    #: ``<vakpipe overrides' version>+genai-prices-<version>[+<user file name>]``
    version: str = ""
    as_of: date | None = None
    #: The layers as a report names them, the most general first.
    source: str = ""

    def lookup(self, provider: str | None, model: str | None) -> Price | None:
        """The first layer's rule for ``model`` served by ``provider``; ``None`` when no
        layer knows it."""
        for layer in self.layers:
            found = layer.lookup(provider, model)
            if found is not None:
                return found
        return None

    def save_cache(self) -> None:
        """Write what the cached layers resolved (:meth:`GenaiPriceTable.save_cache`)."""
        for layer in self.layers:
            if isinstance(layer, GenaiPriceTable):
                layer.save_cache()


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """A request's token counts, in the ledger's convention (``docs/cost-rules.md``).

    ``input`` excludes cached tokens for every provider: vak normalises OpenAI's
    ``prompt_tokens`` (which includes the cached ones) to Anthropic's convention, so
    the prompt a provider saw is ``input + cache_read + cache_write``.
    """

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    #: Of ``cache_write``, the one-hour writes (known from Claude Code transcripts only).
    cache_write_1h: int = 0

    def __post_init__(self) -> None:
        for name in (*_RATES, "cache_write_1h"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise UsageError(f"TokenUsage.{name} must be a non-negative int, got {v!r}")
        if self.cache_write_1h > self.cache_write:
            raise UsageError("TokenUsage.cache_write_1h is part of cache_write: "
                             f"{self.cache_write_1h} > {self.cache_write}")

    @classmethod
    def of(cls, usage: Usage) -> TokenUsage:
        """From the audit's ``(input, output, cache read, cache creation)`` tuple."""
        return cls(*usage)

    @classmethod
    def from_ledger(cls, obj: Any) -> TokenUsage | None:
        """From a ledger ``usage`` object; ``None`` when it is not a valid one."""
        u = usage_of(obj)
        return None if u is None else cls(*u)

    def as_tuple(self) -> Usage:
        """The audit's tuple form."""
        return self.input, self.output, self.cache_read, self.cache_write

    @property
    def prompt(self) -> int:
        """Every input token the provider saw: what a long-context tier is judged on."""
        return input_and_output(self.as_tuple())[0] or 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(self.input + other.input, self.output + other.output,
                          self.cache_read + other.cache_read,
                          self.cache_write + other.cache_write,
                          self.cache_write_1h + other.cache_write_1h)


@dataclass(frozen=True, slots=True)
class Cost:
    """US dollars a request cost, per token kind (exact decimals).

    ``unknown_model`` marks usage no rule could price: its amounts are zero, which is
    not "free"; a report must say so. ``tiered`` marks long-context rates. Adding costs
    keeps both flags if any part had them.
    """

    input: Decimal = _ZERO
    output: Decimal = _ZERO
    cache_read: Decimal = _ZERO
    cache_write: Decimal = _ZERO
    unknown_model: bool = False
    tiered: bool = False

    @property
    def total(self) -> Decimal:
        """The sum of the four amounts."""
        return _CTX.add(_CTX.add(self.input, self.output),
                        _CTX.add(self.cache_read, self.cache_write))

    def __add__(self, other: Cost) -> Cost:
        return Cost(_CTX.add(self.input, other.input), _CTX.add(self.output, other.output),
                    _CTX.add(self.cache_read, other.cache_read),
                    _CTX.add(self.cache_write, other.cache_write),
                    self.unknown_model or other.unknown_model, self.tiered or other.tiered)

    def as_floats(self) -> dict[str, float]:
        """The amounts and total as floats, for table columns."""
        return {"input": float(self.input), "output": float(self.output),
                "cache_read": float(self.cache_read), "cache_write": float(self.cache_write),
                "total": float(self.total)}


def _usd(tokens: int, per_million: Decimal) -> Decimal:
    return _CTX.multiply(Decimal(tokens), per_million).scaleb(-6, _CTX)


def price(usage: TokenUsage, rule: Price | None, fast: bool = False) -> Cost:
    """What ``usage`` cost under ``rule`` (a :meth:`PriceTable.lookup` result).

    Parameters
    ----------
    usage : TokenUsage
        One request's tokens. Price requests one at a time: a long-context tier is
        decided per request, so the cost of summed usage is not the summed cost.
    rule : Price or None
        ``None`` for a model the table does not know.
    fast : bool
        The provider served the request in fast mode (Anthropic's ``usage.speed`` is
        ``"fast"``): the whole request is priced at ``rule.fast``, never at a tier's
        rates. A rule without fast rates does not price it: a fast request is never
        priced at standard rates.

    Returns
    -------
    Cost
        Exact amounts; zero amounts with ``unknown_model=True`` when ``rule`` is None, or
        when ``fast`` and ``rule.fast`` is None. ``tiered`` is never set for a fast request.
    """
    if rule is None:
        return Cost(unknown_model=True)
    if fast:
        if rule.fast is None:
            return Cost(unknown_model=True)
        r = rule.fast
    else:
        r = rule.rates_for(usage.prompt)
    write = _usd(usage.cache_write, r.cache_write)
    if usage.cache_write_1h and r.cache_write_1h is not None:
        write = _CTX.add(_usd(usage.cache_write - usage.cache_write_1h, r.cache_write),
                         _usd(usage.cache_write_1h, r.cache_write_1h))
    return Cost(_usd(usage.input, r.input), _usd(usage.output, r.output),
                _usd(usage.cache_read, r.cache_read), write,
                tiered=not fast and r is not rule.base)


def _get(entry: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in entry:
        raise KeyError(f"{where}{key}")
    return entry[key]


def _rate(entry: Mapping[str, Any], key: str, where: str) -> Decimal:
    v = _get(entry, key, where)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ValueError(f"key '{where}{key}' must be a non-negative number "
                         f"(USD per million tokens), got {v!r}")
    # repr gives back the decimal the file spelt (0.3, not 0.2999...)
    return Decimal(v) if isinstance(v, int) else Decimal(repr(v))


def _rates(entry: Mapping[str, Any], where: str) -> Rates:
    inp, out = _rate(entry, "input", where), _rate(entry, "output", where)
    read = _rate(entry, "cache_read", where) if "cache_read" in entry else inp
    write = _rate(entry, "cache_write", where) if "cache_write" in entry else inp
    hour = _rate(entry, "cache_write_1h", where) if "cache_write_1h" in entry else None
    return Rates(inp, out, read, write, hour)


def _name(entry: Mapping[str, Any], key: str) -> str:
    v = _get(entry, key, "")
    if not isinstance(v, str) or not v:
        raise ValueError(f"key '{key}' must be a non-empty string, got {v!r}")
    return v


def _price_rule(entry: Mapping[str, Any]) -> Price:
    only_keys(entry, _RULE_KEYS)
    base = _rates(entry, "")
    tier = None
    if "tier" in entry:
        # Cheaper tier rates would make a request cost less as its prompt grows.
        t, rates = _rates_above(entry, "tier", _TIER_KEYS, base, "a tier may not be cheaper")
        above = _get(t, "above", "tier.")
        if isinstance(above, bool) or not isinstance(above, int) or above <= 0:
            raise ValueError(f"key 'tier.above' must be a positive integer, got {above!r}")
        tier = Tier(above, rates)
    fast = None
    if "fast" in entry:
        # Fast mode is a premium: a fast rate below the standard one is a typo.
        _, fast = _rates_above(entry, "fast", _FAST_KEYS, base, "a fast rate may not be cheaper")
    return Price(_name(entry, "provider"), _name(entry, "pattern"), base, tier, fast)


def _rates_above(entry: Mapping[str, Any], key: str, allowed: frozenset[str], base: Rates,
                 why: str) -> tuple[Mapping[str, Any], Rates]:
    """A rule's table of rates ``entry[key]`` (``tier``, ``fast``) and its rates, checked:
    its keys, and no rate below ``base``'s. Omitted rates are compared as charged (an
    omitted one-hour rate: the write rate)."""
    table = entry[key]
    if not isinstance(table, dict):
        raise ValueError(f"key '{key}' must be a table, got {table!r}")
    only_keys(table, allowed, f"{key}.")
    rates = _rates(table, f"{key}.")
    for k in (*_RATES, "cache_write_1h"):
        mine, standard = _rate_of(rates, k), _rate_of(base, k)
        if mine < standard:
            said = "" if k in table else f" (omitted: the {key} {_DEFAULTS_TO[k]} rate)"
            raise ValueError(f"key '{key}.{k}' ({mine}){said} is below '{k}' ({standard}): "
                             f"{why}")
    return table, rates


def _rate_of(rates: Rates, kind: str) -> Decimal:
    """The rate ``kind`` is charged at (an omitted one-hour write rate: the write rate)."""
    v: Decimal | None = getattr(rates, kind)
    return rates.cache_write if v is None else v


def load_toml_prices(override: str | Path | None = None) -> TomlPriceTable:
    """vakpipe's own rules (``prices.toml``), with the rules of ``override`` tried first.

    Parameters
    ----------
    override : str or Path or None
        A user's price file of the same shape (its ``version`` and ``as_of`` are not
        read; the table's version becomes ``<shipped>+<file name>``).

    Returns
    -------
    TomlPriceTable
        The rules, the version and the shipped table's ``as_of`` date.

    Raises
    ------
    UsageError
        A file cannot be read, or a key is missing or invalid; the message names the
        file, the ``[[model]]`` entry and the key.
    """
    loaded = load_rule_file("prices.toml", "model", _price_rule, override, "price table")
    as_of = loaded.shipped.get("as_of")
    if not isinstance(as_of, date) or isinstance(as_of, datetime):
        raise UsageError(f"prices.toml: key 'as_of' must be a date (YYYY-MM-DD), got {as_of!r}")
    return TomlPriceTable(loaded.rules, loaded.version, as_of)


def load_genai_prices(as_of: date, cache_dir: Path | None = None) -> GenaiPriceTable:
    """genai-prices' bundled price data, as in force on ``as_of``.

    Parameters
    ----------
    as_of : date
        The day whose prices are in force.
    cache_dir : Path or None
        Where resolved rules are cached (:class:`PriceCache`); ``None``: no cache, every
        model is looked up in the package's data.

    Raises
    ------
    UsageError
        genai-prices is not installed.
    """
    cache = PriceCache.open(cache_dir, as_of)
    if cache.version is not None:  # the version the digest's data file was installed as
        return GenaiPriceTable(as_of, cache.version, _cache=cache)
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:  # genai-prices' own __version__, read without importing the package
        version = installed("genai_prices")
    except PackageNotFoundError as err:
        raise UsageError("the price data needs genai-prices: pip install 'genai-prices>=0.2.3'"
                         ) from err
    return GenaiPriceTable(as_of, version, _cache=cache)


def load_prices(override: str | Path | None = None, *, cache: bool = True
                ) -> LayeredPriceTable:
    """The price table a report uses: ``override``'s rules, then vakpipe's, then
    genai-prices' (as in force on ``prices.toml``'s ``as_of``).

    Parameters
    ----------
    override : str or Path or None
        A user's price file (the shape of ``prices.toml``; its ``version`` and ``as_of``
        are not read), or, when no file has that name, a built-in price source
        (:data:`BUILTIN_PRICE_SOURCES`) or an installed price-source plug-in (entry point
        group ``vakpipe.price_sources``): its table is tried first.
    cache : bool
        Keep genai-prices' resolved rules in :func:`price_cache_dir` (write them with
        :meth:`LayeredPriceTable.save_cache`); False: none.

    Returns
    -------
    LayeredPriceTable
        The layers, a version (``<prices.toml version>+genai-prices-<version>``, then
        ``+<file name>`` with an override), the ``as_of`` date and the source a report
        prints.

    Raises
    ------
    UsageError
        A file cannot be read (or there is none, nor a price source of that name), or a
        key is missing or invalid (the message names the file, the ``[[model]]`` entry
        and the key); genai-prices is not installed.
    """
    if override is not None and not Path(override).exists():
        name = str(override)
        if name in BUILTIN_PRICE_SOURCES:
            return _builtin_first(name, load_prices(None, cache=cache))
        if plugins.find("price_sources", name) is not None:
            return with_price_source(name, load_prices(None, cache=cache))
        raise UsageError(f"cannot read price table {name}: no such file, and no price source "
                         "of that name (vakpipe plugins lists them)")
    own = load_toml_prices(override)
    assert own.as_of is not None  # load_toml_prices checked it
    genai = load_genai_prices(own.as_of, price_cache_dir() if cache else None)
    shipped = own.version.split("+", 1)[0]
    version = f"{shipped}+genai-prices-{genai.version}"
    source = f"{genai.source} + vakpipe overrides {shipped}"
    if override is not None:
        version += f"+{Path(override).name}"
        source += f" + your {Path(override).name}"
    return LayeredPriceTable((own, genai), version, own.as_of, source)


#: The price sources built in, as ``vakpipe plugins`` lists them: both are layers of every
#: table (vakpipe's overrides first); ``--prices NAME`` puts that one first.
BUILTIN_PRICE_SOURCES = ("prices.toml", "genai-prices")


def _builtin_first(name: str, base: LayeredPriceTable) -> LayeredPriceTable:
    """``base`` (vakpipe's overrides, then genai-prices) with the built-in layer ``name``
    tried first: the same table for ``prices.toml``, genai-prices' rules ahead of
    vakpipe's overrides for ``genai-prices``."""
    if name == "prices.toml":
        return base
    first = [layer for layer in base.layers if isinstance(layer, GenaiPriceTable)]
    rest = [layer for layer in base.layers if not isinstance(layer, GenaiPriceTable)]
    return LayeredPriceTable((*first, *rest), f"{base.version}+genai-prices-first",
                             base.as_of, f"{base.source}, genai-prices tried first")


def _price_source(obj: Any) -> str | None:
    return (None if callable(obj) or hasattr(obj, "lookup")
            else "its entry point names no price table, class or function")


def with_price_source(name: str, base: LayeredPriceTable) -> LayeredPriceTable:
    """``base`` with the price-source plug-in ``name``'s table tried first.

    The entry point names a price table (anything with ``lookup(provider, model)``), or a
    class or function that makes one with no argument.

    Raises
    ------
    PluginError
        The plug-in does not load, or makes no price table (one line).
    """
    obj = plugins.load("price_sources", name, _price_source)
    if isinstance(obj, type) or not hasattr(obj, "lookup"):
        try:
            obj = obj()
        except Exception as err:  # a plug-in's constructor may raise anything: one line
            raise PluginError(f"plug-in vakpipe.price_sources:{name} could not be made: "
                              f"{type(err).__name__}: {err}") from err
        if not callable(getattr(obj, "lookup", None)):
            raise PluginError(f"plug-in vakpipe.price_sources:{name} made no price table "
                              "(it has no lookup(provider, model))")
    table: PriceTable = obj
    found = plugins.find("price_sources", name)
    tag = f"{name}-{found.version}" if found is not None and found.version else name
    return LayeredPriceTable((table, *base.layers), f"{base.version}+plugin-{tag}",
                             base.as_of, f"{base.source} + plug-in {name}")
