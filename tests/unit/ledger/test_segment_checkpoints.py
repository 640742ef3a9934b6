"""Nightly checkpoints of segment ledgers (docs/segments.md, *Nightly checkpoints*): a
night checks what an earlier one verified (seal entries, sealed segments' bytes, the
open segment's frames) and, keyless, does not read again the sealed segments it
verified. In process, on generated ledgers (pipeline.synth.segments)."""

from __future__ import annotations

import hashlib

import pytest

from pipeline.ledger.keys import StaticKeys
from pipeline.ledger.segments import (
    GENESIS,
    SEALS,
    SealEntry,
    SegmentCheckpoint,
    SegmentLines,
    members_read,
    read_segment_ledger,
    walk_frames,
)
from pipeline.ledger.types import Code
from pipeline.synth.segments import SEGMENT_FAULTS, compress, frame, segment_ledger

Files = dict[str, bytes]


def night(files: Files, previous: SegmentCheckpoint | None = None,
          keys: StaticKeys | None = None) -> tuple[SegmentLines, list[bytes]]:
    # A member's version token: its digest (as an ETag is, for a whole-object put).
    members = {n: (len(d), hashlib.sha256(d).hexdigest()) for n, d in files.items()}
    lines = read_segment_ledger(files, files.__getitem__, keys, previous=previous,
                                members=members)
    return lines, list(lines)


def open_log(files: Files) -> str:
    return max(n for n in files if n.endswith(".log") and n != SEALS)


def earlier(files: Files, drop: int = 2) -> Files:
    """The ledger a night earlier: its open segment without its last ``drop`` frames."""
    name = open_log(files)
    frames = walk_frames(files[name], None).frames
    return {**files, name: files[name][:frames[-drop].offset]}


def seals_log(entries: list[SealEntry]) -> bytes:
    out, head = bytearray(), GENESIS
    for seal in entries:
        data, head = frame(head, 0, compress(seal.encode()))
        out += data
    return bytes(out)


def checkpoint(files: Files) -> SegmentCheckpoint:
    lines, _ = night(files)
    assert lines.report.checkpoint is not None
    return lines.report.checkpoint


def codes(lines: SegmentLines) -> list[Code]:
    return [f.code for f in lines.report.history]


def test_the_checkpoint_round_trips_and_a_bad_one_is_none() -> None:
    led = segment_ledger(11, segments=4)
    ck = checkpoint(led.files)
    assert SegmentCheckpoint.from_json(ck.to_json()) == ck
    assert len(ck.seals) == 3 and len(ck.verified) == 3 and ck.open_segment == 4
    for bad in (None, "", "{", "[]", '{"v": 1}', '{"seals": [[1]], "verified": [], "open": 1}'):
        assert SegmentCheckpoint.from_json(bad) is None


def test_keyless_growth_reads_only_the_open_segment_and_finds_what_a_whole_read_finds(
) -> None:
    led = segment_ledger(12, segments=4, sealed=True)
    first, _ = night(earlier(led.files))
    assert first.report.checkpoint is not None
    grown, _ = night(led.files, first.report.checkpoint)
    whole, _ = night(led.files)
    assert codes(grown) == []
    assert grown.report.skipped_segments == 3
    assert grown.report.findings == whole.report.findings  # content_sealed alone
    assert (grown.report.frames, grown.report.head, grown.report.content) == \
        (whole.report.frames, whole.report.head, whole.report.content) == \
        (led.entries, whole.report.head, "sealed")
    # Night 2 reads seals.log, KEY and the open segment; night 1 read everything.
    unread = sum(len(d) for n, d in led.files.items() if n.endswith(".sealed"))
    assert grown.report.bytes_read == whole.report.bytes_read - unread
    assert grown.report.bytes_read < first.report.bytes_read  # though the ledger grew
    assert grown.report.checkpoint == whole.report.checkpoint


@pytest.mark.parametrize("sealed", [True, False])
def test_with_the_content_read_every_segment_is_read_and_checked(sealed: bool) -> None:
    led = segment_ledger(13, segments=4, sealed=sealed)
    keys = StaticKeys({led.scope: led.key}) if led.key is not None else None
    first, _ = night(earlier(led.files), keys=keys)
    assert first.report.checkpoint is not None
    grown, out = night(led.files, first.report.checkpoint, keys)
    assert codes(grown) == [] and grown.report.skipped_segments == 0
    assert out == led.lines  # the replay needs every entry: all of them read


def test_the_open_segment_sealed_since_is_checked_against_its_verified_frames() -> None:
    led = segment_ledger(14, segments=4, sealed=True)
    ck = checkpoint(led.files)
    files = dict(led.files)
    # Segment 4 sealed since (and segment 5 opened empty): its frames begin with those
    # verified open.
    data = files.pop("seg-00000004.log")
    walk = walk_frames(data, None)
    entries = [SealEntry(n, e, bytes.fromhex(h), False) for n, e, h in ck.seals]
    files["seg-00000004.sealed"] = b"VAKSEG01\x00" + data
    files[SEALS] = seals_log([*entries, SealEntry(4, len(walk.frames), walk.head, False)])
    lines, _ = night(files, ck)
    assert codes(lines) == [] and lines.report.skipped_segments == 3
    # ... but not when the sealed frames are other than those verified open.
    files["seg-00000004.sealed"] = b"VAKSEG01\x00" + data[:-1] + bytes([data[-1] ^ 1])
    lines, _ = night(files, ck)
    assert Code.HISTORY_REWRITTEN in codes(lines)


