"""Issue 16, item 9: a storage endpoint that dies after the listing ends a run in
bounded time.

The client lists the archive in moto; the workers (a separate ``dask worker`` process)
are given an endpoint where nothing listens, as if the endpoint died right after the
listing: every read is refused. After ``MAX_CONNECTION_FAILURES`` objects in a row could
not connect, a task reports the rest of its batch ``unreadable_object`` without a
request; the run is partial (exit 3). Counted, never timed: the findings say which
objects were tried. A reset (the endpoint answered, then cut the connection) or an
AccessDenied never counts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, ConnectTimeoutError, EndpointConnectionError

from pipeline.cli import EXIT_PARTIAL, run
from pipeline.io.commit import read_manifest
from pipeline.io.storage import endpoint_unreachable, resolve
from pipeline.run.batches import MAX_CONNECTION_FAILURES, EndpointWatch
from pipeline.synth.fleet import write_fleet
from pipeline.synth.local_s3 import LocalS3, free_port
from tests.helpers.storage import BUCKET, committed_rows

ARCHIVE = f"s3://{BUCKET}/archive"
SESSIONS = 10


def connection_error(cause: OSError) -> BaseException:
    """botocore's ``EndpointConnectionError`` raised from ``cause``, as aiobotocore
    raises it for a refused connection and for a reset one alike."""
    err: BaseException = EndpointConnectionError(endpoint_url="http://127.0.0.1:9/b/k")
    err.__cause__ = cause
    return err


def refused() -> BaseException:
    return connection_error(ConnectionRefusedError(111, "Connect call failed"))


def reset() -> BaseException:
    """A connection the endpoint accepted, then cut."""
    return connection_error(ConnectionResetError(104, "Connection reset by peer"))


def denied() -> BaseException:
    return PermissionError("Access Denied")


def test_only_errors_of_an_endpoint_never_reached_count() -> None:
    assert endpoint_unreachable(refused())
    assert endpoint_unreachable(ConnectTimeoutError(endpoint_url="http://10.0.0.1"))
    assert not endpoint_unreachable(reset())
    assert not endpoint_unreachable(denied())
    assert not endpoint_unreachable(ClientError({"Error": {"Code": "SlowDown"}}, "GetObject"))


def test_the_watch_counts_failures_in_a_row_and_any_answer_starts_over() -> None:
    watch = EndpointWatch()
    outcomes: list[Callable[[], BaseException] | None] = [refused, refused, denied, refused,
                                                          reset, None, refused, refused]
    for outcome in outcomes:
        watch.saw(outcome() if outcome is not None else None)
        assert not watch.dead
    watch.saw(refused())
    assert watch.dead and watch.failures == MAX_CONNECTION_FAILURES
    assert "EndpointConnectionError" in watch.last


@pytest.mark.slow
@pytest.mark.parametrize("replay", [False, True], ids=["audit", "audit-replay"])
def test_a_dead_endpoint_ends_each_task_after_a_few_objects(
    replay: bool, s3: LocalS3, start_separate_cluster: Callable[..., Any], tmp_path: Path
) -> None:
    write_fleet(resolve(ARCHIVE), sessions=SESSIONS, seed=8, size_scale=0.2)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cluster = start_separate_cluster(
        nworkers=1, env={"AWS_ENDPOINT_URL": dead, "AWS_ENDPOINT_URL_S3": dead})
    out = tmp_path / "out"
    code = run(["audit", ARCHIVE, "--out", str(out), "--scheduler", cluster.address,
                "--no-progress", *(["--replay"] if replay else []),
                # One try per request: the tried objects cost seconds, not minutes.
                "--storage-option", "config_kwargs.retries.max_attempts=1"])
    assert code == EXIT_PARTIAL
    findings = committed_rows(out, "integrity/findings")
    assert len(findings) == SESSIONS
    assert {f["code"] for f in findings} == {"unreadable_object"}
    tried = [f for f in findings if not f["detail"].startswith("not read:")]
    skipped = [f for f in findings if f["detail"].startswith("not read:")]
    # One batch (the fleet is small): the first objects were tried, the rest not.
    assert len(tried) == MAX_CONNECTION_FAILURES
    assert all("EndpointConnectionError" in f["detail"] for f in tried)
    assert len(skipped) == SESSIONS - MAX_CONNECTION_FAILURES
    assert all("storage endpoint was unreachable" in f["detail"] for f in skipped)
    rows = committed_rows(out, "integrity/sessions")
    assert len(rows) == SESSIONS and all(r["status"] == "error" for r in rows)
    manifest = read_manifest(resolve(str(out)))
    assert manifest is not None
    assert manifest["partial"] is True and manifest["unread_objects"] == SESSIONS
