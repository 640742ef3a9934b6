"""Secrets redaction: credentials found in transcript text never reach an output. Pure.

Transcripts hold whatever the agent saw: ``.env`` files, ``aws configure`` output, shell
history, tokens pasted by the person. vakpipe copies bits of them into its outputs
(finding details, ids, model names, compaction summaries, ``show``), so every such text
goes through :func:`redact`, which replaces each credential it recognises by
``[REDACTED:<kind>]``. Output tables are redacted as a whole by :func:`redact_table`.

The rules follow the shapes the credential issuers document (AWS access key ids,
GitHub, OpenAI, Anthropic, Slack, Stripe and Google keys, JWTs, PEM private keys) and
the usual carriers of free-form secrets (``password=`` in URLs and configs, basic-auth
URLs, ``Bearer`` headers, an AWS secret key next to its label). A rule with a ``v``
group replaces only that group, so ``password=[REDACTED:password]`` still says what was
there. Redaction errs on the side of redacting: a false positive costs a word of an
output, a false negative leaks a credential.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

#: ``(kind, words, rule)``: a rule's regular expression, and the words (lower case) one of
#: which a text must hold for the rule to match. Rules apply in this order, so the more
#: specific comes first (``sk-ant-`` before ``sk-``). Bounded repetitions only where a key
#: has a fixed length; an unterminated PEM block is redacted up to 8 KiB past its header
#: (a key is shorter), so that no block makes a scan quadratic.
RULES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("private_key", ("-----begin",),
     r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY( BLOCK)?-----(?:(?!-----END)[\s\S]){0,8192}"
     r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY( BLOCK)?-----)?"),
    ("aws_access_key", ("akia", "asia", "abia", "acca"), r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}"),
    ("aws_secret_key", ("secret",),
     r"(?i:aws_?secret_?(?:access_?)?key|secret_?access_?key)[\"'\\ \t]*[:=][\"'\\ \t]*"
     r"(?!\[REDACTED:)(?P<v>[A-Za-z0-9/+=]{16,})"),
    ("github_token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
     r"gh[pousr]_[A-Za-z0-9]{20,255}|github_pat_[A-Za-z0-9_]{22,255}"),
    ("anthropic_key", ("sk-ant-",), r"sk-ant-[A-Za-z0-9_\-]{20,}"),
    ("openai_key", ("sk-",), r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_\-]{20,}"),
    ("stripe_key", ("_live_", "_test_"), r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"),
    ("slack_token", ("xox",), r"xox[abposr]-[A-Za-z0-9\-]{10,}"),
    ("slack_webhook", ("hooks.slack.com",),
     r"https://hooks\.slack\.com/services/[A-Za-z0-9/_\-]+"),
    ("google_api_key", ("aiza",), r"AIza[A-Za-z0-9_\-]{35}"),
    ("jwt", ("eyj",), r"eyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]*"),
    ("bearer_token", ("bearer",),
     r"(?i:bearer)[ \t]+(?!\[REDACTED:)(?P<v>[A-Za-z0-9._~+/\-]{16,}=*)"),
    ("url_password", ("://",),
     r"[A-Za-z][A-Za-z0-9+.\-]{0,31}://[^\s/?#@:\"'<>\\]{0,256}:"
     r"(?!\[REDACTED:)(?P<v>[^\s/?#@\"'<>\\]{1,256})@"),
    ("password", ("pass", "pwd"),
     r"(?i:password|passwd|passphrase|pwd)[\"'\\]?[ \t]*[:=][ \t]*"
     r"[\"'\\]?(?!\[REDACTED:)(?P<v>[^\s&#\"'<>,;}\\]+)"),
    ("secret_value", ("token=", "key=", "secret=", "sig=", "signature="),
     r"(?i:access_?token|auth_?token|api_?key|apikey|client_?secret|"
     r"secret|token|signature|sig)=(?!\[REDACTED:)(?P<v>[^\s&#\"'<>\\]+)"),
)

_WORDS = sorted({w for _, words, _ in RULES for w in words})
#: Any rule's word, case-insensitively, in the syntax RE2 and Python share: Arrow picks
#: out with it the few cells of a table that need :func:`redact` at all.
TRIGGER = "(?i)" + "|".join(re.escape(w) for w in _WORDS)
# Python's own check runs on the lower-cased text: a literal alternation is several
# times faster there than a case-insensitive one.
_TRIGGER = re.compile("|".join(re.escape(w) for w in _WORDS))
_RULES = tuple((kind, words, re.compile(rule)) for kind, words, rule in RULES)


def _replacer(kind: str) -> Callable[[re.Match[str]], str]:
    tag = f"[REDACTED:{kind}]"

    def replace(match: re.Match[str]) -> str:
        if "v" in match.re.groupindex and match.start("v") >= 0:
            whole, start = match.group(), match.start()
            return whole[: match.start("v") - start] + tag + whole[match.end("v") - start:]
        return tag

    return replace


_REPLACERS = {kind: _replacer(kind) for kind, _, _ in RULES}


def redact(text: str) -> str:
    """``text`` with every credential it holds replaced by ``[REDACTED:<kind>]``.

    Idempotent, and the text itself (no copy) when nothing matches: one scan of the
    lower-cased text for the rules' words decides, and only the rules whose words are
    there run.
    """
    low = text.lower()
    if _TRIGGER.search(low) is None:
        return text
    for kind, words, rule in _RULES:
        if any(w in low for w in words):
            text = rule.sub(_REPLACERS[kind], text)
    return text


def redact_optional(text: str | None) -> str | None:
    """:func:`redact`, passing ``None`` through."""
    return None if text is None else redact(text)


def redact_value(value: Any) -> Any:
    """A JSON-like value with every string in it (keys too) redacted, for structures sent
    or written whole (the turn cards an HTTP summariser receives)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {redact(str(k)): redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(v) for v in value]
    return value


