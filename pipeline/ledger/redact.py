"""Secrets redaction: credentials found in transcript text never reach an output. Pure.

Transcripts hold whatever the agent saw: ``.env`` files, ``aws configure`` output, shell
history, HTTP headers, tokens pasted by the person. vakpipe copies bits of them into its
outputs (finding details, ids, model names, compaction packets, ``show``), so every such
text goes through :func:`redact`, which replaces each credential it recognises by
``[REDACTED:<kind>]``. Output tables are redacted as a whole by :func:`redact_table`.
A text quoted in a bounded place (a finding's detail, an error message) goes through
:func:`quote`, which redacts *then* cuts: a cut made first can leave part of a key that no
rule recognises any more (``sk-LEAK…``), so there is no function here that cuts alone.

The rules are a hand list, derived from gitleaks' and detect-secrets' rules (detect-secrets
is a line scanner that reports values, not spans, and would be a dependency for a few
regular expressions); two families:

- **Known shapes** (the issuers' documented prefixes): AWS access key ids, GitHub,
  GitLab, Hugging Face, npm, PyPI, OpenAI, Anthropic, Slack, Stripe, SendGrid and Google
  keys and OAuth tokens, JWTs, PEM private key blocks.
- **Secret-ish names** (``password``, ``passwd``, ``pwd``, ``secret``, ``token``,
  ``api_key``, ``access_key``, ``client_secret``, ``private_key``, ``AccountKey``,
  ``auth``, ``authorization``, ``credential``, ``cookie`` at the end of a key name, so
  ``DB_PASSWORD`` and ``x-api-key`` are caught and ``max_tokens`` is not) followed by a
  value in any carrier: JSON (``"token": "…"``, and JSON-escaped ``\"token\": \"…\"`` at
  any depth), quoted, ``key=value``, ``key: value``, ``key => value``, a command-line flag
  (``--aws-secret-access-key VALUE``), an HTTP header (``Authorization: Basic …``: to the
  end of the line), URL userinfo (``https://user:pass@host``), ``curl -u user:pass``. A
  quoted value runs to its closing quote (so spaces, ``&``, ``#`` and ``@`` in a password
  are covered), an unquoted one to whitespace or a quote.

A rule with ``v`` groups replaces only those, so ``password=[REDACTED:password]`` still
says what was there. Redaction errs on the side of redacting: a false positive costs a
word of an output, a false negative leaks a credential.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

# -- the secret-ish key names ---------------------------------------------------------------

#: Names of password-like keys, matched at the end of a key (``PGPASSWORD``, ``db_pass``);
#: a bare ``pass`` only when no letter comes before it (not ``bypass``, ``compass``).
#: Every name starts with one of its rule's words, and a match starts at the name: the
#: rule is tried only where one of them is (:data:`ANCHORED`), since a scan for an
#: alternation of names at every position costs ten times the rest of :func:`redact`.
_PASS_NAMES = r"(?:(?<![A-Za-z])pass|pass(?=word|wd|phrase))(?:word|wd|phrase)?|pwd"
#: Prefixes that make a ``key`` a secret one (``api_key``, ``AccountKey``,
#: ``aws_secret_access_key``, ``x-api-key``): fixed-width look-behinds, so that a match
#: still starts at ``key``.
_KEY_PREFIXES = ("api", "access", "secret", "private", "account", "auth", "client", "master",
                 "signing", "encryption", "service", "shared", "session", "storage")
#: Names of other secret keys, matched at the end of a key (``GITHUB_TOKEN``,
#: ``client_secret``); ``tokens`` or ``token_count`` are not a key that ends with one.
_SECRET_NAMES = ("secret|token|auth(?:ori[sz]ation)?|credentials?|cookie|(?:"
                 + "|".join(f"(?<={p}{s})" for p in _KEY_PREFIXES for s in ("", "_", "-"))
                 + ")key")
_PASS_WORDS = ("pass", "pwd")
_SECRET_WORDS = ("secret", "token", "auth", "credential", "cookie", "key")
#: After a key: its closing quote at any JSON-escaping depth, then a separator.
_SEP = r"(?P<kq>\\{0,7}[\"'])?[ \t]{0,16}(?:=>|:=|[:=])[ \t]{0,16}"
#: A quoted value: from its opening quote (``"``, ``'``, ``\"``, ``\\\"``...) to the
#: same quote followed by what may follow a value (space, punctuation, a backslash, a
#: quote, the end); else to the first same quote; else (an unterminated value) to the end
#: of the line. Backslash escapes are taken two characters at a time, so ``"a\"b"`` is
#: one value.
_BODY = r"(?:\\.|[^\\\n])"
_QUOTED = (r"(?P<q>\\{0,7}[\"'])(?!\[REDACTED:)"
           r"(?:(?P<v1>" + _BODY + r"{1,512}?)(?P=q)(?=[\s,;:}\])>&|/\\\"']|$)"
           r"|(?P<v2>" + _BODY + r"{1,512}?)(?P=q)"
           r"|(?!(?P=q))(?P<v3>[^\r\n]+))")
#: An unquoted value: to whitespace, a quote or a backslash (a JSON escape such as
#: ``\n``), neither opening a structure (``"auth": {``) nor one of the words a type hint
#: or a literal is (``password: str``, ``"token": null``) nor a comparison (``==``).
_UNQUOTED = (r"(?![\[{(<=])(?!\[REDACTED:)"
             r"(?!(?i:null|none|true|false|str|string|int|bytes|bool|undefined|optional)"
             r"(?![A-Za-z0-9_]))"
             r"(?P<v4>[^\s\"'\\`<>]+)")
_VALUE = f"(?:{_QUOTED}|{_UNQUOTED})"


def _named(names: str) -> str:
    """A rule: a key ending with one of ``names``, a separator and its value."""
    return f"(?i:{names}){_SEP}{_VALUE}"


def _flag(names: str) -> str:
    """A rule: a command-line flag ending with one of ``names`` and its value
    (``--aws-secret-access-key VALUE``; ``--token=VALUE`` is a ``key=value`` too)."""
    return (r"--(?<![\w-]--)(?:[A-Za-z0-9]+[_-])*(?i:" + names + r")(?:[ \t]+|=)(?!-)"
            + _VALUE)


#: ``(kind, words, rule)``: a rule's regular expression, and the words (lower case) one of
#: which a text must hold for the rule to match. Rules apply in this order, so the more
#: specific comes first (``sk-ant-`` before ``sk-``, a header before a key name). Bounded
#: repetitions only where a key has a fixed length; an unterminated PEM block is redacted
#: up to 8 KiB past its header (a key is shorter), so that no block makes a scan quadratic.
RULES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("private_key", ("-----begin",),
     r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY( BLOCK)?-----(?:(?!-----END)[\s\S]){0,8192}"
     r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY( BLOCK)?-----)?"),
    ("aws_access_key", ("akia", "asia", "abia", "acca", "a3t"),
     r"(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}"),
    ("aws_secret_key", ("secret",),
     r"(?i:aws_?secret_?(?:access_?)?key|secret_?access_?key)[\"'\\ \t]*[:=][\"'\\ \t]*"
     r"(?!\[REDACTED:)(?P<v>[A-Za-z0-9/+=]{16,})"),
    ("github_token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
     r"gh[pousr]_[A-Za-z0-9]{20,255}|github_pat_[A-Za-z0-9_]{22,255}"),
    ("gitlab_token", ("glpat-", "gldt-", "glft-", "glsoat-", "glrt-", "glcbt-", "glptt-",
                      "glimt-", "glagent-", "gloas-"),
     r"gl(?:pat|dt|ft|soat|rt|cbt|ptt|imt|agent|oas)-[A-Za-z0-9_\-]{20,}"),
    ("huggingface_token", ("hf_",), r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{30,}"),
    ("npm_token", ("npm_",), r"(?<![A-Za-z0-9])npm_[A-Za-z0-9]{30,}"),
    ("pypi_token", ("pypi-",), r"pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_\-]{20,}"),
    ("anthropic_key", ("sk-ant-",), r"sk-ant-[A-Za-z0-9_\-]{20,}"),
    ("openai_key", ("sk-",), r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_\-]{20,}"),
    ("stripe_key", ("_live_", "_test_", "whsec_"),
     r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}|whsec_[A-Za-z0-9]{24,}"),
    ("slack_token", ("xox", "xapp-"), r"xox[abposre]-[A-Za-z0-9\-]{10,}|xapp-[A-Za-z0-9\-]{10,}"),
    ("slack_webhook", ("hooks.slack.com",),
     r"https://hooks\.slack\.com/services/[A-Za-z0-9/_\-]+"),
    ("sendgrid_key", ("sg.",), r"SG\.[A-Za-z0-9_\-]{16,32}\.[A-Za-z0-9_\-]{16,64}"),
    ("google_api_key", ("aiza",), r"AIza[A-Za-z0-9_\-]{35}"),
    ("google_oauth", ("ya29.", "gocspx-"), r"ya29\.[A-Za-z0-9_\-]{20,}|GOCSPX-[A-Za-z0-9_\-]{20,}"),
    ("jwt", ("eyj",), r"eyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]*"),
    # A header's value is the rest of its line: a scheme and its credentials, several
    # cookies, AWS SigV4's comma-separated parts.
    ("auth_header", ("auth", "cookie", "api-key", "-token"),
     r"(?i:(?:proxy-)?authori[sz]ation|set-cookie|cookie|x-api-key|x-auth-token)"
     r"(?:\\{0,7}[\"'])?[ \t]{0,16}:[ \t]{0,16}(?!\\{0,7}[\"'])(?!\[REDACTED:)"
     r"(?P<v>[^\s\"'\\][^\r\n\"'\\]*)"),
    ("bearer_token", ("bearer",),
     r"(?i:bearer)[ \t]+(?!\[REDACTED:)(?P<v>[A-Za-z0-9._~+/\-]{16,}=*)"),
    ("basic_auth", ("basic",),
     r"(?i:basic)[ \t]+(?!\[REDACTED:)(?P<v>[A-Za-z0-9+/]{6,}={0,2})(?![A-Za-z0-9+/=])"),
    ("user_password", ("-u", "--user", "--proxy-user"),
     r"(?<![\w-])(?:-u|--user|--proxy-user)(?:[ \t]+|=)[\"']?(?!\[REDACTED:)"
     r"(?P<v>[^\s:\"'\\]{0,256}:[^\s\"'\\]+)"),
    ("url_password", ("://",),
     r"[A-Za-z][A-Za-z0-9+.\-]{0,31}://[^\s/?#@:\"'<>\\]{0,256}:"
     r"(?!\[REDACTED:)(?P<v>[^\s/?\"'<>\\]{1,256})@"),
    ("password", ("--",), _flag(_PASS_NAMES)),
    ("password", _PASS_WORDS, _named(_PASS_NAMES)),
    ("secret_value", ("--",), _flag(_SECRET_NAMES)),
    ("secret_value", _SECRET_WORDS, _named(_SECRET_NAMES)),
    ("secret_value", ("sig=", "signature="),
     r"(?i:sig|signature)=(?!\[REDACTED:)(?P<v>[^\s&#\"'<>\\]+)"),
)


#: The rules whose every match starts at one of their words: tried only there.
ANCHORED = frozenset({_flag(_PASS_NAMES), _named(_PASS_NAMES), _flag(_SECRET_NAMES),
                      _named(_SECRET_NAMES)})


def _basic_credentials(value: str) -> bool:
    """Whether a ``Basic`` scheme's value is base64 of ``user:password`` (and not the next
    word of a sentence about basic things)."""
    try:
        return b":" in base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False


#: Checks a match must pass to be redacted, by kind.
_VALID: dict[str, Callable[[str], bool]] = {"basic_auth": _basic_credentials}

_WORDS = sorted({w for _, words, _ in RULES for w in words})
#: Any rule's word, case-insensitively, in the syntax RE2 and Python share: Arrow picks
#: out with it the few cells of a table that need :func:`redact` at all.
TRIGGER = "(?i)" + "|".join(re.escape(w) for w in _WORDS)


def _trie(words: Iterable[str]) -> str:
    """An alternation of ``words`` factored by common prefixes, the longest first: Python's
    engine tries a flat alternation of 60 words branch by branch at every position (~7
    MB/s), this one ~4x as fast."""
    root: dict[str, Any] = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        alts = [re.escape(k) + emit(v) for k, v in sorted(node.items()) if k]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(root)


# Python's own check runs on the lower-cased text: the longest word starting at each
# position where one does; with the words that are prefixes of it, that is every word
# the text holds.
_FIND_WORD = re.compile(_trie(_WORDS))
_PREFIXES = {w: frozenset(p for p in _WORDS if w.startswith(p)) for w in _WORDS}


def _words_in(low: str) -> set[str]:
    """Every rule word that ``low`` holds."""
    found: set[str] = set()
    pos, search = 0, _FIND_WORD.search
    while (match := search(low, pos)) is not None:
        found |= _PREFIXES[match.group()]
        pos = match.start() + 1
    return found


def _replacer(kind: str) -> Callable[[re.Match[str]], str]:
    tag = f"[REDACTED:{kind}]"
    valid = _VALID.get(kind)

    def replace(match: re.Match[str]) -> str:
        spans = [match.span(g) for g in match.re.groupindex if g.startswith("v")]
        spans = [s for s in spans if s[0] >= 0]
        if not spans:
            return tag
        (a, b), start, whole = spans[0], match.start(), match.group()
        if valid is not None and not valid(whole[a - start:b - start]):
            return whole
        return whole[: a - start] + tag + whole[b - start:]

    return replace


_RULES = tuple((kind, words, re.compile(rule), _replacer(kind),
                re.compile("|".join(re.escape(w) for w in words)) if rule in ANCHORED else None)
               for kind, words, rule in RULES)


def _anchored(rule: re.Pattern[str], anchors: re.Pattern[str] | None, text: str,
              low: str, overlapping: bool = False) -> Iterator[re.Match[str]]:
    """``rule.finditer(text)`` for a rule whose matches start at an anchor: the rule is
    tried only where ``anchors`` finds one in ``low`` (``text`` lower-cased), leftmost
    first, matches not overlapping, as ``finditer`` does; with ``overlapping``, at every
    anchor, inside an earlier match too. A rule without anchors, or a ``low`` whose
    length lower() changed (a rare letter), gets the plain scan."""
    if anchors is None or len(low) != len(text):
        yield from rule.finditer(text)
        return
    last = 0
    for hit in anchors.finditer(low):
        if hit.start() < last and not overlapping:
            continue
        match = rule.match(text, hit.start())
        if match is not None:
            yield match
            last = match.end()


def _sub(rule: re.Pattern[str], anchors: re.Pattern[str] | None,
         replace: Callable[[re.Match[str]], str], text: str, low: str) -> str:
    """``rule.sub(replace, text)`` over :func:`_anchored`'s matches; ``text`` itself when
    none."""
    if anchors is None or len(low) != len(text):
        return rule.sub(replace, text)  # the plain scan, in C
    out: list[str] = []
    last = 0
    for match in _anchored(rule, anchors, text, low):
        out += (text[last:match.start()], replace(match))
        last = match.end()
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


#: The value groups of the rules that read the value after a key's name (a password's, a
#: secret's: the :data:`ANCHORED` ones).
_VALUE_GROUPS = ("v1", "v2", "v3", "v4")
#: A tag :func:`redact` wrote (a capturing group: ``split`` keeps the tags, between the
#: other parts).
_TAG = re.compile(r"(\[REDACTED:[a-z_]+\])")
#: A keyed value at least this long is redacted wherever it is left (:func:`_left_over`);
#: a shorter one could be any word of the text.
LEFT_OVER_MIN = 8


def _left_over(original: str, text: str, present: set[str]) -> str:
    """``text`` (``original`` through the rules) without any value a keyed rule finds in
    ``original``, wherever it is left.

    A keyed rule can take the next key for its value: in ``PASS :credentials => v`` the
    password rule redacts ``credentials`` (and in ``token: credentials => v`` the secret
    rule does), and ``v`` is then no key's value. Each keyed rule whose words
    ``original`` holds (``present``) is tried again on it, at every one of its anchors,
    inside an earlier match too, and its values (from :data:`LEFT_OVER_MIN` characters)
    are redacted wherever they are still in ``text``: repeats of a secret too.
    """
    low = original.lower()
    for kind, words, rule, _, anchors in _RULES:
        if anchors is None or present.isdisjoint(words):
            continue
        for match in _anchored(rule, anchors, original, low, overlapping=True):
            for group in _VALUE_GROUPS:
                value = match.group(group)
                if value is not None and len(value) >= LEFT_OVER_MIN and value in text:
                    # Never inside a tag already there (a value "REDACTED", say).
                    parts = _TAG.split(text)
                    parts[::2] = [p.replace(value, f"[REDACTED:{kind}]") for p in parts[::2]]
                    text = "".join(parts)
    return text


def redact(text: str) -> str:
    """``text`` with every credential it holds replaced by ``[REDACTED:<kind>]``.

    Idempotent, and the text itself (no copy) when nothing matches: one scan of the
    lower-cased text for the rules' words decides, and only the rules whose words are
    there run.
    """
    low = text.lower()
    present = _words_in(low)
    if not present:
        return text
    original = text
    for _, words, rule, replace, anchors in _RULES:
        if not present.isdisjoint(words):
            new = _sub(rule, anchors, replace, text, low)
            if new is not text:
                text, low = new, new.lower()
    if text is original or text == original:
        # Nothing redacted (a match a check turned down, a "Basic" that is not
        # credentials, made a copy): no keyed rule matched, nothing can be left over.
        return original
    return _left_over(original, text, present)


def quote(text: str, limit: int) -> str:
    """``text`` redacted, *then* cut to at most ``limit`` characters (``…`` marks a cut):
    the one way to quote input in a bounded place (finding details, messages).

    Parameters
    ----------
    text:
        Text from the input (a kind, an id, a line).
    limit:
        The most characters returned.
    """
    text = redact(text)
    if len(text) <= limit:
        return text
    return text[: limit - 1] + "…" if limit > 0 else ""


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
