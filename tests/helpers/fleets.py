"""A generated fleet, written once per test module, and a fresh copy of it per test (a
test that grows, rewrites or attacks its archive never touches another's)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.io.storage import resolve
from pipeline.synth.fleet import write_fleet


def copied_fleet(name: str, **fleet: Any
                 ) -> tuple[Callable[..., Path], Callable[..., Path]]:
    """The fixtures ``generated`` (module scope: :func:`write_fleet` with ``fleet``'s
    arguments, under a folder named ``name``) and ``archive`` (this test's own copy).

    Assign both in the test module: ``generated, archive = copied_fleet("nightly", ...)``.
    """
    @pytest.fixture(scope="module")
    def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
        root = tmp_path_factory.mktemp(name) / "archive"
        write_fleet(resolve(str(root)), **fleet)
        return root

    @pytest.fixture
    def archive(generated: Path, tmp_path: Path) -> Path:
        root = tmp_path / "archive"
        shutil.copytree(generated, root)
        return root

    return generated, archive
