"""Tests of pipeline.io.storage: resolving URLs, listing archives, streamed reads, errors.

The same archive is listed through every kind of storage vakpipe supports (a plain
path, ``file://``, ``memory://`` and ``s3://`` on moto's server over real HTTP); objects
that are not sessions are skipped and counted; hostile keys stay data; storage failures
become one-line :mod:`pipeline.errors` naming the URL.
"""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path

import fsspec
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from pipeline.errors import (
    EmptyInputError,
    OutputInsideArchiveError,
    PipelineError,
    StorageError,
    UsageError,
)
from pipeline.io import storage
from pipeline.io.storage import (
    Location,
    check_output,
    enumerate_sessions,
    forget_listing,
    locate,
    map_io,
    open_lines,
    parse_storage_options,
    resolve,
    shown_url,
    storage_error,
)
from pipeline.ledger.layout import session_path
from pipeline.run.batches import audit_object
from pipeline.synth.fleet import GROUND_TRUTH, write_fleet
from pipeline.synth.local_s3 import LocalS3, free_port
from tests.helpers.ledgers import LedgerBuilder, usage
from tests.helpers.storage import BUCKET

CWD = "/home/me/proj"
CWD_HASH = "2d872b17b24e117e"  # FNV-1a of CWD (spec section 1)


def session_bytes(session_id: str, cwd: str = CWD) -> bytes:
    """A small valid session whose header names ``session_id``."""
    b = LedgerBuilder()
    b.header(session_id=session_id, cwd=cwd)
    b.user("hello")
    b.assistant("hi", u=usage(10, 2))
    return b.to_bytes()


def put(loc: Location, relative: str, data: bytes) -> None:
    """Write one object below ``loc`` (making folders on a local disk)."""
    fs = loc.filesystem()
    path = loc.join(relative)
    if loc.protocol == "file":
        fs.makedirs(os.path.dirname(path), exist_ok=True)
    fs.pipe_file(path, data)


def one_line(err: BaseException) -> str:
    text = str(err)
    assert text and "\n" not in text, repr(text)
    return text


# --- resolve and storage options -------------------------------------------------------


def test_resolve_protocols_and_paths(tmp_path: Path) -> None:
    plain = resolve(str(tmp_path / "a"))
    url = resolve(f"file://{tmp_path}/a/")
    assert (plain.protocol, plain.path) == ("file", str(tmp_path / "a"))
    assert (url.protocol, url.path) == ("file", str(tmp_path / "a"))
    assert resolve("relative/dir").path == os.path.abspath("relative/dir")
    assert resolve(f"{tmp_path}/x/../y").path == str(tmp_path / "y")
    assert (resolve("memory://arch").protocol, resolve("memory://arch").path) == ("memory", "/arch")
    s3 = resolve("s3://bucket/prefix/")
    assert (s3.protocol, s3.path) == ("s3", "bucket/prefix")
    assert resolve("s3a://bucket/p").protocol == "s3"
    # Bounded timeouts and retries on S3 unless the caller says otherwise.
    assert s3.storage_options["config_kwargs"]["connect_timeout"] == 5
    assert s3.storage_options["config_kwargs"]["retries"]["max_attempts"] == 5


def test_resolve_keeps_s3_defaults_beside_a_partial_override() -> None:
    loc = resolve("s3://bucket/p", parse_storage_options(["config_kwargs.retries.max_attempts=1"]))
    config = loc.storage_options["config_kwargs"]
    assert config["retries"] == {"max_attempts": 1, "mode": "adaptive"}
    assert config["connect_timeout"] == 5 and config["read_timeout"] == 60
    # The module defaults are not mutated by a caller's override.
    assert resolve("s3://bucket/p").storage_options["config_kwargs"]["retries"]["max_attempts"] == 5


