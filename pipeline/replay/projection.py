"""Projection rule sets: how a closed turn, a card, a packet and a request are rendered
and counted. Pure.

A :class:`RuleSet` is versioned; the regression check runs two over the same archive.
Rule set ``v1`` follows vak's rendering (``vak-wire-format.md`` section 6); every
detail vak's sources leave open is decided in ``docs/projection-rules.md``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol

import orjson

from pipeline import plugins
from pipeline.errors import PluginError
from pipeline.ledger.nesting import nested_deeper_than
from pipeline.ledger.types import as_dict, dicts

#: Tools whose result is a presentation card: in Full their result becomes a short ack.
CARD_TOOL_PREFIX = "emit_"
_LINK_KEYS = ("title", "url")


def canonical_json(value: Any) -> str:
    """Compact JSON with sorted keys: the one serialisation rule sets count and hash."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _evidence_footer(evidence_id: str, chars: int) -> str:
    return f"[evidence:{evidence_id} — {chars} chars; call recall to expand]"


def _json_digest(value: Any) -> str | None:
    if isinstance(value, list):
        if value and all(isinstance(v, dict) and all(k in v for k in _LINK_KEYS) for v in value):
            lines = [f"{len(value)} results:"]
            lines += [f"- {v['title']} ({v['url']})" for v in value]
            return "\n".join(lines)
        first = canonical_json(value[0])[:200] if value else "none"
        return f"array, {len(value)} items; first: {first}"
    if isinstance(value, dict):
        lines = ["object, keys: " + ", ".join(str(k) for k in value)]
        lines += [f"{k}: array[{len(v)}]" for k, v in value.items() if isinstance(v, list)]
        return "\n".join(lines)
    return None


def _bash_digest(content: str) -> str:
    lines = content.split("\n")
    head = next((ln for ln in lines if ln.startswith("exit code")), "exit code: unknown")
    body = [ln for ln in lines if ln is not head]
    if len(body) > 20:
        body = [*body[:10], f"… {len(body) - 20} lines omitted …", *body[-10:]]
    return "\n".join([head, *body])


def _text_digest(content: str) -> str:
    # Results run to megabytes: their first headings and first sentence are found
    # without splitting the whole text into lines and words.
    headings = list(islice(_headings(content), 5))
    flat = _flat_prefix(content, 302)  # a ". " that ends before 300 lies within
    end = flat.find(". ")
    sentence = flat[: end + 1] if 0 <= end < 300 else flat[:300]
    lines = content.count("\n") + 1
    return "\n".join([*headings, sentence, f"({lines} lines, {len(content.encode())} bytes)"])


#: A heading line (blanks, then ``#``: ``[^\S\n]`` is whitespace as ``str.isspace``
#: has it, but the newline), at the start of the text and after a newline. The second
#: opens with a literal newline, which the regex engine searches for at C speed: 5-8x
#: faster than a Python step per ``#`` on the fleet's tool results, where code
#: comments put a ``#`` on one line in two.
_FIRST_HEADING = re.compile(r"[^\S\n]*#[^\n]*")
_NEXT_HEADING = re.compile(r"\n([^\S\n]*#[^\n]*)")


def _headings(content: str) -> Iterator[str]:
    """The lines whose first non-blank character is ``#``, in order."""
    first = _FIRST_HEADING.match(content)
    if first is not None:
        yield first.group()
    for found in _NEXT_HEADING.finditer(content):
        yield found.group(1)


def _flat_prefix(content: str, need: int) -> str:
    """The first ``need`` characters of ``" ".join(content.split())``, reading no
    more of ``content`` than that takes."""
    cut = 4 * need
    while cut < len(content):
        words = content[:cut].split()
        flat = " ".join(words[:-1])  # the last word may go on past the cut
        if len(flat) >= need:
            return flat[:need]
        cut *= 2
    return " ".join(content.split())[:need]


