"""The run: the per-object tasks, the cluster, the runner and the commit.

What one task does to one batch of sessions (:mod:`~pipeline.run.batches`, and with the
replay :mod:`~pipeline.run.replay_batches`), the cluster and the runner that plans
batches, runs them and commits the tables (:mod:`~pipeline.run.orchestrate`), and a
run's stage, progress and signals (:mod:`~pipeline.run.lifecycle`).

Contract: imports :mod:`pipeline.io` and the pure packages; imports neither
:mod:`pipeline.cli`, ``jobs`` nor :mod:`pipeline.synth`. Nothing is re-exported here: the
modules import dask only when a cluster is asked for, and keep it that way.
"""

from __future__ import annotations

__all__: list[str] = []
