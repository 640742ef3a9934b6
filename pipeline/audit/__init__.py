"""The audit: one session's verdict, and the checkpoints between audits. Pure.

:func:`~pipeline.audit.session.audit_session` turns a ledger's lines into a
:class:`~pipeline.audit.session.SessionAudit` (its ``integrity/sessions`` row, its
findings, its usage records); :mod:`~pipeline.audit.checkpoint` says what changed since
the last verified audit.

Contract: imports :mod:`pipeline.formats` and :mod:`pipeline.ledger` only (no fsspec,
dask or click); nothing below imports it.
"""

from __future__ import annotations

from pipeline.audit.checkpoint import Checkpoint
from pipeline.audit.session import SessionAudit, audit_session, verdict

__all__ = ["Checkpoint", "SessionAudit", "audit_session", "verdict"]
