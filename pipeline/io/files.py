"""One file written at a location a user names (``--html FILE``, ``--file PATH``)."""

from __future__ import annotations

import dataclasses

from pipeline.io.commit import write_small_file
from pipeline.io.storage import Location

__all__ = ["write_file"]


def write_file(dest: Location, data: bytes) -> None:
    """Write ``data`` to the file ``dest`` (any fsspec URL), its folder made: as a
    report's files are written (:func:`~pipeline.io.commit.write_small_file`: whole or
    not at all, never through a symbolic link).

    Raises
    ------
    UnsafeOutputError
        ``dest`` names no file below a folder, or a link is on its way.
    StorageError
        The storage failed.
    """
    path = dest.path.rstrip("/")
    folder = path.rsplit("/", 1)[0] if "/" in path else ""
    url = dest.url.rstrip("/")
    parent = dataclasses.replace(dest, url=url.rsplit("/", 1)[0] if "/" in url else url,
                                 path=folder)
    write_small_file(parent, path, data)
