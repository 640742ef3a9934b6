"""The cards summariser (``"cards"``): the offline, deterministic default. Pure.

It builds a bounded structured summary of a packet's turns from their ``turn_card``
entries (asked, did, answered, outcome), seeded from a stored packet over the same
first turn, within a token target. The format is documented in ``docs/compaction.md``
(*Summaries*); the protocol and the request it answers are in :mod:`pipeline.compaction.summaries`.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pipeline.compaction.summaries import Detail, Summary, SummaryRequest, compact_json, seed_prefix
from pipeline.ledger.redact import redact
from pipeline.replay.projection import canonical_json, card_line, get_rule_set
from pipeline.replay.scopes import turn_range
from pipeline.replay.tokens import ExactTokenizer, Tokenizer, get_tokenizer

K = TypeVar("K")
V = TypeVar("V")


_WS = re.compile(r"\s+")
# The header line this summariser writes; a seed that starts with one loses it, so that a
# summary seeded from an earlier one reads as one summary, not as nested ones.
_HEADER = re.compile(r"\ATurns? t\d+(?:-t\d+)? \(\d+ turns?\)[^\n]*(?:\n|\Z)")
_TERSE = get_rule_set("v1-terse-cards")


def _count(n: int) -> str:
    return f"{n} turn{'s' if n != 1 else ''}"


def _turns(a: int, b: int) -> str:  # the header's subject: "Turns t3-t7 (5 turns)"
    return f"Turn{'s' if b > a else ''} {turn_range(a, b)} ({_count(b - a + 1)})"


def _clean_tag(text: str) -> str:
    # A summary lands inside <context_summary>: a closing tag in the data must not end it.
    return text.replace("</context_summary", "<\\/context_summary")


def _clean(value: Any) -> str:
    """One line of text, redacted (before any shortening: a cut must not leave part of a
    secret behind, nor hide one from the rules)."""
    text = value if isinstance(value, str) else "" if value is None else compact_json(value)
    return _clean_tag(redact(_WS.sub(" ", text).strip()))


def _shorten(text: str, limit: int) -> str:
    """``text`` cut at a word boundary to at most ``limit`` characters, ``…`` marking it."""
    if len(text) <= limit:
        return text
    cut = text[: max(limit - 1, 0)]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip() + "…"


@dataclass(frozen=True)
class _Card:
    """One covered turn's card, normalised: every field a clean one-line string."""

    n: int
    asked: str
    calls: tuple[tuple[str, str, str], ...]  # tool, arguments digest, evidence id
    shown: tuple[tuple[str, str, str, str], ...]  # semantic type, title, digest, id
    narration: str
    outcome: str


