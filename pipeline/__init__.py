"""vakpipe: audit, replay and compact archives of vak session ledgers.

The package keeps three layers apart:

* pure logic (:mod:`pipeline.types`, :mod:`pipeline.layout`, :mod:`pipeline.reader`,
  :mod:`pipeline.tree`, :mod:`pipeline.audit`, :mod:`pipeline.generate`): no fsspec,
  no dask, no IO;
* IO (:mod:`pipeline.io`): fsspec enumeration and reads, Parquet writes and commits;
* orchestration (:mod:`pipeline.orchestrate`): the Dask graphs.
"""

from __future__ import annotations

__version__ = "0.1.0"
