"""Offline checks of the Kubernetes side of deploy/: YAML style, built-in kinds against
Kubernetes' schemas, the DaskJob against the operator's own CRD, and the promises the
files make to each other (one image, names, RBAC, mounts).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.deploy_helpers import (
    DASK_CONFIG,
    DASKJOB,
    DEPLOY,
    INFRA,
    K8S,
    K8S_VERSIONS,
    PLACEHOLDER,
    REPO,
    containers,
    daskjob_pod_specs,
    generated_configmaps,
    kustomization,
    load,
    manifests,
    run,
    tool,
)
from tests.deploy.k8s_schemas import crd_files, resource_schema

#: The command the nightly DaskJob runs (the lead's `vakpipe nightly`).
NIGHTLY_COMMAND = ["vakpipe", "nightly"]
BUILT_IN = ("namespace.yaml", "serviceaccounts.yaml", "rbac.yaml", "cronjob.yaml")


def yaml_files() -> list[Path]:
    return sorted([*DEPLOY.rglob("*.yaml"), *INFRA.rglob("*.yaml"),
                   REPO / ".yamllint", REPO / ".checkov.yaml"])


def test_yamllint_passes_on_every_yaml_file() -> None:
    result = run([tool("yamllint"), "--strict", "-c", str(REPO / ".yamllint"),
                  *map(str, yaml_files())])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_built_in_kinds_validate_strictly(version: str, tmp_path: Path) -> None:
    # The ConfigMaps exist only as kustomize generates them: validated in that form.
    generated = tmp_path / "configmaps.yaml"
    generated.write_text(yaml.safe_dump_all(generated_configmaps()))
    files = [str(K8S / name) for name in BUILT_IN] + [str(generated)]
    result = run([tool("kubernetes-validate"), "--strict", "-k", version, *files])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "did not validate" not in result.stdout


def test_kubernetes_validate_rejects_a_misspelt_field(tmp_path: Path) -> None:
    # The check above must be able to fail: a field the API does not know.
    bad = tmp_path / "cronjob.yaml"
    bad.write_text((K8S / "cronjob.yaml").read_text().replace(
        "successfulJobsHistoryLimit", "successfulJobHistoryLimit"))
    result = run([tool("kubernetes-validate"), "--strict", "-k", K8S_VERSIONS[-1], str(bad)])
    assert result.returncode != 0 and "successfulJobHistoryLimit" in result.stdout


def test_kustomize_renders_what_the_checks_assume(tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:  # not a PyPI tool: the emulation above stands in for it
        pytest.skip("kubectl is not on PATH: the generated ConfigMaps are emulated only")
    result = run([kubectl, "kustomize", str(DEPLOY)], timeout=120)
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    rendered = {f"{o['kind']}/{o['metadata']['name']}": o for o in objects}
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"} \
        == {"vakpipe"}
    for cm in generated_configmaps():
        assert rendered[f"ConfigMap/{cm['metadata']['name']}"]["data"] == cm["data"]
    assert "DaskJob" not in {o["kind"] for o in objects}  # the CronJob creates it
    out = tmp_path / "rendered.yaml"
    out.write_text(result.stdout)
    check = run([tool("kubernetes-validate"), "--strict", "-k", K8S_VERSIONS[-1], str(out)])
    assert check.returncode == 0, check.stdout + check.stderr


# --- the DaskJob against the operator's CRD -----------------------------------------------


@pytest.fixture(scope="module")
def daskjob_schema(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("schemas") / "daskjob.schema.json"
    path.write_text(json.dumps(resource_schema("DaskJob"), indent=1))
    return path


def test_the_wheel_ships_the_operator_crds() -> None:
    assert {"DaskJob", "DaskCluster", "DaskWorkerGroup"} <= set(crd_files())


def test_daskjob_template_and_a_launched_copy_match_the_crd(
    daskjob_schema: Path, tmp_path: Path
) -> None:
    launched = tmp_path / "launched.yaml"
    launched.write_text(DASKJOB.read_text().replace(PLACEHOLDER, "vakpipe-nightly-20261203-020000"))
    result = run([tool("check-jsonschema"), "--schemafile", str(daskjob_schema),
                  str(DASKJOB), str(launched)])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("old", "new"), [
    ("        replicas: 8", "        replica: 8"),                     # misspelt field
    ("        replicas: 8", "        replicas: eight"),                # wrong type
    ("  name: vakpipe-nightly-template", "  name: Vakpipe_Nightly"),    # not a DNS label
])
def test_the_crd_schema_rejects_broken_daskjobs(
    daskjob_schema: Path, tmp_path: Path, old: str, new: str
) -> None:
    text = DASKJOB.read_text()
    assert old in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace(old, new, 1))
    result = run([tool("check-jsonschema"), "--schemafile", str(daskjob_schema), str(bad)])
    assert result.returncode == 1, result.stdout


# --- what the files promise each other ----------------------------------------------------


@pytest.fixture(scope="module")
def objects() -> dict[str, dict[str, Any]]:
    return manifests()


def test_one_image_for_runner_scheduler_and_workers(objects: dict[str, Any]) -> None:
    specs = daskjob_pod_specs(objects[f"DaskJob/{PLACEHOLDER}"])
    images = {c["image"] for spec in specs.values() for c in containers(spec)}
    assert len(images) == 1, images
    (image,) = images
    assert re.fullmatch(r"[\w.\-/:]+:[\w.\-]+(@sha256:[0-9a-f]{64})?", image)
    assert not image.endswith(":latest")


def test_nightly_job_joins_its_scheduler_through_the_environment(
    objects: dict[str, Any],
) -> None:
    job = objects[f"DaskJob/{PLACEHOLDER}"]
    (runner,) = job["spec"]["job"]["spec"]["containers"]
    args = runner["args"]
    assert args[:len(NIGHTLY_COMMAND)] == NIGHTLY_COMMAND
    root, out = args[len(NIGHTLY_COMMAND)], args[args.index("--out") + 1]
    assert root.startswith("s3://") and out.startswith("s3://")
    assert root.split("/")[2] == out.split("/")[2]  # one bucket: archive/ and reports/
    assert root.split("/")[3] == "archive" and out.split("/")[3] == "reports"
    # The operator injects DASK_SCHEDULER_ADDRESS; nothing may shadow it.
    assert "--scheduler" not in args
    names = {e["name"] for spec in daskjob_pod_specs(job).values()
             for c in containers(spec) for e in c.get("env", [])}
    assert "DASK_SCHEDULER_ADDRESS" not in names
    # A failed run ends the DaskJob; the operator's default would restart it forever.
    assert job["spec"]["job"]["spec"]["restartPolicy"] == "Never"


def test_the_nightly_runs_the_delta_layout_with_flags_the_cli_accepts(
    objects: dict[str, Any],
) -> None:
    """The runner's arguments parse with the real ``vakpipe nightly`` command (a renamed
    flag would otherwise fail only at 2 a.m. in the cluster), and it runs the layout
    whose runner fits the pod: Delta tables, with retention."""
    from pipeline.cli.nightly import nightly
    from pipeline.run import lifecycle

    job = objects[f"DaskJob/{PLACEHOLDER}"]
    (runner,) = job["spec"]["job"]["spec"]["containers"]
    args = runner["args"][len(NIGHTLY_COMMAND):]
    reporter = lifecycle.current()
    saved = dict(vars(reporter))  # the progress options' callbacks set the reporter
    try:
        ctx = nightly.make_context("nightly", list(args))
    finally:
        vars(reporter).update(saved)
    assert ctx.params["layout"] == "delta"
    assert ctx.params["keep_days"] == 90
    assert ctx.params["progress"] is False
    # docs/nightly.md, "Runner memory": under 4 GiB at 10^6 sessions.
    assert runner["resources"]["limits"]["memory"] == "4Gi"


def test_the_scheduler_service_selects_this_cluster_only(objects: dict[str, Any]) -> None:
    cluster = objects[f"DaskJob/{PLACEHOLDER}"]["spec"]["cluster"]["spec"]
    selector = cluster["scheduler"]["service"]["selector"]
    assert selector == {"dask.org/cluster-name": PLACEHOLDER, "dask.org/component": "scheduler"}
    ports = {p["name"]: p["port"] for p in cluster["scheduler"]["service"]["ports"]}
    assert ports["tcp-comm"] == 8786  # the port of the address the operator injects


def test_workers_are_single_threaded_processes(objects: dict[str, Any]) -> None:
    worker = daskjob_pod_specs(objects[f"DaskJob/{PLACEHOLDER}"])["worker"]
    (container,) = worker["containers"]
    args = container["args"]
    assert args[:2] == ["dask", "worker"]
    assert args[args.index("--nthreads") + 1] == "1"
    assert args[args.index("--local-directory") + 1] == "/scratch"
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    # Dask reads its memory limit from the cgroup: the limit must be set, and equal to
    # the request so the scheduler's placement matches what the worker may use.
    assert limits["memory"] == requests["memory"]


def test_every_pod_is_unprivileged_with_a_read_only_root(objects: dict[str, Any]) -> None:
    cron = objects["CronJob/vakpipe-nightly"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    specs = {**daskjob_pod_specs(objects[f"DaskJob/{PLACEHOLDER}"]), "launcher": cron}
    for role, spec in specs.items():
        assert spec["securityContext"]["runAsNonRoot"] is True, role
        assert spec["securityContext"]["runAsUser"] != 0, role
        for c in containers(spec):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, role
            assert sc["readOnlyRootFilesystem"] is True, role
            assert sc["capabilities"]["drop"] == ["ALL"], role
            assert c["resources"]["limits"]["memory"], role


def test_dask_config_is_mounted_where_the_image_points_dask(objects: dict[str, Any]) -> None:
    dockerfile = (DEPLOY / "image" / "Dockerfile").read_text()
    assert "DASK_CONFIG=/etc/dask" in dockerfile
    (gen,) = [g for g in kustomization()["configMapGenerator"]
              if g["name"] == "vakpipe-dask-config"]
    assert gen["files"] == [f"dask.yaml={DASK_CONFIG.relative_to(DEPLOY)}"]
    temporary = load(DASK_CONFIG)["temporary-directory"]
    for role, spec in daskjob_pod_specs(objects[f"DaskJob/{PLACEHOLDER}"]).items():
        volumes = {v["name"]: v for v in spec["volumes"]}
        for c in containers(spec):
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            assert volumes[mounts["/etc/dask"]]["configMap"]["name"] == "vakpipe-dask-config"
            assert "emptyDir" in volumes[mounts[temporary]], role
            assert "emptyDir" in volumes[mounts["/tmp"]], role


def test_service_accounts_least_privilege(objects: dict[str, Any]) -> None:
    job = objects[f"DaskJob/{PLACEHOLDER}"]
    specs = daskjob_pod_specs(job)
    assert specs["job"]["serviceAccountName"] == specs["worker"]["serviceAccountName"] \
        == "vakpipe-job"
    assert specs["scheduler"]["serviceAccountName"] == "vakpipe-scheduler"
    job_sa = objects["ServiceAccount/vakpipe-job"]
    assert job_sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith(
        "arn:aws:iam::")
    # Neither the job nor the scheduler talks to the Kubernetes API.
    assert job_sa["automountServiceAccountToken"] is False
    assert objects["ServiceAccount/vakpipe-scheduler"]["automountServiceAccountToken"] is False
    assert "annotations" not in objects["ServiceAccount/vakpipe-scheduler"]["metadata"]


def test_launcher_rbac_is_exactly_what_its_script_uses(objects: dict[str, Any]) -> None:
    role = objects["Role/vakpipe-launcher"]
    (rule,) = role["rules"]
    assert rule == {"apiGroups": ["kubernetes.dask.org"], "resources": ["daskjobs"],
                    "verbs": ["create", "get", "list", "delete"]}
    binding = objects["RoleBinding/vakpipe-launcher"]
    assert binding["roleRef"]["name"] == "vakpipe-launcher"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vakpipe-launcher",
                                    "namespace": kustomization()["namespace"]}]
    script = (DEPLOY / "scripts" / "launch-nightly.sh").read_text()
    # kubectl as a command (line start, after a pipe or in $(...)), not in messages.
    used = set(re.findall(r"(?:^|\||\$\()\s*kubectl (\w+)", script, re.MULTILINE))
    # `get` on a collection is the `list` verb; the script does both.
    assert used == {"get", "create", "delete"}, used
    assert "--watch" not in script and " wait " not in script  # no watch verb granted


def test_cronjob_launches_the_daskjob_template(objects: dict[str, Any]) -> None:
    cron = objects["CronJob/vakpipe-nightly"]["spec"]
    assert cron["concurrencyPolicy"] == "Forbid"
    assert cron["successfulJobsHistoryLimit"] >= 1 and cron["failedJobsHistoryLimit"] >= 1
    job = cron["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0  # a retried launcher would start a second audit
    pod = job["template"]["spec"]
    assert pod["serviceAccountName"] == "vakpipe-launcher" and pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (volume,) = [v for v in pod["volumes"] if v["name"] == "launcher"]
    (gen,) = [g for g in kustomization()["configMapGenerator"]
              if g["name"] == volume["configMap"]["name"]]
    keys = dict(entry.split("=", 1) for entry in gen["files"])
    assert (DEPLOY / keys["daskjob-nightly.yaml"]).resolve() == DASKJOB.resolve()
    assert env["DASKJOB_TEMPLATE"] == f"{mounts['launcher']}/daskjob-nightly.yaml"
    assert container["command"][-1] == f"{mounts['launcher']}/launch-nightly.sh"
    labels = objects[f"DaskJob/{PLACEHOLDER}"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "vakpipe-nightly"  # the launcher's selector


def test_the_placeholder_appears_only_where_the_name_goes() -> None:
    job = load(DASKJOB)
    found: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")
        elif isinstance(node, str) and PLACEHOLDER in node:
            found.append(path)

    walk(job, "")
    assert sorted(found) == [".metadata.name",
                             ".spec.cluster.spec.scheduler.service.selector.dask.org/cluster-name"]
