"""Synthetic data: generated fleets, injected faults, and a local S3 endpoint.

The generator (:mod:`~pipeline.synth.generator`, with :mod:`~pipeline.synth.content`,
:mod:`~pipeline.synth.faults` and :mod:`~pipeline.synth.replay`), the fleet writer
(:mod:`~pipeline.synth.fleet`) and moto's S3 server (:mod:`~pipeline.synth.local_s3`).

Contract: outside the production import graph: only the CLI (``generate``, ``demo``),
the tests and the benchmarks import it.
"""

from __future__ import annotations

__all__: list[str] = []
