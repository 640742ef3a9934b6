"""Replay: rebuild every request a session's model received, and count it. Pure.

Turns (:mod:`~pipeline.replay.turns`), scopes (:mod:`~pipeline.replay.scopes`), the
projection rule sets (:mod:`~pipeline.replay.projection`), the planner
(:mod:`~pipeline.replay.plan`), the engine (:mod:`~pipeline.replay.engine`) and its
closed part (:mod:`~pipeline.replay.closed`), one session's ``turns`` and ``requests``
rows (:mod:`~pipeline.replay.session`), the reported replay of other agents' transcripts
(:mod:`~pipeline.replay.reported`), utilization (:mod:`~pipeline.replay.utilization`),
rendering one request (:mod:`~pipeline.replay.show`), the comparison of two runs
(:mod:`~pipeline.replay.regress`), the model catalog and the tokenizers.

Contract: imports :mod:`pipeline.audit`, :mod:`pipeline.formats` and
:mod:`pipeline.ledger` only (no fsspec, dask or click).
"""

from __future__ import annotations

from pipeline.replay.catalog import ModelCatalog, load_catalog
from pipeline.replay.engine import ReplayEngine, RequestReplay
from pipeline.replay.projection import RuleSet, get_rule_set
from pipeline.replay.session import SessionReplay, replay_session
from pipeline.replay.tokens import Tokenizer, get_tokenizer
from pipeline.replay.turns import Turn, TurnIndex

__all__ = ["ModelCatalog", "ReplayEngine", "RequestReplay", "RuleSet", "SessionReplay",
           "Tokenizer", "Turn", "TurnIndex", "get_rule_set", "get_tokenizer", "load_catalog",
           "replay_session"]
