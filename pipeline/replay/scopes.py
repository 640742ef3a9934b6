"""Scope grammar of the context engine (seed 001): parse, compress, fold and budget. Pure.

A scope is a turn ``tN``, an iteration ``tN/iM`` or a form ``tN/iM/fK`` (spec section
4). Numbers are positive decimal integers written without a leading zero and with at
most 18 digits (``t0``, ``t01`` and longer numbers do not parse), so
``str(parse_scope(x)) == x`` for every ``x`` that parses. Iteration keys ``(turn, iter)``
order scopes; a form always stands for its iteration.

Decisions where the seed is silent (mirrored in docs/projection-rules.md):

- **Joining** (``join_scopes``/``pretty_scopes``): iteration tokens of one turn merge
  behind a bare comma (``t3/i3-i4,i7-i8``); tokens of different turns are joined by
  comma + space (``t1-t2/*, t3/i3-i4,i7-i8, t5/i1``); ``t*`` stands alone.
- **Full turn** (``compress_scopes``): a turn collapses to ``tN/*`` only when its selected
  iterations EQUAL its (non-empty) universe iterations, so a selected scope outside the
  universe keeps its turn explicit instead of vanishing inside ``tN/*``; ``["t*"]`` iff
  the selection equals a non-empty universe. Full-turn runs ``tA-tB/*`` need consecutive
  turn numbers; iteration runs ``iA-iC`` need consecutive iteration numbers. Bare
  ``tN`` entries are not concrete scopes and are ignored there.
- **Fold keys** also read the ledger grammar ``pretty_scopes`` writes, so that a rendered
  anchor can be typed back: ``tN/*`` is ``tN`` (anywhere, also as a range bound),
  ``t*`` is the open window ``{"since": "t1"}``, and a turn-less ``iM`` / ``iA-iC`` token
  continues the turn of the previous token (refused when there is none). An inverted
  window (``t3/i5-i2``) is refused. Canonical recorded values: cursors as canonical
  scope strings, ``scopes`` deduplicated in (turn, iter) order, bare turns as ``tN``;
  a range identical to an earlier one is dropped. The ``label`` is the canonical key:
  tokens joined by ``", "``, ranges as ``A-B`` (right side without its turn when both
  bounds are iterations of one turn). A non-string key is refused.
- **Expansion**: unparseable ``scopes`` entries and windows with an unparseable cursor
  select nothing; ``tN/iM/fK`` records ``tN/iM``. ``intent_ranges`` splits a carrier
  holding several range keys into one window per selector (through; from/to; since),
  flat carrier first, then ``ranges`` in order. Output ``scopes`` is a list in (turn,
  iter) order, ``turns`` a sorted int list (dropped when empty); intents without any
  selector key come back as an unchanged copy.
- **Supersession**: ``B`` covers ``A`` when ``A``'s scopes are a subset of ``B``'s and each
  recap-only turn of ``A`` (a ``turns`` entry with no scope of ``A`` in it) is in ``B``'s
  ``turns`` (missing ``scopes`` count as an empty set). The first covered
  summary (in order) is dropped into the newest coverer, its ``turns`` merged, and the
  scan restarts until nothing is covered: order-stable, idempotent, lossless.
- **Now line**: ``None`` for a missing or empty universe; ``context U% · `` is left out
  when no saturation is known; the ``~N tok`` clause appears only when ``weights`` price
  every folded live scope (``turn_weights`` adds the recaps of whole-turn-folded turns
  it knows and its keys name persisted turns); percentages round half up; ``live none``
  when everything is folded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FOLD_KEY_GRAMMAR",
    "FoldKey",
    "FoldRefusal",
    "Scope",
    "compress_scopes",
    "expand_through",
    "fold_key",
    "folds_view_now",
    "intent_ranges",
    "join_scopes",
    "parse_fold_key_to_scopes",
    "parse_scope",
    "pretty_scopes",
    "scope_key",
    "supersede_summaries",
    "turn_key",
]

FOLD_KEY_GRAMMAR = (
    "fold key: tN | tN/iM | tN/iM/fK | tN/iA-iB | tA[/iM]-tB[/iN] | -tN/iM | tN/iM- | "
    "tN/* | tA-tB/* | t* (comma- or space-separated; '..' = '-')"
)
"""The fold KEY grammar in ONE line, said verbatim by every refusal."""

_NUM = r"([1-9][0-9]{0,17})"
_SCOPE_RE = re.compile(rf"t{_NUM}(?:/i{_NUM}(?:/f{_NUM})?)?", re.ASCII)
_ITER_RE = re.compile(rf"i{_NUM}(?:/f{_NUM})?", re.ASCII)
_SPLIT_RE = re.compile(r"[,\s]+")
_INF = 10**18  # above every number that parses
_RANGE_KEYS = ("through", "from", "to", "since", "ranges")
_SELECTOR_KEYS = ("scopes", *_RANGE_KEYS)

Key = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Scope:
    """A turn (``iter`` None), an iteration (``form`` None) or a form."""

    turn: int
    iter: int | None = None
    form: int | None = None

    def __str__(self) -> str:
        text = f"t{self.turn}"
        if self.iter is not None:
            text += f"/i{self.iter}"
            if self.form is not None:
                text += f"/f{self.form}"
        return text


@dataclass(frozen=True, slots=True)
class FoldKey:
    """A parsed fold key: the recorded selector ``intent`` and the ack card ``label``."""

    intent: dict[str, Any]
    label: str


@dataclass(frozen=True, slots=True)
class FoldRefusal:
    """A model-facing one-line refusal that ends with :data:`FOLD_KEY_GRAMMAR`."""

    error: str


def parse_scope(text: object) -> Scope | None:
    """Parse ``tN``, ``tN/iM`` or ``tN/iM/fK``; a :class:`Scope` passes through.

    Parameters
    ----------
    text : object
        The scope text.

    Returns
    -------
    Scope or None
        None when ``text`` is not a canonical scope string.
    """
    if isinstance(text, Scope):
        return text
    if not isinstance(text, str) or (m := _SCOPE_RE.fullmatch(text)) is None:
        return None
    it, form = (None if g is None else int(g) for g in m.groups()[1:])
    return Scope(int(m.group(1)), it, form)


def scope_key(scope: object) -> Key | None:
    """Ordered ``(turn, iter)`` key of an iteration or form scope (the form dropped).

    Parameters
    ----------
    scope : str or Scope
        ``"t1/i2"`` or ``"t1/i2/f3"`` both give ``(1, 2)``.

    Returns
    -------
    tuple of int or None
        None when the scope does not parse or is a bare turn.
    """
    sc = parse_scope(scope)
    return None if sc is None or sc.iter is None else (sc.turn, sc.iter)


def turn_key(scope: object) -> int | None:
    """Turn number of a bare whole-turn scope ``"tN"``; None otherwise (``"t1/i2"`` too).

    Parameters
    ----------
    scope : str or Scope
        The scope.

    Returns
    -------
    int or None
    """
    sc = parse_scope(scope)
    return sc.turn if sc is not None and sc.iter is None else None


def _keys(scopes: Iterable[object] | None) -> set[Key]:
    return {k for s in scopes or () if (k := scope_key(s)) is not None}


def _render(keys: Iterable[Key]) -> list[str]:
    return [f"t{t}/i{i}" for t, i in sorted(keys)]


def _by_turn(keys: Iterable[Key]) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for t, i in keys:
        out.setdefault(t, set()).add(i)
    return out


def _runs(numbers: Iterable[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for n in sorted(numbers):
        if runs and runs[-1][1] + 1 == n:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return runs


def compress_scopes(scopes: Iterable[object], universe: Iterable[object] | None) -> list[str]:
    """Compress concrete ``tN/iM`` scopes into ledger tokens, relative to ``universe``.

    Parameters
    ----------
    scopes : iterable of str or Scope
        The selected scopes; entries that do not parse (or are bare turns) are ignored.
    universe : iterable of str or Scope, optional
        Every ``tN/iM`` currently on the wire; None or empty collapses nothing.

    Returns
    -------
    list of str
        ``tN/*``, ``tA-tB/*``, ``tN/iM`` or ``tN/iA-iC`` in (turn, iter) order, or
        ``["t*"]`` when the selection is the whole universe.

    Examples
    --------
    >>> compress_scopes(["t1/i1", "t1/i2", "t2/i1", "t3/i2"], ["t1/i1", "t1/i2", "t2/i1",
    ...                 "t3/i1", "t3/i2"])
    ['t1-t2/*', 't3/i2']
    """
    sel, uni = _keys(scopes), _keys(universe)
    if not sel:
        return []
    if sel == uni:
        return ["t*"]
    s_by, u_by = _by_turn(sel), _by_turn(uni)
    full = {t for t, its in s_by.items() if its == u_by.get(t)}
    turns, tokens, n = sorted(s_by), [], 0
    while n < len(turns):
        first = last = turns[n]
        if first in full:
            while n + 1 < len(turns) and turns[n + 1] == last + 1 and turns[n + 1] in full:
                n, last = n + 1, turns[n + 1]
            tokens.append(f"t{first}/*" if first == last else f"t{first}-t{last}/*")
        else:
            tokens += [f"t{first}/i{a}" + ("" if a == b else f"-i{b}")
                       for a, b in _runs(s_by[first])]
        n += 1
    return tokens


def join_scopes(tokens: Iterable[str]) -> str | None:
    """Join ledger tokens into one anchor: ``t3/i3-i4,i7-i8``, turns split by ``", "``.

    Parameters
    ----------
    tokens : iterable of str
        Tokens as :func:`compress_scopes` writes them.

    Returns
    -------
    str or None
        None when there is no token.
    """
    parts: list[str] = []
    last_turn: str | None = None
    for tok in tokens:
        head, sep, tail = tok.partition("/")
        if sep and tail.startswith("i") and head == last_turn:
            parts[-1] += "," + tail
        else:
            parts.append(tok)
        last_turn = head if sep and tail.startswith("i") else None
    return ", ".join(parts) or None


def pretty_scopes(scopes: Iterable[object], universe: Iterable[object] | None) -> str | None:
    """Render scopes as ONE anchor in the ledger grammar (compress + join).

    Parameters
    ----------
    scopes : iterable of str or Scope
        Concrete ``tN/iM`` scopes.
    universe : iterable of str or Scope, optional
        Drives the whole-turn collapse; None or empty keeps every turn explicit.

    Returns
    -------
    str or None
        None for an empty or unparseable selection.

    Examples
    --------
    >>> pretty_scopes(["t3/i3", "t3/i4", "t3/i7", "t3/i8"], None)
    't3/i3-i4,i7-i8'
    """
    return join_scopes(compress_scopes(scopes, universe))


def _bound(text: str, ctx: int | None) -> Scope | None:
    """A range bound or single selector: tN, tN/*, tN/iM[/fK], or iM[/fK] in turn ``ctx``."""
    if text.endswith("/*"):
        text = text[:-2]
        sc = parse_scope(text)
        return sc if sc is not None and sc.iter is None else None
    if (m := _ITER_RE.fullmatch(text)) is not None:
        return None if ctx is None else Scope(ctx, int(m.group(1)))
    sc = parse_scope(text)
    return None if sc is None else Scope(sc.turn, sc.iter)


def _lo(sc: Scope | None) -> Key:
    if sc is None:
        return (0, 0)
    return (sc.turn, 0 if sc.iter is None else sc.iter)


def _hi(sc: Scope | None) -> Key:
    if sc is None:
        return (_INF, _INF)
    return (sc.turn, _INF if sc.iter is None else sc.iter)


def fold_key(key: object) -> FoldKey | FoldRefusal | None:
    """Parse ``fold_session``'s KEY into one selector intent plus its label.

    Parameters
    ----------
    key : object
        Comma- or space-separated tokens (see :data:`FOLD_KEY_GRAMMAR`).

    Returns
    -------
    FoldKey, FoldRefusal or None
        The intent (``scopes``; one window flat as ``through``, ``since`` or
        ``from``/``to``; further windows under ``ranges``), a refusal for an
        unparseable token or a non-string key, or None when the key names nothing.
        Never raises.

    Examples
    --------
    >>> fold_key("t1, t2/i1..i3").intent
    {'scopes': ['t1'], 'from': 't2/i1', 'to': 't2/i3'}
    """
    if not isinstance(key, str):
        return FoldRefusal(f"fold key must be a string; {FOLD_KEY_GRAMMAR}")
    singles: set[Scope] = set()
    windows: list[dict[str, str]] = []
    labels: list[str] = []
    ctx: int | None = None
    for token in (t for t in _SPLIT_RE.split(key.replace("..", "-")) if t):
        refusal = FoldRefusal(f"fold key token {token[:40]!r} unparseable; {FOLD_KEY_GRAMMAR}")
        if token == "t*":
            window, label, ctx = {"since": "t1"}, "t*", None
        elif token.count("-") > 1:
            return refusal
        elif "-" in token:
            left_text, _, right_text = token.partition("-")
            left = _bound(left_text, ctx) if left_text else None
            right = _bound(right_text, left.turn if left else ctx) if right_text else None
            if (left_text and left is None) or (right_text and right is None):
                return refusal
            if (left is None and right is None) or _lo(left) > _hi(right):
                return refusal
            if left is None:
                window = {"through": str(right)}
            elif right is None:
                window = {"since": str(left)}
            else:
                window = {"from": str(left), "to": str(right)}
            short = (right is not None and left is not None and right.turn == left.turn
                     and left.iter is not None and right.iter is not None)
            label = ("" if left is None else str(left)) + "-" + (
                "" if right is None else f"i{right.iter}" if short else str(right))
            ctx = right.turn if right is not None else left.turn if left is not None else None
        else:
            single = _bound(token, ctx)
            if single is None:
                return refusal
            singles.add(single)
            labels.append(str(single))
            ctx = single.turn
            continue
        labels.append(label)
        if window not in windows:
            windows.append(window)
    if not singles and not windows:
        return None
    intent: dict[str, Any] = {}
    if singles:
        intent["scopes"] = [str(s) for s in sorted(singles, key=_lo)]
    if windows:
        intent.update(windows[0])
    if len(windows) > 1:
        intent["ranges"] = windows[1:]
    return FoldKey(intent, ", ".join(dict.fromkeys(labels)))


def intent_ranges(intent: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every range window an intent carries, flat one first, then its ``ranges``.

    Parameters
    ----------
    intent : mapping
        A fold intent or summary.

    Returns
    -------
    list of dict
        One map per window: ``{"through": c}``, ``{"since": c}`` or ``{"from": a,
        "to": b}`` (either bound optional). None values are absent keys.
    """
    extra = intent.get("ranges")
    carriers = [intent, *(r for r in extra if isinstance(r, Mapping))] if isinstance(
        extra, list | tuple) else [intent]
    out: list[dict[str, Any]] = []
    for src in carriers:
        if src.get("through") is not None:
            out.append({"through": src["through"]})
        window = {k: src[k] for k in ("from", "to") if src.get(k) is not None}
        if window:
            out.append(window)
        if src.get("since") is not None:
            out.append({"since": src["since"]})
    return out


def _window(rng: Mapping[str, Any]) -> tuple[Key, Key] | None:
    """(lo, hi) keys of one window; a bare tN cursor is a whole-turn boundary."""
    cursors = {k: _bound(v, None) if isinstance(v, str) else None for k, v in rng.items()}
    if any(c is None for c in cursors.values()):
        return None
    start = cursors.get("from") or cursors.get("since")
    end = cursors.get("to") or cursors.get("through")
    return _lo(start), _hi(end)


def _listed(value: object) -> list[object]:
    if isinstance(value, str):
        return [value]
    return list(value) if isinstance(value, Iterable) else []


def expand_through(summaries: Iterable[Mapping[str, Any]], universe: Iterable[object] | None,
                   turns: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """Resolve every fold selector into a concrete ``scopes`` list and ``turns``.

    Parameters
    ----------
    summaries : iterable of mapping
        Recorded intents/summaries (``scopes``, ``through``, ``from``/``to``,
        ``since``, ``ranges``, ``turns``).
    universe : iterable of str or Scope, optional
        The live ``tN/iM`` scopes.
    turns : iterable of int, optional
        Persisted turns, including turns with no indexed iterations.

    Returns
    -------
    list of dict
        Range keys dropped, the union in ``scopes``, whole-turn intent (bare ``tN``
        tokens; ranges covering every universe iteration of a turn, or spanning an
        iteration-less persisted turn entirely) in ``turns``.
    """
    uni = _keys(universe)
    u_by = _by_turn(uni)
    bare = {t for t in turns or () if isinstance(t, int) and t not in u_by}
    out: list[dict[str, Any]] = []
    for summary in summaries:
        if not any(k in summary for k in _SELECTOR_KEYS):
            out.append(dict(summary))
            continue
        chosen: set[Key] = set()
        whole = {t for t in _listed(summary.get("turns")) if isinstance(t, int)}
        for entry in _listed(summary.get("scopes")):
            sc = parse_scope(entry)
            if sc is not None and sc.iter is None:
                whole.add(sc.turn)
                chosen |= {(sc.turn, i) for i in u_by.get(sc.turn, ())}
            elif sc is not None and sc.iter is not None:
                chosen.add((sc.turn, sc.iter))
        for rng in intent_ranges(summary):
            if (win := _window(rng)) is None:
                continue
            lo, hi = win
            picked = {k for k in uni if lo <= k <= hi}
            chosen |= picked
            whole |= {t for t, its in u_by.items() if all((t, i) in picked for i in its)}
            whole |= {t for t in bare if lo <= (t, 0) and (t, _INF) <= hi}
        res = {k: v for k, v in summary.items() if k not in _RANGE_KEYS and k != "turns"}
        res["scopes"] = _render(chosen)
        if whole:
            res["turns"] = sorted(whole)
        out.append(res)
    return out


def _turns_of(summary: Mapping[str, Any]) -> set[int]:
    return {t for t in _listed(summary.get("turns")) if isinstance(t, int)}


def _covers(b: tuple[set[Key], set[int]], a: tuple[set[Key], set[int]]) -> bool:
    """``b`` covers ``a``: a's scopes inside b's, a's recap-only turns in b's turns."""
    recap_only = a[1] - {t for t, _ in a[0]}
    return a[0] <= b[0] and recap_only <= b[1]


def supersede_summaries(summaries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Drop every summary covered by another (proper cover, or equal and recorded earlier).

    Parameters
    ----------
    summaries : iterable of mapping
        Resolved summaries (see :func:`expand_through`).

    Returns
    -------
    list of dict
        Survivors in their original order; each dropped summary's ``turns`` merged
        into its (newest) coverer. The union of scopes and of turns is unchanged.
    """
    live = [dict(s) for s in summaries]
    cover = [(_keys(_listed(s.get("scopes"))), _turns_of(s)) for s in live]
    while True:
        for n, a in enumerate(cover):
            coverers = [m for m, b in enumerate(cover) if m != n and _covers(b, a)
                        and (m > n or not _covers(a, b))]
            if coverers:
                m = coverers[-1]
                if merged := a[1] | cover[m][1]:
                    live[m]["turns"] = sorted(merged)
                    cover[m] = (cover[m][0], merged)
                del live[n], cover[n]
                break
        else:
            return live


def folds_view_now(summaries: Iterable[Mapping[str, Any]], universe: Iterable[object] | None,
                   weights: Mapping[str, float] | None = None,
                   saturation: float | None = None,
                   turn_weights: Mapping[int, float] | None = None) -> str | None:
    """The volatile "now" budget line of ``folds-view``.

    Parameters
    ----------
    summaries : iterable of mapping
        Recorded fold intents (resolved and superseded here).
    universe : iterable of str or Scope, optional
        The live ``tN/iM`` scopes of this send.
    weights : mapping of str to number, optional
        ``tN/iM`` -> measured tokens of that iteration on the wire.
    saturation : number, optional
        The live per-call saturation in percent.
    turn_weights : mapping of int to number, optional
        Turn number -> tokens of its Q/A recap; also names persisted turns.

    Returns
    -------
    str or None
        ``context U% · saved C/T (P%, ~N tok) · live <scopes>``; None without a universe.
    """
    uni = _keys(universe)
    if not uni:
        return None
    wire = _render(uni)
    resolved = supersede_summaries(expand_through(summaries, wire, turn_weights))
    folded = uni & set().union(*(_keys(_listed(s.get("scopes"))) for s in resolved))
    total, count = len(uni), len(folded)
    price = f"{(200 * count + total) // (2 * total)}%"
    weighed = {k: w for s, w in (weights or {}).items() if (k := scope_key(s)) is not None}
    if weights is not None and folded <= weighed.keys():
        whole = set().union(*(_turns_of(s) for s in resolved))
        recaps = turn_weights or {}
        toks = sum(weighed[k] for k in folded) + sum(recaps.get(t, 0) for t in whole)
        price += f", ~{round(toks)} tok"
    live = pretty_scopes(_render(uni - folded), wire) or "none"
    head = "" if saturation is None else f"context {round(saturation)}% · "
    return f"{head}saved {count}/{total} ({price}) · live {live}"


def parse_fold_key_to_scopes(key: str, universe: Iterable[object]) -> set[Scope]:
    """The iterations of ``universe`` a fold key selects (``--scope t3/i2-t5``).

    Parameters
    ----------
    key : str
        A fold key.
    universe : iterable of str or Scope
        The session's iteration scopes.

    Returns
    -------
    set of Scope
        Iteration scopes, restricted to the universe; empty for an empty key.

    Raises
    ------
    ValueError
        With the one-line refusal when the key does not parse.
    """
    parsed = fold_key(key)
    if isinstance(parsed, FoldRefusal):
        raise ValueError(parsed.error)
    if parsed is None:
        return set()
    uni = _keys(universe)
    expanded = expand_through([parsed.intent], _render(uni))[0]
    return {Scope(t, i) for t, i in _keys(expanded["scopes"]) & uni}


def turn_range(first: int, last: int) -> str:
    """Turns ``first`` to ``last`` as scopes name them: ``t3-t7``, ``t3`` for one."""
    return f"t{first}" if first == last else f"t{first}-t{last}"
