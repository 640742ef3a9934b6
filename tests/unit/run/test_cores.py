"""The CPU quota a cgroup sets (``orchestrate.cgroup_cpu_quota``), read from folders
laid out as the kernel's are: the LocalCluster's workers and the in-process limits
follow a container's ``--cpus`` or a Kubernetes CPU limit, not the host's cores."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.run import orchestrate
from pipeline.run.orchestrate import cgroup_cpu_quota


def group(mount: Path, path: str, **files: str) -> None:
    folder = mount / path.strip("/")
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text + "\n")


def membership(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "cgroup"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_v2_reads_cpu_max_and_the_smallest_along_the_path(tmp_path: Path) -> None:
    mounts = tmp_path / "fs"
    group(mounts, "/kubepods", cpu_max="400000 100000")
    group(mounts, "/kubepods/pod1", cpu_max="max 100000")
    group(mounts, "/kubepods/pod1/c1", cpu_max="150000 100000")
    assert cgroup_cpu_quota(mounts, membership(tmp_path, "0::/kubepods/pod1/c1")) == 1.5
    group(mounts, "/kubepods/pod1/c1", cpu_max="max 100000")
    assert cgroup_cpu_quota(mounts, membership(tmp_path, "0::/kubepods/pod1/c1")) == 4.0
    group(mounts, "/kubepods", cpu_max="max 100000")
    assert cgroup_cpu_quota(mounts, membership(tmp_path, "0::/kubepods/pod1/c1")) is None


def test_a_container_sees_its_own_group_as_the_mount_root(tmp_path: Path) -> None:
    # Without a cgroup namespace the path is the host's, and the folder that holds the
    # container's limit is the mount itself.
    mounts = tmp_path / "fs"
    group(mounts, "/", cpu_max="200000 100000")
    assert cgroup_cpu_quota(mounts, membership(tmp_path, "0::/docker/abc123")) == 2.0
    assert cgroup_cpu_quota(mounts, membership(tmp_path, "0::/")) == 2.0


@pytest.mark.parametrize("controllers", ["cpu,cpuacct", "cpu"])
def test_v1_reads_the_cfs_quota_under_the_cpu_controllers_mount(
        tmp_path: Path, controllers: str) -> None:
    mounts = tmp_path / "fs"
    group(mounts / controllers, "/", cpu_cfs_quota_us="-1", cpu_cfs_period_us="100000")
    group(mounts / controllers, "/vak", cpu_cfs_quota_us="50000",
          cpu_cfs_period_us="100000")
    group(mounts / "memory", "/vak")
    lines = ("5:memory:/vak", f"3:{controllers}:/vak", "1:name=systemd:/")
    assert cgroup_cpu_quota(mounts, membership(tmp_path, *lines)) == 0.5
    group(mounts / controllers, "/vak", cpu_cfs_quota_us="-1", cpu_cfs_period_us="100000")
    assert cgroup_cpu_quota(mounts, membership(tmp_path, *lines)) is None


@pytest.mark.parametrize("text", ["", "garbage", "0::", "max", "x 100000", "100000 0",
                                  "-5 100000"])
def test_what_the_files_do_not_say_is_no_quota(tmp_path: Path, text: str) -> None:
    mounts = tmp_path / "fs"
    group(mounts, "/", cpu_max=text)
    assert cgroup_cpu_quota(mounts, membership(tmp_path, "0::/", text)) is None
    assert cgroup_cpu_quota(mounts, tmp_path / "no-such-file") is None
    assert cgroup_cpu_quota(tmp_path / "no-mounts", membership(tmp_path, "0::/a")) is None


def test_a_folder_it_may_not_look_into_is_no_crash(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Path.is_dir raises PermissionError (it swallows only "not there" errors).
    mounts = tmp_path / "fs"
    group(mounts, "/", cpu_max="100000 100000")

    def denied(self: Path) -> bool:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "is_dir", denied)
    assert cgroup_cpu_quota(mounts, membership(tmp_path, "0::/a")) is None
    assert orchestrate.local_cores() >= 1


@pytest.mark.parametrize(("quota", "cores"), [(None, 2), (0.5, 1), (1.5, 2), (2.0, 2),
                                              (64.0, 2)])
def test_local_cores_is_the_affinity_capped_by_the_quota_rounded_up(
        quota: float | None, cores: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(orchestrate.os, "sched_getaffinity", lambda pid: {0, 1},
                        raising=False)
    monkeypatch.setattr(orchestrate, "cgroup_cpu_quota", lambda: quota)
    assert orchestrate.local_cores() == cores