def test_location_filesystem_is_one_instance_and_options_stay_put(s3: LocalS3) -> None:
    loc = resolve(f"s3://{BUCKET}/archive")
    options = copy.deepcopy(loc.storage_options)
    fs = loc.filesystem()
    fs.ls(BUCKET)  # the first request builds botocore's client from the options
    assert loc.storage_options == options
    assert loc.filesystem() is fs  # so listings cached by one call serve the next


@pytest.mark.parametrize(("options", "message"), [
    ({"endpoint_url": "notaurl"}, "do not make an S3 client: Invalid endpoint: notaurl"),
    ({"client_kwargs": {"region_name": "x y"}}, "do not make an S3 client: Provided region"),
    ({"no_such_option": 1}, "unexpected keyword argument 'no_such_option'"),
    ({"max_concurrency": "abc"}, "do not fit its filesystem"),
])
def test_resolve_refuses_options_botocore_cannot_use(options: dict[str, object],
                                                     message: str) -> None:
    with pytest.raises(UsageError) as info:
        resolve("s3://bucket/p", options)
    assert one_line(info.value).startswith("s3://bucket/p: the storage options")
    assert message in str(info.value)


def test_resolve_makes_the_client_every_later_call_uses(s3: LocalS3) -> None:
    loc = resolve(f"s3://{BUCKET}/archive")
    fs = loc.filesystem()
    client = fs._s3
    assert client is not None  # made as the location was resolved, no request sent
    fs.ls(BUCKET)
    assert fs._s3 is client


@pytest.mark.parametrize("text", ["2026-12-07T07:03:26.000Z", "2026-12-07T07:03:26Z",
                                  "2026-12-07T07:03:26.123456+02:00",
                                  "Mon, 07 Dec 2026 07:03:26 GMT", "1796626206"])
def test_s3_timestamps_are_the_instants_botocore_parses(text: str) -> None:
    from botocore.utils import parse_timestamp

    assert storage._s3_timestamp(text) == parse_timestamp(text)


