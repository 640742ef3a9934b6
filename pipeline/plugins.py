"""Plug-ins found through ``importlib.metadata`` entry points. Pure (standard library).

A package extends vakpipe without editing it by declaring entry points in one of the
groups of :data:`GROUPS` (``[project.entry-points."vakpipe.rule_sets"]`` in its
``pyproject.toml``); the registries of rule sets
(:func:`pipeline.replay.projection.get_rule_set`), summarisers
(:func:`pipeline.compaction.registry.get_summariser`), price sources
(:func:`pipeline.costs.pricing.load_prices`) and transcript formats
(:func:`pipeline.formats.detect`) look a name up in their built-in table first, then
here. A built-in name always wins: a plug-in cannot replace vakpipe's own ``v1``.

Loading is lazy (an entry point is imported only when its name is asked for) and a
plug-in that fails to import or holds the wrong kind of object is one
:class:`~pipeline.errors.PluginError` line, never a traceback. ``vakpipe plugins`` lists
what is installed (:func:`inventory`). docs/plugins.md has the how-to.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from pipeline.errors import PluginError

__all__ = ["GROUPS", "Plugin", "PluginStatus", "find", "installed", "inventory", "load",
           "refresh"]

#: Kind of plug-in -> its entry-point group.
GROUPS: dict[str, str] = {
    "rule_sets": "vakpipe.rule_sets",
    "summarisers": "vakpipe.summarisers",
    "price_sources": "vakpipe.price_sources",
    "formats": "vakpipe.transcript_formats",
}


@dataclass(frozen=True)
class Plugin:
    """One installed entry point of a ``vakpipe.*`` group."""

    kind: str
    name: str
    #: ``module:attribute`` as the entry point names it.
    value: str
    #: The distribution that declares it, and its version (``None`` when unknown).
    distribution: str | None
    version: str | None


@dataclass(frozen=True)
class PluginStatus:
    """A plug-in and whether it loads: ``error`` is the one line saying why not."""

    plugin: Plugin
    error: str | None


def _plugin(kind: str, ep: EntryPoint) -> Plugin:
    dist = ep.dist
    return Plugin(kind, ep.name, ep.value, dist.name if dist is not None else None,
                  dist.version if dist is not None else None)


@functools.cache
def _entry_points(kind: str) -> tuple[tuple[Plugin, EntryPoint], ...]:
    # Scanning sys.path's dist-info folders costs milliseconds: once per process (and per
    # Dask worker), not once per session a worker reads.
    group = GROUPS[kind]
    found = sorted(entry_points(group=group), key=lambda ep: ep.name)
    seen: set[str] = set()
    out = []
    for ep in found:
        if ep.name in seen:
            continue  # two distributions, one name: the first on sys.path, as import does
        seen.add(ep.name)
        out.append((_plugin(kind, ep), ep))
    return tuple(out)


def refresh() -> None:
    """Forget the entry points read so far (after installing a plug-in in-process)."""
    _entry_points.cache_clear()
    _loaded.cache_clear()


def installed(kind: str) -> tuple[Plugin, ...]:
    """The plug-ins of ``kind`` (a key of :data:`GROUPS`) installed, by name."""
    return tuple(p for p, _ in _entry_points(kind))


def find(kind: str, name: str) -> Plugin | None:
    """The installed plug-in of ``kind`` called ``name``, or ``None``."""
    return next((p for p in installed(kind) if p.name == name), None)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return f"{type(err).__name__}: {text[:300]}"


@functools.cache
def _loaded(kind: str, name: str) -> Any:
    for plugin, ep in _entry_points(kind):
        if plugin.name == name:
            where = f"{plugin.distribution or '?'} {plugin.version or ''}".strip()
            try:
                return ep.load()
            except Exception as err:  # a plug-in's import may raise anything: one line
                raise PluginError(
                    f"plug-in {GROUPS[kind]}:{name} ({plugin.value}, from {where}) does "
                    f"not load: {_one_line(err)}") from err
    raise PluginError(f"no plug-in {GROUPS[kind]}:{name} is installed")


def load(kind: str, name: str, check: Callable[[Any], str | None] | None = None) -> Any:
    """The object the plug-in ``name`` of ``kind`` names, imported now.

    Parameters
    ----------
    kind:
        A key of :data:`GROUPS`.
    name:
        The entry point's name.
    check:
        Returns why the object is not usable (``None``: it is); a reason becomes the
        :class:`~pipeline.errors.PluginError`.

    Raises
    ------
    PluginError
        Not installed, does not import, or ``check`` refused it (one line).
    """
    obj = _loaded(kind, name)
    if check is not None:
        reason = check(obj)
        if reason is not None:
            raise PluginError(f"plug-in {GROUPS[kind]}:{name} is not usable: {reason}")
    return obj


def inventory(verify: Mapping[str, Callable[[str], object]] | None = None
              ) -> list[PluginStatus]:
    """Every installed plug-in of every kind, each loaded once to say whether it works.

    Parameters
    ----------
    verify:
        Kind -> a function that gets a plug-in by name as its registry would (the rule
        sets' ``get_rule_set``), raising :class:`~pipeline.errors.PluginError` or
        ``ValueError`` when it is not usable; default: the entry point is imported.
    """
    verify = verify or {}
    out = []
    for kind in GROUPS:
        for plugin in installed(kind):
            get: Callable[[str], object] = verify.get(kind) or functools.partial(load, kind)
            try:
                get(plugin.name)
            except (PluginError, ValueError) as err:
                out.append(PluginStatus(plugin, " ".join(str(err).split())))
            else:
                out.append(PluginStatus(plugin, None))
    return out