def test_a_truncated_open_segment_is_history_truncated() -> None:
    led = segment_ledger(15, segments=4)
    lines, _ = night(earlier(led.files), checkpoint(led.files))
    assert codes(lines) == [Code.HISTORY_TRUNCATED]
    assert "seg-00000004" in lines.report.history[0].detail


def test_a_rewritten_verified_frame_is_history_rewritten() -> None:
    led = segment_ledger(16, segments=4)
    files = dict(led.files)
    log = open_log(files)
    at = walk_frames(files[log], None).frames[0].offset + 9
    files[log] = files[log][:at] + bytes([files[log][at] ^ 0x40]) + files[log][at + 1:]
    lines, _ = night(files, checkpoint(led.files))
    assert codes(lines) == [Code.HISTORY_REWRITTEN]


def test_a_sealed_segment_whose_bytes_changed_is_history_rewritten() -> None:
    led = segment_ledger(17, segments=4)
    files = dict(led.files)
    data = files["seg-00000002.sealed"]
    files["seg-00000002.sealed"] = data[:-3] + bytes([data[-3] ^ 1]) + data[-2:]
    lines, _ = night(files, checkpoint(led.files))
    assert Code.HISTORY_REWRITTEN in codes(lines)
    assert "seg-00000002.sealed" in lines.report.history[0].detail
    assert lines.report.skipped_segments == 2  # the others still unread


def test_a_re_sealed_segment_and_a_seal_entry_gone_are_breaks() -> None:
    led = segment_ledger(18, segments=4)
    ck = checkpoint(led.files)
    entries = [SealEntry(n, e, bytes.fromhex(h), False) for n, e, h in ck.seals]
    files = dict(led.files)
    files[SEALS] = seals_log([entries[0], SealEntry(2, entries[1].entries + 1,
                                                    entries[1].head, False), entries[2]])
    lines, _ = night(files, ck)
    assert codes(lines) == [Code.HISTORY_REWRITTEN]
    assert "re-sealed" in lines.report.history[0].detail
    assert lines.report.skipped_segments == 2  # not segment 2: its seal entry changed
    files[SEALS] = seals_log(entries[:2])
    lines, _ = night(files, ck)
    assert Code.HISTORY_TRUNCATED in codes(lines)


def test_retention_is_no_break_but_a_lost_newest_segment_is() -> None:
    led = segment_ledger(19, segments=4)
    ck = checkpoint(led.files)
    files = {n: d for n, d in led.files.items() if n != "seg-00000001.sealed"}
    lines, _ = night(files, ck)
    assert codes(lines) == []
    assert Code.SEGMENT_DROPPED in [f.code for f in lines.report.findings]
    files = {n: d for n, d in led.files.items() if n != "seg-00000004.log"}
    lines, _ = night(files, ck)
    assert Code.HISTORY_TRUNCATED in codes(lines)


def reads_of(files: Files, previous: SegmentCheckpoint | None = None,
             keys: StaticKeys | None = None) -> list[str]:
    """The members a reading of ``files`` asks for, in its order."""
    asked: list[str] = []
    members = {n: (len(d), hashlib.sha256(d).hexdigest()) for n, d in files.items()}

    def read(name: str) -> bytes:
        asked.append(name)
        return files[name]
    list(read_segment_ledger(files, read, keys, previous=previous, members=members))
    return asked


@pytest.mark.parametrize("fault", [None, *SEGMENT_FAULTS])
@pytest.mark.parametrize("sealed", [True, False])
def test_members_read_are_the_members_a_reading_asks_for(fault: str | None,
                                                         sealed: bool) -> None:
    # What an object store fetches ahead, side by side (pipeline.io.segments): a member
    # fetched and not asked for is a wasted GET, one asked for and not fetched a round
    # trip of its own.
    led = segment_ledger(21, segments=4, sealed=sealed, fault=fault)
    members = {n: (len(d), hashlib.sha256(d).hexdigest()) for n, d in led.files.items()}
    keys = StaticKeys({led.scope: led.key}) if led.key is not None else None
    predicted = members_read(led.files, members)
    for with_keys in (None, keys):
        asked = reads_of(led.files, keys=with_keys)
        # Both files where a .log lies beside a .sealed: which one is read, only
        # seals.log says (one of them fetched for nothing, in that rare case).
        assert [n for n in predicted if n in asked] == asked
        assert len(predicted) - len(asked) == (fault == "log_beside_sealed")


def test_members_read_leave_out_the_sealed_segments_a_keyless_night_skips() -> None:
    led = segment_ledger(22, segments=5, sealed=True)
    before = checkpoint(earlier(led.files))
    members = {n: (len(d), hashlib.sha256(d).hexdigest()) for n, d in led.files.items()}
    predicted = members_read(led.files, members, before)
    assert predicted == reads_of(led.files, before) == ["KEY", SEALS, open_log(led.files)]
    # A sealed segment rewritten since (another version) is read, and predicted.
    rewritten = "seg-00000002.sealed"
    changed = {**led.files, rewritten: led.files[rewritten] + b"x"}
    members[rewritten] = (len(changed[rewritten]), "another")
    assert rewritten in members_read(changed, members, before)
    assert rewritten in reads_of(changed, before)
