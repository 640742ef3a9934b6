"""The summarisers by name: a lazy registry. Pure.

Each name maps to the module and class that implement it, imported only when asked
for: the summaries' Protocol (:mod:`pipeline.compaction.summaries`) knows no
implementation, so ``cards`` and ``http`` import it and nothing imports back (no
cycle), and the HTTP client is loaded only by a run that uses it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from pipeline.compaction.summaries import Summariser
from pipeline.errors import UsageError
from pipeline.replay.tokens import get_tokenizer

__all__ = ["SUMMARISERS", "get_summariser"]

#: Name -> ``(module, class)`` of every summariser :func:`get_summariser` knows.
_REGISTRY: dict[str, tuple[str, str]] = {
    "cards": ("pipeline.compaction.cards", "CardsSummariser"),
    "http": ("pipeline.compaction.http", "HttpSummariser"),
}
#: Names :func:`get_summariser` knows.
SUMMARISERS = tuple(_REGISTRY)


def get_summariser(name: str, **options: Any) -> Summariser:
    """The summariser called ``name`` (:data:`SUMMARISERS`), built with ``options``.

    Parameters
    ----------
    name:
        ``cards`` (:class:`~pipeline.compaction.cards.CardsSummariser`) or ``http``
        (:class:`~pipeline.compaction.http.HttpSummariser`).
    **options:
        Constructor arguments; ``tokenizer`` may be given by name (``cl100k_base``).

    Raises
    ------
    UsageError
        For an unknown name or options the summariser does not take.
    """
    if isinstance(options.get("tokenizer"), str):
        try:
            options["tokenizer"] = get_tokenizer(options["tokenizer"])
        except ValueError as err:
            raise UsageError(str(err)) from err
    if name not in _REGISTRY:
        raise UsageError(f"unknown summariser {name!r}; known: {', '.join(SUMMARISERS)}")
    module, attr = _REGISTRY[name]
    # Imported on demand: the HTTP client pulls urllib3 in, which a cards run never needs.
    factory: Callable[..., Summariser] = getattr(importlib.import_module(module), attr)
    try:
        return factory(**options)
    except TypeError as err:
        raise UsageError(f"bad options for summariser {name!r}: {err}") from err
