"""The incremental nightly run: dated partitions, checkpoints, rows carried forward.

Each run commits one partition ``OUT/date=YYYY-MM-DD/`` holding the integrity, usage,
``turns``, ``requests`` (and, asked for, ``compaction``) tables of *every* session in
the archive that night, plus the ``checkpoints`` table (:mod:`pipeline.checkpoint`).
Only objects that changed since the newest committed partition are read: the rows of
the others are copied from that partition. A rerun on the same day replaces the day's
partition (its own previous version is then the baseline).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections import Counter
from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.checkpoint import Change, Checkpoint, classify, missing_finding
from pipeline.errors import CommitError
from pipeline.io.commit import StagedRun, new_run_id, read_dataset, read_manifest
from pipeline.io.storage import Listing, Location, enumerate_sessions, storage_errors
from pipeline.io.tables import findings_table, sessions_table
from pipeline.layout import SessionKey, parse_session_path
from pipeline.orchestrate import RunSummary, check_locations, execute_run
from pipeline.partitions import not_audited
from pipeline.replay_partitions import ReplayOptions

PARTITION = re.compile(r"date=(\d{4}-\d\d-\d\d)\Z")
SUMMARY_FILE = "summary.json"
#: Part indexes of carried and missing rows come after every task's (tasks count from 0).
_CARRIED_PART = 1_000_000


def partition(out: Location, day: date) -> Location:
    """The location of ``day``'s partition under ``out``."""
    name = f"date={day.isoformat()}"
    return dataclasses.replace(out, url=f"{out.url.rstrip('/')}/{name}", path=out.join(name))


def latest_partition(out: Location, day: date) -> Location | None:
    """The newest committed partition on or before ``day`` (a manifest is its commit)."""
    fs = out.filesystem()
    try:
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(out.path, detail=False)]
    except FileNotFoundError:
        return None
    except storage_errors():
        return None
    days = sorted((m.group(1) for n in names if (m := PARTITION.match(n))), reverse=True)
    for text in days:
        if text <= day.isoformat():
            loc = partition(out, date.fromisoformat(text))
            if read_manifest(loc) is not None:
                return loc
    return None


