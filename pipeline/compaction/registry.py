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

from pipeline import plugins
from pipeline.compaction.summaries import Summariser
from pipeline.errors import PipelineError, PluginError, UsageError
from pipeline.replay.tokens import get_tokenizer

__all__ = ["SUMMARISERS", "get_summariser", "summariser_names"]

#: Name -> ``(module, class)`` of every summariser :func:`get_summariser` knows.
_REGISTRY: dict[str, tuple[str, str]] = {
    "cards": ("pipeline.compaction.cards", "CardsSummariser"),
    "http": ("pipeline.compaction.http", "HttpSummariser"),
}
#: Names :func:`get_summariser` knows.
SUMMARISERS = tuple(_REGISTRY)


def summariser_names() -> list[str]:
    """The built-in summarisers, then the installed plug-ins' (``vakpipe.summarisers``)."""
    return [*SUMMARISERS, *(p.name for p in plugins.installed("summarisers")
                            if p.name not in _REGISTRY)]


def _callable(obj: Any) -> str | None:
    return None if callable(obj) else "its entry point names no class or function"


def get_summariser(name: str, **options: Any) -> Summariser:
    """The summariser called ``name`` (:data:`SUMMARISERS`), built with ``options``.

    Parameters
    ----------
    name:
        ``cards`` (:class:`~pipeline.compaction.cards.CardsSummariser`), ``http``
        (:class:`~pipeline.compaction.http.HttpSummariser`), or an installed plug-in's
        (entry point group ``vakpipe.summarisers``: a class or function called with
        ``options``).
    **options:
        Constructor arguments; ``tokenizer`` may be given by name (``cl100k_base``).

    Raises
    ------
    UsageError
        For an unknown name or options the summariser does not take.
    PluginError
        A plug-in that does not load or whose constructor fails (one line).
    """
    if isinstance(options.get("tokenizer"), str):
        try:
            options["tokenizer"] = get_tokenizer(options["tokenizer"])
        except ValueError as err:
            raise UsageError(str(err)) from err
    factory: Callable[..., Summariser]
    if name in _REGISTRY:
        module, attr = _REGISTRY[name]
        # Imported on demand: the HTTP client pulls urllib3 in, which a cards run never needs.
        factory = getattr(importlib.import_module(module), attr)
    elif plugins.find("summarisers", name) is not None:
        factory = plugins.load("summarisers", name, _callable)
    else:
        raise UsageError(f"unknown summariser {name!r}; known: {', '.join(summariser_names())}")
    try:
        return factory(**options)
    except TypeError as err:
        raise UsageError(f"bad options for summariser {name!r}: {err}") from err
    except PipelineError:
        raise
    except Exception as err:  # a plug-in's constructor may raise anything: one line
        raise PluginError(f"summariser {name!r} could not be made: "
                          f"{type(err).__name__}: {err}") from err
