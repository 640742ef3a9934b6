"""Domain records shared by every layer: severities, finding codes, findings, and the
marker of a line too long to read.

Pure module: no IO of its own (:func:`read_user_bytes` reads only the stream it is
handed), no third-party imports.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, BinaryIO

from pipeline.errors import UsageError


class Severity(enum.IntEnum):
    """How bad a finding is; ordered so ``max()`` gives a session's status."""

    INFO = 0
    WARNING = 1
    ERROR = 2

    @property
    def label(self) -> str:
        """Lower-case name as written in the output tables."""
        return self.name.lower()


#: The largest token count read: what an int64 column holds. A larger one is no count
#: vak writes (hostile or damaged input) and makes the whole ``usage`` object absent.
MAX_TOKEN_COUNT = 2**63 - 1
#: The largest model window (or output reserve) in tokens a catalog rule or ``--window``
#: may give: one past MAX_TOKEN_COUNT was written null as every request's limit, and
#: this leaves the sums made with it room in the same int64 columns.
LARGEST_WINDOW = 2**62
#: The most bytes read of a small file a user names (``--keys``, ``--vak-key-file`` and
#: its tenant's scope keys, ``--budgets``, ``--prices``, ``--catalog``): far past any
#: such file, so that a device (``/dev/zero`` was read until the kernel killed the
#: process) or a ledger named by mistake is refused, never read whole.
USER_FILE_LIMIT = 16 * 2**20


def read_user_bytes(stream: BinaryIO, what: str) -> bytes:
    """At most :data:`USER_FILE_LIMIT` bytes of ``stream``, a small file a user names
    (``what``, as messages name it); more is refused, never read.

    Raises
    ------
    UsageError
        ``stream`` holds more than the limit.
    """
    data = stream.read(USER_FILE_LIMIT + 1)
    if len(data) > USER_FILE_LIMIT:
        raise UsageError(f"cannot read {what}: larger than {USER_FILE_LIMIT >> 20} MiB, "
                         "which no such file is")
    return bytes(data)


def token_count(v: object) -> int | None:
    """A token count recorded outside ``usage`` (a receipt's ``prefix_tokens``, a turn
    card's, a transcript's): an integer from 0 to :data:`MAX_TOKEN_COUNT`, else ``None``
    (bool too)."""
    return v if type(v) is int and 0 <= v <= MAX_TOKEN_COUNT else None


#: What a JSON value is, as a finding names it (never the value: input is data).
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "an integer",
               float: "a number", bool: "a boolean", type(None): "null"}
#: What a token count is, as a ``bad_field`` finding says it is wanted.
TOKEN_COUNT_WANTED = "a token count (an integer from 0 to 2^63 - 1)"


def bad_field_detail(path: str, value: object, wanted: str) -> str:
    """The detail of a ``bad_field`` finding: the field at ``path`` holds ``value``
    where ``wanted`` goes, and is read as absent. It names the path and the type found,
    never the value."""
    got = _JSON_TYPES.get(type(value), "a value")
    if type(value) is int and wanted == TOKEN_COUNT_WANTED:
        got = "an integer out of range"
    return f"{path} is {got}, not {wanted}: read as absent"


# Typed accessors of payload values. vak writes each payload field with one type; a file
# can hold any JSON value there, and a value of another type is read as absent (the
# empty value of the expected type), never used as what it is not: ``for x in v or []``
# on a ``5`` raises, ``as_list(v)`` is ``[]``. orjson yields exact ``dict``/``list``/
# ``str`` types, so ``type() is`` is exact and cheaper than ``isinstance``.


def as_dict(v: object) -> dict[str, Any]:
    """``v`` if it is a JSON object, else an empty one (a fresh dict: never shared)."""
    return v if type(v) is dict else {}


def as_list(v: object) -> list[Any]:
    """``v`` if it is a JSON array, else an empty one (a fresh list: never shared)."""
    return v if type(v) is list else []


def dicts(v: object) -> list[dict[str, Any]]:
    """The objects of a JSON array (its other items dropped); none if ``v`` is no array."""
    return [x for x in v if type(x) is dict] if type(v) is list else []