def digest_result(content: str, *, tool: str, is_error: bool, evidence_id: str) -> str:
    """Schema-driven digest of a tool result (never a character-count trim).

    Errors are kept verbatim; JSON by shape; ``bash`` by exit code and output; other
    text by headings, first sentence and size. Ends with the evidence footer.
    """
    if is_error:
        return content
    body: str | None = None
    stripped = content.lstrip()
    if stripped[:1] in ("[", "{"):
        try:
            value = json.loads(content)
            # Past the depth at which 3.11's json fails, on every Python.
            body = None if nested_deeper_than(content) else _json_digest(value)
        except (ValueError, RecursionError):
            body = None
    if body is None:
        body = _bash_digest(content) if tool == "bash" else _text_digest(content)
    return f"{body}\n{_evidence_footer(evidence_id, len(content))}"


def card_line(n: int, card: dict[str, Any] | None, *, asked: str, tools: Sequence[str],
              narration: str) -> str:
    """vak's one-line Card rendering of turn ``n``.

    ``#<n> asked: <asked> → did: web×2, x → <semantic_type> "<title>" [pres:<id>; ev:a,b]``,
    or ``"<first 12 words…>"`` of the narration when no card was shown.
    """
    # Every card field through the typed accessors: a field of another type is absent.
    card = as_dict(card)
    asked = str(card.get("asked") or asked)
    did_raw = card.get("did")
    did = dicts(did_raw)
    names = [str(d.get("tool", "?")) for d in did] if type(did_raw) is list else list(tools)
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    did_text = ", ".join(f"{k}×{v}" if v > 1 else k for k, v in counts.items()) or "nothing"
    answered = as_dict(card.get("answered"))
    presentations = dicts(answered.get("presentations"))
    evidence = [str(d.get("evidence_id")) for d in did if d.get("evidence_id")]
    if presentations:
        p = presentations[-1]
        shown = f"{p.get('semantic_type', '?')} \"{p.get('title', '')}\""
        refs = f"pres:{p.get('id', '?')}"
    else:
        words = str(answered.get("narration") or narration).split()
        shown = '"' + " ".join(words[:12]) + ("…" if len(words) > 12 else "") + '"'
        refs = ""
    if evidence:
        refs = f"{refs}; ev:{','.join(evidence)}" if refs else f"ev:{','.join(evidence)}"
    tail = f" [{refs}]" if refs else ""
    return f"#{n} asked: {asked} → did: {did_text} → {shown}{tail}"


class RuleSet(Protocol):
    """A versioned projection rule set: rendering plus token accounting."""

    @property
    def name(self) -> str:
        """The rule set's versioned name."""
        ...

    @property
    def message_overhead(self) -> int:
        """Tokens every message costs beyond its content."""
        ...

    @property
    def request_overhead(self) -> int:
        """Tokens every request costs beyond its messages."""
        ...

    @property
    def tool_overhead(self) -> int:
        """Tokens every tool schema costs beyond its JSON."""
        ...

    @property
    def tool_use_overhead(self) -> int:
        """Tokens every ``tool_use`` block costs beyond its name and input."""
        ...

    @property
    def image_tokens(self) -> int:
        """Tokens an image block is counted as."""
        ...

    def card_line(self, n: int, card: dict[str, Any] | None, *, asked: str,
                  tools: Sequence[str], narration: str) -> str:
        """One turn's Card line."""
        ...

    def digest_result(self, content: str, *, tool: str, is_error: bool,
                      evidence_id: str) -> str:
        """A tool result's digest for Full rendering."""
        ...

    def turns_open(self) -> str:
        """Text that opens the message of Card lines."""
        ...

    def turns_close(self) -> str:
        """Text that closes the message of Card lines."""
        ...

    def summary(self, text: str) -> str:
        """A packet's or reset's summary as the model reads it."""
        ...


