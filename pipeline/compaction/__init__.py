"""Compaction: the packets a capacity budget needs, and their summaries.

The engine (:mod:`~pipeline.compaction.engine`), the summariser Protocol
(:mod:`~pipeline.compaction.summaries`), its implementations (``cards``:
:mod:`~pipeline.compaction.cards`; ``http``: :mod:`~pipeline.compaction.http`, an
OpenAI-compatible client over urllib3) and the lazy registry that finds them by name
(:mod:`~pipeline.compaction.registry`: nothing imports an implementation but the registry,
on demand, so there is no cycle).

Contract: imports :mod:`pipeline.replay` and below only; no fsspec, dask or click.
"""

from __future__ import annotations

from pipeline.compaction.engine import CompactionOptions
from pipeline.compaction.registry import SUMMARISERS, get_summariser
from pipeline.compaction.summaries import Summariser, Summary

__all__ = ["SUMMARISERS", "CompactionOptions", "Summariser", "Summary", "get_summariser"]
