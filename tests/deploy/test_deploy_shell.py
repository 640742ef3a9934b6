"""Shell scripts: shellcheck on every one, and the nightly launcher against a stand-in
kubectl (there is no API server here) that keeps DaskJobs in a JSON file."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.deploy_helpers import DASKJOB, DEPLOY, PLACEHOLDER, REPO, run, tool

LAUNCHER = DEPLOY / "scripts" / "launch-nightly.sh"


def shell_scripts() -> list[Path]:
    """.ci/run, every *.sh, and every file in deploy/ or infra/ with a shell shebang."""
    found = {REPO / ".ci" / "run", *REPO.glob("deploy/**/*.sh"), *REPO.glob("infra/**/*.sh")}
    for folder in (REPO / "deploy", REPO / "infra", REPO / ".ci"):
        for path in folder.rglob("*"):
            if path.is_file() and path.suffix not in (".py", ".yaml", ".tf", ".md"):
                head = path.read_bytes()[:64]
                if head.startswith(b"#!") and b"sh" in head.split(b"\n", 1)[0]:
                    found.add(path)
    return sorted(found)


def test_shellcheck_passes_on_every_script() -> None:
    scripts = shell_scripts()
    assert LAUNCHER in scripts and REPO / ".ci" / "run" in scripts
    result = run([tool("shellcheck"), "--severity=style", *map(str, scripts)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/sh\nrm -rf $1/*\n")
    assert run([tool("shellcheck"), str(bad)]).returncode != 0


# --- the launcher against a stand-in kubectl ------------------------------------------------

FAKE_KUBECTL = textwrap.dedent('''\
    #!{python}
    """Stand-in kubectl: the verbs launch-nightly.sh uses, on DaskJobs kept in $STATE."""
    import json, os, sys, yaml
    state_path = os.environ["STATE"]
    state = json.load(open(state_path))
    args = sys.argv[1:]
    state["calls"].append(args)
    jobs = state["jobs"]

    def save():
        json.dump(state, open(state_path, "w"))

    if args[0] == "create":
        doc = yaml.safe_load(sys.stdin)
        name = doc["metadata"]["name"]
        state["created"].append(doc)
        jobs.append({{"name": name, "status": "", "labels": doc["metadata"]["labels"]}})
        save(); print(f"daskjob.kubernetes.dask.org/{{name}} created")
    elif args[0] == "get" and args[1] == "daskjobs":
        out = "".join(f"{{j['name']}} {{j['status']}}\\n" for j in jobs)
        save(); sys.stdout.write(out)
    elif args[0] == "get" and args[1] == "daskjob":
        (job,) = [j for j in jobs if j["name"] == args[2]]
        # The operator's progress: each poll moves the job one step on.
        steps = state["steps"]
        job["status"] = steps.pop(0) if steps else state["final"]
        save(); sys.stdout.write(job["status"])
    elif args[0] == "delete":
        state["jobs"] = [j for j in jobs if j["name"] != args[2]]
        save(); print(f"daskjob.kubernetes.dask.org/{{args[2]}} deleted")
    else:
        sys.exit(f"unexpected kubectl {{args}}")
''')


def launch(tmp_path: Path, jobs: list[tuple[str, str]], final: str,
           keep: int = 3) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(FAKE_KUBECTL.format(python=sys.executable))
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IEXEC)
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps({
        "jobs": [{"name": n, "status": s} for n, s in jobs], "calls": [], "created": [],
        "steps": ["JobCreated", "ClusterCreated", "Running"], "final": final}))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(state_path),
           "DASKJOB_TEMPLATE": str(DASKJOB), "KEEP_DASKJOBS": str(keep), "POLL_SECONDS": "0"}
    result = subprocess.run(["sh", str(LAUNCHER)], env=env, capture_output=True, text=True,
                            timeout=60)
    return result, json.loads(state_path.read_text())


def old_jobs(n: int) -> list[tuple[str, str]]:
    return [(f"vakpipe-nightly-2026110{i}-020000", "Successful") for i in range(1, n + 1)]


def test_launcher_creates_a_unique_daskjob_waits_and_prunes(tmp_path: Path) -> None:
    result, state = launch(tmp_path, old_jobs(4), final="Successful", keep=3)
    assert result.returncode == 0, result.stderr
    (created,) = state["created"]
    name = created["metadata"]["name"]
    assert name.startswith("vakpipe-nightly-") and name != PLACEHOLDER and len(name) <= 63
    assert PLACEHOLDER not in yaml.safe_dump(created)
    selector = created["spec"]["cluster"]["spec"]["scheduler"]["service"]["selector"]
    assert selector["dask.org/cluster-name"] == name
    # It polled until the operator said Successful, then kept the newest 3 ended ones.
    before = [n for n, _ in old_jobs(4)]
    assert [j["name"] for j in state["jobs"]] == [*before[2:], name]
    deleted = [c[2] for c in state["calls"] if c[0] == "delete"]
    assert deleted == before[:2]


def test_launcher_exits_1_when_the_audit_failed(tmp_path: Path) -> None:
    result, state = launch(tmp_path, [], final="Failed")
    assert result.returncode == 1
    assert "Failed" in result.stderr and len(state["created"]) == 1


def test_launcher_refuses_while_a_night_is_still_running(tmp_path: Path) -> None:
    result, state = launch(tmp_path, [*old_jobs(1), ("vakpipe-nightly-20261102-020000",
                                                     "Running")], final="Successful")
    assert result.returncode == 1 and "still running" in result.stderr
    assert state["created"] == [] and not any(c[0] == "delete" for c in state["calls"])


@pytest.mark.parametrize("keep", ["0", "x"])
def test_launcher_rejects_a_bad_keep(keep: str) -> None:
    env = {**os.environ, "KEEP_DASKJOBS": keep}
    result = subprocess.run(["sh", str(LAUNCHER)], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "KEEP_DASKJOBS" in result.stderr
