"""Shared fixtures of the IO, orchestration and CLI tests.

- ``s3_server`` (session): moto's S3 server as a separate process on 127.0.0.1, reached
  over real HTTP by s3fs (never a patched client). Its endpoint and dummy credentials are
  exported into ``os.environ`` for the whole session, *before* any Dask cluster starts,
  so worker processes and ``vakpipe`` subprocesses inherit them.
- ``s3`` (function): the server reset (every bucket dropped) and a fresh test bucket,
  like s3fs's own test-suite does.
- ``proxy`` (function): the fault proxy of :mod:`tests.helpers.fault_proxy` in front of
  ``s3``, no rule yet (its requests logged).
- ``dask_scheduler`` (session): the address of a LocalCluster of two single-threaded
  worker processes, to pass as ``scheduler=`` where a test does not need its own
  cluster (``run_audit`` starts one per call otherwise: ~2.5 s each); tests take it
  through ``scheduler``, which first clears the workers' s3fs instance caches.
- ``start_separate_cluster`` (function): starts ``dask scheduler`` and ``dask worker``
  as separate processes, as a deployment runs them (any number of times per test, each
  shut down through its scheduler at the end); ``separate_cluster`` is the address of
  one with two worker processes.
- Autouse: fsspec's s3fs instance cache is cleared around every test (a cached instance
  keeps listings of objects a reset has dropped) and Dask's configuration re-read after
  it; Dask's scratch space lives under the session's temporary directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import dask
import fsspec
import pytest
import s3fs
from distributed import Client, LocalCluster
from fsspec.implementations.memory import MemoryFileSystem
from hypothesis import settings

from pipeline.synth.local_s3 import LocalS3, free_port, local_s3
from tests.helpers.fault_proxy import FaultProxy, fault_proxy
from tests.helpers.storage import BUCKET

# Tests never assert wall-clock times: hypothesis's default deadline (200 ms an
# example) is one, and a loaded machine tripped it on a test that set none (an example
# of ~1 ms took 488 ms once in a fresh clone's `make test`). 58 tests had set
# deadline=None one by one; the whole suite runs without one.
settings.register_profile("vakpipe", deadline=None)
settings.load_profile("vakpipe")


@pytest.fixture(scope="session", autouse=True)
def price_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """vakpipe's price cache for the session (``VAKPIPE_CACHE_DIR``), under tmp: the
    suite never writes to the user's ``~/.cache``, and every session starts cold."""
    path = tmp_path_factory.mktemp("price-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("VAKPIPE_CACHE_DIR", str(path))
    yield path
    mp.undo()


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


@pytest.fixture
def proxy(s3: LocalS3) -> Iterator[FaultProxy]:
    """The fault proxy (:mod:`tests.helpers.fault_proxy`) in front of the test's moto
    server, no rule yet."""
    with fault_proxy(s3.endpoint) as p:
        yield p


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


@dataclass(frozen=True)
class SeparateCluster:
    """A scheduler and workers running as separate ``dask`` processes."""

    address: str
    scheduler: subprocess.Popen[bytes]
    workers: subprocess.Popen[bytes]
    log: Path


@contextmanager
def _separate_cluster(base: Path, nworkers: int,
                      env: dict[str, str] | None) -> Iterator[SeparateCluster]:
    bin_dir = Path(sys.executable).parent
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    scratch = base / "dask-scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "DASK_TEMPORARY_DIRECTORY": str(scratch), **(env or {})}
    log = base / "dask.log"
    procs: list[subprocess.Popen[bytes]] = []
    with open(log, "wb") as sink:
        try:
            procs.append(subprocess.Popen(
                [str(bin_dir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                 "--dashboard-address", "127.0.0.1:0"],
                env=full_env, stdout=subprocess.DEVNULL, stderr=sink,
            ))
            procs.append(subprocess.Popen(
                [str(bin_dir / "dask"), "worker", address, "--nworkers", str(nworkers),
                 "--nthreads", "1", "--local-directory", str(scratch)],
                env=full_env, stdout=subprocess.DEVNULL, stderr=sink,
            ))
            with Client(address, timeout=30, set_as_default=False) as client:
                client.wait_for_workers(nworkers, timeout=60)
            yield SeparateCluster(address, procs[0], procs[1], log)
            with Client(address, timeout=30, set_as_default=False) as client:
                client.shutdown()
            codes = [p.wait(timeout=30) for p in procs]
            assert codes == [0, 0], log.read_text()[-3000:]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
                    p.wait(timeout=10)
            dask.config.refresh()  # forget DASK_SCHEDULER_ADDRESS once the test unset it


@pytest.fixture
def start_separate_cluster(
    s3_server: LocalS3, tmp_path: Path
) -> Iterator[Callable[..., SeparateCluster]]:
    """Start ``dask scheduler`` + ``dask worker --nworkers N`` as separate processes.

    ``start(nworkers=2, env=None)`` returns the running :class:`SeparateCluster`. The
    processes inherit this process's environment (the S3 endpoint and credentials) plus
    ``env``, and are shut down through the scheduler when the test ends (both must exit
    with 0).
    """
    with ExitStack() as stack:
        count = 0

        def start(nworkers: int = 2, env: dict[str, str] | None = None) -> SeparateCluster:
            nonlocal count
            count += 1
            return stack.enter_context(
                _separate_cluster(tmp_path / f"cluster-{count}", nworkers, env))

        yield start


@pytest.fixture
def separate_cluster(start_separate_cluster: Callable[..., SeparateCluster]) -> str:
    """The address of a separate-process cluster of two worker processes."""
    return start_separate_cluster().address
