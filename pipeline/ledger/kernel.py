"""The per-line kernel of the audit: validate a line, read its envelope, leave the
payload unparsed. Pure.

A line becomes Python objects only as far as the audit reads it (docs/audit.md, "The
per-line kernel"): the kernel validates the whole line (UTF-8, escapes, numbers,
nesting, trailing bytes) without building Python objects, the envelope and the few
fields the audit reads are taken from it, and the payload stays as the stored bytes,
parsed by orjson when a later stage asks for it.

The kernel only ever *accepts*: it answers ``None`` whenever it cannot vouch that the
orjson reader would accept the line with the same envelope (the kernel refused it, a
number or a byte order mark orjson may read otherwise, a key it reads is repeated, a
field has an unusual type), and the caller then reads the line exactly as before, with
orjson, which also says why a line is bad. So the kernel can make a line's verdict neither stricter
nor looser; it only makes the common, valid line cheaper.

Two implementations of one contract: the C extension ``pipeline.ledger._ckernel``
(``_ckernel.c``: one call per line validates the whole line as orjson reads it and builds
the tuple; built by ``pip install`` where a compiler is found) and, where it did not
build, pysimdjson (:func:`scan_simdjson`). ``VAKPIPE_KERNEL`` forces one for tests and
benchmarks: ``c``, ``simdjson``, or ``orjson`` (no kernel: every line read by orjson);
unset (or any other value), the C kernel where it imports, else simdjson.

Memory: simdjson's tape is reused from line to line (simdjson refuses to reuse it
while an object of the previous document is alive), so nothing this module returns
holds a simdjson object; the C kernel allocates nothing that outlives the call.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import simdjson

__all__ = ["IMPLEMENTATION", "MIN_BYTES", "MIN_MESSAGE_BYTES", "THRESHOLDS",
           "activity_run_c", "any_in_c", "chained_c", "columns_c", "configure_c",
           "configure_info_c", "configure_kind_data_c", "configure_tree_c", "direct_sha256_c",
           "entry_c", "figures_c", "guarded_c", "kind_data_c", "lazy_c", "node_info_c",
           "parse_object", "pushback_c", "run_c", "scan", "scan_c", "scan_simdjson",
           "scan_transcript_c", "sha256_hex_c", "transcript_info_c", "tree_add_c",
           "usage_rows_c", "use", "valid_c", "work_quirk_c", "worth_it", "worth_it_c",
           "worth_it_simdjson"]

#: Lines shorter than this are parsed by orjson whole, per implementation. simdjson's
#: fixed cost per line (its proxies, the key list that catches repeated keys) is ~1.8 us,
#: orjson's ~0.3 us, and simdjson validates ~1.5 GB/s against orjson's ~0.45 GB/s
#: building objects, so the two cross near 1 KB (a message line, whose view costs
#: ~1.7 us more: 4 KB). The C kernel's whole call is ~0.7 us of validation at ~2.5 GB/s
#: plus ~0.6 us for the tuple and view on the fleet's lines: it is faster than orjson at
#: every size and kind measured (docs/audit.md), so it reads them all. ``orjson``: none.
THRESHOLDS: dict[str, tuple[int, int]] = {
    "c": (0, 0), "simdjson": (768, 4096), "orjson": (sys.maxsize, sys.maxsize)}
#: Lines shorter than this are read by orjson (the current implementation's threshold).
MIN_BYTES = 768
#: The same for a message line.
MIN_MESSAGE_BYTES = 4096
#: Where vak writes the kind: after the envelope (``{"id":…,"parent_id":…,"ts":…,
#: "prev_hash":…,"at_turn":…,"kind":"…``), within its first few hundred bytes.
_KIND_AT = b'"kind":"'
_KIND_WITHIN = 512

_BOM = b"\xef\xbb\xbf"
_Object = simdjson.Object
_Array = simdjson.Array
_parser = simdjson.Parser()
#: A parser keeps the buffers of the longest line it has read for the next ones: lines
#: longer than this get a parser of their own, freed with the line, so that one huge
#: line does not leave a worker holding several times its size.
_REUSE_BYTES = 1 << 20
#: Envelope keys read as "absent" when missing, present when null (spec section 2).
_ABSENT: Any = object()


def _message_view(obj: Any, present: set[str]) -> dict[str, Any] | None:
    """What the audit reads of a message line, as plain objects, or ``None`` when the
    line is not the common shape (the caller then reads the whole payload).

    ``{"message": {"role": …, "content": blocks}, "meta": …}``: a user message's blocks
    cut to their ``type`` (a block that is not an object: ``None``; a ``type`` that is
    not a string: left out), an assistant's to an empty list (only its type is read);
    ``meta`` whole (small: model, usage, flags), absent when absent.
    """
    if "message" not in present:
        return None
    message = obj.get("message")
    if type(message) is not _Object:
        return None
    keys = list(message.keys())
    if len(keys) != len(set(keys)) or "role" not in keys or "content" not in keys:
        return None
    role = message.get("role")
    content = message.get("content")
    if type(role) is not str or type(content) is not _Array:
        return None
    blocks: list[dict[str, Any] | None] = []
    if role == "user":
        for block in content:
            if type(block) is not _Object:
                blocks.append(None)
                continue
            keys = list(block.keys())
            if len(keys) != len(set(keys)):
                return None
            kind = block.get("type") if "type" in keys else None
            blocks.append({"type": kind} if type(kind) is str else {})
    view: dict[str, Any] = {"message": {"role": role, "content": blocks}}
    if "meta" in present:
        meta = obj.get("meta")
        if type(meta) is _Object:
            view["meta"] = meta.as_dict()
        elif meta is None:
            view["meta"] = None
        else:
            return None
    return view


def worth_it_simdjson(body: bytes) -> bool:
    """Whether the simdjson kernel is likely to read ``body`` faster than orjson (a
    guess from its length and the kind it seems to hold; either reader gives the same
    result).

    Receipts and headers are left to the entry's other readers: the audit reads more of
    them than a scan keeps (the C kernel's entry reads a receipt into the audit's info
    itself, docs/audit.md).
    """
    size = len(body)
    if size < MIN_BYTES:
        return False
    at = body.find(_KIND_AT, 0, _KIND_WITHIN)
    if at < 0:
        return True
    at += len(_KIND_AT)
    if body.startswith(b'message"', at):
        return size >= MIN_MESSAGE_BYTES
    return not body.startswith((b'receipt"', b'header"'), at)


def parse_object(body: bytes) -> Any:
    """One stored line validated by simdjson, as its top-level ``simdjson.Object``, or
    ``None`` where simdjson cannot vouch for it as orjson would read it: a byte order
    mark (simdjson skips it, orjson refuses it), a line simdjson refuses (or a number
    it cannot hold: orjson decides, and says why), a value other than an object.

    The vak kernel's simdjson path and the Claude Code scan both start here. The
    object lives on a parser reused from line to line (one of its own for a line over
    :data:`_REUSE_BYTES`): read it, then drop it before the next call.
    """
    if body[:3] == _BOM:
        return None
    try:
        obj = (_parser if len(body) <= _REUSE_BYTES else simdjson.Parser()).parse(body)
    except (ValueError, RuntimeError):
        return None
    return obj if type(obj) is _Object else None


def scan_simdjson(body: bytes) -> tuple[Any, ...] | None:
    """Validate one stored line and read its envelope, or ``None`` when the kernel does
    not vouch for it (the caller reads it with orjson).

    Parameters
    ----------
    body:
        The line's stored bytes without the newline.

    Returns
    -------
    tuple | None
        ``(id, parent_id, kind, ts, prev_hash, at_turn, view)``: the envelope of a
        valid vak entry, checked for types and presence only (the caller checks the
        timestamp); ``view`` what the audit reads of a message (see
        :func:`_message_view`; else ``None``). Plain Python objects all.
    """
    obj = parse_object(body)
    if obj is None:
        return None
    # A repeated key: orjson keeps its last value, simdjson's look-up finds the first.
    keys = list(obj.keys())
    present = set(keys)
    if len(keys) != len(present):
        return None
    # simdjson's look-up of a missing key costs a raised and caught KeyError (several
    # times a present one's): optional keys are looked up only when present.
    get = obj.get
    ident = get("id") if "id" in present else None
    parent = get("parent_id") if "parent_id" in present else _ABSENT
    kind = get("kind") if "kind" in present else None
    prev = get("prev_hash") if "prev_hash" in present else None
    at_turn = get("at_turn") if "at_turn" in present else None
    ts = get("ts") if "ts" in present else None
    # Optional fields are omitted when absent, never null: a null one is refused by the
    # orjson reader's checks, which then say why.
    if not (
        type(ident) is str and ident
        and (parent is None or type(parent) is str)
        and type(kind) is str and kind
        and (type(prev) is str or (prev is None and "prev_hash" not in present))
        and (type(at_turn) is str or (at_turn is None and "at_turn" not in present))
        and type(ts) is str
    ):
        return None
    view = _message_view(obj, present) if kind == "message" else None
    return ident, parent, kind, ts, prev, at_turn, view


Scan = Callable[[bytes], tuple[Any, ...] | None]

#: The C kernel's scan and worth_it, and its scan of Claude Code transcript lines
#: (``scan_transcript_c(result_type, body)``: pipeline/formats/claude_code.py's scan), or
#: ``None`` where the extension did not build.
scan_c: Scan | None
worth_it_c: Callable[[bytes], bool] | None
scan_transcript_c: Callable[[type[Any], bytes], Any] | None
#: The C kernel's whole entry (``entry_c(body, line)``: reader.parse_entry's steps for a
#: line the C kernel reads, in one call; the reader configures it with its types), or
#: ``None``.
entry_c: Callable[[bytes, int], Any] | None
#: reader.read_ledger's common line in one call (``chained_c(raw, line, prev)``: the
#: entry of a physical line with its newline, when chained to the digest ``prev``), or
#: ``None``.
chained_c: Callable[[bytes, int, str], Any] | None
#: tree.TreeIndex.add's common case in one call (``tree_add_c(by_id, nodes, slow, entry,
#: info)``, ``slow`` the Python add for every other entry; configured with the Node
#: type and the known kinds by ``configure_tree_c``), or ``None``.
tree_add_c: Callable[..., Any] | None
configure_tree_c: Callable[[type[Any], frozenset[str]], None] | None
#: The audit's node info of a common vak entry in one call (``node_info_c(entry, bad)``:
#: pipeline/audit/session.py's ``_node_info``, which it calls for every other entry;
#: ``configure_info_c`` gives it the request and receipt types, the directive marker,
#: the zero usage and that function), or ``None``.
node_info_c: Callable[[Any, list[Any]], Any] | None
#: The same for an entry a transcript's adapter made (``transcript_info_c(entry, bad)``:
#: ``_transcript_info_py``'s, with a request's key, one-hour writes and mirror), or ``None``.
transcript_info_c: Callable[[Any, list[Any]], Any] | None
configure_info_c: Callable[[type[Any], type[Any], object, tuple[int, int, int, int],
                            Callable[[Any, list[Any]], Any],
                            Callable[[Any, list[Any]], Any]], None] | None
#: A session's figures and its active chain's lines and ids in one call
#: (``figures_c(nodes, by_id)``: pipeline/audit/session.py's ``_figures`` and the chain,
#: configured by ``configure_tree_c`` and ``configure_info_c``; ``None`` where that
#: function must decide), or ``None``.
figures_c: Callable[[list[Any], dict[str, Any]], tuple[Any, ...] | None] | None
#: A session's usage rows in one call (``usage_rows_c(nodes, by_id, provider, model,
#: subagent)``: pipeline/audit/session.py's ``_usage_rows``; ``None`` where that function
#: must decide), or ``None``.
usage_rows_c: Callable[..., list[tuple[Any, ...]] | None] | None
#: The audit's common lines in one loop (``run_c(by_id, nodes, slow_add, info, findings,
#: last, lines, number, prev)``: tree.TreeIndex.runner's), over the lines of
#: ``pushback_c(lines)``, which it gives back the first line it does not take; or
#: ``None``.
run_c: Callable[..., tuple[int, int, str]] | None
pushback_c: Callable[[Iterable[bytes]], Iterator[bytes]] | None
#: A Claude Code transcript's activity lines in one loop (``activity_run_c(seen, batch,
#: lines, number)``: pipeline/formats/claude_code.py's ``activity_run``), over the lines
#: of ``pushback_c(lines)`` as ``run_c``; or ``None``.
activity_run_c: Callable[[set[str], list[Any], Iterator[bytes], int], tuple[int, int]] | None
#: A Claude Code line's entry kind and data (``kind_data_c(obj)``: claude_code.py's
#: ``_kind_data_py``, its message lines built in C; ``configure_kind_data_c`` gives it that
#: function for the others and the synthetic model's name), or ``None``.
kind_data_c: Callable[[dict[str, Any]], tuple[str, dict[str, Any]]] | None
configure_kind_data_c: Callable[[Callable[[dict[str, Any]], tuple[str, dict[str, Any]]], str],
                                None] | None
#: Whether the C kernel's grammar takes a line as one JSON value (``valid_c(body)``: it
#: takes only what orjson takes, and defers some of that), or ``None``.
valid_c: Callable[[bytes], bool] | None
#: Whether the entries' digests call OpenSSL's SHA-256 directly, found in the
#: libcrypto that hashlib loaded (``direct_sha256_c(on)``: ``False`` turns that off and
#: hashlib's ``sha256`` is called, ``True`` back on where found), and the hex digest of
#: bytes as the entries' are made (``sha256_hex_c(body)``); or ``None``.
direct_sha256_c: Callable[..., bool] | None
sha256_hex_c: Callable[[bytes], str] | None
#: pipeline/io/storage.py's guarded_lines loop in C (``guarded_c(readline, limit, tap,
#: oversize)``: the lines readline(limit + 1) gives, tapped, an over-long one as
#: ``oversize(line)`` makes it), or ``None``.
guarded_c: Callable[[Callable[[int], bytes], int, Callable[[bytes], object] | None,
                     Callable[[bytes], bytes]], Iterator[bytes]] | None
#: reader.lazy_entry's entry built in C (the same arguments), or ``None``.
lazy_c: Callable[..., Any] | None
configure_c: Callable[[type[Any], type[Any], Callable[[bytes], Any], type[Any]], None] | None
#: Rows of values as the buffers of Arrow arrays (``columns_c(rows, kinds, names)``:
#: pipeline/tables/schemas.py's ``built_columns``; ``None`` where pyarrow must convert
#: the rows), or ``None``.
columns_c: Callable[..., list[tuple[int, bytes | None, bytes, bytes | None]] | None] | None
#: Whether a line orjson took is vak's work entry with two ``kind`` keys
#: (``work_quirk_c(body)``: pipeline/ledger/reader.py's ``_work_quirk``; ``None`` where
#: that function must tell), or ``None``.
work_quirk_c: Callable[[bytes], bool | None] | None
#: Whether a text holds a code point of the given ranges (``any_in_c(text, ranges)``,
#: ``ranges`` native uint32 pairs ``first, last``, sorted; pipeline/replay/tokens.py's
#: guard), or ``None``.
any_in_c: Callable[[str, bytes], bool] | None
try:
    from pipeline.ledger._ckernel import activity_run as activity_run_c
    from pipeline.ledger._ckernel import any_in as any_in_c
    from pipeline.ledger._ckernel import chained as chained_c
    from pipeline.ledger._ckernel import columns as columns_c
    from pipeline.ledger._ckernel import configure as configure_c
    from pipeline.ledger._ckernel import configure_info as configure_info_c
    from pipeline.ledger._ckernel import configure_kind_data as configure_kind_data_c
    from pipeline.ledger._ckernel import configure_tree as configure_tree_c
    from pipeline.ledger._ckernel import direct_sha256 as direct_sha256_c
    from pipeline.ledger._ckernel import entry as entry_c
    from pipeline.ledger._ckernel import figures as figures_c
    from pipeline.ledger._ckernel import guarded as guarded_c
    from pipeline.ledger._ckernel import kind_data as kind_data_c
    from pipeline.ledger._ckernel import lazy as lazy_c
    from pipeline.ledger._ckernel import node_info as node_info_c
    from pipeline.ledger._ckernel import pushback as pushback_c
    from pipeline.ledger._ckernel import run as run_c
    from pipeline.ledger._ckernel import scan as scan_c
    from pipeline.ledger._ckernel import scan_transcript as scan_transcript_c
    from pipeline.ledger._ckernel import sha256_hex as sha256_hex_c
    from pipeline.ledger._ckernel import transcript_info as transcript_info_c
    from pipeline.ledger._ckernel import tree_add as tree_add_c
    from pipeline.ledger._ckernel import usage_rows as usage_rows_c
    from pipeline.ledger._ckernel import valid as valid_c
    from pipeline.ledger._ckernel import work_quirk as work_quirk_c
    from pipeline.ledger._ckernel import worth_it as worth_it_c
except ImportError:  # not built here (no compiler at install): simdjson stands in
    scan_c = worth_it_c = scan_transcript_c = entry_c = lazy_c = configure_c = None
    any_in_c = chained_c = valid_c = tree_add_c = configure_tree_c = None
    node_info_c = configure_info_c = run_c = pushback_c = direct_sha256_c = sha256_hex_c = None
    figures_c = usage_rows_c = activity_run_c = kind_data_c = configure_kind_data_c = None
    transcript_info_c = guarded_c = columns_c = work_quirk_c = None


def _scan_none(body: bytes) -> None:
    """No kernel (``VAKPIPE_KERNEL=orjson``): every line is read by orjson."""
    return None


def _never(body: bytes) -> bool:
    return False


def _kernels() -> dict[str, tuple[Scan, Callable[[bytes], bool]]]:
    found: dict[str, tuple[Scan, Callable[[bytes], bool]]] = {
        "simdjson": (scan_simdjson, worth_it_simdjson), "orjson": (_scan_none, _never)}
    if scan_c is not None and worth_it_c is not None:
        found["c"] = (scan_c, worth_it_c)
    return found


def use(name: str) -> tuple[Scan, Callable[[bytes], bool]]:
    """Make ``name`` (``"c"``, ``"simdjson"`` or ``"orjson"``) the kernel: set
    :data:`IMPLEMENTATION`, :data:`scan`, :data:`worth_it` and the thresholds; return
    ``(scan, worth_it)`` (a module that imported them by name rebinds them itself).

    Raises
    ------
    KeyError
        ``name`` is not an implementation that imports here (``"c"`` where the
        extension did not build).
    """
    global IMPLEMENTATION, scan, worth_it, MIN_BYTES, MIN_MESSAGE_BYTES
    chosen = _kernels()[name]
    IMPLEMENTATION, (scan, worth_it) = name, chosen
    MIN_BYTES, MIN_MESSAGE_BYTES = THRESHOLDS[name]
    return chosen


def _default() -> str:
    wanted = os.environ.get("VAKPIPE_KERNEL", "")
    if wanted in ("simdjson", "orjson"):
        return wanted
    return "c" if scan_c is not None else "simdjson"


#: Which kernel reads the lines: ``"c"``, ``"simdjson"`` or ``"orjson"`` (none).
IMPLEMENTATION = "simdjson"
#: The kernel's scan: validate a line and read its envelope, or ``None`` (orjson reads it).
scan: Scan = scan_simdjson
#: Whether the kernel is likely to read a line faster than orjson (a guess: either
#: reader gives the same result); the C kernel's leaves out only receipts and headers.
worth_it: Callable[[bytes], bool] = worth_it_simdjson
use(_default())
