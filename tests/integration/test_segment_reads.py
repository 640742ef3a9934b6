"""Reading vak's segment ledgers on an object store: a ledger's members fetched side by
side (:class:`pipeline.io.segments.MemberReads`), and the next ledgers of a batch listed
and fetched ahead (:class:`pipeline.io.storage.ReadAhead`), each member once, never one
a keyless night skips, the same audit as one member at a time.

The fleet lies on moto's S3 server, read over real HTTP through the fault proxy, which
logs every request; no test here times anything (``bench/object_store_latency.py``
does).
"""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.io import storage
from pipeline.io.commit import read_dataset
from pipeline.io.segments import MemberReads, fetch_ledger
from pipeline.io.storage import (
    MEMBER_READS,
    Location,
    ReadAhead,
    SessionObject,
    enumerate_sessions,
    object_version,
    resolve,
)
from pipeline.ledger.keys import StaticKeys, keys_from_json
from pipeline.ledger.layout import SEGMENTS
from pipeline.ledger.segments import (
    LOCK_FILE,
    SEALS,
    SegmentCheckpoint,
    members_read,
    read_segment_ledger,
    walk_frames,
)
from pipeline.run.batches import audit_batch
from pipeline.synth.local_s3 import LocalS3
from pipeline.synth.segments import SegmentLedger, write_segment_fleet
from tests.helpers.fault_proxy import FaultProxy, InFlight, Rule
from tests.helpers.storage import BUCKET, vakpipe_exe

ARCHIVE = f"s3://{BUCKET}/archive"
LEDGERS = 6


@pytest.fixture
def fleet(s3: LocalS3) -> tuple[list[SegmentLedger], bytes]:
    """:data:`LEDGERS` generated segment ledgers under ``ARCHIVE``, without faults
    (which members a faulty ledger's reading asks for is checked, fault by fault, by
    the unit tests), and their keys."""
    return write_segment_fleet(resolve(ARCHIVE), LEDGERS, seed=5)


def through(proxy: FaultProxy, keys: bytes | None = None) -> Location:
    """``ARCHIVE`` read through the proxy (a filesystem of its own: no listing cached)."""
    root = resolve(ARCHIVE, {"endpoint_url": proxy.endpoint})
    return dataclasses.replace(root, keys=keys_from_json(keys, "keys") if keys else None)


def ledgers(root: Location) -> list[SessionObject]:
    return [o for o in enumerate_sessions(root).sessions if o.key.storage == SEGMENTS]


def member_gets(proxy: FaultProxy) -> list[str]:
    return [r.key for r in proxy.requests(method="GET") if "/" in r.key]


def audited(root: Location, batch: list[SessionObject]) -> tuple[pa.Table, pa.Table]:
    result = audit_batch(root, 0, batch)
    return result.sessions.drop_columns(["etag"]), result.extra["usage"]


@pytest.mark.parametrize("with_keys", [True, False])
def test_each_member_read_is_fetched_once_side_by_side_and_audits_alike(
    proxy: FaultProxy, fleet: tuple[list[SegmentLedger], bytes],
    monkeypatch: pytest.MonkeyPatch, with_keys: bool
) -> None:
    made, keys = fleet
    root = through(proxy, keys if with_keys else None)
    batch = ledgers(root)
    assert len(batch) == LEDGERS
    root.filesystem().invalidate_cache()  # as on a worker: no listing cached
    proxy.clear()
    flying = InFlight()  # each GET held long enough for those side by side to overlap
    proxy.add(Rule("call", ".", method="GET", times=None, callback=flying))
    fetched = audited(root, batch)
    assert flying.most > 1
    # Every member the reading asks for, once; LOCK never.
    gets = member_gets(proxy)
    expected = [f"archive/{led.path}/{name}" for led in made
                for name in members_read(led.files)]
    assert sorted(gets) == sorted(expected)
    assert not any(g.endswith(f"/{LOCK_FILE}") for g in gets)
    # One listing a ledger, none listed twice (the listing ahead is the one read).
    lists = [r.query for r in proxy.requests(method="GET") if "list-type" in r.query]
    assert len(lists) == len(set(lists)) == LEDGERS
    # The same tables as one member at a time, nothing read ahead.
    monkeypatch.setattr(storage, "MEMBER_READS", MemberReads(1, 0))
    monkeypatch.setattr(storage, "READ_AHEAD_MAX_BYTES", 0)
    proxy.clear()
    alone = audited(root, batch)
    assert fetched[0].equals(alone[0]) and fetched[1].equals(alone[1])
    assert sorted(member_gets(proxy)) == sorted(expected)
    assert set(fetched[0].column("status").to_pylist()) == {"ok"}


@pytest.fixture
def keyed(proxy: FaultProxy, fleet: tuple[list[SegmentLedger], bytes]
          ) -> tuple[Location, list[SessionObject]]:
    """``ARCHIVE`` through the proxy with the fleet's keys, and its ledgers as listed."""
    root = through(proxy, fleet[1])
    return root, ledgers(root)


def test_a_member_that_fails_ahead_is_read_when_asked(
    proxy: FaultProxy, keyed: tuple[Location, list[SessionObject]]
) -> None:
    root, batch = keyed
    # Each ledger's seals.log refused once (its fetch ahead), then answered.
    proxy.add(Rule("denied", f"/{SEALS}$", method="GET", times=1))
    sessions, _ = audited(root, batch)
    assert sessions.column("status").to_pylist() == ["ok"] * LEDGERS
    seals = [g for g in member_gets(proxy) if g.endswith(f"/{SEALS}")]
    assert len(seals) == 2 * LEDGERS  # refused ahead, then read alone when asked


