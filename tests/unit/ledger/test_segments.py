"""vak's record-segment ledgers: keyless verification, opening with keys, the projection
(docs/segments.md). In process, on generated ledgers (pipeline.synth.segments)."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.audit.segments import audit_lines
from pipeline.errors import UsageError
from pipeline.ledger.keys import StaticKeys, keys_from_json, open_key_file, vak_scope_keys
from pipeline.ledger.layout import SEGMENTS, SessionKey, segment_member
from pipeline.ledger.segments import (
    GENESIS,
    SegmentLines,
    members_read,
    read_segment_ledger,
    walk_frames,
)
from pipeline.ledger.types import Code, Severity
from pipeline.synth.segments import (
    SEGMENT_FAULTS,
    SegmentLedger,
    frame,
    segment_ledger,
    vak_key_material,
)


def read(led: SegmentLedger, keys: StaticKeys | None) -> tuple[SegmentLines, list[bytes]]:
    lines = read_segment_ledger(led.files, led.files.__getitem__, keys)
    return lines, list(lines)


def keys_of(led: SegmentLedger) -> StaticKeys | None:
    return StaticKeys({led.scope: led.key}) if led.key is not None else None


@pytest.mark.parametrize("sealed", [True, False])
@pytest.mark.parametrize("seed", [1, 2])
def test_clean_ledger_projects_to_its_jsonl_session(seed: int, sealed: bool) -> None:
    led = segment_ledger(seed, sealed=sealed, segments=3)
    lines, out = read(led, keys_of(led))
    assert lines.report.findings == []
    assert lines.report.frames == led.entries == len(led.lines)
    assert lines.report.content == ("opened" if sealed else "plain")
    # The projection is the JSONL session the entries came from, byte for byte (its
    # prev_hash chain included), so the JSONL audit reads it as it reads that session.
    assert out == led.lines


def test_without_key_the_chain_verifies_and_nothing_is_read() -> None:
    led = segment_ledger(3, sealed=True)
    lines, out = read(led, None)
    assert out == []
    assert lines.report.frames == led.entries
    assert lines.report.content == "sealed"
    assert [f.code for f in lines.report.findings] == [Code.CONTENT_SEALED]
    assert Code.CONTENT_SEALED.severity is Severity.INFO
    wrong = StaticKeys({led.scope: bytes(32)})
    lines, out = read(led, wrong)
    assert out == []  # another key: every frame unreadable (an error), content sealed
    assert {f.code for f in lines.report.findings} == {Code.FRAME_UNREADABLE, Code.CONTENT_SEALED}


@pytest.mark.parametrize("fault", sorted(SEGMENT_FAULTS))
@pytest.mark.parametrize("sealed", [True, False])
def test_each_fault_is_found_alone_at_its_severity(fault: str, sealed: bool) -> None:
    for seed in (5, 6):
        led = segment_ledger(seed, sealed=sealed, fault=fault)
        for keys in ({keys_of(led), None} if sealed else {None}):
            lines, _ = read(led, keys)
            found = {f.code for f in lines.report.findings} - {Code.CONTENT_SEALED}
            expected = set(led.expected)
            if keys is None and sealed:
                expected.discard(Code.FRAME_UNREADABLE)  # needs the key to be seen
            assert found == expected, (seed, keys)
            assert lines.report.frames == led.entries
            for f in lines.report.findings:
                # Located: a file, and for a frame its index and byte offset.
                assert f.detail.startswith(("seg-", "seals.log", "segment ", "1 ")) or \
                    f.code is Code.CONTENT_SEALED, f.detail


def test_a_broken_frame_does_not_stop_the_frames_after_it() -> None:
    led = segment_ledger(7, sealed=False, fault="frame_hash_mismatch")
    lines, out = read(led, None)
    # Every entry still read: the frames after the rewritten one verify from its
    # stored hash, and its own content reads.
    assert len(out) == led.entries
    (finding,) = lines.report.findings
    assert " frame 1 byte " in finding.detail


def test_audit_of_a_projection_matches_the_jsonl_audit() -> None:
    led = segment_ledger(8, sealed=True)
    key = segment_member(f"{led.path}/KEY")
    assert key is not None and key.storage == SEGMENTS
    audit = audit_lines(key, read_segment_ledger(led.files, led.files.__getitem__,
                                                 keys_of(led)))
    plain = audit_lines(SessionKey(led.path, key.agent, key.cwd_hash, key.session_id),
                        iter(led.lines))
    assert audit.row["status"] == "ok" and audit.findings == []
    assert audit.row["content"] == "opened" and audit.row["storage"] == "segments"
    for col in ("entries", "input_tokens", "output_tokens", "turns", "requests", "head_id"):
        assert audit.row[col] == plain.row[col], col
    assert audit.usage == plain.usage


def test_sealed_audit_counts_entries_and_says_sealed_never_zero() -> None:
    led = segment_ledger(9, sealed=True)
    key = segment_member(f"{led.path}/KEY")
    assert key is not None
    audit = audit_lines(key, read_segment_ledger(led.files, led.files.__getitem__, None))
    assert audit.row["entries"] == led.entries
    assert audit.row["status"] == "ok" and audit.row["content"] == "sealed"
    assert audit.row.get("input_tokens") is None
    (usage,) = audit.usage
    assert "sealed" in usage and not any(isinstance(v, int) and not isinstance(v, bool)
                                          for v in usage)


def test_lost_entries_are_not_reported_twice_by_the_tree() -> None:
    led = segment_ledger(10, sealed=True, fault="segment_dropped")
    key = segment_member(f"{led.path}/KEY")
    assert key is not None
    audit = audit_lines(key, read_segment_ledger(led.files, led.files.__getitem__,
                                                 keys_of(led)))
    assert {f.code for f in audit.findings} - {Code.DUPLICATE_KIND_KEY} == {Code.SEGMENT_DROPPED}
    assert audit.row["status"] == "ok"


def test_keys_never_show() -> None:
    secret = "ab" * 32
    keys = keys_from_json(f'{{"conversation:x": "{secret}"}}')
    assert secret not in repr(keys) and secret not in str(keys)
    assert keys.scope_key("conversation:x") == bytes.fromhex(secret)
    assert pickle.loads(pickle.dumps(keys)).scope_key("conversation:x") == bytes.fromhex(secret)
    with pytest.raises(UsageError) as err:
        keys_from_json(f'{{"a": "{secret}", "b": "{secret[:-2]}zz"}}')
    assert secret[:20] not in str(err.value) and "'b'" in str(err.value)
    with pytest.raises(UsageError):
        keys_from_json("[1, 2]")


def test_vak_key_file_and_scope_keys_unwrap_as_vak_does() -> None:
    ledgers = [segment_ledger(s, sealed=True) for s in (11, 12)]
    text, files = vak_key_material(ledgers, "four quiet lanterns",
                                   shredded=[ledgers[1].scope])
    keks = open_key_file(text, "four quiet lanterns")
    wrapped = {p.rsplit("/", 1)[1]: b for p, b in files.items() if "/keys/scopes/keys/" in
               f"/{p}"}
    tombs = [p.rsplit("/", 1)[1] for p in files if "tombstones" in p]
    keys = vak_scope_keys(keks, wrapped, tombs)
    assert keys.scope_key(ledgers[0].scope) == ledgers[0].key
    assert keys.scope_key(ledgers[1].scope) is None and keys.shredded(ledgers[1].scope)
    lines, _ = read(ledgers[1], keys)
    assert "shredded" in lines.report.findings[-1].detail
    with pytest.raises(UsageError, match="passphrase"):
        open_key_file(text, "not the passphrase")


def test_frames_of_another_chain_and_genesis() -> None:
    data, head = frame(GENESIS, 0, b"x")
    walk = walk_frames(data, GENESIS)
    assert walk.head == head and not walk.mismatches
    assert walk_frames(data, head).mismatches == [(0, 0)]
    assert not walk_frames(data, None).mismatches  # unknown predecessor: not checked


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["seg-00000001.log", "seg-00000001.sealed",
                                        "seg-00000002.log", "seg-00000003.sealed",
                                        "seg-00000002.sealing", "seals.log", "KEY"]),
                       st.binary(max_size=300), min_size=1))
def test_arbitrary_files_never_raise(files: dict[str, bytes]) -> None:
    keys = StaticKeys({"conversation:x": bytes(32)})
    lines = read_segment_ledger(files, files.__getitem__, keys)
    list(lines)
    assert all(f.detail for f in lines.report.findings)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["seg-00000001.log", "seg-00000001.sealed",
                                        "seg-00000002.log", "seg-00000002.sealed",
                                        "seg-00000003.sealed", "seg-00000002.sealing",
                                        "seals.log", "KEY", "LOCK"]),
                       st.binary(max_size=300), min_size=1), st.booleans())
def test_what_is_fetched_ahead_holds_every_read_in_its_order(files: dict[str, bytes],
                                                              keyed: bool) -> None:
    # members_read is what an object store fetches ahead of the reading: whatever the
    # files hold, every member the reading asks for is in it, in the reading's order,
    # once; LOCK and a .sealing leftover never.
    asked: list[str] = []

    def fetch(name: str) -> bytes:
        asked.append(name)
        return files[name]
    keys = StaticKeys({"conversation:x": bytes(32)}) if keyed else None
    list(read_segment_ledger(files, fetch, keys))
    predicted = members_read(files)
    assert len(set(predicted)) == len(predicted)
    assert not {"LOCK", "seg-00000002.sealing"} & set(predicted)
    assert [n for n in predicted if n in asked] == asked


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.data())
def test_a_flipped_bit_is_always_reported(seed: int, data: st.DataObject) -> None:
    led = segment_ledger(seed % 5, sealed=data.draw(st.booleans()), segments=2)
    name = data.draw(st.sampled_from(sorted(n for n in led.files if n.startswith("seg"))))
    body = bytearray(led.files[name])
    at = data.draw(st.integers(0, len(body) - 1))
    body[at] ^= 1 << data.draw(st.integers(0, 7))
    files = {**led.files, name: bytes(body)}
    lines = read_segment_ledger(files, files.__getitem__, keys_of(led))
    list(lines)
    assert any(f.severity >= Severity.WARNING for f in lines.report.findings)


@pytest.mark.parametrize("sealed", [True, False])
def test_after_a_broken_length_reading_resumes_at_the_next_verifying_frame(
        sealed: bool) -> None:
    led = segment_ledger(13, sealed=sealed, fault="frame_length")
    lines, out = read(led, keys_of(led))
    (finding,) = lines.report.findings
    assert finding.code is Code.FRAME_LENGTH and "reading resumed at byte" in finding.detail
    # Only the length was zeroed: that frame's content reads too, and all after it.
    assert out == led.lines
