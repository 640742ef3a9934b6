"""How deep a JSON text nests, told the same on every Python. Pure.

A few checks parse a line again with Python's ``json`` (a pairs hook sees repeated
keys, which orjson drops). How deep ``json`` goes depends on the interpreter: Python
3.11 raises ``RecursionError`` near ``sys.getrecursionlimit()`` (1,000), 3.12 and later
parse far deeper. So once ``json`` has parsed a text, those checks ask
:func:`nested_deeper_than` :data:`MAX_NESTING`, the depth past which the C kernel's
grammar defers too, and a text nested deeper is read as those checks read an
unparsable one: no quirk, no repeated role, no JSON digest (docs/audit.md, "Lines and
the chain").
"""

from __future__ import annotations

import re

#: The deepest nesting those checks parse (the C kernel's ``MAX_DEPTH``).
MAX_NESTING = 512

#: A JSON string, escapes included: brackets inside one do not nest.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
#: Every byte but the four brackets (``bytes.translate`` deletes them).
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_OPENING = frozenset(b"[{")


def nested_deeper_than(text: bytes | str, limit: int = MAX_NESTING) -> bool:
    """Whether arrays and objects in ``text`` nest more than ``limit`` deep (brackets
    inside strings aside). Cheap for the usual line: one that holds no more than
    ``limit`` opening brackets is not looked at further.

    ``text`` is one ``json`` parsed: in a text whose strings are not all closed, the
    string pattern would be tried again from every quote (quadratic time)."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    depth = 0
    for byte in _STRING.sub(b"", data).translate(None, _NOT_BRACKETS):
        depth += 1 if byte in _OPENING else -1
        if depth > limit:
            return True
    return False