class Code(enum.Enum):
    """Every finding code vakpipe reports, with its severity (spec sections 2 and 6)."""

    # 2.1 lines and the hash chain
    DAMAGED_ENTRY = ("damaged_entry", Severity.ERROR)
    HASH_MISMATCH = ("hash_mismatch", Severity.ERROR)
    TORN_TAIL = ("torn_tail", Severity.WARNING)
    TORN_WRITE_RECOVERED = ("torn_write_recovered", Severity.WARNING)
    TORN_MERGE = ("torn_merge", Severity.WARNING)
    UNCHAINED = ("unchained", Severity.WARNING)
    DUPLICATE_KIND_KEY = ("duplicate_kind_key", Severity.INFO)
    # decided here (docs/audit.md): a message object with two ``role`` keys of different
    # values (vak never writes one; JSON readers disagree on which wins)
    DUPLICATE_KEY = ("duplicate_key", Severity.WARNING)
    # decided here: a payload field the audit's figures rest on holds a value of another
    # type than vak writes (read as absent)
    BAD_FIELD = ("bad_field", Severity.WARNING)
    # 2.2 the tree
    MISSING_HEADER = ("missing_header", Severity.ERROR)
    HEADER_NOT_FIRST = ("header_not_first", Severity.ERROR)
    SECOND_HEADER = ("second_header", Severity.ERROR)
    ORPHAN_PARENT = ("orphan_parent", Severity.ERROR)
    FORWARD_PARENT = ("forward_parent", Severity.ERROR)
    DUPLICATE_ID = ("duplicate_id", Severity.ERROR)
    CWD_HASH_MISMATCH = ("cwd_hash_mismatch", Severity.WARNING)
    SESSION_ID_MISMATCH = ("session_id_mismatch", Severity.WARNING)
    UNKNOWN_KIND = ("unknown_kind", Severity.INFO)
    # transcripts of other agents (docs/formats.md): a compaction boundary names, as the
    # entry it follows, one the file does not hold; linked to the entry before it
    LOGICAL_PARENT_MISSING = ("logical_parent_missing", Severity.WARNING)
    # ... a file neither a vak ledger nor a format an adapter knows: read, not audited
    UNKNOWN_FORMAT = ("unknown_format", Severity.ERROR)
    # ... a forked Codex rollout: requests copied from its parent's history (billed once)
    FORK_HISTORY = ("fork_history", Severity.INFO)
    # ... a Claude Code subagent transcript whose parent transcript the archive lacks
    SUBAGENT_PARENT_MISSING = ("subagent_parent_missing", Severity.INFO)
    # 6 checkpoints between audits
    HISTORY_TRUNCATED = ("history_truncated", Severity.ERROR)
    HISTORY_REWRITTEN = ("history_rewritten", Severity.ERROR)
    SESSION_MISSING = ("session_missing", Severity.ERROR)
    # record-segment ledgers (docs/segments.md): frames, sealed segments, seals.log
    FRAME_LENGTH = ("frame_length", Severity.ERROR)
    FRAME_HASH_MISMATCH = ("frame_hash_mismatch", Severity.ERROR)
    FRAME_TORN_TAIL = ("frame_torn_tail", Severity.WARNING)
    FRAME_UNREADABLE = ("frame_unreadable", Severity.ERROR)
    SEGMENT_DISCONTINUITY = ("segment_discontinuity", Severity.ERROR)
    SEALED_SEGMENT_MALFORMED = ("sealed_segment_malformed", Severity.ERROR)
    SEALED_SEGMENT_MISMATCH = ("sealed_segment_mismatch", Severity.ERROR)
    SEALED_SEGMENT_UNRECORDED = ("sealed_segment_unrecorded", Severity.ERROR)
    SEALS_LOG_BROKEN = ("seals_log_broken", Severity.ERROR)
    SEALS_LOG_TORN_TAIL = ("seals_log_torn_tail", Severity.WARNING)
    SEAL_INTERRUPTED = ("seal_interrupted", Severity.WARNING)
    LOG_BESIDE_SEALED = ("log_beside_sealed", Severity.WARNING)
    SEGMENT_DROPPED = ("segment_dropped", Severity.INFO)
    SEGMENT_MISSING = ("segment_missing", Severity.ERROR)
    SEGMENT_NOT_SEALED = ("segment_not_sealed", Severity.ERROR)
    CONTENT_SEALED = ("content_sealed", Severity.INFO)
    # decided here (docs/audit.md): the object could not be read at all
    UNREADABLE_OBJECT = ("unreadable_object", Severity.ERROR)
    # ... it changed under the reader twice in a row (a live object): audited next run
    CHANGED_DURING_AUDIT = ("changed_during_audit", Severity.WARNING)
    # ... every worker that read it died, up to the allowed failures: quarantined
    WORKER_CRASHED = ("worker_crashed", Severity.ERROR)
    # ... auditing or replaying it raised (a bug, not a storage error): contained
    AUDIT_FAILED = ("audit_failed", Severity.ERROR)

    def __init__(self, text: str, severity: Severity) -> None:
        self.text = text
        self.severity = severity


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing an audit reports about one session.

    Attributes
    ----------
    code:
        What was found.
    line:
        1-based physical line it is about, or ``None`` (``missing_header``).
    entry_id:
        Id of the entry concerned, when one could be read.
    detail:
        Short human-readable explanation; bounded in length, never a whole line.
    """

    code: Code
    line: int | None = None
    entry_id: str | None = None
    detail: str = ""

    @property
    def severity(self) -> Severity:
        """Severity of the finding's code."""
        return self.code.severity


class Status(enum.Enum):
    """A session's overall verdict: the worst severity among its findings."""

    OK = "ok"
    WARNING = "warning"
    ERROR = "error"

    @classmethod
    def of(cls, findings: list[Finding]) -> Status:
        """Status for a list of findings (info findings keep a session ``ok``)."""
        worst = max((f.severity for f in findings), default=Severity.INFO)
        if worst is Severity.ERROR:
            return cls.ERROR
        if worst is Severity.WARNING:
            return cls.WARNING
        return cls.OK


class OversizeLine(bytes):
    """Stands for a physical line longer than the line limit, which the IO layer skipped
    without reading it into memory (``--max-line-bytes``).

    Its bytes are only the line's newline (empty for an unterminated last line), so it
    never parses and costs the reader nothing until a line fails; ``size`` is the line's
    real length, newline included.
    """

    size: int
    limit: int

    def __new__(cls, size: int, limit: int, terminated: bool) -> OversizeLine:
        line = super().__new__(cls, b"\n" if terminated else b"")
        line.size, line.limit = size, limit
        return line

    @property
    def reason(self) -> str:
        """Why the line is not a valid entry (a finding's detail)."""
        body = self.size - len(self)
        return (f"line of {body:,} bytes is longer than the line limit ({self.limit:,} bytes, "
                "--max-line-bytes): skipped unread")
