"""Compacted archives: a copy of a ledger with its packets appended, streamed.

Workers write the copies into the run's staging folder (never into the archive they
read); the commit moves them under ``OUT/archive/`` with the source archive's layout, so
``OUT/archive`` is itself an archive root that vakpipe and vak can read.
"""

from __future__ import annotations

import posixpath
import shutil
from typing import IO

from pipeline.io.storage import Location, storage_error, storage_errors

#: Copy buffer: the copy holds this much at a time, whatever the ledger's size.
COPY_BYTES = 2**20
#: The dataset name of compacted ledgers in a run's manifest and under ``OUT``.
ARCHIVE = "archive"


def write_compacted(dest: Location, relpath: str, ledger: IO[bytes],
                    appended: list[bytes]) -> int:
    """Write ``ledger``'s bytes followed by ``appended`` lines to ``dest/relpath``.

    Parameters
    ----------
    dest:
        The folder the copy goes under (a run's staging folder for the archive).
    relpath:
        The session's path relative to the archive root.
    ledger:
        The original bytes, read from its start (a spool of what the audit read).
    appended:
        Whole lines (``\\n``-terminated) to add after them.

    Returns
    -------
    int
        Bytes written.

    Raises
    ------
    StorageError
        The copy could not be written; the message names the destination.
    """
    path = dest.join(relpath)
    fs = dest.filesystem()
    ledger.seek(0)
    try:
        dest.makedirs(posixpath.dirname(path))
        with fs.open(path, "wb") as out:
            shutil.copyfileobj(ledger, out, COPY_BYTES)
            for line in appended:
                out.write(line)
            written = out.tell()
    except storage_errors() as err:
        raise storage_error(err, path) from err
    return int(written)