def test_a_member_that_always_fails_makes_its_ledger_unreadable_not_the_batch(
    proxy: FaultProxy, keyed: tuple[Location, list[SessionObject]]
) -> None:
    root, batch = keyed
    broken = batch[2].key.path
    proxy.add(Rule("denied", f"{broken}/seg-00000002", method="GET", times=None))
    result = audit_batch(root, 0, batch)
    by_path = dict(zip(result.sessions.column("session_path").to_pylist(),
                       result.sessions.column("status").to_pylist(), strict=True))
    assert by_path.pop(broken) == "error"
    assert set(by_path.values()) == {"ok"}
    found = result.findings.select(["session_path", "code"]).to_pylist()
    assert [f["code"] for f in found if f["session_path"] == broken] == ["unreadable_object"]


def test_a_nights_unchanged_sealed_segments_are_not_fetched_ahead(
    proxy: FaultProxy, fleet: tuple[list[SegmentLedger], bytes]
) -> None:
    made, _ = fleet
    led = made[0]
    root = through(proxy)
    fs = root.filesystem()
    path = root.join(led.path)
    # The night before: the same ledger, its open segment two frames shorter.
    log = max(n for n in led.files if n.endswith(".log") and n != SEALS)
    cut = led.files[log][:walk_frames(led.files[log], None).frames[-2].offset]
    earlier = {**led.files, log: cut}
    members = {n: (len(d), hashlib.md5(d).hexdigest()) for n, d in led.files.items()}
    first = read_segment_ledger(earlier, earlier.__getitem__, None, members=members)
    list(first)
    before = first.report.checkpoint
    assert isinstance(before, SegmentCheckpoint)
    proxy.clear()
    listed = fetch_ledger(fs, path, MEMBER_READS, None, previous=before,
                          version=object_version)
    assert sorted(listed.fetched) == sorted(["KEY", SEALS, log])
    assert sorted(g.rsplit("/", 1)[1] for g in member_gets(proxy)) == sorted(listed.fetched)
    # Without the checkpoint every member the reading asks for.
    # Without the checkpoint, or with keys (then every segment is read), every member
    # the reading asks for.
    whole = fetch_ledger(fs, path, MEMBER_READS, None, version=object_version)
    assert sorted(whole.fetched) == sorted(members_read(led.files))
    assert led.key is not None
    keyed = fetch_ledger(fs, path, MEMBER_READS, StaticKeys({led.scope: led.key}),
                         previous=before, version=object_version)
    assert sorted(keyed.fetched) == sorted(members_read(led.files))


def test_a_ledger_listed_ahead_is_not_listed_again(
    proxy: FaultProxy, fleet: tuple[list[SegmentLedger], bytes]
) -> None:
    root = through(proxy)
    batch = ledgers(root)
    with ReadAhead(root, batch) as ahead:
        ahead.take(batch[0])
        started = ahead.take(batch[1])
        assert started is not None
        listed = started.result()
    assert set(listed.fetched) == set(members_read(listed.names))
    assert LOCK_FILE in listed.names and LOCK_FILE not in listed.fetched


def test_a_keyless_nights_grown_ledger_fetches_only_what_changed(
    proxy: FaultProxy, fleet: tuple[list[SegmentLedger], bytes], tmp_path: Path
) -> None:
    # Two `vakpipe nightly` runs in processes of their own, reading through the proxy:
    # the checkpoints reach the read-ahead, so night 2 fetches of a grown ledger its KEY,
    # seals.log and open segment, and of an unchanged one nothing.
    made, _ = fleet
    grown = made[:3]
    fs = resolve(ARCHIVE).filesystem()
    for led in grown:  # night 1: their open segments two frames shorter
        log = max(n for n in led.files if n.endswith(".log") and n != SEALS)
        frames = walk_frames(led.files[log], None).frames
        fs.pipe_file(f"{BUCKET}/archive/{led.path}/{log}",
                     led.files[log][:frames[-2].offset])
    via = ("--storage-option", f"endpoint_url={proxy.endpoint}")
    for day in ("2026-12-01", "2026-12-02"):
        if day == "2026-12-02":
            for led in grown:
                log = max(n for n in led.files if n.endswith(".log") and n != SEALS)
                fs.pipe_file(f"{BUCKET}/archive/{led.path}/{log}", led.files[log])
            proxy.clear()
        done = subprocess.run(
            [vakpipe_exe(), "nightly", ARCHIVE, "--out", str(tmp_path / "out"), "--date", day,
             "--no-progress", "--workers", "0", *via],
            capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr
    fetched = sorted(g.removeprefix("archive/") for g in member_gets(proxy))
    assert fetched == sorted(
        f"{led.path}/{name}" for led in grown
        for name in ("KEY", SEALS, max(n for n in led.files if n.endswith(".log")
                                       and n != SEALS)))
    found = read_dataset(resolve(str(tmp_path / "out" / "date=2026-12-02")),
                         "integrity/findings")
    assert not {"history_truncated", "history_rewritten"} & set(
        found.column("code").to_pylist())
