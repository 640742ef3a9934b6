"""Install a plug-in package for a test: into a temporary folder, no build, no network.

What an installer does with a pure-Python wheel, done by hand: the package's modules are
copied, and a ``<name>-<version>.dist-info`` folder (``METADATA``, ``entry_points.txt``
from the ``pyproject.toml``'s ``[project.entry-points.*]``, ``INSTALLER``, ``RECORD``) is
written beside them. With the folder on ``sys.path`` (``PYTHONPATH`` for a process),
``importlib.metadata`` finds the distribution and its entry points as it finds any
installed one. (A real build needs ``wheel`` or a build backend fetched from an index: a
test must not depend on either.)
"""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

from tests.helpers.data_paths import DATA

#: The demo plug-in (one entry point of each kind, and a broken one).
DEMO_PLUGIN = DATA / "plugins" / "vakpipe-demo-plugin"


def install_plugin(source: Path, target: Path) -> Path:
    """Install the plug-in project at ``source`` into ``target``; returns ``target``."""
    project = tomllib.loads((source / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    name, version = project["name"], project["version"]
    target.mkdir(parents=True, exist_ok=True)
    records = []
    for package in sorted(p for p in source.iterdir() if (p / "__init__.py").exists()):
        shutil.copytree(package, target / package.name,
                        ignore=shutil.ignore_patterns("__pycache__"))
        records += [str(f.relative_to(target)) for f in (target / package.name).rglob("*.py")]
    dist = target / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    groups = project.get("entry-points", {})
    (dist / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()) + "\n"
        for group, points in groups.items()), encoding="utf-8")
    (dist / "INSTALLER").write_text("vakpipe-tests\n", encoding="utf-8")
    records += [f"{dist.name}/{f}" for f in ("METADATA", "entry_points.txt", "INSTALLER",
                                             "RECORD")]
    (dist / "RECORD").write_text("".join(f"{r},,\n" for r in records), encoding="utf-8")
    return target


def env_with(path: Path) -> dict[str, str]:
    """This process's environment with ``path`` first on ``PYTHONPATH``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH")) if p)
    return env
