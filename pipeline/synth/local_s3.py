"""A local S3 endpoint for the demo, the tests and the benchmarks.

moto's server runs as a separate process on 127.0.0.1 (in-process it would serialise
concurrent reads behind the client's GIL), on a free port, and is reached over real
HTTP by s3fs exactly as a remote S3 would be.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pipeline.errors import StorageError

#: Dummy credentials: moto accepts anything, and giving some stops botocore from
#: probing the EC2 metadata address.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "vakpipe-local",
    "AWS_SECRET_ACCESS_KEY": "vakpipe-local-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class LocalS3:
    """A running local endpoint."""

    endpoint: str
    process: subprocess.Popen[bytes]

    def env(self) -> dict[str, str]:
        """Environment that points botocore (and Dask workers started after) at it."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL_S3": self.endpoint,
                "AWS_ENDPOINT_URL": self.endpoint}

    def reset(self) -> None:
        """Drop every bucket and object (moto's reset API)."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=10).close()


def _wait_ready(endpoint: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StorageError(f"local S3 endpoint exited with code {process.returncode}")
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
            return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise StorageError(f"local S3 endpoint {endpoint} did not answer within {timeout:.0f} s")


@contextmanager
def local_s3(*, set_env: bool = True, extra_env: dict[str, str] | None = None,
             timeout: float = 30.0) -> Iterator[LocalS3]:
    """Start moto's S3 server on 127.0.0.1 for the duration of the block.

    Parameters
    ----------
    set_env:
        Export the endpoint and dummy credentials into ``os.environ`` (restored after),
        so s3fs here and Dask workers started inside the block use it.
    extra_env:
        Extra environment for the server process (e.g. moto settings).
    timeout:
        Seconds to wait for the server to answer.
    """
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, **CREDENTIALS, **(extra_env or {})}
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    saved = dict(os.environ)
    try:
        _wait_ready(endpoint, process, timeout)
        server = LocalS3(endpoint, process)
        if set_env:
            os.environ.update(server.env())
        yield server
    finally:
        if set_env:
            os.environ.clear()
            os.environ.update(saved)
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
