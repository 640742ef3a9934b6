"""Text taken from transcripts, made safe for where people open it. Pure.

A transcript's text is data: a model name, a message, a tool's output may hold terminal
escapes (``ESC ]0;title BEL``, a screen clear), bidirectional overrides, line breaks, a
spreadsheet formula (``=HYPERLINK(...)``) or markup. Each place vakpipe shows such text
neutralises what that place would act on:

- a terminal (``show``, ``cost``): :func:`terminal_safe` writes every control character
  as its visible ``\\x``/``\\u`` escape (and a line break too, inside one field);
- a spreadsheet (``costs.csv``): :func:`spreadsheet_safe` prefixes ``'`` to a cell that
  a spreadsheet would read as a formula, as OWASP recommends for CSV injection;
- a web page (``report.html``): :func:`html_text` escapes the characters markup starts
  with (plotly renders a subset of HTML in trace names and hover text).

Secrets are another matter (:mod:`pipeline.ledger.redact`): redact first, then make safe.
"""

from __future__ import annotations

import html
import re

#: What a terminal acts on besides printing: C0 controls (ESC, BEL, CR, backspace...),
#: DEL, C1 controls (including the one-byte CSI ``\x9b``), the line and paragraph
#: separators, bidirectional marks, embeddings, overrides and isolates (which reorder what
#: is shown), zero-width joiners and the byte-order mark. Tab and line feed are handled
#: apart (:func:`terminal_safe`).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e"
                      "\u2060-\u2069\ufeff]")
_CONTROL_OR_BREAK = re.compile(_CONTROL.pattern[:-1] + "\t\n]")


def _escape(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def terminal_safe(text: str, *, multiline: bool = False) -> str:
    """``text`` safe to print to a terminal: every control character as its escape.

    Parameters
    ----------
    text:
        Text from a transcript (a message, a model name, an id).
    multiline:
        The text is a block whose lines are meant (a message's text): line feeds are kept
        and tabs expanded to spaces. Otherwise (one field of a line) both are escaped too,
        so that a field cannot start a line of its own.

    Returns
    -------
    str
        The text itself when there is nothing to escape; else a copy with ESC as
        ``\\x1b``, CR as ``\\r``, U+202E as ``\\u202e``...
    """
    if multiline:
        if "\t" in text:
            text = text.expandtabs(4)
        return _CONTROL.sub(_escape, text)
    return _CONTROL_OR_BREAK.sub(_escape, text)


#: First characters a spreadsheet reads as the start of a formula (OWASP, "CSV
#: injection"): ``=``, ``+``, ``-``, ``@``, tab and carriage return.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(cell: str) -> str:
    """A CSV string cell a spreadsheet will show as text, never evaluate: one that starts
    like a formula gets a leading ``'``. Only for string cells: a number is written as a
    number (its ``-`` is a sign)."""
    return "'" + cell if cell.startswith(FORMULA_PREFIXES) else cell


def html_text(text: str) -> str:
    """``text`` for an HTML page or a plotly label: ``&``, ``<`` and ``>`` escaped (plotly
    turns ``&lt;`` back into ``<`` on screen, as text)."""
    return html.escape(text, quote=False)
