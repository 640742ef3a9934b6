"""The contract of a transcript format (:class:`pipeline.formats.base.TranscriptFormat`).

A subclass gives ``adapter`` (the implementation) and ``sample`` (a real transcript of
that format, ``tests/data/real``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from pipeline.formats import FORMATS, detect
from pipeline.formats.base import ROOT_ID, TranscriptFormat
from pipeline.ledger.reader import Entry, LineStats
from pipeline.ledger.types import Finding

_GARBAGE = (b"{not json\n", b"\x00\xff\xfe garbage\n", b"[1, 2, 3]\n", b'"a string"\n',
            b'{"type": 7, "message": [], "usage": "lots"}\n', b"\n")


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _read(adapter: TranscriptFormat, lines: Iterable[bytes]
          ) -> tuple[list[Entry | Finding], LineStats, dict[str, Any]]:
    stats, header = LineStats(), {}
    out = list(adapter.read(lines, stats, header))
    return out, stats, header


class FormatContract:
    """What every adapter promises: it is told apart by content, reads its own files
    without raising, survives garbage lines and yields sane usage."""

    @pytest.fixture
    def adapter(self) -> TranscriptFormat:
        raise NotImplementedError

    @pytest.fixture
    def sample(self) -> Path:
        raise NotImplementedError

    def test_is_registered_under_a_unique_name(self, adapter: TranscriptFormat) -> None:
        names = [f.name for f in FORMATS]
        assert adapter.name in names and names.count(adapter.name) == 1

    def test_detect_recognises_its_own_file(self, adapter: TranscriptFormat,
                                            sample: Path) -> None:
        found, lines = detect(_lines(sample))
        assert found is not None and found.name == adapter.name
        assert list(lines) == _lines(sample)  # nothing consumed

    def test_sniff_refuses_a_vak_entry(self, adapter: TranscriptFormat) -> None:
        vak = {"id": "e1", "parent_id": None, "ts": "2026-01-01T00:00:00Z",
               "kind": "header", "hash": "0" * 64, "prev_hash": None}
        found, _ = detect([(json.dumps(vak) + "\n").encode()])
        assert found is None  # a vak ledger, whatever the adapter's sniff says

    def test_reads_its_file_root_first_counting_every_line(self, adapter: TranscriptFormat,
                                                           sample: Path) -> None:
        lines = _lines(sample)
        out, stats, header = _read(adapter, lines)
        assert isinstance(out[0], Entry) and out[0].id == ROOT_ID
        assert stats.lines == len(lines)
        assert stats.bytes == sum(map(len, lines))
        assert isinstance(header.get("links"), list)
        assert all(isinstance(x, Entry | Finding) for x in out)

    def test_usage_tokens_are_non_negative_ints(self, adapter: TranscriptFormat,
                                                sample: Path) -> None:
        out, _, _ = _read(adapter, _lines(sample))
        usages = [e.data["meta"]["usage"] for e in out if isinstance(e, Entry)
                  and isinstance(e.data.get("meta"), dict) and e.data["meta"].get("usage")]
        assert usages, "a real transcript has model requests"
        for usage in usages:
            for key, value in usage.items():
                assert type(value) is int and value >= 0, (key, value)

    @pytest.mark.parametrize("garbage", _GARBAGE)
    def test_never_raises_on_a_garbage_line(self, adapter: TranscriptFormat, sample: Path,
                                            garbage: bytes) -> None:
        lines = _lines(sample)
        mid = len(lines) // 2
        spoiled = [*lines[:mid], garbage, *lines[mid:]]
        out, stats, _ = _read(adapter, spoiled)
        clean, _, _ = _read(adapter, lines)
        assert stats.lines == len(spoiled)
        entries = [e for e in out if isinstance(e, Entry)]
        assert len(entries) >= len([e for e in clean if isinstance(e, Entry)]) - 1

    def test_garbage_alone_gives_findings_and_no_usage(self,
                                                       adapter: TranscriptFormat) -> None:
        out, stats, _ = _read(adapter, _GARBAGE)
        assert isinstance(out[0], Entry) and out[0].id == ROOT_ID
        assert stats.lines == len(_GARBAGE)
        # the four lines that are not JSON objects are each a finding, never an entry
        assert len([x for x in out if isinstance(x, Finding)]) >= 4
        assert not any(isinstance(x, Entry) and isinstance(x.data.get("meta"), dict)
                       and x.data["meta"].get("usage") for x in out)