def test_a_resolved_location_lists_with_the_fast_timestamps(
    s3: LocalS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The command's listing: the same entries as a plain s3fs instance lists, its
    # timestamps parsed by the standard library (2.4x less CPU: bench/listing_scale.py).
    for name in ("a", "b"):
        put(resolve(f"s3://{BUCKET}/archive"), f"{name}.jsonl", b"{}\n")
    parsed: list[str] = []

    def counted(text: str) -> object:
        parsed.append(text)
        return real(text)

    real = storage._s3_timestamp
    monkeypatch.setattr(storage, "_s3_timestamp", counted)
    fsspec.filesystem("s3").clear_instance_cache()
    loc = resolve(f"s3://{BUCKET}/archive")
    found = loc.filesystem().find(loc.path, detail=True)
    assert len(parsed) == 2 and all(text.endswith("Z") for text in parsed)
    plain = fsspec.filesystem("s3", skip_instance_cache=True)
    assert found == plain.find(loc.path, detail=True) and len(found) == 2


def test_forget_listing_drops_every_folder_listed_below_the_root(s3: LocalS3) -> None:
    # s3fs's own invalidate_cache(root) drops the root and its parents only: the
    # folders below stayed cached (~1.3 KiB a session) after a night had invalidated.
    root = resolve(f"s3://{BUCKET}/archive")
    other = resolve(f"s3://{BUCKET}/archived")  # a sibling whose name starts the same
    for loc in (root, other):
        put(loc, "agents/vak/sessions/h/s.jsonl", b"{}\n")
        loc.filesystem().find(loc.path)  # as enumerate_sessions lists
    cache = root.filesystem().dircache
    assert [p for p in cache if p.startswith(root.path + "/")]
    forget_listing(root)
    assert not [p for p in cache if p == root.path or p.startswith(root.path + "/")]
    assert [p for p in cache if p.startswith(other.path + "/")]  # not below the root


def test_resolve_refuses_unknown_protocols() -> None:
    with pytest.raises(UsageError, match="nosuchproto://x"):
        resolve("nosuchproto://x")


@pytest.mark.parametrize("url", ["", " ", "\t"])
def test_resolve_refuses_an_empty_location(url: str) -> None:
    # fsspec would read it as the current folder: an unset `--out "$OUT"` must not
    # audit, or write beside, whatever folder the command ran in.
    with pytest.raises(UsageError, match="empty location"):
        resolve(url)


@pytest.mark.parametrize(("url", "shown"), [
    ("ftp://alice:hunter2@host:21/x", "ftp://alice:***@host:21/x"),
    ("https://bob:p%40ss@host/a/b", "https://bob:***@host/a/b"),
    ("https://token@host/a", "https://token@host/a"),  # a user alone is no secret
    ("s3://bucket/a:b@c", "s3://bucket/a:b@c"),  # an @ in the path is a key's own
    ("/tmp/a:b@c", "/tmp/a:b@c"),
])
def test_a_password_in_a_url_is_never_shown(url: str, shown: str) -> None:
    assert shown_url(url) == shown


def test_a_filesystem_that_fails_as_it_is_made_is_one_error_without_the_password() -> None:
    # ftp connects as its filesystem is made: nothing listens on this port.
    url = f"ftp://alice:hunter2@127.0.0.1:{free_port()}/x"
    with pytest.raises(StorageError, match="storage unreachable or refused") as err:
        resolve(url)
    assert "hunter2" not in str(err.value) and "alice:***@" in str(err.value)


@pytest.mark.parametrize("url", ["fleet", "s3://b/x/", "memory://a/b", "file:///tmp/x",
                                 "/tmp/a b/c"])
def test_locate_is_where_resolve_would_point(url: str) -> None:
    located, resolved = locate(url), resolve(url)
    assert located is not None
    assert (located.protocol, located.path) == (resolved.protocol, resolved.path)


def test_locate_connects_to_nothing() -> None:
    located = locate(f"ftp://alice:hunter2@127.0.0.1:{free_port()}/x")  # nothing listens
    assert located is not None and "hunter2" not in located.url
    assert locate("nosuchproto://x") is None


def test_location_picklable_and_contains() -> None:
    import pickle

    loc = resolve("s3://bucket/archive", {"endpoint_url": "http://127.0.0.1:1"})
    assert pickle.loads(pickle.dumps(loc)) == loc
    assert loc.join("agents", "x") == "bucket/archive/agents/x"


def test_parse_storage_options() -> None:
    opts = parse_storage_options([
        "endpoint_url=http://127.0.0.1:5000",
        "anon=false",
        "use_ssl=TRUE",
        "max_concurrency=4",
        "ratio=0.5",
        'client_kwargs={"region_name": "eu-west-1"}',
        "config_kwargs.retries.max_attempts=2",
        "config_kwargs.connect_timeout=3",
        "token=a=b=c",
        "empty=",
        "word=hello world",
        "null=null",
    ])
    assert opts == {
        "endpoint_url": "http://127.0.0.1:5000",
        "anon": False,
        "use_ssl": True,
        "max_concurrency": 4,
        "ratio": 0.5,
        "client_kwargs": {"region_name": "eu-west-1"},
        "config_kwargs": {"retries": {"max_attempts": 2}, "connect_timeout": 3},
        "token": "a=b=c",
        "empty": "",
        "word": "hello world",
        "null": "null",
    }
    assert parse_storage_options([]) == {}


@pytest.mark.parametrize("bad", [["novalue"], ["=x"], ["a=1", "a.b=2"], ["a.b=1", "a.b.c=2"]])
def test_parse_storage_options_refuses_malformed_pairs(bad: list[str]) -> None:
    with pytest.raises(UsageError) as info:
        parse_storage_options(bad)
    one_line(info.value)


# --- check_output -------------------------------------------------------------------------


@pytest.mark.parametrize("root, out", [
    ("s3://b/archive", "s3://b/archive"),
    ("s3://b/archive", "s3://b/archive/out"),
    ("s3://b", "s3://b/anything/deeper"),
    ("memory://arch", "memory://arch/out"),
    ("/data/archive", "/data/archive/out"),
    ("/data/archive", "file:///data/archive/x/y"),
    ("file:///data/archive/", "/data/archive/../archive/out"),
])
def test_check_output_refuses_an_output_inside_the_archive(root: str, out: str) -> None:
    with pytest.raises(OutputInsideArchiveError) as info:
        check_output(resolve(root), resolve(out))
    assert root in one_line(info.value) and out in str(info.value)


@pytest.mark.parametrize("root, out", [
    ("s3://b/archive", "s3://b/archive2"),
    ("s3://b/archive", "s3://b/out"),
    ("s3://b/archive", "s3://other/archive"),
    ("/data/archive", "/data/archive-out"),
    ("/data/archive", "s3://data/archive/out"),
    ("memory://data/archive", "/data/archive/out"),
])
def test_check_output_accepts_outputs_elsewhere(root: str, out: str) -> None:
    check_output(resolve(root), resolve(out))


@pytest.mark.parametrize("root, out", [
    ("s3://b/archive/sub", "s3://b/archive"),
    ("s3://b/reports/archive", "s3://b/reports"),
    ("/data/out/archive", "/data/out"),
])
def test_check_output_refuses_an_archive_inside_the_output(root: str, out: str) -> None:
    # A commit there could write over the archive (OUT/archive) or delete from it.
    with pytest.raises(OutputInsideArchiveError, match="inside the output"):
        check_output(resolve(root), resolve(out))


# --- enumeration over every kind of storage -----------------------------------------------


def test_same_fleet_lists_the_same_sessions_everywhere(
    s3: LocalS3, memfs: fsspec.AbstractFileSystem, tmp_path: Path
) -> None:
    local = tmp_path / "archive"
    urls = [str(local), f"file://{local}", "memory://fleet/archive", f"s3://{BUCKET}/archive"]
    for url in (urls[0], urls[2], urls[3]):
        written = write_fleet(resolve(url), sessions=20, seed=4, faults=True, size_scale=0.2)
        assert written.sessions == 20
    seen = {}
    for url in urls:
        listing = enumerate_sessions(resolve(url))
        assert listing.skipped == 1 and listing.skipped_examples == (GROUND_TRUTH,)
        assert listing.total_bytes == written.bytes
        seen[url] = [(s.key, s.size) for s in listing.sessions]
        assert all(s.full_path.endswith(s.key.path) for s in listing.sessions)
    assert len(seen[urls[0]]) == 20
    assert all(v == seen[urls[0]] for v in seen.values())
    # S3 listings carry the object's version (ETag, without its quotes).
    s3_listing = enumerate_sessions(resolve(urls[3]))
    assert all(s.etag and '"' not in s.etag for s in s3_listing.sessions)


NOT_SESSIONS = [
    GROUND_TRUTH,
    "README.md",
    "agents/vak/notes.jsonl",  # too shallow
    f"agents/vak/sessions/{CWD_HASH}.jsonl",  # too shallow
    f"agents/vak/sessions/{CWD_HASH}/nested/s.jsonl",  # too deep
    f"agents/vak/sessions/{CWD_HASH}/s.json",  # not .jsonl
    f"agents/vak/sessions/{CWD_HASH}/s.jsonl.bz2",  # .gz and .zst are read
    f"agents/vak/sessions/{CWD_HASH}/s.jsonl.tmp",
    f"agents/vak/sessions/{CWD_HASH}/.jsonl",  # no session id
    f"agents/vak/session/{CWD_HASH}/s.jsonl",  # not "sessions"
    f"other/vak/sessions/{CWD_HASH}/s.jsonl",  # not "agents"
    f"prefix/agents/vak/sessions/{CWD_HASH}/s.jsonl",  # one level too deep
]


@pytest.mark.parametrize("kind", ["local", "memory", "s3"])
def test_objects_that_are_not_sessions_are_counted_as_skipped(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    root = {
        "local": lambda: resolve(str(tmp_path / "archive")),
        "memory": lambda: (request.getfixturevalue("memfs"), resolve("memory://skips"))[1],
        "s3": lambda: (request.getfixturevalue("s3"), resolve(f"s3://{BUCKET}/skips"))[1],
    }[kind]()
    sid = "0199a1f2-5f00-7000-8000-00000000abcd"
    put(root, session_path("vak", CWD, sid), session_bytes(sid))
    for rel in NOT_SESSIONS:
        put(root, rel, b"{}\n")
    listing = enumerate_sessions(root)
    assert [s.key.session_id for s in listing.sessions] == [sid]
    assert listing.skipped == len(NOT_SESSIONS)
    assert listing.skipped_examples == tuple(sorted(NOT_SESSIONS)[:5])


def test_listing_stays_under_its_prefix(s3: LocalS3) -> None:
    sid = "0199a1f2-5f00-7000-8000-00000000abcd"
    for prefix in ("archive", "archive2", "archive-old"):
        put(resolve(f"s3://{BUCKET}/{prefix}"), session_path("vak", CWD, sid), session_bytes(sid))
    listing = enumerate_sessions(resolve(f"s3://{BUCKET}/archive"))
    assert len(listing.sessions) == 1 and listing.skipped == 0
    assert listing.sessions[0].full_path.startswith(f"{BUCKET}/archive/agents/")


# --- hostile keys -----------------------------------------------------------------------

SKIPPED_HOSTILE = [
    "agents/vak/sessions/../x.jsonl",
    f"agents/vak/sessions/{CWD_HASH}/../../../../etc.jsonl",
    f"agents/../agents/vak/sessions/{CWD_HASH}/s.jsonl",
    f"agents/vak/sessions/./{CWD_HASH}/s.jsonl",
    f"agents/vak/sessions/{CWD_HASH}/../s.jsonl",
    f"agents/./sessions/{CWD_HASH}/s.jsonl",
    f"agents//sessions/{CWD_HASH}/s.jsonl",
    f"agents/vak/sessions/{CWD_HASH}/..jsonl/s.jsonl",
    f"agents/vak/sessions/{CWD_HASH}/a\\..\\..\\b.jsonl",
    f"agents/vak/sessions/{CWD_HASH}/tab\tname.jsonl",
]
#: moto's server answers 404 to a key with a line break (real S3 takes it): memory only.
SKIPPED_HOSTILE_MEMORY = [f"agents/vak/sessions/{CWD_HASH}/line\nbreak.jsonl"]
#: Kept, as plain strings: nothing decodes or resolves them.
KEPT_HOSTILE = {
    "agents/vak/sessions/%2e%2e/pct.jsonl": "pct",
    f"agents/vak/sessions/{CWD_HASH}/..%2f..%2fescape.jsonl": "..%2f..%2fescape",
    f"agents/vak/sessions/{CWD_HASH}/%2e%2e%2fdot.jsonl": "%2e%2e%2fdot",
    f"agents/%2e%2e/sessions/{CWD_HASH}/...jsonl": "..",
}


def _hostile_archive(root: Location, long_id: str, skipped: list[str]) -> dict[str, str]:
    """Write hostile keys under ``root``; return {relative path: session id} of kept ones."""
    kept = {**KEPT_HOSTILE, f"agents/vak/sessions/{CWD_HASH}/{long_id}.jsonl": long_id}
    for rel, sid in kept.items():
        put(root, rel, session_bytes(sid))
    for rel in skipped:
        put(root, rel, session_bytes("decoy"))
    return kept


@pytest.mark.parametrize("kind", ["memory", "s3"])
def test_hostile_keys_are_skipped_or_kept_verbatim(
    kind: str, request: pytest.FixtureRequest
) -> None:
    request.getfixturevalue("memfs" if kind == "memory" else "s3")
    root = resolve("memory://hostile/archive" if kind == "memory" else f"s3://{BUCKET}/hostile")
    # S3 keys are at most 1,024 bytes: a session id that fills the key.
    long_id = "L" * (1000 - len(root.path) - len(f"/agents/vak/sessions/{CWD_HASH}/.jsonl"))
    skipped = SKIPPED_HOSTILE + (SKIPPED_HOSTILE_MEMORY if kind == "memory" else [])
    kept = _hostile_archive(root, long_id, skipped)
    listing = enumerate_sessions(root)
    assert {s.key.path for s in listing.sessions} == set(kept)
    assert listing.skipped == len(skipped)
    for obj in listing.sessions:
        assert obj.full_path == root.join(obj.key.path)  # the key, verbatim
        result = audit_object(root, obj)
        assert result.row["session_id"] == kept[obj.key.path], obj.key.path
        assert result.row["lines"] == 3
        assert not any(f.code.text == "unreadable_object" for f in result.findings)


def test_hostile_local_names_are_never_resolved(tmp_path: Path) -> None:
    """On a local disk, an encoded dot-dot name reads that very file, not its decoding."""
    root = resolve(str(tmp_path / "archive"))
    long_id = "L" * 240  # a file name is at most 255 bytes here
    kept = {**KEPT_HOSTILE, f"agents/vak/sessions/{CWD_HASH}/{long_id}.jsonl": long_id}
    for rel, sid in kept.items():
        put(root, rel, session_bytes(sid))
    # Decoys where a decoded or resolved key would land, inside and outside the root.
    put(root, "agents/vak/pct.jsonl", session_bytes("decoy"))
    put(root, "agents/vak/sessions/escape.jsonl", session_bytes("decoy"))
    put(resolve(str(tmp_path)), "escape.jsonl", session_bytes("decoy"))
    listing = enumerate_sessions(root)
    assert {s.key.path for s in listing.sessions} == set(kept)
    for obj in listing.sessions:
        assert os.path.realpath(obj.full_path).startswith(root.path + os.sep)
        assert audit_object(root, obj).row["session_id"] == kept[obj.key.path]


# --- streamed reads ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["local", "memory", "s3"])
def test_open_lines_streams_the_exact_physical_lines(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    root = {
        "local": lambda: resolve(str(tmp_path / "archive")),
        "memory": lambda: (request.getfixturevalue("memfs"), resolve("memory://lines"))[1],
        "s3": lambda: (request.getfixturevalue("s3"), resolve(f"s3://{BUCKET}/lines"))[1],
    }[kind]()
    sid = "0199a1f2-5f00-7000-8000-00000000abcd"
    body = session_bytes(sid) + b'{"torn tail, no newline' + b"x" * 100_000
    put(root, session_path("vak", CWD, sid), body)
    (obj,) = enumerate_sessions(root).sessions
    assert obj.size == len(body)
    with open_lines(root, obj) as lines:
        got = list(lines)
    assert b"".join(got) == body
    assert all(line.endswith(b"\n") for line in got[:-1]) and not got[-1].endswith(b"\n")


# --- errors -----------------------------------------------------------------------------


def test_unreachable_endpoint_fails_fast_with_one_line(
    s3_server: LocalS3, caplog: pytest.LogCaptureFixture
) -> None:
    url = "s3://some-bucket/archive"
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    # Two retries instead of the default five: with botocore's jittered exponential
    # backoff the default gives up after 8 to 30 s here (measured), too slow for a test;
    # test_resolve_protocols_and_paths checks those defaults.
    options = {"endpoint_url": endpoint, **parse_storage_options(
        ["config_kwargs.retries.max_attempts=2"])}
    with caplog.at_level(logging.DEBUG, logger="botocore.endpoint"), \
            pytest.raises(StorageError) as info:
        enumerate_sessions(resolve(url, options))
    text = one_line(info.value)
    assert text.startswith(f"{url}: storage endpoint unreachable"), text
    assert endpoint in text
    # "Fails fast" without a clock: the listing gives up after the request and the two
    # retries the options allow (botocore's max_attempts counts retries), and neither
    # s3fs nor vakpipe retries a refused connection on top of them.
    sends = [r for r in caplog.records
             if r.name == "botocore.endpoint" and r.getMessage().startswith("Sending http request")]
    assert len(sends) == 3, [r.getMessage()[:80] for r in sends]


def test_no_such_bucket(s3: LocalS3) -> None:
    url = "s3://no-such-bucket-here/archive"
    with pytest.raises(StorageError) as info:
        enumerate_sessions(resolve(url))
    assert one_line(info.value).startswith(f"{url}: no such bucket")
    assert isinstance(info.value, PipelineError) and isinstance(info.value, OSError)


@pytest.mark.parametrize("kind", ["local", "memory", "s3"])
def test_empty_prefix(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    url = {"local": str(tmp_path / "nothing-here"), "memory": "memory://nothing/here",
           "s3": f"s3://{BUCKET}/nothing-here"}[kind]
    request.getfixturevalue({"local": "tmp_path", "memory": "memfs", "s3": "s3"}[kind])
    with pytest.raises(EmptyInputError) as info:
        enumerate_sessions(resolve(url))
    # a local folder that is not there is said so (tests/integration/test_inputs.py)
    if kind == "local":
        assert one_line(info.value) == f"root {url} does not exist"
        return
    assert one_line(info.value).startswith(
        f"{url}: no session ledgers found (nothing under it); vakpipe reads agents/")


def test_only_other_objects_is_empty_input(memfs: fsspec.AbstractFileSystem) -> None:
    root = resolve("memory://others")
    for rel in NOT_SESSIONS[:3]:
        put(root, rel, b"x")
    with pytest.raises(EmptyInputError, match=r"memory://others: .*\(3 other objects under it\)"):
        enumerate_sessions(root)


@pytest.mark.parametrize("err, expected", [
    (FileNotFoundError("b/k"), "s3://b/k: no such bucket or path (b/k)"),
    (PermissionError("Access Denied\nmore"), "s3://b/k: access denied; check the credentials "
                                            "(Access Denied)"),
    (ClientError({"Error": {"Code": "SignatureDoesNotMatch", "Message": "no"}}, "ListObjectsV2"),
     "s3://b/k: access denied; check the credentials"),
    (ClientError({"Error": {"Code": "NoSuchBucket", "Message": "gone"}}, "ListObjectsV2"),
     "s3://b/k: no such bucket or path"),
    (EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
     "s3://b/k: storage endpoint unreachable"),
    (NotADirectoryError(20, "Not a directory", "/o/_staging"),
     "s3://b/k: a file where a folder is needed ([Errno 20] Not a directory: '/o/_staging')"),
    (IsADirectoryError(21, "Is a directory", "/o/x.html"),
     "s3://b/k: a folder where a file is needed"),
    (OSError(), "s3://b/k: storage error: OSError: OSError"),
    (TimeoutError("read timed out"), "s3://b/k: storage error: TimeoutError: read timed out"),
])
def test_storage_error_translation(err: BaseException, expected: str) -> None:
    translated = storage_error(err, "s3://b/k")
    assert isinstance(translated, StorageError)
    assert one_line(translated).startswith(expected)


def test_map_io_reads_side_by_side_only_over_the_network(s3: LocalS3) -> None:
    """In the items' order either way; threads only where a read waits on round trips;
    the first failing item's error, as a loop would raise it."""
    import threading

    def read(item: int) -> tuple[int, str]:
        if item in (2, 3):
            raise ValueError(f"item {item}")
        return item, threading.current_thread().name

    for url, threaded in ((f"s3://{BUCKET}/x", True), ("memory://x", False)):
        where = resolve(url)
        got = map_io(where, read, [0, 1, 4, 5])
        assert [i for i, _ in got] == [0, 1, 4, 5]
        assert all(name.startswith("vakpipe-read") == threaded for _, name in got)
        with pytest.raises(ValueError, match="item 2"):
            map_io(where, read, range(6))
    assert map_io(resolve(f"s3://{BUCKET}/x"), read, [7]) == [(7, "MainThread")]
