"""Partial means partial: a report made from a partial run says so, and exits 3.

The partial run is real: ``vakpipe audit --replay`` of an archive in moto's S3 server,
one object answered ``403 AccessDenied`` by the fault proxy (row 6), so the run commits
with ``"partial": true`` and exit 3. Then ``vakpipe cost`` and ``vakpipe regress
--baseline-run`` of that run, each in a process of its own (without the proxy): the line
``input run X is partial: N of M sessions not read; figures are incomplete`` on stderr,
a banner in the HTML, ``partial`` and ``sessions_unread`` in the regression summary, exit
3; ``--allow-partial`` exits 0 (and still says it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
import s3fs

from pipeline.cli import EXIT_OK, EXIT_PARTIAL, run
from pipeline.io.storage import enumerate_sessions, resolve
from pipeline.synth.fleet import write_fleet
from pipeline.synth.local_s3 import LocalS3
from tests.helpers.fault_proxy import FaultProxy, Rule, fault_proxy
from tests.helpers.storage import BUCKET, run_vakpipe

ARCHIVE = f"s3://{BUCKET}/archive"
RUN = f"s3://{BUCKET}/run"
SESSIONS = 4
LINE = re.compile(rf"input run {re.escape(RUN)} is partial: 1 of {SESSIONS} sessions not "
                  "read; figures are incomplete")


@pytest.fixture
def partial_run(s3: LocalS3, scheduler: str) -> Iterator[str]:
    """A replayed run of the archive with one object denied; yields the scheduler."""
    write_fleet(resolve(ARCHIVE), sessions=SESSIONS, seed=5, size_scale=0.2)
    keys = [f"archive/{o.key.path}" for o in enumerate_sessions(resolve(ARCHIVE)).sessions]
    with fault_proxy(s3.endpoint) as proxy:
        proxy.add(Rule("denied", re.escape(keys[1]) + "$", times=None))
        assert partial_audit(proxy, scheduler) == EXIT_PARTIAL
    yield scheduler


def partial_audit(proxy: FaultProxy, scheduler: str) -> int:
    code: int = run(["audit", ARCHIVE, "--replay", "--out", RUN, "--scheduler", scheduler,
                     "--no-progress", "--storage-option", f"endpoint_url={proxy.endpoint}"])
    return code


vakpipe = run_vakpipe


def test_cost_of_a_partial_run_says_so_and_exits_3(partial_run: str) -> None:
    done = vakpipe("cost", RUN)
    assert done.returncode == EXIT_PARTIAL, done.stderr
    assert len(LINE.findall(done.stderr)) == 1
    page = s3fs.S3FileSystem(skip_instance_cache=True).cat_file(
        f"{BUCKET}/run/cost/report.html").decode()
    assert 'id=partial' in page and "PARTIAL INPUT" in page
    assert LINE.search(page)

    allowed = vakpipe("cost", RUN, "--allow-partial")
    assert allowed.returncode == EXIT_OK, allowed.stderr
    assert LINE.search(allowed.stderr)  # still said


def test_regress_against_a_partial_run_says_so_and_exits_3(partial_run: str) -> None:
    args = ("regress", ARCHIVE, "--out", f"s3://{BUCKET}/reg", "--candidate", "v1",
            "--baseline-run", RUN, "--scheduler", partial_run, "--no-progress")
    done = vakpipe(*args)
    assert done.returncode == EXIT_PARTIAL, done.stderr
    assert len(LINE.findall(done.stderr)) == 1
    summary = json.loads(s3fs.S3FileSystem(skip_instance_cache=True).cat_file(
        f"{BUCKET}/reg/regression-summary.json"))
    assert summary["partial"] is True and summary["sessions_unread"] == 1
    assert summary["inputs"][0] == {"run": RUN, "run_id": summary["inputs"][0]["run_id"],
                                    "partial": True, "sessions": SESSIONS,
                                    "sessions_unread": 1}
    assert summary["inputs"][1]["partial"] is False  # the candidate read everything

    allowed = vakpipe(*args, "--allow-partial")
    assert allowed.returncode == EXIT_OK, allowed.stderr
    assert LINE.search(allowed.stderr)
