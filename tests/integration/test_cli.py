"""Tests of the ``vakpipe`` command line, through its installed entry point.

Subprocesses run the console script exactly as a user does (they inherit the S3
endpoint of the session's moto server from the environment); click's ``CliRunner``
covers the cases that need no process of their own. Every unusable setup must end with
exit code 2 and one line on stderr, never a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
import s3fs
from click.testing import CliRunner

from pipeline.cli import EXIT_FINDINGS, EXIT_OK, EXIT_UNUSABLE, main, run
from pipeline.cli._exits import EXIT_PIPE_CLOSED
from pipeline.io.commit import read_dataset, read_manifest
from pipeline.io.storage import Location, resolve
from pipeline.synth.fleet import write_fleet
from pipeline.synth.generator import generate_fleet, ground_truth
from pipeline.synth.local_s3 import CREDENTIALS, LocalS3, free_port, local_s3
from tests.helpers.storage import BUCKET, plain_rows, run_vakpipe, vakpipe_exe

ARCHIVE = f"s3://{BUCKET}/archive"


vakpipe = run_vakpipe


def assert_one_line_error(code: int | None, stderr: str, *names: str) -> str:
    """Exit 2, and stderr is a single ``vakpipe: error:`` line naming ``names``."""
    assert code == EXIT_UNUSABLE, stderr
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("vakpipe: error: "), stderr
    for name in names:
        assert name in lines[0], (name, stderr)
    return lines[0]


@pytest.fixture
def faulty_archive(s3: LocalS3) -> Location:
    archive = resolve(ARCHIVE)
    write_fleet(archive, sessions=30, seed=8, faults=True, size_scale=0.3)
    return archive


def error_sessions(archive: Location) -> int:
    truth = json.loads(archive.filesystem().cat_file(archive.join("ground-truth.json")))
    return sum(1 for t in truth.values() if t["fault"])


# --- audit: success and --fail-on -------------------------------------------------------


@pytest.mark.slow
def test_audit_through_the_entry_point(faulty_archive: Location, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = vakpipe("audit", ARCHIVE, "--out", str(out), "--workers", "2")
    assert done.returncode == EXIT_OK, done.stderr
    assert "30 sessions" in done.stdout and "(1 other objects skipped)" in done.stdout
    assert "findings by code:" in done.stdout
    assert f"tables: {out}/integrity/sessions" in done.stdout
    findings = plain_rows(read_dataset(resolve(str(out)), "integrity/findings"))
    assert any(f["severity"] == "error" for f in findings)
    assert len(plain_rows(read_dataset(resolve(str(out)), "integrity/sessions"))) == 30


def test_fail_on_error_exits_1(faulty_archive: Location, scheduler: str,
                               tmp_path: Path) -> None:
    assert error_sessions(faulty_archive) > 0
    runner = CliRunner()
    args = ["audit", ARCHIVE, "--scheduler", scheduler, "--no-progress"]
    plain = runner.invoke(main, [*args, "--out", str(tmp_path / "a")])
    assert plain.exit_code == EXIT_OK, plain.output
    failing = runner.invoke(main, [*args, "--out", str(tmp_path / "b"), "--fail-on", "error"])
    assert failing.exit_code == EXIT_FINDINGS, failing.output
    assert "status: error" in failing.stdout  # the summary is still printed
    manifest = read_manifest(resolve(str(tmp_path / "b")))
    assert manifest is not None and manifest["statuses"]["error"] > 0  # and committed


def test_fail_on_thresholds(s3: LocalS3, scheduler: str, tmp_path: Path) -> None:
    """Warnings fail ``--fail-on warning`` only; a clean fleet fails neither."""
    clean = f"s3://{BUCKET}/clean"
    write_fleet(resolve(clean), sessions=3, seed=1, size_scale=0.2)
    warned = f"s3://{BUCKET}/warned"
    fs = resolve(warned).filesystem()
    for src in fs.find(resolve(clean).path):
        if src.endswith(".jsonl"):  # a moved project: every session gets cwd_hash_mismatch
            rel = src[len(resolve(clean).path) + 1:].split("/")
            rel[3] = "0000000000000000"
            fs.copy(src, resolve(warned).join(*rel))
    codes = {}
    for root in (clean, warned):
        for level in ("error", "warning"):
            out = str(tmp_path / f"{root.rsplit('/', 1)[-1]}-{level}")
            codes[root, level] = run(["audit", root, "--out", out, "--scheduler", scheduler,
                                      "--fail-on", level, "--no-progress"])
    assert codes == {(clean, "error"): 0, (clean, "warning"): 0,
                     (warned, "error"): 0, (warned, "warning"): EXIT_FINDINGS}


# --- audit: unusable setups ---------------------------------------------------------------


@pytest.mark.slow
def test_no_such_bucket(s3: LocalS3, tmp_path: Path) -> None:
    url = "s3://no-such-bucket-anywhere/archive"
    done = vakpipe("audit", url, "--out", str(tmp_path / "out"))
    assert_one_line_error(done.returncode, done.stderr, url, "no such bucket")
    assert not (tmp_path / "out").exists()


def test_unreachable_endpoint(s3: LocalS3, tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # a closed port
    env = {**os.environ, "AWS_ENDPOINT_URL_S3": endpoint, "AWS_ENDPOINT_URL": endpoint}
    # One attempt (the default retries with backoff take ~10 s to give up); the retry
    # override also checks that it keeps the other bounded S3 defaults.
    done = vakpipe("audit", ARCHIVE, "--out", str(tmp_path / "out"),
                   "--storage-option", "config_kwargs.retries.max_attempts=1", env=env)
    assert_one_line_error(done.returncode, done.stderr, ARCHIVE, "unreachable", endpoint)


def test_empty_prefix(faulty_archive: Location, tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/nothing-here"
    result = CliRunner().invoke(main, ["audit", url, "--out", str(tmp_path / "out")])
    line = assert_one_line_error(result.exit_code, result.stderr, url)
    assert "no session ledgers found" in line


def test_output_inside_the_archive(faulty_archive: Location) -> None:
    out = f"{ARCHIVE}/results"
    result = CliRunner().invoke(main, ["audit", ARCHIVE, "--out", out])
    assert_one_line_error(result.exit_code, result.stderr, ARCHIVE, out, "inside the archive")
    assert not resolve(out).filesystem().exists(resolve(out).path)


@pytest.mark.parametrize("command", [["audit", "ROOT", "--out", ""],
                                     ["audit", "", "--out", "OUT"],
                                     ["cost", "", "--out", "OUT"],
                                     ["nightly", "ROOT", "--out", ""]])
def test_an_empty_location_is_refused(command: list[str], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # An unset `--out "$OUT"` in a script: never the folder the command runs in.
    write_fleet(resolve(str(tmp_path / "ROOT")), sessions=2, seed=1)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, command)
    assert_one_line_error(result.exit_code, result.stderr, "empty location")
    assert sorted(os.listdir(tmp_path)) == ["ROOT"]


@pytest.mark.parametrize(("args", "named"), [
    # NaN passed the range and timed the heartbeat's waits at zero (10,431 lines in a
    # two-second audit); inf or 1e308 overflowed them: a traceback from its thread
    (["audit", "--heartbeat", "nan"], "nan is not a number of seconds"),
    (["audit", "--heartbeat", "1e308"], "0<=x<=86400"),
    # past 2^62 a window was written null in every request row
    (["replay", "--window", str(2**63)], "1<=x<=4611686018427387904"),
    (["compact", "--window", str(2**63)], "1<=x<=4611686018427387904"),
    # a traceback from delta-rs after the night's commit
    (["nightly", "--format", "delta", "--keep-days", "99999999999999999999"], "0<=x<=36500"),
])
def test_numbers_past_what_a_run_can_use_are_refused(tmp_path: Path, args: list[str],
                                                     named: str) -> None:
    command, *flags = args
    done = subprocess.run([vakpipe_exe(), command, str(tmp_path / "none"), "--out",
                           str(tmp_path / "out"), *flags], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == EXIT_UNUSABLE and "Traceback" not in done.stderr, done.stderr
    assert named in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_bad_storage_option(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["audit", "memory://x", "--out", str(tmp_path),
                                       "--storage-option", "no-equals-sign"])
    assert_one_line_error(result.exit_code, result.stderr, "no-equals-sign")


@pytest.mark.parametrize(("options", "env", "named"), [
    (["endpoint_url=notaurl"], {}, "Invalid endpoint: notaurl"),
    ([], {"AWS_ENDPOINT_URL_S3": "notaurl", "AWS_ENDPOINT_URL": "notaurl"},
     "Invalid endpoint: notaurl"),
    (['client_kwargs={"endpoint_url": "zz"}'], {}, "Invalid endpoint: zz"),
    (["region_name=eu-west-1"], {}, "'region_name'"),  # belongs in client_kwargs
    (["max_concurrency=abc"], {}, "do not fit its filesystem"),
    # not JSON, so a string: each was a traceback (s3_additional_kwargs at the listing)
    (["client_kwargs={bad"], {}, "client_kwargs must be a JSON object"),
    (["config_kwargs=5"], {}, "config_kwargs must be a JSON object"),
    (["s3_additional_kwargs=x"], {}, "s3_additional_kwargs must be a JSON object"),
    (['config_kwargs={"retries": 5}'], {}, "do not make an S3 client"),
])
def test_storage_options_botocore_refuses(s3: LocalS3, tmp_path: Path, options: list[str],
                                          env: dict[str, str], named: str) -> None:
    # botocore refuses these only as the client is made; they were a traceback from
    # whichever request came first.
    flags = [arg for option in options for arg in ("--storage-option", option)]
    done = vakpipe("audit", ARCHIVE, "--out", str(tmp_path / "out"), *flags,
                   env={**os.environ, **env})
    assert_one_line_error(done.returncode, done.stderr, ARCHIVE, named)
    assert not (tmp_path / "out").exists()


def test_output_bucket_that_does_not_exist_is_not_created(
    faulty_archive: Location, scheduler: str
) -> None:
    out = "s3://no-such-output-bucket/results"
    result = CliRunner().invoke(main, ["audit", ARCHIVE, "--out", out,
                                       "--scheduler", scheduler])
    assert_one_line_error(result.exit_code, result.stderr, out, "no such bucket")
    assert "no-such-output-bucket" not in s3fs.S3FileSystem(skip_instance_cache=True).ls("")


@pytest.mark.slow
def test_unreachable_scheduler(faulty_archive: Location, tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, "DASK_SCHEDULER_ADDRESS": address,
           "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"}
    done = vakpipe("audit", ARCHIVE, "--out", str(tmp_path / "out"), env=env)
    assert_one_line_error(done.returncode, done.stderr, address, "Dask scheduler")


# --- bad credentials: a second moto server that checks them -------------------------------


@dataclass(frozen=True)
class AuthS3:
    """A moto server that authenticates requests, with one real user and its bucket."""

    endpoint: str
    key: str
    secret: str
    bucket: str = "locked-bucket"


def _reset_auth(endpoint: str, free_actions: int) -> None:
    """moto's server-mode switch: the next ``free_actions`` requests skip authentication."""
    req = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", method="POST",
                                 data=str(free_actions).encode(),
                                 headers={"Content-Type": "text/plain"})
    urllib.request.urlopen(req, timeout=10).close()


