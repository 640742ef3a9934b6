"""Segment ledgers through the ``vakpipe`` entry point, in separate processes
(docs/segments.md): a mixed archive (JSONL ledgers and segment ledgers, clean and with
every fault, sealed and plain) audits, replays and prices in one run, locally and on
S3; with the keys, sealed content is read; without, integrity is complete and the
content is said sealed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.compute as pc
import pytest

from pipeline.io.commit import read_dataset
from pipeline.io.storage import Location, resolve
from pipeline.ledger.types import Code
from pipeline.synth.fleet import write_fleet
from pipeline.synth.local_s3 import LocalS3
from pipeline.synth.segments import (
    SEGMENT_FAULTS,
    SegmentLedger,
    keys_json,
    segment_ledger,
    vak_key_material,
    write_segment_ledger,
)
from tests.helpers.storage import BUCKET, run_vakpipe

JSONL_SESSIONS = 3


vakpipe = run_vakpipe


def ledgers() -> list[SegmentLedger]:
    out = [segment_ledger(200, sealed=True), segment_ledger(201, sealed=False)]
    for i, fault in enumerate(sorted(SEGMENT_FAULTS)):
        out.append(segment_ledger(210 + i, sealed=i % 2 == 0, fault=fault))
    return out


def write_archive(root: Location) -> list[SegmentLedger]:
    write_fleet(root, sessions=JSONL_SESSIONS, seed=4, size_scale=0.3)
    made = ledgers()
    for led in made:
        write_segment_ledger(root, led)
    return made


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[SegmentLedger]]:
    base = tmp_path_factory.mktemp("segments")
    made = write_archive(resolve(str(base / "archive")))
    (base / "keys.json").write_bytes(keys_json(made))
    return base, made


def by_path(out: Path, dataset: str) -> dict[str, list[dict[str, object]]]:
    rows: dict[str, list[dict[str, object]]] = {}
    table = read_dataset(resolve(str(out)), dataset)
    for row in table.drop_columns([c for c in table.column_names if c.endswith("ts")]
                                  ).to_pylist():
        rows.setdefault(str(row["session_path"]), []).append(row)
    return rows


def expected(led: SegmentLedger, keyed: bool) -> set[str]:
    codes = {c.text for c in led.expected}
    if led.key is not None and not keyed:
        codes.discard(Code.FRAME_UNREADABLE.text)  # only a key sees it
        codes.add(Code.CONTENT_SEALED.text)
    return codes


def check_run(out: Path, made: list[SegmentLedger], keyed: bool) -> None:
    sessions = {p: r[0] for p, r in by_path(out, "integrity/sessions").items()}
    findings = by_path(out, "integrity/findings")
    assert sum(1 for r in sessions.values() if r["storage"] == "jsonl") == JSONL_SESSIONS
    for led in made:
        row = sessions[led.path]
        assert row["storage"] == "segments"
        codes = {str(f["code"]) for f in findings.get(led.path, [])}
        codes.discard(Code.DUPLICATE_KIND_KEY.text)  # vak's work quirk: info, as in JSONL
        assert codes == expected(led, keyed), led.fault
        sealed = led.key is not None and not keyed
        # Sealed: every frame is an entry; read: the entries that could be read.
        unread = led.fault == "frame_unreadable" and not sealed
        assert row["entries"] == led.entries - unread, led.fault
        assert row["content"] == ("sealed" if sealed else "opened" if led.key else "plain")
        if sealed:
            assert row["input_tokens"] is None  # never a silent zero
        elif led.fault is None:
            assert isinstance(row["input_tokens"], int) and row["input_tokens"] > 0
        for f in findings.get(led.path, []):
            code = Code[str(f["code"]).upper()]
            assert f["severity"] == code.severity.label


def test_mixed_archive_audits_with_and_without_keys(
        archive: tuple[Path, list[SegmentLedger]]) -> None:
    base, made = archive
    done = vakpipe("audit", str(base / "archive"), "--out", str(base / "nokeys"),
                   "--workers", "0")
    assert done.returncode == 0, done.stderr
    assert "segment ledgers: " in done.stdout and "sealed 9" in done.stdout
    check_run(base / "nokeys", made, keyed=False)
    usage = read_dataset(resolve(str(base / "nokeys")), "usage")
    assert pc.sum(pc.equal(usage["kind"], "sealed")).as_py() == sum(
        1 for led in made if led.key is not None)

    done = vakpipe("replay", str(base / "archive"), "--out", str(base / "keys"),
                   "--workers", "0", "--keys", str(base / "keys.json"))
    assert done.returncode == 0, done.stderr
    check_run(base / "keys", made, keyed=True)
    requests = by_path(base / "keys", "requests")
    assert requests[made[0].path] and requests[made[1].path]  # sealed and plain, replayed


def test_the_keys_travel_to_the_workers_of_a_cluster(
        archive: tuple[Path, list[SegmentLedger]]) -> None:
    base, made = archive
    done = vakpipe("audit", str(base / "archive"), "--out", str(base / "cluster"),
                   "--workers", "1", "--keys", str(base / "keys.json"))
    assert done.returncode == 0, done.stderr
    check_run(base / "cluster", made, keyed=True)
    secret = made[0].key
    assert secret is not None
    assert secret.hex() not in done.stdout + done.stderr


def test_cost_names_sealed_ledgers_and_prices_opened_ones(
        archive: tuple[Path, list[SegmentLedger]]) -> None:
    base, _ = archive
    done = vakpipe("cost", str(base / "archive"), "--out", str(base / "cost-nokeys"))
    assert done.returncode == 0, done.stderr
    assert "9 segment ledgers are sealed" in done.stderr
    assert "NOT PRICED: 9 sealed segment ledgers" in done.stdout
    done = vakpipe("cost", str(base / "archive"), "--out", str(base / "cost-keys"),
                   "--keys", str(base / "keys.json"))
    assert done.returncode == 0, done.stderr
    assert "sealed" not in done.stderr


def test_vak_key_file_opens_the_ledgers_and_a_shredded_scope_stays_sealed(
        tmp_path: Path) -> None:
    made = [segment_ledger(300, sealed=True), segment_ledger(301, sealed=True)]
    for led in made:
        write_segment_ledger(resolve(str(tmp_path / "archive")), led)
    text, files = vak_key_material(made, "four quiet lanterns", shredded=[made[1].scope])
    (tmp_path / "vakyartha.key").write_text(text)
    for name, data in files.items():
        (tmp_path / "home" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "home" / name).write_bytes(data)
    args = ("audit", str(tmp_path / "archive"), "--out", str(tmp_path / "out"),
            "--workers", "0", "--vak-key-file", str(tmp_path / "vakyartha.key"),
            "--vak-tenant", str(tmp_path / "home"))
    done = vakpipe(*args, env={k: v for k, v in os.environ.items()
                               if k != "VAKPIPE_KEY_PASSPHRASE"})
    assert done.returncode == 2 and "VAKPIPE_KEY_PASSPHRASE" in done.stderr
    done = vakpipe(*args, env={**os.environ, "VAKPIPE_KEY_PASSPHRASE": "wrong one"})
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "four quiet" not in done.stderr
    done = vakpipe(*args, env={**os.environ, "VAKPIPE_KEY_PASSPHRASE": "four quiet lanterns"})
    assert done.returncode == 0, done.stderr
    rows = {p: r[0] for p, r in by_path(tmp_path / "out", "integrity/sessions").items()}
    assert rows[made[0].path]["content"] == "opened"
    assert rows[made[1].path]["content"] == "sealed"
    details = [f["detail"] for f in by_path(tmp_path / "out", "integrity/findings")
               [made[1].path]]
    assert any("shredded" in str(d) for d in details)


def test_compact_write_archive_skips_segment_ledgers_with_one_line(
        archive: tuple[Path, list[SegmentLedger]]) -> None:
    base, made = archive
    done = vakpipe("compact", str(base / "archive"), "--out", str(base / "packets"),
                   "--workers", "0", "--window", "4000", "--write-archive",
                   "--keys", str(base / "keys.json"))
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "not copied" in line]
    assert len(lines) == 1 and f"{len(made)} not copied" in lines[0]
    copies = base / "packets" / "archive"
    assert not any(p.name.startswith("seg-") for p in copies.rglob("*")) \
        if copies.exists() else True


def test_show_a_request_of_a_segment_ledger(
        archive: tuple[Path, list[SegmentLedger]]) -> None:
    base, made = archive
    requests = by_path(base / "keys", "requests") if (base / "keys").exists() else {}
    if not requests:
        pytest.skip("runs after the replay of test_mixed_archive_audits_with_and_without_keys")
    scope = str(requests[made[0].path][0]["scope"])
    done = vakpipe("show", str(base / "archive" / made[0].path), "--scope", scope,
                   "--keys", str(base / "keys.json"))
    assert done.returncode == 0, done.stderr
    assert scope in done.stdout


@pytest.mark.slow
def test_mixed_archive_on_s3(s3: LocalS3, tmp_path: Path) -> None:
    made = write_archive(resolve(f"s3://{BUCKET}/archive"))
    (tmp_path / "keys.json").write_bytes(keys_json(made))
    done = vakpipe("audit", f"s3://{BUCKET}/archive", "--out", str(tmp_path / "out"),
                   "--workers", "0", "--keys", str(tmp_path / "keys.json"))
    assert done.returncode == 0, done.stderr
    check_run(tmp_path / "out", made, keyed=True)
    assert json.loads((tmp_path / "out" / "_manifest.json").read_text())


def test_generated_segment_fleet_matches_its_ground_truth(tmp_path: Path) -> None:
    archive, keys = tmp_path / "archive", tmp_path / "keys.json"
    done = vakpipe("generate", str(archive), "--sessions", "2", "--faults",
                   "--segment-ledgers", "32", "--keys-out", str(keys))
    assert done.returncode == 0, done.stderr
    assert keys.stat().st_mode & 0o777 == 0o600  # the ledgers' keys: the owner's only
    truth = json.loads((archive / "segment-ground-truth.json").read_text())
    assert len(truth) == 32 and {t["fault"] for t in truth.values()} >= set(SEGMENT_FAULTS)
    done = vakpipe("audit", str(archive), "--out", str(tmp_path / "out"), "--workers", "0",
                   "--keys", str(keys))
    assert done.returncode == 0, done.stderr
    findings = by_path(tmp_path / "out", "integrity/findings")
    sessions = {p: r[0] for p, r in by_path(tmp_path / "out", "integrity/sessions").items()}
    for path, t in truth.items():
        codes = {str(f["code"]) for f in findings.get(path, [])} - {"duplicate_kind_key"}
        assert codes == set(t["expected"]), (path, t["fault"])
        if t["fault"] is None:
            assert sessions[path]["status"] == "ok"
            assert sessions[path]["entries"] == t["entries"]


def test_nightly_carries_segment_ledgers_forward_and_sees_a_cut_history(
        tmp_path: Path) -> None:
    led = segment_ledger(400, sealed=True)
    root = tmp_path / "archive"
    write_segment_ledger(resolve(str(root)), led)
    (tmp_path / "keys.json").write_bytes(keys_json([led]))
    args = ("nightly", str(root), "--out", str(tmp_path / "nightly"), "--workers", "0",
            "--keys", str(tmp_path / "keys.json"))
    assert vakpipe(*args, "--date", "2026-12-01").returncode == 0
    done = vakpipe(*args, "--date", "2026-12-02")
    assert done.returncode == 0 and "1 unchanged (carried forward)" in done.stdout
    log = sorted((root / led.path).glob("seg-*.log"))[-1]
    log.write_bytes(log.read_bytes()[:-40])  # the last frame cut: history shortened
    done = vakpipe(*args, "--date", "2026-12-03")
    assert done.returncode == 0, done.stderr
    findings = by_path(tmp_path / "nightly" / "date=2026-12-03", "integrity/findings")
    assert {str(f["code"]) for f in findings[led.path]} >= {"frame_torn_tail",
                                                             "history_truncated"}


def test_regress_reads_sealed_segment_ledgers_with_keys(tmp_path: Path) -> None:
    made = [segment_ledger(600, sealed=True), segment_ledger(601, sealed=True)]
    for led in made:
        write_segment_ledger(resolve(str(tmp_path / "archive")), led)
    (tmp_path / "keys.json").write_bytes(keys_json(made))
    args = ("regress", str(tmp_path / "archive"), "--candidate", "v1", "--workers", "0")

    def compared(out: str, *more: str) -> dict[str, object]:
        done = vakpipe(*args, "--out", str(tmp_path / out), *more)
        assert done.returncode == 0, done.stderr
        summary: dict[str, object] = json.loads(
            (tmp_path / out / "regression-summary.json").read_text())
        return summary

    # Without the keys the content stays sealed: nothing to replay, nothing compared.
    assert compared("nokeys")["requests_compared"] == 0
    summary = compared("keys", "--keys", str(tmp_path / "keys.json"))
    assert summary["sessions_compared"] == 2
    assert int(str(summary["requests_compared"])) > 0 and summary["requests_changed"] == 0


def test_generate_refuses_a_keys_file_it_cannot_write_before_writing_the_fleet(
        tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    done = vakpipe("generate", str(archive), "--sessions", "1", "--segment-ledgers", "1",
                   "--keys-out", str(tmp_path / "no-such-folder" / "keys.json"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == (f"vakpipe: error: --keys-out {tmp_path}/no-such-folder/"
                                   "keys.json: its folder does not exist")
    assert not archive.exists()
