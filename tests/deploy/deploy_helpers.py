"""Plain helpers of the deploy/ and infra/ checks: where things are, the offline tools.

The tools come from the ``deploy-check`` extra (and checkov from its own virtualenv,
``.venv/checkov``), which ``make test`` installs. A test whose tool is missing skips,
naming the tool, except under CI (``CI=true``), where a skipped check would be a check
silently not done: there it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
INFRA = REPO / "infra"
TERRAFORM = INFRA / "terraform"
DASKJOB = K8S / "daskjob-nightly.yaml"
DASK_CONFIG = DEPLOY / "dask" / "dask.yaml"
#: The name the launcher replaces in the DaskJob template.
PLACEHOLDER = "vakpipe-nightly-template"
#: Kubernetes versions the manifests are validated against: the oldest that has every
#: field used (CronJob.spec.timeZone is GA in 1.27; EKS's oldest standard-support
#: version is newer) and the newest kubernetes-validate knows.
K8S_VERSIONS = ("1.29.0", "1.37.0")


def tool(name: str, *, extra: str = "deploy-check") -> str:
    """Path of command-line tool ``name``: this virtualenv's, checkov's own, or PATH's.

    Skips the calling test when it is missing, except under CI, where it fails.
    """
    bin_dir = Path(sys.executable).parent
    candidates = [bin_dir / name, Path(sys.prefix) / name / "bin" / name]
    override = os.environ.get(f"VAKPIPE_{name.upper().replace('-', '_')}")
    if override:
        candidates.insert(0, Path(override))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    found = shutil.which(name)
    if found:
        return found
    reason = (f"{name} is not installed (`make test` installs it: the {extra!r} extra, "
              "checkov in .venv/checkov)")
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI must run every deploy check")
    pytest.skip(reason)


def run(args: Sequence[str], *, cwd: Path = REPO, check: bool = False,
        env: dict[str, str] | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run a tool; return its result (output captured as text)."""
    result = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True,
                            env=env, timeout=timeout)
    if check:
        assert result.returncode == 0, (args, result.stdout[-4000:], result.stderr[-4000:])
    return result


def load_all(path: Path) -> list[dict[str, Any]]:
    """Every YAML document of ``path`` (empty ones dropped)."""
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def load(path: Path) -> dict[str, Any]:
    """The one YAML document of ``path``."""
    (doc,) = load_all(path)
    return doc


def manifests() -> dict[str, dict[str, Any]]:
    """Every object of deploy/k8s (the DaskJob template included), by ``Kind/name``."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in load_all(path):
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


def kustomization() -> dict[str, Any]:
    """deploy/kustomization.yaml."""
    return load(DEPLOY / "kustomization.yaml")


def generated_configmaps() -> list[dict[str, Any]]:
    """The ConfigMaps that deploy/kustomization.yaml's configMapGenerator makes.

    What ``kubectl kustomize`` does for ``files: [key=path]`` with fixed names and the
    generator labels; the real renderer is checked too where kubectl exists.
    """
    k = kustomization()
    labels = k.get("generatorOptions", {}).get("labels", {})
    maps = []
    for gen in k["configMapGenerator"]:
        data = {}
        for entry in gen["files"]:
            key, _, rel = entry.partition("=")
            data[key] = (DEPLOY / rel).read_text()
        maps.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": gen["name"], "namespace": k["namespace"],
                                  "labels": dict(labels)},
                     "data": data})
    return maps


def containers(pod_spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The containers and init containers of a pod spec."""
    yield from pod_spec.get("initContainers", [])
    yield from pod_spec["containers"]


def daskjob_pod_specs(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The three pod specs of a DaskJob: job runner, scheduler, worker."""
    cluster = job["spec"]["cluster"]["spec"]
    return {"job": job["spec"]["job"]["spec"], "scheduler": cluster["scheduler"]["spec"],
            "worker": cluster["worker"]["spec"]}
