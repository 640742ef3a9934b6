"""Audit one session: reader + tree + per-session figures. Pure.

:func:`audit_session` turns a stream of physical lines into a :class:`SessionAudit`:
the session's integrity row (one row of ``integrity/sessions``) and its findings (rows
of ``integrity/findings``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from pipeline.formats import UNKNOWN, VAK, detect
from pipeline.ledger.entry import USAGE_KEYS, Usage, starts_turn, ts_nanos, usage_of
from pipeline.ledger.entry import ZERO_USAGE as _ZERO
from pipeline.ledger.entry import add_usage as _add
from pipeline.ledger.kernel import (
    configure_info_c,
    figures_c,
    node_info_c,
    transcript_info_c,
    usage_rows_c,
)
from pipeline.ledger.layout import SessionKey, cwd_hash
from pipeline.ledger.reader import Entry, LineStats, audit_view, header_view, read_ledger
from pipeline.ledger.redact import quote
from pipeline.ledger.tree import Node, TreeIndex
from pipeline.ledger.types import (
    TOKEN_COUNT_WANTED,
    Code,
    Finding,
    Severity,
    Status,
    bad_field_detail,
    token_count,
)

_LINE, _ID = attrgetter("line"), attrgetter("id")
#: The token kinds of the ``integrity/sessions`` usage columns (``{kind}_tokens``, ...):
#: the same names as the ``usage`` dataset's (``cache_write``: the provider's cache
#: creation), one name per thing across datasets.
USAGE_KINDS = ("input", "output", "cache_read", "cache_write")
#: The fields of a :attr:`SessionAudit.usage` row, in order: the ``usage`` dataset's
#: columns but the session's own (path, id, agent) and ``day`` (derived from ``ts``).
USAGE_FIELDS = ("entry_id", "request_id", "kind", "purpose", "ordinal", "settlement",
                "winning", "ts", "provider", "model", "on_active_chain", "input_tokens",
                "output_tokens", "cache_read_tokens", "cache_write_tokens", "billed",
                "effective", "waste", "cache_write_1h_tokens", "subagent", "speed")



@dataclass(slots=True)
class _Request:
    """Info kept on an assistant-message node."""

    usage: Usage | None  # its own ``meta.usage``
    ts: str
    model: str | None  # ``meta.model``
    #: Its first receipt whose winning attempt has usage: the same request, as billed.
    receipt: _Receipt | None = None
    #: The provider request it is part of, for formats that stream one request over
    #: several lines (``meta.request_key``; vak: none, one line is one request).
    key: str | None = None
    #: An earlier line of a request streamed over several: not a request of its own.
    part: bool = False
    #: Of its cache writes, the one-hour ones, where the format says (``meta.write_1h``).
    write_1h: int | None = None
    #: A subagent's request copied into its parent's transcript: the subagent's id. Its
    #: usage is a record of that subagent, never a request of this session.
    mirror: str | None = None
    #: The speed the provider served it at, where the format says one other than the
    #: standard (``meta.speed``: Claude Code's ``fast``, priced apart).
    speed: str | None = None


#: ``(ordinal, settlement, usage, provider, model, winning)`` of an attempt with usage.
_Metered = tuple[Any, str | None, Usage, str | None, str | None, bool]


@dataclass(slots=True)
class _Receipt:
    """Info kept on a receipt node."""

    winning: Usage | None
    billed: Usage
    attempts: int
    failed: int
    ts: str
    provider: str | None
    model: str | None
    purpose: str | None
    metered: list[_Metered]


class _Directive:
    """Marker info for a directive (a user message that starts a turn)."""

    __slots__ = ()


_DIRECTIVE = _Directive()



def _name(v: Any) -> str | None:
    # Names repeat on every request: one shared string each, not one per entry kept
    # until the usage rows are built (a 1 GB session has 10⁵ of them).
    return sys.intern(v) if type(v) is str else None


def _bad_field(entry: Entry, path: str, value: Any, wanted: str) -> Finding:
    """``bad_field`` on ``entry``: the field at ``path`` is not what vak writes there.

    The detail names the path and the type found, never the value (input is data).
    """
    return Finding(Code.BAD_FIELD, entry.line, entry.id, bad_field_detail(path, value, wanted))


def _bad_usage(entry: Entry, path: str, usage: Any) -> Finding:
    """``bad_field`` for a ``usage`` object :func:`usage_of` refused, on its first bad count."""
    if type(usage) is dict:
        for k in USAGE_KEYS:
            v = usage.get(k)
            if v is not None and token_count(v) is None:
                return _bad_field(entry, f"{path}.{k}", v, TOKEN_COUNT_WANTED)
    return _bad_field(entry, path, usage, "a usage object")


def _receipt_info(entry: Entry, bad: list[Finding]) -> _Receipt:
    data = entry.data
    attempts = data.get("attempts")
    if type(attempts) is not list:
        if attempts is not None:
            bad.append(_bad_field(entry, "attempts", attempts, "an array"))
        attempts = []
    billed, failed, winning = _ZERO, 0, None
    metered: list[_Metered] = []
    win = data.get("winning_attempt")  # cleared once its attempt is seen
    for i, att in enumerate(attempts):
        if type(att) is not dict:
            bad.append(_bad_field(entry, f"attempts[{i}]", att, "an object"))
            continue
        raw = att.get("usage")
        u = usage_of(raw)
        if u is None and raw is not None:
            bad.append(_bad_usage(entry, f"attempts[{i}].usage", raw))
        # The first attempt with the winning ordinal wins, as in winning_usage (one
        # pass here: this runs once per receipt).
        is_win = win is not None and att.get("ordinal") == win
        if is_win:
            winning, win = u, None
        if u is not None:
            billed = u if billed is _ZERO else _add(billed, u)
            metered.append((att.get("ordinal"), _name(att.get("settlement")), u,
                            _name(att.get("provider")), _name(att.get("model")), is_win))
        if att.get("settlement") != "ok":
            failed += 1
    return _Receipt(winning, billed, len(attempts), failed, entry.ts, _name(data.get("provider")),
                    _name(data.get("model")), _name(data.get("purpose")), metered)


def _node_info(entry: Entry, bad: list[Finding]) -> Any:
    """What the tree keeps of ``entry`` for the figures; a field they rest on that holds
    a value of another type than vak writes is read as absent and appended to ``bad``
    (``bad_field``)."""
    # Once per entry: plain dict access, no typed accessors; the checks of a bad field
    # run only once a value has failed its test.
    kind = entry.kind
    if kind == "message":
        # Of a message, the kernel's view: the content's blocks are never parsed.
        data = audit_view(entry)
        message = data.get("message")
        if type(message) is not dict:
            bad.append(_bad_field(entry, "message", message, "an object"))
            return None
        meta = data.get("meta")
        if type(meta) is not dict and meta is not None:
            bad.append(_bad_field(entry, "meta", meta, "an object"))
            meta = None
        if type(message.get("content")) is not list:
            bad.append(_bad_field(entry, "message.content", message.get("content"),
                                  "an array"))
        role = message.get("role")
        if role == "assistant":
            if meta is None:
                return _Request(None, entry.ts, None)
            raw = meta.get("usage")
            u = usage_of(raw)
            if u is None and raw is not None:
                bad.append(_bad_usage(entry, "meta.usage", raw))
            return _Request(u, entry.ts, _name(meta.get("model")))
        if role == "user":
            return _DIRECTIVE if starts_turn(message, meta) else None
        bad.append(_bad_field(entry, "message.role", role, '"user" or "assistant"')
                   if type(role) is not str else
                   Finding(Code.BAD_FIELD, entry.line, entry.id,
                           'message.role is a string other than "user" or "assistant": '
                           "neither a request nor a turn"))
    elif kind == "receipt":
        return _receipt_info(entry, bad)
    return None


def _transcript_info_py(entry: Entry, bad: list[Finding]) -> Any:
    """:func:`_node_info` of an entry an adapter made (:mod:`pipeline.formats`): its
    requests also carry the request they are part of, their one-hour cache writes and,
    for a subagent's request copied into its parent, the subagent. Never read from a
    vak ledger, whatever its ``meta`` holds."""
    if entry.kind == "activity":
        return None  # most of a transcript's lines: nothing kept, no call further
    info = _info(entry, bad)
    if type(info) is _Request:
        # The view, never ``entry.meta``: that would parse a lazy entry's whole line.
        meta = audit_view(entry).get("meta")
        meta = meta if type(meta) is dict else {}
        info.key = _name(meta.get("request_key"))
        info.write_1h = token_count(meta.get("write_1h"))
        info.mirror = _name(meta.get("mirror"))
        info.speed = _name(meta.get("speed"))
    return info


#: :func:`_node_info` and :func:`_transcript_info_py` as the audit calls them: the C
#: kernel's where it built (docs/audit.md, "The per-line kernel": the info of a common
#: message or receipt made there, any other entry handed to the Python function, which
#: decides), else the functions themselves.
_info: Callable[[Entry, list[Finding]], Any] = _node_info
_transcript_info: Callable[[Entry, list[Finding]], Any] = _transcript_info_py
if node_info_c is not None and configure_info_c is not None and transcript_info_c is not None:
    configure_info_c(_Request, _Receipt, _DIRECTIVE, _ZERO, _node_info, _transcript_info_py)
    _info, _transcript_info = node_info_c, transcript_info_c



@dataclass(slots=True)
class SessionAudit:
    """The result of auditing one session: its row and its findings."""

    row: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    #: Line and id of every active-chain entry, in file order (see :attr:`active`).
    chain_lines: tuple[int, ...] = ()
    chain_ids: tuple[str, ...] = ()
    #: One tuple of :data:`USAGE_FIELDS` per usage-bearing record (``usage`` dataset).
    usage: list[tuple[Any, ...]] = field(default_factory=list)
    #: ``(session_path, agent_id, tool_use_id, entry_id, line)`` of every subagent the
    #: session started (``subagents`` dataset; Claude Code).
    links: list[tuple[Any, ...]] = field(default_factory=list)
    _active: frozenset[tuple[int, str]] | None = field(default=None, repr=False)

    @property
    def active(self) -> frozenset[tuple[int, str]]:
        """``(line, id)`` of every active-chain entry, for a replay pass over the same
        bytes; made when first asked."""
        # Not made by the audit itself: a task keeps every audit of its batch until
        # their tables are built, and a set of pairs per session, which an audit alone
        # never reads, was most of what the cyclic GC walked (docs/scaling.md).
        if self._active is None:
            self._active = frozenset(zip(self.chain_lines, self.chain_ids, strict=True))
        return self._active

    def add_findings(self, findings: list[Finding]) -> None:
        """Add findings made outside the audit (checkpoints), first; recount the row."""
        if not findings:
            return
        self.findings[:0] = findings
        self.row.update(verdict(self.findings))


def verdict(findings: list[Finding]) -> dict[str, Any]:
    """A session row's ``status`` (:meth:`Status.of <pipeline.ledger.types.Status.of>`)
    and counts per severity."""
    # Once per session, in one pass: the status from the counts (the worst severity
    # found), no iteration of the enums (a tenth of a small session's audit).
    errors = warnings = infos = 0
    for f in findings:
        severity = f.severity
        if severity is Severity.ERROR:
            errors += 1
        elif severity is Severity.WARNING:
            warnings += 1
        else:
            infos += 1
    status = _ERROR if errors else _WARNING if warnings else _OK
    return {"status": status, "errors": errors, "warnings": warnings, "infos": infos}


_ERROR, _WARNING, _OK = Status.ERROR.value, Status.WARNING.value, Status.OK.value


#: What the audit reads of a vak header, in :func:`~pipeline.ledger.reader.header_view`'s
#: order.
_HEADER_FIELDS = ("session_id", "cwd", "model", "provider", "app_version")


def _header_fields(entry: Entry, bad: list[Finding]) -> dict[str, Any]:
    kept = header_view(entry)
    if kept is not None:  # read by the C kernel: its payload never parsed here
        return dict(zip(_HEADER_FIELDS, kept, strict=True))
    contract = entry.data.get("contract")
    if type(contract) is not dict:
        if contract is not None:
            bad.append(_bad_field(entry, "contract", contract, "an object"))
        contract = {}

    def text(v: Any) -> str | None:
        return v if isinstance(v, str) else None

    return {
        "session_id": text(entry.data.get("session_id")),
        "cwd": text(entry.data.get("cwd")),
        "model": text(contract.get("model")),
        "provider": text(contract.get("provider")),
        "app_version": text(contract.get("app_version")),
    }


def _owner(tree: TreeIndex, receipt: Node) -> Node | None:
    """The assistant message a receipt's node belongs to: its parent, if that is a
    request. Looked up, never kept on the receipt: the message keeps its receipt, and a
    link back would make every such pair a reference cycle, left to the cyclic collector
    (docs/scaling.md)."""
    parent = tree.by_id.get(receipt.parent_id or "")
    return parent if parent is not None and type(parent.info) is _Request else None


def _figures(tree: TreeIndex) -> dict[str, Any]:
    """Per-session counts and usage: active chain and abandoned branches apart."""
    usage = {True: _ZERO, False: _ZERO}
    requests = {True: 0, False: 0}
    turns = 0
    billed, attempts, failed = _ZERO, 0, 0
    for node in tree.nodes:
        info = node.info
        if isinstance(info, _Receipt):
            billed = _add(billed, info.billed)
            attempts += info.attempts
            failed += info.failed
            # A receipt belongs to the assistant message it follows: it stands in for a
            # message that carries no usage of its own.
            owner = _owner(tree, node)
            if owner is not None and owner.info.receipt is None and info.winning is not None:
                owner.info.receipt = info
    for node in tree.nodes:
        info = node.info
        if isinstance(info, _Request):
            if info.part or info.mirror is not None:
                continue
            requests[node.on_active_chain] += 1
            u = info.usage
            if u is None and info.receipt is not None:
                u = info.receipt.winning
            if u is not None:
                usage[node.on_active_chain] = _add(usage[node.on_active_chain], u)
        elif info is _DIRECTIVE and node.on_active_chain:
            turns += 1
    return _figures_row(turns, requests[True], requests[False], attempts, failed,
                        usage[True], usage[False], billed)


def _figures_row(turns: int, requests: int, requests_abandoned: int, attempts: int,
                 failed: int, usage: Usage, usage_abandoned: Usage,
                 billed: Usage) -> dict[str, Any]:
    """The figures' columns of a session's row (made by :func:`_figures` or in C)."""
    row: dict[str, Any] = {
        "turns": turns,
        "requests": requests,
        "requests_abandoned": requests_abandoned,
        "receipt_attempts": attempts,
        "receipt_failed_attempts": failed,
    }
    for i, (kept, abandoned, paid) in enumerate(_USAGE_COLUMNS):
        row[kept] = usage[i]
        row[abandoned] = usage_abandoned[i]
        row[paid] = billed[i]
    return row


#: The row's usage columns of each kind: on the active chain, abandoned, billed.
_USAGE_COLUMNS = tuple((f"{kind}_tokens", f"{kind}_tokens_abandoned", f"billed_{kind}_tokens")
                       for kind in USAGE_KINDS)


def _figures_and_chain(tree: TreeIndex) -> tuple[dict[str, Any], tuple[int, ...],
                                                 tuple[str, ...]]:
    """:func:`_figures` and the active chain's lines and ids, in node order: one C call
    (``figures_c``, the same two passes) where the kernel built and the nodes are what
    the audit makes, else here."""
    walked = figures_c(tree.nodes, tree.by_id) if figures_c is not None else None
    if walked is None:
        active = [n for n in tree.nodes if n.on_active_chain]
        return _figures(tree), tuple(map(_LINE, active)), tuple(map(_ID, active))
    *figures, lines, ids = walked
    return _figures_row(*figures), lines, ids


def _merge_streamed(tree: TreeIndex) -> None:
    """Make each streamed request one (docs/formats.md): the final line's usage (earlier
    lines carry running counts) goes on one line, the *carrier*, the others become parts,
    counted in no figure. A message whose blocks were written as several lines can sit on
    two branches (parallel tool calls: each ``tool_use`` line gets its own result, the
    conversation goes on from the last), so the carrier is its last line on the active
    chain, if any, else its last line. Runs after :meth:`TreeIndex.finish`."""
    lines: dict[str, list[Node]] = {}
    for node in tree.nodes:
        info = node.info
        if type(info) is _Request and info.key is not None:
            lines.setdefault(info.key, []).append(node)
    for nodes in lines.values():
        if len(nodes) < 2:
            continue
        final = next((n.info for n in reversed(nodes) if n.info.usage is not None), None)
        carrier = next((n for n in reversed(nodes) if n.on_active_chain), nodes[-1])
        usage, hour, speed = ((final.usage, final.write_1h, final.speed) if final is not None
                              else (None, None, None))
        for n in nodes:
            n.info.part = n is not carrier
            n.info.usage = usage if n is carrier else None
            n.info.write_1h = hour if n is carrier else None
            n.info.speed = speed if n is carrier else None


def _abandoned_messages(tree: TreeIndex) -> int:
    """A transcript's abandoned entries: the messages off the active chain that a user
    or the model could have continued (docs/formats.md): prompts (directives) and model
    requests. Not counted: activity lines (Claude Code's ``progress``, hook and metadata
    lines, Codex's events: side lines, never a branch), tool results and runtime
    messages (``isMeta``: hook context hung off an entry), a subagent's requests copied
    into its parent, and the earlier lines of a streamed request (parts: parallel tool
    calls sit on side branches while the conversation goes on from the last one). Runs
    after :func:`_merge_streamed`."""
    count = 0
    for node in tree.nodes:
        if node.on_active_chain:
            continue
        info = node.info
        if info is _DIRECTIVE or (type(info) is _Request and not info.part
                                  and info.mirror is None):
            count += 1
    return count


def _usage_rows(tree: TreeIndex, header: dict[str, Any],
                subagent: str | None = None) -> list[tuple[Any, ...]]:
    """The usage records of a session, flagged billed / effective / waste.

    The rules are in ``docs/cost-rules.md`` ("Billed, effective, wasted"). Runs after
    :func:`_figures` has tied receipts to their messages. Flat tuples and inline checks:
    this runs once per request of every session audited. In one C call where the kernel
    built (``usage_rows_c``: the same rows, a test holds them alike), here where it
    defers (a value the audit never makes).
    """
    provider, model = header.get("provider") or None, header.get("model") or None
    made = (usage_rows_c(tree.nodes, tree.by_id, provider, model, subagent)
            if usage_rows_c is not None else None)
    if made is not None:  # in C (the same rows); None where this function decides
        return made
    rows: list[tuple[Any, ...]] = []
    append = rows.append
    for node in tree.nodes:
        info = node.info
        kind = type(info)
        if kind is _Request:
            u = info.usage
            if u is None:
                continue
            # A subagent's request copied into its parent hangs off the parent's chain
            # as a progress line: where it hangs says nothing of the subagent's work.
            active = node.on_active_chain or info.mirror is not None
            # Its receipt's winning attempt is the same request: that one is billed.
            billed = info.receipt is None
            append((node.id, info.key or node.id,
                    "message" if info.mirror is None else "mirror", None, None, None, None,
                    info.ts, provider, info.model or model, active, u[0], u[1], u[2], u[3],
                    billed, billed and active, "abandoned" if billed and not active else None,
                    info.write_1h, info.mirror or subagent, info.speed))
        elif kind is _Receipt and info.metered:
            owner = _owner(tree, node)
            active = owner.on_active_chain if owner is not None else node.on_active_chain
            # A second receipt of the same message billed the same answer again: a retry.
            counts = owner is None or owner.info.receipt is info
            p, m = info.provider or provider, info.model or model
            for ordinal, settlement, u, a_p, a_m, win in info.metered:
                effective = win and counts and active
                append((node.id, owner.id if owner is not None else None, "attempt",
                        info.purpose,
                        ordinal if type(ordinal) is int and 0 <= ordinal < 2**31 else None,
                        settlement, win, info.ts, a_p or p, a_m or m, active,
                        u[0], u[1], u[2], u[3], True, effective,
                        None if effective else "abandoned" if win and counts else "retry",
                        None, subagent, None))
    return rows


def audit_session(key: SessionKey, lines: Iterable[bytes], size: int | None = None,
                  keep: list[Entry] | None = None) -> SessionAudit:
    """Audit one session streamed as physical lines: a vak ledger, or a transcript of
    another agent (:mod:`pipeline.formats`), told apart by its content.

    Parameters
    ----------
    key:
        The session's place in the archive (path, agent, cwd directory, file stem).
    lines:
        Its physical lines as bytes, as iterating a binary file yields them.
    size:
        The object's size in bytes when known (else counted from the lines).
    keep:
        When given, every valid entry is appended to it, in file order (for a second
        pass over a small session without reading it again).

    Returns
    -------
    SessionAudit
        The ``integrity/sessions`` row and the findings, in line order.
    """
    fmt, lines = detect(lines)
    tree = TreeIndex()
    findings: list[Finding] = []
    header: dict[str, Any] = {}
    first_ts = None
    last_entry: Entry | None = None

    stats = LineStats()
    add = tree.adder()
    info = _info if fmt is None else _transcript_info
    # A vak ledger's common lines go to the tree in one C loop, never yielded (except
    # when every entry is kept): the last entry it took is run_last[0].
    run_last: list[Entry | None] = [None]
    run = tree.runner(info, findings, run_last) if fmt is None and keep is None else None
    items = read_ledger(lines, stats, run) if fmt is None else fmt.read(lines, stats, header)
    for item in items:
        if isinstance(item, Finding):
            findings.append(item)
            continue
        found = add(item, info(item, findings))
        if found:
            findings.extend(found)
        if keep is not None:
            keep.append(item)
        if (fmt is None and item.kind == "header" and tree.header is not None
                and tree.header.line == item.line):
            header = _header_fields(item, findings)
        if not first_ts:
            first_ts = item.ts
        last_entry = item
    ran = run_last[0]
    if ran is not None and (last_entry is None or ran.line > last_entry.line):
        last_entry = ran
    findings.extend(tree.finish())
    if fmt is None:
        findings.extend(_placement(key, tree, header))
    elif (key.parent is None and fmt.name != UNKNOWN
          and header.get("session_id") != key.session_id):
        findings.append(Finding(Code.SESSION_ID_MISMATCH, None, None,
                                "file name does not name the transcript's session id"))
    if key.parent_missing:
        # Set at enumeration, which saw the whole listing: its usage is still this
        # subagent's, but no parent row links it to a session.
        findings.append(Finding(Code.SUBAGENT_PARENT_MISSING, None, None,
                                f"the parent transcript {quote(key.parent or '', 160)} is "
                                "not in the archive"))
    findings.sort(key=lambda f: (f.line is not None, f.line or 0))
    if fmt is not None:
        _merge_streamed(tree)
    figures, chain_lines, chain_ids = _figures_and_chain(tree)
    head: Node | None = tree.head
    row: dict[str, Any] = {
        "session_path": key.path,
        "source": fmt.name if fmt is not None else VAK,
        "agent": key.agent,
        "cwd_hash": key.cwd_hash,
        "session_id": header.get("session_id"),
        "parent_session_path": key.parent,
        "subagent": key.subagent,
        "bytes": size if size is not None else stats.bytes,
        "lines": stats.lines,
        "entries": len(tree.nodes) - (fmt is not None),  # not the synthetic root
        **verdict(findings),
        "head_id": head.id if head else None,
        # A transcript adapter that hashes only its head entry says so in the header.
        "head_hash": (header["head_hash"] if fmt is not None and "head_hash" in header
                      else last_entry.digest or None if last_entry else None),
        "active_chain_len": len(chain_lines) - (fmt is not None),
        "abandoned_entries": (len(tree.nodes) - len(chain_lines) if fmt is None
                              else _abandoned_messages(tree)),
        "model": header.get("model"),
        "provider": header.get("provider"),
        "app_version": header.get("app_version"),
        "first_ts": ts_nanos(first_ts),
        "last_ts": ts_nanos(last_entry.ts if last_entry is not None else None),
    }
    row.update(figures)
    links = [(key.path, *link) for link in header.get("links", ())]
    return SessionAudit(row, findings, chain_lines, chain_ids,
                        _usage_rows(tree, header, key.subagent), links)


def _placement(key: SessionKey, tree: TreeIndex, header: dict[str, Any]) -> list[Finding]:
    """A vak ledger's place against its header: the cwd directory and the file name."""
    if tree.header is None:
        return []
    found: list[Finding] = []
    cwd, sid = header.get("cwd"), header.get("session_id")
    if cwd is None:
        # Like a missing session_id below: nothing ties the directory to the header.
        found.append(Finding(
            Code.CWD_HASH_MISMATCH, tree.header.line, tree.header.id,
            "the header has no cwd (string): the directory cannot be checked",
        ))
    elif cwd_hash(cwd) != key.cwd_hash:
        found.append(Finding(
            Code.CWD_HASH_MISMATCH, tree.header.line, tree.header.id,
            f"directory {quote(key.cwd_hash, 40)!r} is not FNV-1a of the header's cwd "
            f"({cwd_hash(cwd)})",
        ))
    if sid != key.session_id:
        found.append(Finding(
            Code.SESSION_ID_MISMATCH, tree.header.line, tree.header.id,
            "file name is not the header's session_id",
        ))
    return found
