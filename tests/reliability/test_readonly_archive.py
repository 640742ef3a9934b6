"""Row 12: vakpipe never writes or deletes anything under the archive prefix.

By construction: workers get the archive's location to read from only (they return
tables; the client stages and commits them under OUT), compacted copies are written into
the run's staging folder under OUT, and an output that overlaps the archive either way
round is refused before anything runs (``check_output``, exit 2).

Proved here at the wire: every command that reads an archive (``audit``, ``audit
--replay``, ``replay``, ``compact --write-archive``, two ``nightly`` runs, ``regress``),
including the paths of a partial run (an object denied) and of an object replaced while
read, runs against moto through the fault proxy, with its outputs in the *same bucket*;
the proxy's log of every request (the client's and the workers') must show only GET and
HEAD under ``archive/``, while the outputs were written (so writes would have been seen).
"""

from __future__ import annotations

import re

import pytest
import s3fs

from pipeline.cli import EXIT_OK, EXIT_PARTIAL, EXIT_UNUSABLE, run
from pipeline.io.storage import enumerate_sessions, resolve
from pipeline.synth.fleet import write_fleet
from pipeline.synth.local_s3 import LocalS3
from tests.helpers.fault_proxy import READ_METHODS, FaultProxy, Rule
from tests.helpers.storage import BUCKET

ARCHIVE = f"s3://{BUCKET}/archive"


def snapshot(fs: s3fs.S3FileSystem) -> dict[str, tuple[str, bytes]]:
    """Every archive object: ETag and bytes (read straight from moto)."""
    return {p: (i["ETag"], fs.cat_file(p))
            for p, i in fs.find(f"{BUCKET}/archive", detail=True).items()}


@pytest.mark.slow
def test_no_command_ever_writes_or_deletes_under_the_archive_prefix(
    s3: LocalS3, proxy: FaultProxy, scheduler: str
) -> None:
    write_fleet(resolve(ARCHIVE), sessions=8, seed=12, faults=True, size_scale=0.3)
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    before = snapshot(fs)
    keys = [f"archive/{o.key.path}" for o in enumerate_sessions(resolve(ARCHIVE)).sessions]
    common = ["--scheduler", scheduler, "--no-progress",
              "--storage-option", f"endpoint_url={proxy.endpoint}"]
    reports = f"s3://{BUCKET}/reports"

    assert run(["audit", ARCHIVE, "--out", f"{reports}/audit", *common]) == EXIT_OK
    assert run(["audit", ARCHIVE, "--out", f"{reports}/replay", "--replay",
                *common]) == EXIT_OK
    # A partial run (one object denied) and an object replaced while read (its re-read).
    proxy.add(Rule("denied", re.escape(keys[0]) + "$", "GET", times=None))
    grown = fs.cat_file(f"{BUCKET}/{keys[1]}") + b"\n"

    def replace(key: str) -> None:
        fs.pipe_file(f"{BUCKET}/{key}", grown)  # the test's own write, straight to moto

    proxy.add(Rule("call", re.escape(keys[1]) + "$", "GET", callback=replace))
    assert run(["replay", ARCHIVE, "--out", f"{reports}/partial", *common]) == EXIT_PARTIAL
    proxy.rules.clear()
    assert run(["compact", ARCHIVE, "--out", f"{reports}/compact", "--window", "8000",
                "--write-archive", *common]) == EXIT_OK
    assert run(["nightly", ARCHIVE, "--out", f"{reports}/nightly", "--date", "2026-12-01",
                *common]) == EXIT_OK
    assert run(["nightly", ARCHIVE, "--out", f"{reports}/nightly", "--date", "2026-12-02",
                "--compaction", *common]) == EXIT_OK
    assert run(["regress", ARCHIVE, "--out", f"{reports}/regress", "--candidate",
                "v1-terse-cards", *common]) in (0, 1)
    # An output that would overlap the archive is refused before anything is read.
    for out in (ARCHIVE, f"{ARCHIVE}/reports", f"s3://{BUCKET}"):
        assert run(["audit", ARCHIVE, "--out", out, *common]) == EXIT_UNUSABLE

    log = proxy.requests()
    writes = [r for r in log if r.method not in READ_METHODS]
    assert any(k.startswith("reports/compact/archive/") for r in writes for k in r.writes)
    assert any(r.method == "DELETE" or r.deleted for r in writes)  # commits clean up
    touched = [(r.method, k) for r in writes for k in r.writes
               if k.startswith("archive/") or k.startswith("<bucket")]
    assert touched == []
    # Reads of the archive did happen, by every kind: listings, HEADs, GETs.
    archive_reads = {r.method for r in log if r.key.startswith("archive/")}
    assert archive_reads == {"GET", "HEAD"}
    assert any("list-type" in r.query and "prefix=archive" in r.query for r in log)
    # And the archive is byte for byte what it was (moto's own view).
    after = snapshot(fs)
    rewritten = f"{BUCKET}/{keys[1]}"  # only by the test's own write
    assert after.keys() == before.keys() and after[rewritten][1] == grown
    assert {p: v for p, v in after.items() if p != rewritten} == \
        {p: v for p, v in before.items() if p != rewritten}
