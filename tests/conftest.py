"""Shared fixtures of the IO, orchestration and CLI tests.

- ``s3_server`` (session): moto's S3 server as a separate process on 127.0.0.1, reached
  over real HTTP by s3fs (never a patched client). Its endpoint and dummy credentials are
  exported into ``os.environ`` for the whole session, *before* any Dask cluster starts,
  so worker processes and ``vakpipe`` subprocesses inherit them.
- ``s3`` (function): the server reset (every bucket dropped) and a fresh test bucket,
  like s3fs's own test-suite does.
- ``dask_scheduler`` (session): the address of a LocalCluster of two single-threaded
  worker processes, to pass as ``scheduler=`` where a test does not need its own
  cluster (``run_audit`` starts one per call otherwise: ~2.5 s each); tests take it
  through ``scheduler``, which first clears the workers' s3fs instance caches.
- Autouse: fsspec's s3fs instance cache is cleared around every test (a cached instance
  keeps listings of objects a reset has dropped) and Dask's configuration re-read after
  it; Dask's scratch space lives under the session's temporary directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import dask
import fsspec
import pytest
import s3fs
from distributed import Client, LocalCluster
from fsspec.implementations.memory import MemoryFileSystem
from storage_helpers import BUCKET

from pipeline.io.local_s3 import LocalS3, local_s3


@pytest.fixture(scope="session", autouse=True)
def dask_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Dask's ``temporary-directory`` for the session (env and config), under tmp.

    Exported as ``DASK_TEMPORARY_DIRECTORY`` so the clusters ``run_audit`` starts (in
    this process, or in a ``vakpipe`` subprocess) keep their scratch files there too.
    """
    path = tmp_path_factory.mktemp("dask-scratch")
    mp = pytest.MonkeyPatch()
    mp.setenv("DASK_TEMPORARY_DIRECTORY", str(path))
    dask.config.refresh()
    yield path
    mp.undo()
    dask.config.refresh()


@pytest.fixture(scope="session")
def s3_server(dask_tmp: Path) -> Iterator[LocalS3]:
    """moto's S3 server for the whole session, its endpoint exported to ``os.environ``."""
    # Never let a developer's own AWS setup leak into the tests.
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN",
                 "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        os.environ.pop(name, None)
    with local_s3() as server:
        s3fs.S3FileSystem.clear_instance_cache()
        yield server
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def s3(s3_server: LocalS3) -> Iterator[LocalS3]:
    """The S3 server, reset, with an empty bucket ``BUCKET``."""
    s3_server.reset()
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir(BUCKET)
    yield s3_server


@pytest.fixture(autouse=True)
def _fresh_instances_and_config() -> Iterator[None]:
    """No s3fs instance (and its listings cache) survives from one test to the next,
    nor Dask configuration read from a variable a test set (``DASK_SCHEDULER_ADDRESS``,
    which ``run_audit`` reads through ``dask.config.refresh``)."""
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()
    dask.config.refresh()


@pytest.fixture
def memfs() -> Iterator[fsspec.AbstractFileSystem]:
    """fsspec's process-wide in-memory filesystem, emptied before and after the test."""
    fs = fsspec.filesystem("memory")
    MemoryFileSystem.store.clear()
    MemoryFileSystem.pseudo_dirs[:] = [""]
    yield fs
    MemoryFileSystem.store.clear()
    MemoryFileSystem.pseudo_dirs[:] = [""]


@pytest.fixture(scope="session")
def dask_scheduler(s3_server: LocalS3, dask_tmp: Path) -> Iterator[str]:
    """Address of a session-wide LocalCluster of two single-threaded worker processes.

    Depends on ``s3_server`` so the S3 environment is in place before the workers are
    spawned (they inherit it).
    """
    # Its HTTP server on a free port: with ``None`` it would still take 8787, and every
    # cluster run_audit starts meanwhile would warn that the port is in use.
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0",
                      local_directory=str(dask_tmp)) as cluster:
        yield cluster.scheduler_address


@pytest.fixture
def scheduler(dask_scheduler: str) -> str:
    """The session cluster's address, its workers' s3fs instance caches cleared first."""
    with Client(dask_scheduler, set_as_default=False) as client:
        client.run(s3fs.S3FileSystem.clear_instance_cache)
    return dask_scheduler
