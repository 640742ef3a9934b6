"""The redactor's corpus of secret formats, the detail path's order (redact, then cut), and
the helpers that make transcript text safe for a terminal, a spreadsheet and a web page."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipeline.costs.report import spreadsheet_table
from pipeline.ledger.redact import quote, redact
from pipeline.ledger.text import html_text, spreadsheet_safe, terminal_safe

#: (name, the secret value) of every shape with a known prefix.
TOKENS = [
    ("aws_access_key", "AKIAZ7Q3XAMPLE7KEY42"),
    ("aws_sts_key", "ASIAQ2W3E4R5T6Y7U8I9"),
    ("github_pat", "ghp_R3aLL0ngT0kenF0rTheTest5uite12345678"),
    ("github_oauth", "gho_16C7e42F292c6912E7710c838347Ae178B4a"),
    ("github_server", "ghs_16C7e42F292c6912E7710c838347Ae178B4a"),
    ("github_fine", "github_pat_11ABCDEFG0abcdefghijklmn_opqrstuvwxyz0123456789ABCDEFGHIJ"),
    ("gitlab", "glpat-Zx8Cv7Bn6Mm5Ll4Kk3Jj"),
    ("huggingface", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"),
    ("npm", "npm_Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2"),
    ("slack_bot", "xoxb-2481632641-1357911131517-QwErTyUiOpAsDfGh"),
    ("slack_user", "xoxp-2481632641-1357911131517-QwErTyUiOpAsDfGh"),
    ("stripe_live", "sk_live_51H8xYzAbCdEfGhIjKlMnOp"),
    ("stripe_restricted", "rk_live_51H8xYzAbCdEfGhIjKlMnOp"),
    ("openai", "sk-Tq9vXw2LmN8pR4sT6uV0yZ1aB3cD5eF7gH9"),
    ("openai_project", "sk-proj-Tq9vXw2LmN8pR4sT6uV0yZ1aB3cD5eF7gH9"),
    ("anthropic", "sk-ant-api03-Zx8Cv7Bn6Mm5Ll4Kk3Jj2Hh1Gg0Ff9Dd8Ss7Aa6"),
    ("google", "AIzaSyD-1234567890abcdefghijklmnopqrstu"),
    ("google_oauth", "ya29.a0AfH6SMBx1234567890abcdefghij"),
    ("jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ2YWtwaXBlIn0.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg"),
]
#: (name, key, value): secrets known by the name of the key they are the value of.
NAMED = [
    ("password", "password", "hunter 2&#@x!"),
    ("db_password", "DB_PASSWORD", "Tr0ub4dor&3#pass"),
    ("passwd", "passwd", "c0rrect-h0rse"),
    ("pwd", "MYSQL_PWD", "s3cr3t@db#1"),
    ("secret", "client_secret", "cs_9f8e7d6c5b4a3"),
    ("token", "token", "tok 4f5e6d7c&8b9a"),
    ("api_key", "api_key", "ak_12ab34cd56ef78"),
    ("apikey", "apiKey", "0a1b2c3d4e5f6a7b8c"),
    ("access_key", "access_key", "minio-Acc3ss-K3y99"),
    ("private_key", "private_key", "pk-0f9e8d7c6b5a4"),
    ("session_token", "AWS_SESSION_TOKEN", "FwoGZXIvYXdzEJr//////////wEaD"),
    ("auth", "auth", "Zm9vOmJhcmJhemJhcg"),
    ("credential", "credentials", "cr3d-3nt1al-v4lue"),
    ("azure", "AccountKey", "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq=="),
    ("aws_secret", "aws_secret_access_key", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzSECRET99"),
]
#: (name, text, the secret in it) of carriers that are neither of the above.
OTHER = [
    ("basic_header", "Authorization: Basic dXNlcjpodW50ZXIyIHdpdGggc3BhY2Vz",
     "dXNlcjpodW50ZXIyIHdpdGggc3BhY2Vz"),
    ("bearer_header", "Authorization: Bearer 7f3a9c2e5b8d4f1a6c0e9b2d7a4f8c1e",
     "7f3a9c2e5b8d4f1a6c0e9b2d7a4f8c1e"),
    ("api_key_header", "X-Api-Key: 9c2e5b8d4f1a6c0e9b2d", "9c2e5b8d4f1a6c0e9b2d"),
    ("cookie_header", "Cookie: session=8d4f1a6c0e9b2d7a; csrf=1a6c0e9b",
     "8d4f1a6c0e9b2d7a"),
    ("url_userinfo", "https://deploy:p4ss@w0rd#1@git.example.com/repo.git", "p4ss@w0rd#1"),
    ("db_url", "postgres://admin:Hunter2Tr0ub4dorX@db.internal:5432/app", "Hunter2Tr0ub4dorX"),
    ("cli_aws", "aws s3 cp x s3://b --aws-secret-access-key wJalrXUtnFEMI/K7MDENGbPxRf",
     "wJalrXUtnFEMI/K7MDENGbPxRf"),
    ("cli_password", "psql --password 'c0rrect horse' -h db", "c0rrect horse"),
    ("cli_token", "gh auth login --with-token --token=Zq8Wx7Ec6Rv5Tb4Yn3", "Zq8Wx7Ec6Rv5Tb4Yn3"),
    ("curl_user", "curl -u admin:Sup3rS3cr3tPw https://x", "Sup3rS3cr3tPw"),
    ("azure_conn", "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey="
     "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq==;EndpointSuffix=core",
     "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq=="),
    ("private_key", "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx4Ul7kq0aB3c\n"
     "-----END RSA PRIVATE KEY-----", "MIIEowIBAAKCAQEAx4Ul7kq0aB3c"),
]


def _named_forms(key: str, value: str) -> list[str]:
    """A key and its value in every carrier: JSON, JSON-escaped (twice), quoted, and
    ``key=value``, ``key: value``, ``key => value`` when the value has no space."""
    plain = json.dumps({key: value, "next": 1})
    forms = [plain, json.dumps(plain)[1:-1], json.dumps(json.dumps(plain))[1:-1],
             f"{key} = '{value}'", f'{key}="{value}"', f"{{'{key}': '{value}'}}",
             f"{key}: \"{value}\"\n"]
    if " " not in value:
        forms += [f"{key}={value}", f"export {key}={value}\n", f"{key}: {value}",
                  f"  {key}: {value}\n", f":{key} => {value},"]
    return forms


#: (case id, text, the secret in it): every secret of the corpus in every carrier.
CORPUS: list[tuple[str, str, str]] = []
for _name, _token in TOKENS:
    for _i, _form in enumerate([_token, json.dumps({"out": f"key {_token}"}),
                                json.dumps(json.dumps({"x": _token}))[1:-1], f"'{_token}'",
                                f"SOMETHING: {_token}"]):
        CORPUS.append((f"{_name}-{_i}", _form, _token))
for _name, _key, _value in NAMED:
    for _i, _form in enumerate(_named_forms(_key, _value)):
        CORPUS.append((f"{_name}-{_i}", _form, _value))
for _name, _text, _secret in OTHER:
    for _i, _form in enumerate([_text, json.dumps({"t": _text})]):
        CORPUS.append((f"{_name}-{_i}", _form, _secret))


def _escaped(secret: str) -> list[str]:
    """The secret as it may appear: itself, and JSON-escaped once and twice."""
    once = json.dumps(secret)[1:-1]
    return [secret, once, json.dumps(once)[1:-1]]


def _fragments(secret: str, size: int = 8) -> set[str]:
    return {secret[i:i + size] for i in range(len(secret) - size + 1)}


def leaks(out: str, secret: str) -> list[str]:
    """Every substring of 8 characters or more of ``secret`` (as it may be escaped) found
    in ``out``."""
    return sorted(f for s in _escaped(secret) for f in _fragments(s) if f in out)


@pytest.mark.parametrize(("case", "text", "secret"), CORPUS, ids=[c for c, _, _ in CORPUS])
def test_every_secret_in_every_carrier_is_redacted(case: str, text: str, secret: str) -> None:
    out = redact(text)
    assert not leaks(out, secret), (text, out)
    assert "[REDACTED:" in out
    assert redact(out) == out  # idempotent


def test_a_quoted_value_runs_to_its_closing_quote_and_no_further() -> None:
    assert redact('{"password": "a b&c#d@e", "user": "bob"}') == \
        '{"password": "[REDACTED:password]", "user": "bob"}'
    assert redact('{"password": "say \\"hi\\" now", "n": 1}') == \
        '{"password": "[REDACTED:password]", "n": 1}'
    assert redact('"password": "unterminated and long') == '"password": "[REDACTED:password]'
    assert redact('"password": ""') == '"password": ""'


@pytest.mark.parametrize("text", [
    "max_tokens: 4096", '"input_tokens": 120, "output_tokens": 10', "token_count=3",
    "def login(password: str, token: str | None = None) -> bool:",
    "if token == expected:", '"auth": {"type": "oauth"}', "the basic configuration works",
    "git push -u origin main", "the key is in the drawer", "keyboard: us",
    "bypass: true", "compass=north", "task-abcdefghijklmnopqrstuvwxyz0123",
    "https://example.com/path?q=1", "0199a1f2-6a00-7000-8000-00000000abcd",
    "sha256 946f0e1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e", "--no-password --verbose",
])
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact(text) is text


def test_quote_redacts_before_it_cuts() -> None:
    key = "sk-LEAK" + "abcdefghijklmnopqrstuvwxyz0123456789"
    # the defect: kind[:40] first left "sk-LEAKabcd…", which no rule knows any more
    assert "LEAK" not in quote(f"kind {key} x", 20)
    assert quote("abcdef", 4) == "abc…" and quote("abc", 4) == "abc"
    assert len(quote("x" * 500, 200)) == 200


#: What may stand around a secret: a word boundary of any kind.
_SEPARATORS = st.sampled_from([" ", "\n", "\t", ", ", "; ", "(", ") ", " | ", "\r\n", "> "])


def test_a_key_taken_for_an_earlier_rules_value_leaves_no_secret() -> None:
    """Found by the property below in a CI run: the password rule took ``credentials``
    (the next key) for the value of ``PASS``, and the secret after it was left as no
    key's value; a rule taking the next key of its own kind did the same. Every keyed
    rule's values in the original text are redacted wherever they are left
    (:func:`pipeline.ledger.redact._left_over`)."""
    text = "PASS :credentials => cr3d-3nt1al-v4lue, "
    assert redact(text) == "PASS :[REDACTED:password] => [REDACTED:secret_value] "
    assert "cr3d" not in quote(text, 38)
    assert redact('PASS :credentials => "cr3d 3nt1al v4lue"') == \
        'PASS :[REDACTED:password] => "[REDACTED:secret_value]"'
    # a value left elsewhere goes too; never inside a tag already written
    assert redact("token: abcdefgh12345 and again abcdefgh12345") == \
        "token: [REDACTED:secret_value] and again [REDACTED:secret_value]"
    assert redact("token: REDACTED") == "token: [REDACTED:secret_value]"
    # the same rule taking the next key (its own kind) for the value
    assert redact("token: credentials => cr3d-3nt1al-v4lue") == \
        "token: [REDACTED:secret_value] => [REDACTED:secret_value]"
    assert redact("password: pwd => hunter2hunter2") == \
        "password: [REDACTED:password] => [REDACTED:password]"


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(CORPUS), before=st.text(max_size=120),
       after=st.text(max_size=120), left=_SEPARATORS, right=_SEPARATORS,
       limit=st.integers(min_value=0, max_value=400))
@example(case=("credential-11", ":credentials => cr3d-3nt1al-v4lue,", "cr3d-3nt1al-v4lue"),
         before="PASS", after="", left=" ", right=" ", limit=38)
def test_no_part_of_a_secret_survives_the_detail_path(
        case: tuple[str, str, str], before: str, after: str, left: str, right: str,
        limit: int) -> None:
    """A secret of the corpus at any place in any text, then cut at any length through
    the detail path (:func:`quote`): no 8 characters of it are left."""
    _, carrier, secret = case
    text = before + left + carrier + right + after
    out = quote(text, limit)
    assert len(out) <= limit
    found = [f for f in leaks(out, secret) if f not in before + after]
    assert not found, (text, out)


def test_terminal_safe_escapes_what_a_terminal_acts_on() -> None:
    hostile = "\x1b]0;pwned\x07\x1b[2Jhi\r\u202eevil\x9b1m\x00"
    out = terminal_safe(hostile)
    assert all(ch.isprintable() for ch in out)
    assert out == "\\x1b]0;pwned\\x07\\x1b[2Jhi\\r\\u202eevil\\x9b1m\\x00"
    assert terminal_safe("a\nb\tc") == "a\\nb\\tc"  # one field stays one line
    assert terminal_safe("a\nb\tc\x1b", multiline=True) == "a\nb   c\\x1b"
    plain = "plain text, ünïcode ✓"
    assert terminal_safe(plain) is plain


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_terminal_safe_leaves_nothing_a_terminal_acts_on(text: str) -> None:
    for line in terminal_safe(text, multiline=True).split("\n"):
        assert "\x1b" not in line and "\r" not in line and "\x9b" not in line
    assert "\n" not in terminal_safe(text)


@pytest.mark.parametrize(("cell", "safe"), [
    ('=HYPERLINK("http://x","y")', '\'=HYPERLINK("http://x","y")'), ("@SUM(A1)", "'@SUM(A1)"),
    ("+1", "'+1"), ("-2+3", "'-2+3"), ("\tx", "'\tx"), ("\rx", "'\rx"),
    ("gpt-4.1", "gpt-4.1"), ("", ""), ("a=b", "a=b"),
])
def test_spreadsheet_safe(cell: str, safe: str) -> None:
    assert spreadsheet_safe(cell) == safe


def test_spreadsheet_table_touches_string_cells_only() -> None:
    table = pa.table({"model": ['=HYPERLINK("http://x","y")', "ok", None],
                      "billed_usd": [-1.5, 2.0, 0.0], "n": [-3, 1, 2]})
    out = spreadsheet_table(table)
    assert out["model"].to_pylist() == ['\'=HYPERLINK("http://x","y")', "ok", None]
    assert out["billed_usd"].to_pylist() == [-1.5, 2.0, 0.0]
    assert out["n"].to_pylist() == [-3, 1, 2] and out.schema == table.schema


def test_html_text() -> None:
    assert html_text('<a href="https://evil">x</a> & co') == \
        '&lt;a href="https://evil"&gt;x&lt;/a&gt; &amp; co'