def bounded(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ``…`` marking a cut."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def _redact_column(column: pa.ChunkedArray, limit: int | None) -> pa.ChunkedArray:
    """One string column, redacted (and cut to ``limit`` characters): Arrow (RE2) picks
    out the cells holding a rule's word or over the limit, and only those go through
    :func:`redact` and are replaced."""
    import pyarrow as pa
    import pyarrow.compute as pc

    hit = pc.match_substring_regex(column, TRIGGER)
    if limit is not None:
        hit = pc.or_(hit, pc.greater(pc.utf8_length(column), limit))
    hit = pc.fill_null(hit, False)
    if not pc.any(hit).as_py():
        return column
    old = pc.filter(column, hit).to_pylist()
    new = [redact(v) for v in old]
    if limit is not None:
        new = [bounded(v, limit) for v in new]
    if new == old:  # a rule's word, and no secret (a hex digest holding "acca")
        return column
    mask = hit.combine_chunks() if isinstance(hit, pa.ChunkedArray) else hit
    return pa.chunked_array([pc.replace_with_mask(column.combine_chunks(), mask,
                                                  pa.array(new, column.type))])


#: Columns of the output tables that never hold transcript text: object keys and what
#: the path gives (they name the archive's objects and must find them again: row 13 of
#: the reliability matrix escapes hostile ones), digests vakpipe computes, validated
#: timestamps, and texts it writes from numbers, scopes and its own vocabularies. Every
#: other string column is redacted, new ones included.
NOT_TRANSCRIPT = frozenset({
    "session_path", "agent", "cwd_hash", "etag", "status", "code", "severity", "kind",
    "waste", "head_hash", "prefix_sha256", "replayed_prefix_digest", "request_digest",
    "rules", "hint_level", "hint_text", "now_line", "scope", "plan_packet_range", "state",
    "first_ts", "summary_detail", "summariser", "summariser_version",
})


def redact_table(table: pa.Table, *, keep: Iterable[str] = NOT_TRANSCRIPT,
                 limits: Mapping[str, int] | None = None) -> pa.Table:
    """``table`` with every string column but ``keep`` redacted.

    Parameters
    ----------
    table:
        An output table.
    keep:
        Columns left as they are (default :data:`NOT_TRANSCRIPT`).
    limits:
        Columns cut to at most this many characters after redaction (finding details).
    """
    import pyarrow as pa  # here: the text functions above need no Arrow

    kept, limits = set(keep), limits or {}
    columns = []
    changed = False
    for field, column in zip(table.schema, table.columns, strict=True):
        if field.name not in kept and (pa.types.is_string(field.type)
                                       or pa.types.is_large_string(field.type)):
            new = _redact_column(column, limits.get(field.name))
            changed = changed or new is not column
            column = new
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=table.schema) if changed else table
