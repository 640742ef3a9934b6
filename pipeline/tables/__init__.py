"""The output tables: one schema per dataset, the row builders beside them, and their
redaction. Pure (pyarrow).

Schemas and row -> table conversion (:mod:`~pipeline.tables.schemas`), redaction of every
transcript column (:mod:`~pipeline.tables.redact`), and whether a run read as input is
complete (:mod:`~pipeline.tables.partial`).

Contract: imports :mod:`pipeline.audit` and below only; no fsspec, dask or click.
"""

from __future__ import annotations

from pipeline.tables.partial import InputRun
from pipeline.tables.redact import redact_table

__all__ = ["InputRun", "redact_table"]
