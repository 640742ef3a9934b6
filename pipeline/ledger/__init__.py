"""The ledger: what a session file holds and means, at the bottom of the graph. Pure.

Records and finding codes (:mod:`~pipeline.ledger.types`), where sessions live
(:mod:`~pipeline.ledger.layout`), the line reader (:mod:`~pipeline.ledger.reader`), the
entry tree (:mod:`~pipeline.ledger.tree`), what an entry means (:mod:`~pipeline.ledger.entry`:
directives, usage, timestamps), the wire format (:mod:`~pipeline.ledger.wire`) and text
made safe (:mod:`~pipeline.ledger.redact`, :mod:`~pipeline.ledger.text`).

Contract (``[tool.importlinter]`` in ``pyproject.toml``): imports only
:mod:`pipeline.errors` of vakpipe, and no fsspec, s3fs, dask, distributed or click.
"""

from __future__ import annotations

from pipeline.ledger.entry import Usage, input_and_output, is_directive, ts_nanos, usage_of
from pipeline.ledger.layout import SessionKey
from pipeline.ledger.reader import Entry, LineStats, read_ledger
from pipeline.ledger.redact import quote, redact
from pipeline.ledger.tree import TreeIndex
from pipeline.ledger.types import Code, Finding, Severity

__all__ = ["Code", "Entry", "Finding", "LineStats", "SessionKey", "Severity", "TreeIndex",
           "Usage", "input_and_output", "is_directive", "quote", "read_ledger", "redact",
           "ts_nanos", "usage_of"]