@dataclass(frozen=True)
class RuleSetV1:
    """vak's rendering (JSON Lines era, T13-T17), with vakpipe's documented accounting."""

    name: str = "v1"
    message_overhead: int = 4
    request_overhead: int = 3
    tool_overhead: int = 8
    tool_use_overhead: int = 6
    image_tokens: int = 1600

    def card_line(self, n: int, card: dict[str, Any] | None, *, asked: str,
                  tools: Sequence[str], narration: str) -> str:
        """See :func:`card_line`."""
        return card_line(n, card, asked=asked, tools=tools, narration=narration)

    def digest_result(self, content: str, *, tool: str, is_error: bool,
                      evidence_id: str) -> str:
        """See :func:`digest_result`."""
        return digest_result(content, tool=tool, is_error=is_error, evidence_id=evidence_id)

    def turns_open(self) -> str:
        """``<turns>``."""
        return "<turns>"

    def turns_close(self) -> str:
        """``</turns>``."""
        return "</turns>"

    def summary(self, text: str) -> str:
        """``<context_summary>\\n…\\n</context_summary>``."""
        return f"<context_summary>\n{text}\n</context_summary>"


@dataclass(frozen=True)
class RuleSetV1TerseCards(RuleSetV1):
    """``v1`` with a shorter Card line: no evidence or presentation references."""

    name: str = "v1-terse-cards"

    def card_line(self, n: int, card: dict[str, Any] | None, *, asked: str,
                  tools: Sequence[str], narration: str) -> str:
        """The v1 line cut before its ``[pres:…; ev:…]`` references."""
        line = card_line(n, card, asked=asked, tools=tools, narration=narration)
        cut = line.rfind(" [")
        return line[:cut] if cut > 0 and line.endswith("]") else line


RULE_SETS: dict[str, RuleSet] = {"v1": RuleSetV1(), "v1-terse-cards": RuleSetV1TerseCards()}

#: What a rule set must have (:class:`RuleSet`); a plug-in missing one is refused by name.
_RULE_SET_MEMBERS = ("name", "message_overhead", "request_overhead", "tool_overhead",
                     "tool_use_overhead", "image_tokens", "card_line", "digest_result",
                     "turns_open", "turns_close", "summary")


def _plugin_rule_set(name: str) -> RuleSet:
    """The rule set of the installed plug-in ``name`` (``vakpipe.rule_sets``): its entry
    point names a rule set, or a class or function that makes one with no argument."""
    obj = plugins.load("rule_sets", name)
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "card_line")):
        try:
            obj = obj()
        except Exception as err:  # a plug-in's constructor may raise anything: one line
            raise PluginError(f"plug-in vakpipe.rule_sets:{name} could not be made: "
                              f"{type(err).__name__}: {err}") from err
    missing = [m for m in _RULE_SET_MEMBERS if not hasattr(obj, m)]
    if missing:
        raise PluginError(f"plug-in vakpipe.rule_sets:{name} is not a rule set: it has no "
                          + ", ".join(missing))
    if obj.name != name:
        # The name is written into every requests row and the nightly's fingerprint:
        # the one asked for and the one recorded must be the same.
        raise PluginError(f"plug-in vakpipe.rule_sets:{name} calls itself {obj.name!r}: "
                          "its name must be the entry point's")
    rules: RuleSet = obj
    return rules


def rule_set_names() -> list[str]:
    """The built-in rule sets, then the installed plug-ins' (``vakpipe.rule_sets``)."""
    return [*RULE_SETS, *(p.name for p in plugins.installed("rule_sets")
                          if p.name not in RULE_SETS)]


def get_rule_set(name: str) -> RuleSet:
    """The rule set called ``name``: a built-in one (``v1``, ``v1-terse-cards``), else an
    installed plug-in's (entry point group ``vakpipe.rule_sets``).

    Raises
    ------
    ValueError
        No rule set has that name (:class:`~pipeline.errors.PluginError`, a ValueError,
        when the plug-in of that name does not load or is not a rule set).
    """
    if name in RULE_SETS:
        return RULE_SETS[name]
    if plugins.find("rule_sets", name) is not None:
        return _plugin_rule_set(name)
    raise ValueError(f"unknown projection rule set {name!r}; known: {', '.join(rule_set_names())}")
