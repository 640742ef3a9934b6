"""Tests of :class:`pipeline.io.storage.ReadAhead`: a batch's small objects on an object
store opened side by side, read as the versions listed, never ahead of a dead endpoint.

On moto's S3 server over real HTTP, through the fault proxy where the requests are
counted; nothing here is timed (the figures are in ``bench/object_store_latency.py``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import s3fs
from botocore.exceptions import EndpointConnectionError

from pipeline.io import storage
from pipeline.io.storage import (
    Location,
    ReadAhead,
    SessionObject,
    enumerate_sessions,
    reads_over_network,
    resolve,
)
from pipeline.run import batches
from pipeline.run.batches import EndpointWatch, audit_batch, audit_batch_result, audit_object
from pipeline.synth.fleet import write_fleet
from pipeline.synth.local_s3 import LocalS3
from tests.helpers.fault_proxy import FaultProxy, InFlight, Rule
from tests.helpers.ledgers import LedgerBuilder, usage
from tests.helpers.storage import BUCKET

ARCHIVE = f"s3://{BUCKET}/archive"
SESSIONS = 12


@pytest.fixture
def listed(s3: LocalS3) -> list[SessionObject]:
    """:data:`SESSIONS` small generated sessions under ``ARCHIVE``, as listed."""
    write_fleet(resolve(ARCHIVE), sessions=SESSIONS, seed=3, size_scale=0.2)
    return enumerate_sessions(resolve(ARCHIVE)).sessions


def through(proxy: FaultProxy) -> Location:
    """``ARCHIVE`` read through the proxy (a filesystem of its own: no listing cached)."""
    return resolve(ARCHIVE, {"endpoint_url": proxy.endpoint})


def refused() -> BaseException:
    """What aiobotocore raises for a refused connection."""
    err = EndpointConnectionError(endpoint_url="http://127.0.0.1:9/b/k")
    err.__cause__ = ConnectionRefusedError(111, "Connect call failed")
    return err


def test_the_objects_after_the_one_read_are_opened_side_by_side(
    proxy: FaultProxy, listed: list[SessionObject]
) -> None:
    flying = InFlight()  # each GET held long enough for the opens ahead to overlap it
    proxy.add(Rule("call", ".", method="GET", times=None, callback=flying))
    root = through(proxy)
    result = audit_batch(root, 0, listed)
    assert flying.most > 1
    # Each object read once, whole, in one GET (they are under READ_AHEAD_MAX_BYTES).
    gets = [r.key for r in proxy.requests(method="GET")]
    assert sorted(gets) == sorted(f"archive/{o.key.path}" for o in listed)
    # The same audit as one object at a time, never read ahead.
    alone = audit_batch_result(0, listed, [audit_object(root, o) for o in listed])
    assert result.sessions.equals(alone.sessions)
    assert result.extra["usage"].equals(alone.extra["usage"])


def test_nothing_is_read_ahead_before_the_endpoint_answered(
    proxy: FaultProxy, listed: list[SessionObject]
) -> None:
    root = through(proxy)
    watch = EndpointWatch()
    with ReadAhead(root, listed, watch.reachable) as ahead:
        assert ahead.take(listed[0]) is None
        assert proxy.requests() == []  # not ready: nothing was sent
        watch.saw(None)  # the first object was read
        assert ahead.take(listed[1]) is None  # taken as it was asked: opened by its reader
        opened = ahead.take(listed[2])  # read ahead since listed[1]; now 3 to 10 ahead
        assert opened is not None
        opened.result().close()
        watch.saw(refused())  # a read that could not reach the endpoint: paused
        assert not watch.reachable()
        taken = ahead.take(listed[3])  # still read ahead before the failure
        assert taken is not None
        taken.result().close()
        assert ahead.take(listed[11]) is None  # the window did not move on to 11


def test_an_object_read_ahead_is_taken_once(
    proxy: FaultProxy, listed: list[SessionObject]
) -> None:
    root = through(proxy)
    first, second = listed[0], listed[1]
    with ReadAhead(root, listed) as ahead:
        ahead.take(first)
        opened = ahead.take(second)
        assert opened is not None
        opened.result().close()
        # Taken: a second read of it (it changed under the first) opens it anew.
        assert ahead.take(second) is None


def test_an_object_replaced_after_the_listing_is_read_again_as_it_is_now(
    s3: LocalS3, listed: list[SessionObject], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = resolve(ARCHIVE)  # the listing cached: the opens ahead ask for its ETags
    replaced = listed[3]
    b = LedgerBuilder()
    b.header(session_id=replaced.key.session_id)
    b.user("hello")
    b.assistant("hi", u=usage(10, 2))
    s3fs.S3FileSystem(skip_instance_cache=True).pipe(replaced.full_path, b.to_bytes())
    looked_up: list[str] = []
    real = batches.refresh_object

    def refresh(root: Location, obj: SessionObject) -> SessionObject:
        looked_up.append(obj.key.path)
        return real(root, obj)

    monkeypatch.setattr(batches, "refresh_object", refresh)
    result = audit_batch(root, 0, listed)
    # Its open ahead asked for the version listed (If-Match), which failed: looked up
    # again, then read as it is now.
    assert looked_up == [replaced.key.path]
    shown = result.sessions.select(["session_path", "status", "bytes", "etag"])
    by_path = {r["session_path"]: r for r in shown.to_pylist()}
    row = by_path[replaced.key.path]
    assert row["bytes"] == len(b.to_bytes()) and row["etag"] != replaced.etag
    codes = {r["code"] for r in result.findings.select(["session_path", "code"]).to_pylist()
             if r["session_path"] == replaced.key.path}
    assert not codes & {"changed_during_audit", "unreadable_object", "audit_failed"}, codes
    assert result.statuses["error"] == 0


def test_big_objects_and_local_folders_are_never_read_ahead(
    proxy: FaultProxy, listed: list[SessionObject], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path
) -> None:
    monkeypatch.setattr(storage, "READ_AHEAD_MAX_BYTES", min(o.size for o in listed) - 1)
    with ReadAhead(through(proxy), listed) as ahead:
        assert all(ahead.take(o) is None for o in listed)
    assert proxy.requests() == []
    write_fleet(resolve(str(tmp_path)), sessions=3, seed=3, size_scale=0.2)
    local = resolve(str(tmp_path))
    assert not reads_over_network(local) and not reads_over_network(resolve("memory://x"))
    assert reads_over_network(through(proxy))
    with ReadAhead(local, enumerate_sessions(local).sessions) as ahead:
        assert all(ahead.take(o) is None for o in enumerate_sessions(local).sessions)


def test_the_files_opened_ahead_and_never_taken_are_closed(
    proxy: FaultProxy, listed: list[SessionObject], monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[object] = []
    real = storage._open_object

    def tracked(*args: object) -> object:
        f = real(*args)  # type: ignore[arg-type]
        opened.append(f)
        return f

    monkeypatch.setattr(storage, "_open_object", tracked)
    with ReadAhead(through(proxy), listed) as ahead:
        ahead.take(listed[0])  # the next READ_AHEAD_OBJECTS are opened, none taken
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
            len(opened) < 1 or not all(getattr(f, "closed", False) for f in opened)):
        time.sleep(0.05)
    assert opened and all(getattr(f, "closed", False) for f in opened)
    for thread in threading.enumerate():
        if thread.name.startswith("vakpipe-read-ahead"):
            thread.join(timeout=30)  # its pool was shut down: it ends once idle
            assert not thread.is_alive()
