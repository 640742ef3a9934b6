"""vakpipe: audit, replay and compact archives of vak session ledgers.

Packages by stage, each importing only the ones below it (``[tool.importlinter]`` in
``pyproject.toml``, checked by ``make test``):

* :mod:`pipeline.cli` (click), over ``jobs`` (the scheduled jobs);
* :mod:`pipeline.run`: tasks, cluster, runner; :mod:`pipeline.io`: fsspec and Parquet;
* the pure stages: :mod:`pipeline.compaction`, :mod:`pipeline.costs`,
  :mod:`pipeline.tables`, then :mod:`pipeline.replay`, :mod:`pipeline.audit`,
  :mod:`pipeline.formats`, :mod:`pipeline.ledger` and :mod:`pipeline.errors`: no fsspec,
  no dask, no click;
* :mod:`pipeline.synth` (synthetic fleets) apart, outside the production graph.
"""

from __future__ import annotations

__version__ = "0.1.0"
