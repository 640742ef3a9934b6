"""checkov on the Terraform, the Dockerfile and the Kubernetes manifests, with the skip
list of .checkov.yaml (a reason on every skip). One run: checkov takes ~8 s of CPU to
start."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.deploy.deploy_helpers import DEPLOY, REPO, TERRAFORM, run, tool


@pytest.fixture(scope="module")
def report() -> list[dict[str, Any]]:
    checkov = tool("checkov")
    result = run([checkov, "--config-file", str(REPO / ".checkov.yaml"), "--output", "json",
                  "-d", str(TERRAFORM), "-d", str(DEPLOY)], timeout=900)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    # One JSON document per -d folder, one after the other; a list where a folder had
    # more than one framework.
    decoder, text, pos, reports = json.JSONDecoder(), result.stdout, 0, []
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return reports
        doc, pos = decoder.raw_decode(text, pos)
        reports.extend(doc if isinstance(doc, list) else [doc])


def test_checkov_finds_nothing_unskipped(report: list[dict[str, Any]]) -> None:
    failed = [(r["check_type"], c["check_id"], c["resource"], c["file_path"])
              for r in report for c in r["results"]["failed_checks"]]
    assert failed == []


def test_checkov_really_checked_each_framework(report: list[dict[str, Any]]) -> None:
    passed: dict[str, int] = {}
    for r in report:
        passed[r["check_type"]] = max(passed.get(r["check_type"], 0), r["summary"]["passed"])
    assert passed.get("terraform", 0) >= 30, passed
    assert passed.get("dockerfile", 0) >= 5, passed
    assert passed.get("kubernetes", 0) >= 20, passed


def test_every_skip_has_a_reason(report: list[dict[str, Any]]) -> None:
    lines = (REPO / ".checkov.yaml").read_text().splitlines()
    config = yaml.safe_load("\n".join(lines))
    for check in config["skip-check"]:
        (i,) = [n for n, line in enumerate(lines) if line.strip() == f"- {check}"]
        reason = []
        while lines[i - 1 - len(reason)].strip().startswith("#"):
            reason.append(lines[i - 1 - len(reason)])
        assert len(" ".join(reason)) > 40, f"{check}: no reason above it"
    # Inline skips (next to one resource) carry theirs after the colon.
    skipped = [c for r in report for c in r["results"]["skipped_checks"]]
    assert skipped, "expected the documented inline skips"
    for c in skipped:
        comment = c.get("suppress_comment") or c["check_result"].get("suppress_comment")
        assert c["check_id"] in config["skip-check"] or \
            len(comment or "") > 20, c["check_id"]
