"""Costs: the ``usage`` table priced, grouped and drawn. Pure.

Price tables and the pricing of one request (:mod:`~pipeline.costs.pricing`), the
report grouped by day, week, month, project, agent, model... (:mod:`~pipeline.costs.report`,
the periods and projects :mod:`~pipeline.costs.periods`), budgets
(:mod:`~pipeline.costs.budgets`), the cost table as text (:mod:`~pipeline.costs.terminal`)
and the HTML page (:mod:`~pipeline.costs.html`).

Contract: imports :mod:`pipeline.replay` (the catalog's rule files) and below only; no
fsspec, dask or click. Neither genai-prices nor plotly is imported until used.
"""

from __future__ import annotations

__all__: list[str] = []