def _dicts(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _card(n: int, card: Mapping[str, Any]) -> _Card:
    answered = card.get("answered")
    answered = answered if isinstance(answered, Mapping) else {}
    calls = tuple((_clean(d.get("tool")) or "?", _clean(d.get("args_digest")),
                   _clean(d.get("evidence_id"))) for d in _dicts(card.get("did")))
    shown = tuple((_clean(p.get("semantic_type")) or "?", _clean(p.get("title")),
                   _clean(p.get("digest")), _clean(p.get("id")))
                  for p in _dicts(answered.get("presentations")))
    return _Card(n, _clean(card.get("asked")), calls, shown, _clean(answered.get("narration")),
                 _clean(card.get("outcome")))


class _Memo(Generic[K, V]):
    """A bounded, thread-safe memo (oldest entries dropped first).

    A compaction engine asks for ever broader ranges over the same first turn, each in
    several forms: the same cards are normalised, and the same lines counted, again and
    again (most of a planning replay's extra time on long sessions). Memoised by value,
    so a result never depends on what was asked before.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: dict[K, V] = {}
        self._lock = threading.Lock()

    def get(self, key: K, make: Callable[[K], V]) -> V:
        """The value of ``key``, ``make(key)`` (and kept) on a miss."""
        try:
            return self._items[key]  # one dict read: atomic, no lock needed
        except KeyError:
            pass
        value = make(key)
        with self._lock:
            if len(self._items) >= self.size:
                del self._items[next(iter(self._items))]
            self._items[key] = value
        return value


_CARDS: _Memo[tuple[int, str], _Card] = _Memo(4096)
#: Token counts of lines (newline included) under ``cl100k_base``.
_LINES: _Memo[str, int] = _Memo(16384)
#: Longer keys are not memoised: the memos stay within a few tens of megabytes.
_MEMO_CHARS = 8192
# After a newline, cl100k's pre-tokenizer starts a new piece unless the next line holds
# only blanks, or a carriage return among its leading blanks (the line breaks then merge
# into one piece). A text without such a line splits into lines whose token counts add
# up exactly (a property test checks it).
_UNSPLITTABLE = re.compile(r"\n[^\S\n]*(?:\r|\n|\Z)")


def _normalised(n: int, card: Mapping[str, Any]) -> _Card:
    """:func:`_card`, memoised by the card's canonical JSON."""
    try:
        key = (n, canonical_json(card))
    except TypeError:  # values orjson refuses: rare enough to normalise every time
        return _card(n, card)
    if len(key[1]) > _MEMO_CHARS:
        return _card(n, card)
    return _CARDS.get(key, lambda _: _card(n, card))


def _counter(tok: Tokenizer) -> Callable[[str], int]:
    """``tok.count``, summed over memoised lines where that is exact (``cl100k_base``)."""
    if not isinstance(tok, ExactTokenizer) or tok.name != "cl100k_base":
        return tok.count
    whole, memo = tok.count, _LINES.get

    def count(text: str) -> int:
        if "\n" not in text or _UNSPLITTABLE.search(text):
            return whole(text)
        lines = text.split("\n")
        last = lines.pop()
        total = memo(last, whole) if len(last) <= _MEMO_CHARS else whole(last)
        for line in lines:
            line += "\n"
            total += memo(line, whole) if len(line) <= _MEMO_CHARS else whole(line)
        return total

    return count


@dataclass(frozen=True)
class _Style:
    text: int  # characters kept of ``asked`` and the narration
    each_call: bool  # every call with its arguments, else ``tool×count`` per tool
    digests: bool  # presentation digests


_STYLES = ((Detail.FULL, _Style(400, True, True)), (Detail.SHORT, _Style(160, False, True)),
           (Detail.SHORT, _Style(80, False, False)))
_BRIEF = _STYLES[-1][1]
_LINE_ASKED, _TERSE_ASKED, _RUN_ASKED, _NAME = 80, 40, 30, 40


def _grouped(calls: Sequence[tuple[str, str, str]], *, refs: bool) -> list[str]:
    """``tool×count [ev:…]`` per tool, in order of first use."""
    groups: dict[str, list[str]] = {}
    for tool, _, ev in calls:
        groups.setdefault(tool, []).append(ev)
    out = []
    for tool, evs in groups.items():
        ids = [e for e in evs if e]
        ref = f" [ev:{','.join(ids)}]" if refs and ids else ""
        out.append(f"{tool}×{len(evs)}{ref}" if len(evs) > 1 else f"{tool}{ref}")
    return out


# Memoised: a chain of ever broader packets renders the same turns in the same forms.
@functools.lru_cache(maxsize=8192)
def _block(c: _Card, s: _Style) -> str:
    if s.each_call:
        did = [f"{tool}{' ' + _shorten(args, 100) if args else ''}{f' [ev:{ev}]' if ev else ''}"
               for tool, args, ev in c.calls]
    else:
        did = _grouped(c.calls, refs=True)
    answered = []
    for sem, title, digest, pid in c.shown:
        extra = f" = {_shorten(digest, s.text)}" if s.digests and digest not in ("", title) \
            else ""
        ref = f" [pres:{pid}]" if pid else ""
        answered.append(f"{sem} \"{_shorten(title, s.text)}\"{extra}{ref}")
    if c.narration:
        answered.append(f"\"{_shorten(c.narration, s.text)}\"")
    lines = [f"#{c.n} asked: {_shorten(c.asked, s.text) or '(nothing recorded)'}",
             f"  did: {'; '.join(did) or 'nothing'}",
             f"  answered: {'; '.join(answered) or 'nothing recorded'}"]
    if c.outcome:
        lines.append(f"  outcome: {_shorten(c.outcome, _NAME)}")
    return "\n".join(lines)


@functools.lru_cache(maxsize=8192)
def _line(c: _Card, asked: int, *, terse: bool) -> str:
    """The turn's Card line (projection rule set v1, or v1-terse-cards without references)
    over the normalised card, so it stays on one line and bounded."""
    card = {"asked": _shorten(c.asked, asked) or "(nothing recorded)",
            "did": [{"tool": _shorten(t, _NAME), "evidence_id": ev} for t, _, ev in c.calls],
            "answered": {"narration": c.narration, "presentations": [
                {"semantic_type": _shorten(sem, _NAME), "title": _shorten(title, _NAME),
                 "id": pid} for sem, title, _, pid in c.shown]}}
    render = _TERSE.card_line if terse else card_line
    return render(c.n, card, asked="", tools=(), narration="")


def _run(cards: Sequence[_Card], *, asked: bool = True) -> str:
    """Consecutive turns merged into one line: first and last ask, tools, outcomes."""
    if len(cards) == 1 and asked:
        return _line(cards[0], _TERSE_ASKED, terse=True)
    first, last = cards[0], cards[-1]
    tools = _grouped([(_shorten(t, _NAME), "", "") for c in cards for t, _, _ in c.calls],
                     refs=False)
    outcomes: dict[str, int] = {}
    for c in cards:
        key = _shorten(c.outcome, _NAME) or "unrecorded"
        outcomes[key] = outcomes.get(key, 0) + 1
    did = ", ".join(tools[:6]) + (f", +{len(tools) - 6} more" if len(tools) > 6 else "")
    asks = (f" asked: \"{_shorten(first.asked, _RUN_ASKED)}\" … "
            f"\"{_shorten(last.asked, _RUN_ASKED)}\"" if asked else "")
    label = f"#{first.n}" + (f"-#{last.n}" if len(cards) > 1 else "")
    return (f"{label} ({_count(len(cards))}){asks} → did: "
            f"{did or 'nothing'} → outcomes: "
            + ", ".join(f"{k}×{v}" if v > 1 else k for k, v in outcomes.items()))


def _smallest(lo: int, hi: int, render: Callable[[int], str],
              fits: Callable[[str], bool]) -> str | None:
    """The rendering of the smallest ``k`` in ``lo..hi`` that fits (binary search: more
    collapsed turns never make the text longer in practice, and every answer is checked)."""
    best = None
    while lo <= hi:
        mid = (lo + hi) // 2
        text = render(mid)
        if fits(text):
            best, hi = text, mid - 1
        else:
            lo = mid + 1
    return best


def _fit(head: str, cards: Sequence[_Card],
         fits: Callable[[str], bool]) -> tuple[Detail, str] | None:
    """The most detailed rendering of ``cards`` under ``head`` that fits, if any."""

    def join(parts: Sequence[str]) -> str:
        return "\n".join([head, *parts])

    if not fits(head):  # a long seed: no form of the later turns can help
        return None
    if not cards:
        return Detail.FULL, head
    for detail, style in _STYLES:
        text = join([_block(c, style) for c in cards])
        if fits(text):
            return detail, text
    blocks = [_block(c, _BRIEF) for c in cards]
    lines = [_line(c, _LINE_ASKED, terse=False) for c in cards]
    found = _smallest(1, len(cards), lambda k: join(lines[:k] + blocks[k:]), fits)
    if found is not None:
        return Detail.COLLAPSED, found
    text = join([_line(c, _TERSE_ASKED, terse=True) for c in cards])
    if fits(text):
        return Detail.LINES, text
    size = 2
    while True:
        text = join([_run(cards[i:i + size]) for i in range(0, len(cards), size)])
        if fits(text):
            return Detail.RUNS, text
        if size >= len(cards):
            break
        size *= 2
    text = join([_run(cards, asked=False)])
    return (Detail.RUNS, text) if fits(text) else None


@dataclass(frozen=True)
class CardsSummariser:
    """The offline, deterministic summariser: a structured summary built from the cards.

    Per turn what was asked, done (tools with evidence ids), answered and the outcome,
    degraded until it fits the target: fields shortened, then the oldest turns collapsed
    to one Card line each, then terse lines, then runs of turns merged, then the header
    alone (flagged ``over_target`` when even that is too long). A usable seed is kept
    verbatim and only the turns after it are added; when no form of that fits, the whole
    range is summarised from its cards instead. Same request, same bytes.

    Parameters
    ----------
    tokenizer:
        Measures the target (default ``cl100k_base``, see :mod:`pipeline.replay.tokens`).
    """

    tokenizer: Tokenizer | None = None

    @property
    def name(self) -> str:
        """``cards``."""
        return "cards"

    @property
    def version(self) -> str:
        """The format's version: bumped whenever any rendering changes."""
        return "1"

    def summarise(self, request: SummaryRequest) -> Summary:
        """Summarise ``request`` within ``request.target_tokens`` (see the class)."""
        tok = self.tokenizer or get_tokenizer()
        target = request.target_tokens
        count = _counter(tok)

        def fits(text: str) -> bool:
            return count(text) <= target

        cards = [_normalised(request.first_turn + i, c) for i, c in enumerate(request.cards)]
        a, b = request.first_turn, request.last_turn
        covered = seed_prefix(request)
        # A stored packet is transcript text like any other: redacted before it is kept.
        body = _HEADER.sub("", redact(request.seed.summary).strip()).strip() \
            if request.seed is not None and covered is not None else ""
        if covered is not None and body:
            split = a + covered - 1
            parts = f"{turn_range(a, split)} from an earlier summary"
            if split < b:
                parts += f", {turn_range(split + 1, b)} from their turn cards"
            # The seed's own lines as written, minus trailing blanks and closing tags.
            lines = "\n".join(ln.rstrip() for ln in body.split("\n"))
            head = f"{_turns(a, b)}: {parts}.\n{_clean_tag(lines)}"
            got = _fit(head, cards[covered:], fits)
            if got is not None:
                return self._summary(got, tok, seeded=True)
        got = _fit(f"{_turns(a, b)}, summarised from their turn cards.", cards, fits)
        if got is not None:
            return self._summary(got, tok)
        text = f"{_turns(a, b)} compacted."
        tokens = tok.count(text)
        return Summary(text, tokens, self.name, self.version, Detail.MINIMAL,
                       over_target=tokens > target)

    def _summary(self, got: tuple[Detail, str], tok: Tokenizer, *,
                 seeded: bool = False) -> Summary:
        # Every field was redacted on the way in; once more over the whole, so that no
        # join of two fields can make a secret either.
        detail, text = got[0], redact(got[1])
        return Summary(text, tok.count(text), self.name, self.version, detail, seeded=seeded)