def options_fingerprint(options: ReplayOptions) -> str:
    """What the carried rows depend on: rule set, catalog, planner, compaction profile.

    A change of any of them makes every session's replay rows stale, so the run reads
    everything again (the checkpoints still catch rewritten history).
    """
    compaction = options.compaction
    text = json.dumps({
        "rules": options.rules, "catalog": options.catalog.version,
        "catalog_rules": [dataclasses.astuple(r) for r in options.catalog.rules],
        "planner": options.planner, "scope": options.scope,
        "compaction": None if compaction is None else [
            compaction.window, compaction.model, compaction.scale, compaction.summary_tokens,
            compaction.summariser.name, compaction.summariser.version],
    }, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass
class NightlySummary:
    """A nightly run: the run's summary and what changed since the baseline."""

    run: RunSummary
    day: date
    baseline: str | None
    changes: Counter[str] = dataclasses.field(default_factory=Counter)
    bytes_read: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``summary.json``)."""
        return {"run_id": self.run.run_id, "bytes_read": self.bytes_read, **self.run.as_dict(),
                "changes": dict(sorted(self.changes.items()))}


def _checkpoints(baseline: Location | None) -> dict[str, Checkpoint]:
    if baseline is None:
        return {}
    try:
        table = read_dataset(baseline, "checkpoints")
    except FileNotFoundError:
        return {}
    return {row["session_path"]: Checkpoint.from_row(row) for row in table.to_pylist()}


def _carry(staged: StagedRun, baseline: Location, paths: set[str],
           missing: list[Checkpoint], run: RunSummary) -> None:
    """Stage the baseline's rows of ``paths`` and the rows of missing sessions; count
    both into ``run``."""
    manifest = read_manifest(baseline) or {"datasets": {}}
    keep = pa.array(sorted(paths), pa.string())
    for offset, name in enumerate(sorted(staged.schemas)):
        if name not in manifest["datasets"] or not paths:
            continue
        table = read_dataset(baseline, name)
        table = table.filter(pc.is_in(table["session_path"], value_set=keep))
        staged.write_part(name, _CARRIED_PART + offset, table)
        if name == "integrity/sessions":
            run.statuses.update(table["status"].to_pylist())
        elif name == "integrity/findings":
            run.codes.update(table["code"].to_pylist())
    if missing:
        gone = [not_audited(parse_session_path(c.session_path)
                            or SessionKey(c.session_path, "", "", ""), c.size, missing_finding(c))
                for c in missing]
        index = _CARRIED_PART + len(staged.schemas)
        staged.write_part("integrity/sessions", index, sessions_table([g.row for g in gone]))
        staged.write_part("integrity/findings", index, findings_table(
            (g.row["session_path"], f) for g in gone for f in g.findings))
        # Kept, so the session is reported missing every night until it is back; and
        # read again when it is back, however unchanged it looks.
        staged.write_part("checkpoints", index, pa.Table.from_pylist(
            [c.reread().as_row() for c in missing], schema=staged.schemas["checkpoints"]))
        run.statuses["error"] += len(missing)
        run.codes["session_missing"] += len(missing)


def run_nightly(
    root: Location,
    out: Location,
    options: ReplayOptions,
    *,
    day: date | None = None,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool | None = None,
) -> NightlySummary:
    """Audit and replay what changed under ``root`` since the last night; commit the
    whole archive's tables into ``out``'s partition for ``day`` (default today, UTC).

    Returns
    -------
    NightlySummary
        The run's counts, what changed (``new``, ``unchanged``, ``changed``,
        ``missing``, ``history_truncated``, ``history_rewritten``) and the bytes read.
    """
    day = day or datetime.now(UTC).date()
    target = partition(out, day)
    in_process = check_locations(root, out, scheduler)
    baseline = latest_partition(out, day)
    previous = _checkpoints(baseline)
    fingerprint = options_fingerprint(options)
    same_options = baseline is not None and \
        (read_manifest(baseline) or {}).get("options") == fingerprint
    listing = enumerate_sessions(root)
    to_read, unchanged = [], set()
    changes: Counter[str] = Counter()
    for obj in listing.sessions:
        change = classify(obj.size, obj.etag, previous.get(obj.key.path))
        if change is Change.UNCHANGED and same_options:
            unchanged.add(obj.key.path)
            changes[change.value] += 1
        else:
            to_read.append(obj)
            # "unchanged" counts only what is carried forward (as printed and documented).
            changes["reread_options_changed" if change is Change.UNCHANGED
                    else change.value] += 1
    listed = {obj.key.path for obj in listing.sessions}
    missing = [c for path, c in sorted(previous.items()) if path not in listed]
    changes["missing"] = len(missing)
    run = RunSummary(new_run_id(), root.url, target.url, len(listing.sessions),
                     listing.total_bytes, listing.skipped)
    run.manifest_extra = {"options": fingerprint, "date": day.isoformat(),
                          "baseline": baseline.url if baseline else None,
                          "changes": changes}
    summary = NightlySummary(run, day, baseline.url if baseline else None, changes,
                             sum(o.size for o in to_read))

    def before_commit(staged: StagedRun) -> None:
        for code in ("history_truncated", "history_rewritten"):
            changes[code] = run.codes[code]
        if baseline is not None:
            _carry(staged, baseline, unchanged, missing, run)

    execute_run(root, target, Listing(to_read, listing.skipped, listing.skipped_examples),
                run, scheduler=scheduler, workers=workers, progress=progress,
                replay=options, in_process=in_process, previous=previous,
                before_commit=before_commit)
    try:
        target.filesystem().pipe_file(
            target.join(SUMMARY_FILE),
            json.dumps(summary.as_dict(), indent=1, sort_keys=True).encode())
    except storage_errors() as err:
        raise CommitError(f"{target.url}: run committed, but {SUMMARY_FILE} could not be "
                          f"written: {err}") from err
    return summary
