"""Write a generated fleet (and its ground truth) to any fsspec location."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any

from pipeline.generate import generate_fleet
from pipeline.io.storage import Location, storage_error, storage_errors

GROUND_TRUTH = "ground-truth.json"


@dataclass(frozen=True)
class WrittenFleet:
    """What :func:`write_fleet` wrote."""

    sessions: int
    bytes: int
    truth_path: str


def write_fleet(out: Location, *, sessions: int, seed: int, faults: bool = False,
                size_scale: float = 1.0, consistent: bool = True,
                noise: float = 0.0) -> WrittenFleet:
    """Generate a fleet and write it under ``out`` in the archive layout.

    Sessions are streamed line by line into their objects, so memory stays bounded
    whatever their size. The ground truth (injected faults, lines and bytes per
    session, in the shape of the conformance ``expected.json``) goes to
    ``out/ground-truth.json``, which an audit counts as a skipped object.
    ``consistent`` makes reported usage and card figures exactly what replay under rule
    set v1 computes (~10 MB/s: it tokenizes); ``noise`` perturbs reported usage by up to
    that fraction, as providers do.
    """
    fs = out.filesystem()
    truth: dict[str, dict[str, Any]] = {}
    total = 0
    try:
        for s in generate_fleet(sessions, seed, faults=faults, size_scale=size_scale,
                                consistent=consistent, noise=noise):
            n_lines = n_bytes = 0
            path = out.join(s.path)
            if out.protocol == "file":  # object stores have no folders to create
                fs.makedirs(posixpath.dirname(path), exist_ok=True)
            with fs.open(path, "wb") as f:
                for line in s.lines():
                    f.write(line)
                    n_lines += 1
                    n_bytes += len(line)
            total += n_bytes
            truth[s.path] = {
                "fault": s.fault,
                "findings": [{"line": x.line, "code": x.code} for x in s.faults],
                "lines": n_lines,
                "bytes": n_bytes,
            }
        truth_path = out.join(GROUND_TRUTH)
        fs.pipe_file(truth_path, json.dumps(truth, indent=1, sort_keys=True).encode())
    except storage_errors() as err:
        raise storage_error(err, out.url) from err
    return WrittenFleet(len(truth), total, truth_path)