@pytest.fixture(scope="module")
def auth_s3(s3_server: LocalS3) -> Iterator[AuthS3]:
    """moto's S3 with authentication on (``INITIAL_NO_AUTH_ACTION_COUNT=0``).

    moto authenticates S3 requests against its own IAM: with the count at 0 every
    request must be signed by an access key of an IAM user moto knows, with a policy that
    allows the action. To get one, authentication is switched off for exactly the four
    set-up requests (``/moto-api/reset-auth``), which then switches it on again.
    """
    with local_s3(set_env=False, extra_env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as server:
        ep = server.endpoint
        _reset_auth(ep, 4)
        iam = boto3.client("iam", endpoint_url=ep, region_name="us-east-1")
        iam.create_user(UserName="auditor")
        iam.put_user_policy(UserName="auditor", PolicyName="s3", PolicyDocument=json.dumps(
            {"Version": "2012-10-17",
             "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="auditor")["AccessKey"]
        boto3.client("s3", endpoint_url=ep, region_name="us-east-1").create_bucket(
            Bucket="locked-bucket")
        auth = AuthS3(ep, key["AccessKeyId"], key["SecretAccessKey"])
        good = s3fs.S3FileSystem(endpoint_url=ep, key=auth.key, secret=auth.secret,
                                 skip_instance_cache=True)
        good.pipe_file("locked-bucket/archive/agents/vak/sessions/h/s.jsonl", b"{}\n")
        yield auth


def test_the_second_server_really_checks_credentials(auth_s3: AuthS3) -> None:
    def fs(key: str, secret: str) -> s3fs.S3FileSystem:
        return s3fs.S3FileSystem(endpoint_url=auth_s3.endpoint, key=key, secret=secret,
                                 skip_instance_cache=True)

    path = f"{auth_s3.bucket}/archive"
    assert fs(auth_s3.key, auth_s3.secret).find(path)  # the real user is let in
    with pytest.raises(PermissionError, match="signature"):
        fs(auth_s3.key, "wrong-secret").find(path)
    with pytest.raises(PermissionError, match="Access Key Id"):
        fs(CREDENTIALS["AWS_ACCESS_KEY_ID"], CREDENTIALS["AWS_SECRET_ACCESS_KEY"]).find(path)


@pytest.mark.parametrize("which", ["wrong secret", "unknown key"])
def test_bad_credentials(auth_s3: AuthS3, tmp_path: Path, which: str) -> None:
    key, secret = ((auth_s3.key, "wrong-secret") if which == "wrong secret"
                   else (CREDENTIALS["AWS_ACCESS_KEY_ID"], "whatever"))
    env = {**os.environ, "AWS_ENDPOINT_URL_S3": auth_s3.endpoint,
           "AWS_ENDPOINT_URL": auth_s3.endpoint,
           "AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}
    url = f"s3://{auth_s3.bucket}/archive"
    done = vakpipe("audit", url, "--out", str(tmp_path / "out"), env=env)
    assert_one_line_error(done.returncode, done.stderr, url, "access denied")


# --- generate and --storage-option instead of the environment ------------------------------


def test_generate_writes_a_fleet_and_its_ground_truth(s3: LocalS3) -> None:
    url = f"s3://{BUCKET}/generated"
    done = vakpipe("generate", url, "--sessions", "12", "--seed", "5", "--faults")
    assert done.returncode == EXIT_OK, done.stderr
    assert done.stdout.startswith("wrote 12 sessions") and "ground truth:" in done.stdout
    loc = resolve(url)
    fs = loc.filesystem()
    truth = json.loads(fs.cat_file(loc.join("ground-truth.json")))
    assert truth == ground_truth(generate_fleet(12, 5, faults=True))
    for path, t in truth.items():
        assert fs.size(loc.join(path)) == t["bytes"]


def test_generate_to_a_local_folder(tmp_path: Path) -> None:
    out = tmp_path / "fleet"
    result = CliRunner().invoke(main, ["generate", str(out), "--sessions", "3"])
    assert result.exit_code == EXIT_OK, result.output
    truth = json.loads((out / "ground-truth.json").read_text())
    assert len(truth) == 3 and all((out / p).stat().st_size == t["bytes"]
                                   for p, t in truth.items())


def test_generate_into_a_missing_bucket(s3: LocalS3) -> None:
    url = "s3://no-such-bucket-for-fleet/x"
    result = CliRunner().invoke(main, ["generate", url, "--sessions", "1"])
    assert_one_line_error(result.exit_code, result.stderr, url, "no such bucket")


@pytest.mark.slow
def test_a_password_in_the_root_url_is_never_written_or_printed(tmp_path: Path) -> None:
    """An archive served over HTTP, its URL holding a user and password: audited, and
    neither the summary nor anything under OUT holds the password."""
    import functools
    import http.server
    import threading

    write_fleet(resolve(str(tmp_path / "served" / "fleet")), sessions=2, seed=3,
                size_scale=0.2)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler,
                                directory=str(tmp_path / "served"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://alice:hunter2@127.0.0.1:{server.server_address[1]}/fleet/"
        out = tmp_path / "out"
        result = CliRunner().invoke(main, ["audit", url, "--out", str(out), "--workers",
                                           "0", "--no-progress", "--json"])
    finally:
        server.shutdown()
    assert result.exit_code == EXIT_OK, result.stderr
    assert json.loads(result.stdout)["sessions"] == 2
    assert "hunter2" not in result.stdout + result.stderr
    assert "alice:***@" in result.stdout
    for path in out.rglob("*"):
        if path.is_file():
            assert b"hunter2" not in path.read_bytes(), path


def test_storage_options_instead_of_environment(s3: LocalS3, tmp_path: Path) -> None:
    """Endpoint and credentials given as ``--storage-option`` only, none in the env."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_EC2_METADATA_DISABLED"] = "true"  # never probe a metadata address
    env["AWS_CONFIG_FILE"] = env["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    options = ["--storage-option", f"endpoint_url={s3.endpoint}",
               "--storage-option", f"key={CREDENTIALS['AWS_ACCESS_KEY_ID']}",
               "--storage-option", f"secret={CREDENTIALS['AWS_SECRET_ACCESS_KEY']}"]
    url = f"s3://{BUCKET}/by-options"
    made = vakpipe("generate", url, "--sessions", "6", "--faults", *options, env=env)
    assert made.returncode == EXIT_OK, made.stderr
    out = tmp_path / "out"
    done = vakpipe("audit", url, "--out", str(out), "--workers", "2", *options, env=env)
    assert done.returncode == EXIT_OK, done.stderr
    rows = plain_rows(read_dataset(resolve(str(out)), "integrity/sessions"))
    assert len(rows) == 6 and all(r["lines"] for r in rows)  # the workers read them too


@pytest.mark.parametrize("command", [["plugins"], ["cost", "OUT"], ["cost", "OUT", "--json"]])
def test_a_reader_that_stops_early_ends_the_command_quietly(
    command: list[str], tmp_path: Path
) -> None:
    # `vakpipe cost OUT | head`: 141 (128 + SIGPIPE, as a Unix tool killed by it), no
    # traceback, no error; click's own handling exited 1, --fail-on's code.
    out = tmp_path / "OUT"
    if "OUT" in command:
        write_fleet(resolve(str(tmp_path / "ROOT")), sessions=3, seed=1)
        assert run(["audit", str(tmp_path / "ROOT"), "--out", str(out), "--no-progress"]) \
            == EXIT_OK
    args = [str(out) if arg == "OUT" else arg for arg in command]
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes a byte
    try:
        done = subprocess.run([vakpipe_exe(), *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=300, check=False)
    finally:
        os.close(write)
    assert done.returncode == EXIT_PIPE_CLOSED
    # (with --json the human text goes to stderr, as always)
    assert "Error" not in done.stderr and "Traceback" not in done.stderr
    assert done.stderr == "" or "--json" in command


def test_version_and_help() -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["--version"]).exit_code == 0
    helped = runner.invoke(main, ["audit", "--help"])
    assert helped.exit_code == 0 and "--storage-option" in helped.output
    missing = runner.invoke(main, ["audit", "s3://b/x"])  # no --out: click's usage error
    assert missing.exit_code == EXIT_UNUSABLE
