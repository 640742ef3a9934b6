"""The contract of a summariser (:class:`pipeline.compaction.summaries.Summariser`).

A subclass gives ``summariser`` (the implementation, ready to answer: the HTTP one
against the local test server of ``tests.helpers.http``) and ``deterministic`` (whether
the same request must give the same bytes).
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.compaction.summaries import Summariser, Summary, SummaryRequest, SummarySeed
from pipeline.errors import UsageError


def cards(n: int) -> list[dict[str, Any]]:
    return [{"turn_id": f"turn-{i}", "asked": f"check service {i} and report its health",
             "did": [{"tool": "bash", "args_digest": {"cmd": f"systemctl status svc{i}"},
                      "evidence_id": f"call_{i}"}],
             "answered": {"presentations": [], "narration": f"service {i} is healthy"},
             "outcome": "completed"} for i in range(1, n + 1)]


def request(n: int = 3, target: int = 256, seed: SummarySeed | None = None) -> SummaryRequest:
    return SummaryRequest("s", 1, n, "turn-1", f"turn-{n}", cards(n), target, "gemma", seed)


class SummariserContract:
    """What every summariser promises: a non-empty summary within its target (or flagged
    over it), signed with its name and version; bad requests refused before any work."""

    deterministic = False

    @pytest.fixture
    def summariser(self) -> Summariser:
        raise NotImplementedError

    def test_satisfies_the_protocol(self, summariser: Summariser) -> None:
        assert isinstance(summariser, Summariser)
        assert summariser.name and summariser.version

    @pytest.mark.parametrize("target", [64, 256, 2048])
    def test_summary_is_within_its_target(self, summariser: Summariser, target: int) -> None:
        s = summariser.summarise(request(target=target))
        assert isinstance(s, Summary) and s.text.strip()
        assert s.tokens <= target or s.over_target
        assert s.tokens > 0

    def test_summary_names_its_maker(self, summariser: Summariser) -> None:
        s = summariser.summarise(request())
        assert (s.summariser, s.version) == (summariser.name, summariser.version)

    def test_same_request_same_summary_when_deterministic(self,
                                                          summariser: Summariser) -> None:
        if not self.deterministic:
            pytest.skip("a model's answer may vary")
        assert summariser.summarise(request(5, 128)) == summariser.summarise(request(5, 128))

    def test_a_seeded_request_is_answered(self, summariser: Summariser) -> None:
        s = summariser.summarise(request(seed=SummarySeed("t1: service 1 is healthy.",
                                                          "turn-1")))
        assert s.text.strip() and (s.tokens <= 256 or s.over_target)

    def test_bad_requests_are_refused(self) -> None:
        with pytest.raises(UsageError):
            SummaryRequest("s", 1, 2, "turn-1", "turn-2", cards(1), 100)
        with pytest.raises(UsageError):
            request(target=0)
