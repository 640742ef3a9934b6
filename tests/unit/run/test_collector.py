"""The cyclic collector paused while one session object is read: off inside, back on
after (unless it was off before), reentrant, shared by threads, and around the per-object
pipeline of the audit and the replay."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.io.storage import enumerate_sessions, resolve
from pipeline.run import batches, replay_batches
from pipeline.run.batches import ObjectRead, RunContext, audit_object
from pipeline.run.collector import cyclic_gc_paused
from pipeline.run.replay_batches import ReplayOptions, audit_and_replay
from pipeline.synth.generator import generate_session


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    """Each test starts, and leaves, with the collector on."""
    gc.enable()
    yield
    gc.enable()


class Cycle:
    """An object that refers to itself: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_off_inside_on_after_and_reentrant() -> None:
    with cyclic_gc_paused():
        assert not gc.isenabled()
        with cyclic_gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block still holds it
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with cyclic_gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_on_again_after_a_block_that_raised() -> None:
    with pytest.raises(RuntimeError), cyclic_gc_paused():
        raise RuntimeError("an object's read failed")
    assert gc.isenabled()


def test_threads_share_the_pause_and_each_collects_its_cycles() -> None:
    # A memory:// run's workers are threads of one process: the collector stays paused
    # while any of them reads an object, and an object done while another still reads
    # leaves no cycle behind.
    second_started, first_done = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def second() -> None:
        with cyclic_gc_paused():
            second_started.set()
            first_done.wait(10)
            seen["on while the second reads"] = gc.isenabled()

    thread = threading.Thread(target=second)
    thread.start()
    second_started.wait(10)
    with cyclic_gc_paused():
        ref = weakref.ref(Cycle())
        assert ref() is not None  # paused: the cycle waits
    seen["cycle after the first"] = ref()
    seen["on after the first"] = gc.isenabled()
    first_done.set()
    thread.join(10)
    assert seen == {"cycle after the first": None, "on after the first": False,
                    "on while the second reads": False}
    assert gc.isenabled()


def test_the_audit_and_the_replay_read_each_object_paused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session = generate_session(1)
    path = tmp_path / session.path
    path.parent.mkdir(parents=True)
    path.write_bytes(b"".join(session.lines()))
    root = resolve(str(tmp_path))
    obj = enumerate_sessions(root).sessions[0]
    states: list[bool] = []
    read_object = batches.read_object

    def recording(*args: Any, **kwargs: Any) -> ObjectRead:
        states.append(gc.isenabled())
        return read_object(*args, **kwargs)

    monkeypatch.setattr(batches, "read_object", recording)
    monkeypatch.setattr(replay_batches, "read_object", recording)
    assert audit_object(root, obj).row["status"] == "ok"
    read, replayed, _ = audit_and_replay(root, obj, ReplayOptions(), RunContext())
    assert read.audit.row["status"] == "ok" and replayed is not None and replayed.requests
    assert states == [False, False] and gc.isenabled()


def test_a_task_holds_the_pause_and_each_object_still_collects_its_cycles(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's task (``shipped``) is paused whole, no full collection in it; a cycle
    an object leaves is freed when that object's block ends, not at the task's end."""
    from pipeline.run import orchestrate
    from pipeline.run.batches import audit_batch

    for seed in (1, 2):
        session = generate_session(seed)
        path = tmp_path / session.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(session.lines()))
    root = resolve(str(tmp_path))
    objects = enumerate_sessions(root).sessions
    left: list[weakref.ref[Cycle]] = []
    seen: list[tuple[bool, bool | None]] = []
    read_object = batches.read_object

    def leaving_a_cycle(*args: Any, **kwargs: Any) -> ObjectRead:
        # What an object read leaves (s3fs's reads leave ~10 objects in cycles): the
        # previous object's cycle is gone by the time the next one is read.
        seen.append((gc.isenabled(), left[-1]() is None if left else None))
        left.append(weakref.ref(Cycle()))
        return read_object(*args, **kwargs)

    ship = orchestrate.ship

    def shipping(result: batches.BatchResult) -> orchestrate.ShippedResult:
        seen.append((gc.isenabled(), left[-1]() is None))  # the tables: still paused
        return ship(result)

    monkeypatch.setattr(batches, "read_object", leaving_a_cycle)
    monkeypatch.setattr(orchestrate, "ship", shipping)
    result = orchestrate.shipped(audit_batch, root, 0, orchestrate.PackedBatch.of(objects))
    assert sum(result.statuses.values()) == 2
    assert seen == [(False, None), (False, True), (False, True)]
    assert gc.isenabled()
