"""Context utilization per request and the over-budget hint (seed 001 ``utilization``,
``over-budget-hint``; spec section 5). Pure.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

#: The soft per-call operating budget: routine work stays below it while the provider's
#: input limit remains the hard ceiling.
OPERATING_BUDGET = 200_000


class HintLevel(enum.IntEnum):
    """Compaction pressure, ordered."""

    NONE = 0
    ADVISORY = 1
    ESCALATED = 2
    MANDATORY = 3

    @property
    def label(self) -> str:
        """Lower-case name as written in the tables."""
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class Utilization:
    """The ``session_utilization`` map of one request."""

    last_request_tokens: int
    model_input_limit: int | None
    saturation: int | None
    headroom_tokens: int | None
    auto_compress_above: int | None
    turn_total_tokens: int


def utilization(request_tokens: int, limit: int | None, turn_total: int) -> Utilization | None:
    """Utilization of a request of ``request_tokens`` against a model's input ``limit``.

    ``None`` until a request has been measured (``request_tokens <= 0``), as the seed
    says: the first iteration shows nothing rather than a bogus 0%. An unknown model
    (no limit) still reports its size, with the limit-derived fields null.
    """
    if request_tokens <= 0:
        return None
    if limit is None or limit <= 0:
        return Utilization(request_tokens, None, None, None, None, turn_total)
    return Utilization(
        request_tokens, limit, round(100 * request_tokens / limit), limit - request_tokens,
        min(OPERATING_BUDGET, limit), turn_total,
    )


def limit_columns(util: Utilization | None) -> dict[str, int | None]:
    """The ``requests`` columns derived from the model's limit (null without a
    utilization or a known limit)."""
    if util is None:
        return dict.fromkeys(("model_input_limit", "saturation", "headroom_tokens",
                              "auto_compress_above"))
    return {"model_input_limit": util.model_input_limit, "saturation": util.saturation,
            "headroom_tokens": util.headroom_tokens,
            "auto_compress_above": util.auto_compress_above}


def pressure(util: Utilization | None) -> HintLevel:
    """The level this request alone calls for: 75% / 90% / above the ceiling."""
    if util is None or util.auto_compress_above is None:
        return HintLevel.NONE
    ratio = util.last_request_tokens / util.auto_compress_above
    if ratio > 1.0:
        return HintLevel.MANDATORY
    if ratio >= 0.9:
        return HintLevel.ESCALATED
    if ratio >= 0.75:
        return HintLevel.ADVISORY
    return HintLevel.NONE


@dataclass
class HintState:
    """The armed hint of one session, carried from request to request.

    Once armed the hint stays, at the highest level reached, while the pressure stays
    (every request at or above the advisory threshold): an ignored warning never
    silently expires. It disarms only when a request falls below the threshold.
    """

    level: HintLevel = HintLevel.NONE

    def update(self, util: Utilization | None) -> HintLevel:
        """Advance with one request; return the level in force for it."""
        now = pressure(util)
        self.level = HintLevel.NONE if now is HintLevel.NONE else max(self.level, now)
        return self.level


def hint_text(level: HintLevel, util: Utilization, *, settled: str | None,
              open_scope: str) -> str:
    """The hint the model would read: names ``fold_session``, the last safe settled
    boundary (a fold key) and what to preserve. Empty at level NONE."""
    if level is HintLevel.NONE:
        return ""
    ceiling = util.auto_compress_above
    head = {
        HintLevel.ADVISORY: "context is filling up",
        HintLevel.ESCALATED: "context is nearly full",
        HintLevel.MANDATORY: "context is over the operating ceiling",
    }[level]
    where = (f'call fold_session("{settled}") to fold the settled turns'
             if settled else "no settled turn to fold yet; finish the open turn first")
    return (f"{level.label}: {head} ({util.last_request_tokens:,}/{ceiling:,} tokens); "
            f"{where}; preserve the open turn {open_scope}, the goal and unresolved evidence ids")
