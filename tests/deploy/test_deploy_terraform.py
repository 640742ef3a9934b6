"""infra/terraform read with python-hcl2: the bucket's protections are all there, and
the two job policies (and the bucket policy) grant no more than they say.

Beyond pattern checks, a small evaluator answers "may this policy do ACTION on KEY?"
the way IAM does (an explicit Deny wins, else some Allow must match action, resource
and conditions), for the questions least privilege is about.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.deploy_helpers import REPO, TERRAFORM, run

hcl2 = pytest.importorskip("hcl2", reason="python-hcl2 is in the deploy-check extra")

BUCKET = "vakpipe-archive-test"
BUCKET_ARN = f"arn:aws:s3:::{BUCKET}"


def _plain(node: Any) -> Any:
    """hcl2's output without its bookkeeping keys, quotes, and one-element wrappers."""
    if isinstance(node, dict):
        return {_unquote(k): _plain(v) for k, v in node.items() if not k.startswith("__")}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return _unquote(node) if isinstance(node, str) else node


def _unquote(text: str) -> str:
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == '"' else text


def parse_all() -> dict[str, Any]:
    """Every .tf file merged: ``{"resource": {type: {name: body}}, "data": ..., ...}``."""
    from hcl2.utils import SerializationOptions

    merged: dict[str, Any] = {"resource": {}, "data": {}, "variable": {}, "locals": {}}
    for path in sorted(TERRAFORM.glob("*.tf")):
        doc = _plain(hcl2.loads(path.read_text(),
                                serialization_options=SerializationOptions(
                                    strip_string_quotes=True)))
        for block in ("resource", "data"):
            for entry in doc.get(block, []):
                for rtype, named in entry.items():
                    merged[block].setdefault(rtype, {}).update(named)
        for entry in doc.get("variable", []):
            merged["variable"].update(entry)
        for entry in doc.get("locals", []):
            merged["locals"].update(entry)
    return merged


@pytest.fixture(scope="module")
def tf() -> dict[str, Any]:
    return parse_all()


def substitute(text: str, tf: dict[str, Any]) -> str:
    """Resolve the interpolations the policies use, with the variables' defaults."""
    values = {
        "aws_s3_bucket.archive.arn": BUCKET_ARN,
        "aws_kms_key.archive.arn": "arn:aws:kms:eu-west-1:111122223333:key/test",
        "local.s3_service": "s3.eu-west-1.amazonaws.com",
        "local.account_root": "arn:aws:iam::111122223333:root",
    }
    for name, var in tf["variable"].items():
        if "default" in var and isinstance(var["default"], str):
            values[f"var.{name}"] = var["default"]
    for name, value in tf["locals"].items():
        if isinstance(value, str):
            values.setdefault(f"local.{name}", value)
    for _ in range(3):  # locals refer to other interpolations
        text = re.sub(r"\$\{([^}]+)\}", lambda m: values.get(m.group(1), m.group(0)), text)
    assert "${" not in text, f"unresolved interpolation in {text!r}"
    return text


@dataclass
class Statement:
    sid: str
    effect: str
    actions: list[str]
    resources: list[str]
    principals: list[str] = field(default_factory=list)
    conditions: list[tuple[str, str, list[str]]] = field(default_factory=list)


def statements(tf: dict[str, Any], name: str) -> list[Statement]:
    doc = tf["data"]["aws_iam_policy_document"][name]
    out = []
    for s in doc["statement"]:
        def sub(values: list[str]) -> list[str]:
            return [substitute(v, tf) for v in values]
        principals = [i for p in s.get("principals", []) for i in sub(p["identifiers"])]
        conditions = [(c["test"], c["variable"], sub(c["values"]))
                      for c in s.get("condition", [])]
        out.append(Statement(s.get("sid", ""), s.get("effect", "Allow"), s["actions"],
                             sub(s["resources"]), principals, conditions))
    return out


def _matches(pattern: str, value: str) -> bool:
    return fnmatch.fnmatchcase(value, pattern.replace("[", "[[]"))


def _condition_holds(test: str, values: list[str], actual: str | None) -> bool:
    if actual is None:
        return False  # a condition on a key the request lacks does not hold
    if test == "StringLike":
        return any(_matches(v, actual) for v in values)
    if test == "StringEquals":
        return actual in values
    raise AssertionError(f"the evaluator does not know condition {test}")


def allowed(policy: list[Statement], action: str, resource: str,
            context: dict[str, str] | None = None) -> bool:
    """IAM's answer for one request: explicit Deny wins; else any matching Allow."""
    context = context or {}

    def applies(s: Statement) -> bool:
        return (any(_matches(a, action) for a in s.actions)
                and any(_matches(r, resource) for r in s.resources)
                and all(_condition_holds(t, v, context.get(k)) for t, k, v in s.conditions))

    if any(s.effect == "Deny" and applies(s) for s in policy):
        return False
    return any(s.effect == "Allow" and applies(s) for s in policy)


def obj(key: str) -> str:
    return f"{BUCKET_ARN}/{key}"


WRITES = ["s3:PutObject", "s3:DeleteObject", "s3:DeleteObjectVersion", "s3:PutObjectRetention",
          "s3:PutObjectLegalHold", "s3:BypassGovernanceRetention", "s3:PutObjectAcl",
          "s3:RestoreObject", "s3:PutObjectTagging"]
ARCHIVE_KEYS = ["archive/agents/vak/sessions/abc/0199.jsonl", "archive/ground-truth.json"]


def test_reader_reads_and_lists_the_archive_and_nothing_else(tf: dict[str, Any]) -> None:
    reader = statements(tf, "archive_read")
    for key in ARCHIVE_KEYS:
        assert allowed(reader, "s3:GetObject", obj(key))
        for action in WRITES:
            assert not allowed(reader, action, obj(key)), action
    assert not allowed(reader, "s3:GetObject", obj("reports/nightly/_manifest.json"))
    assert not allowed(reader, "s3:GetObject", obj("archive"))  # the prefix, not a lookalike
    assert not allowed(reader, "s3:GetObject", obj("archive-old/x"))
    assert allowed(reader, "s3:ListBucket", BUCKET_ARN, {"s3:prefix": "archive/"})
    assert allowed(reader, "s3:ListBucket", BUCKET_ARN, {"s3:prefix": "archive/agents/"})
    for prefix in ("", "reports/", "archive-old/"):
        assert not allowed(reader, "s3:ListBucket", BUCKET_ARN, {"s3:prefix": prefix})
    assert not allowed(reader, "s3:ListBucket", BUCKET_ARN)  # no prefix: the whole bucket
    assert not allowed(reader, "s3:ListBucketVersions", BUCKET_ARN, {"s3:prefix": "archive/"})


def test_writer_writes_reports_only_and_never_the_archive(tf: dict[str, Any]) -> None:
    writer = statements(tf, "reports_write")
    for key in ("reports/nightly/date=2026-12-03/_manifest.json",
                "reports/nightly/_staging/run/integrity/sessions/part-00000.parquet"):
        for action in ("s3:PutObject", "s3:GetObject", "s3:DeleteObject",
                       "s3:AbortMultipartUpload"):
            assert allowed(writer, action, obj(key)), (action, key)
        # Versions and locks stay out of reach: history is the bucket's, not the job's.
        for action in ("s3:DeleteObjectVersion", "s3:PutObjectRetention",
                       "s3:BypassGovernanceRetention"):
            assert not allowed(writer, action, obj(key)), action
    for key in ARCHIVE_KEYS:
        for action in WRITES:
            assert not allowed(writer, action, obj(key)), action
        # The Allows alone never reach the archive: the Deny is a second line, not the
        # only one.
        assert not [s.sid for s in writer if s.effect == "Allow"
                    and any(_matches(r, obj(key)) for r in s.resources)]
    assert allowed(writer, "s3:ListBucket", BUCKET_ARN, {"s3:prefix": "reports/nightly/"})
    assert not allowed(writer, "s3:ListBucket", BUCKET_ARN, {"s3:prefix": "archive/"})
    assert not allowed(writer, "s3:ListBucket", BUCKET_ARN)
    # And the explicit Deny holds even beside an Allow of everything on the archive.
    broad = [*writer, Statement("x", "Allow", ["s3:PutObject", "s3:DeleteObject"],
                                [obj("archive/*")])]
    assert not allowed(broad, "s3:PutObject", obj(ARCHIVE_KEYS[0]))
    assert not allowed(broad, "s3:DeleteObject", obj(ARCHIVE_KEYS[0]))


def test_kms_use_only_through_s3(tf: dict[str, Any]) -> None:
    via_s3 = {"kms:ViaService": "s3.eu-west-1.amazonaws.com"}
    key = "arn:aws:kms:eu-west-1:111122223333:key/test"
    reader, writer = statements(tf, "archive_read"), statements(tf, "reports_write")
    assert allowed(reader, "kms:Decrypt", key, via_s3)
    assert not allowed(reader, "kms:GenerateDataKey", key, via_s3)
    assert allowed(writer, "kms:GenerateDataKey", key, via_s3)
    for policy in (reader, writer):
        assert not allowed(policy, "kms:Decrypt", key)  # not outside S3


@pytest.mark.parametrize("name", ["archive_read", "reports_write", "archive_bucket",
                                  "archive_key"])
def test_no_wildcard_actions_or_principals_in_any_allow(tf: dict[str, Any], name: str) -> None:
    for s in statements(tf, name):
        if s.effect != "Allow":
            continue
        for action in s.actions:
            assert action != "*" and not action.endswith(":*"), (name, s.sid, action)
        assert "*" not in s.principals, (name, s.sid)
        if name != "archive_key":  # in a key policy "*" is the key itself
            assert "*" not in s.resources, (name, s.sid)
            assert BUCKET_ARN + "/*" not in s.resources, (name, s.sid)


def test_bucket_policy_only_denies_and_requires_tls(tf: dict[str, Any]) -> None:
    policy = statements(tf, "archive_bucket")
    assert {s.effect for s in policy} == {"Deny"}  # grants nothing to anyone
    tls = {(t, k): v for s in policy for t, k, v in s.conditions}
    assert tls[("Bool", "aws:SecureTransport")] == ["false"]
    assert tls[("NumericLessThan", "s3:TlsVersion")] == ["1.2"]
    for s in policy:
        assert set(s.resources) == {BUCKET_ARN, BUCKET_ARN + "/*"}


def test_the_bucket_is_locked_versioned_encrypted_and_private(tf: dict[str, Any]) -> None:
    r = tf["resource"]
    assert r["aws_s3_bucket"]["archive"]["object_lock_enabled"] is True
    versioning = r["aws_s3_bucket_versioning"]["archive"]["versioning_configuration"]
    assert versioning[0]["status"] == "Enabled"
    (rule,) = r["aws_s3_bucket_object_lock_configuration"]["archive"]["rule"]
    assert rule["default_retention"][0]["mode"] == "${var.object_lock_mode}"
    assert tf["variable"]["object_lock_mode"]["default"] == "COMPLIANCE"
    (sse,) = r["aws_s3_bucket_server_side_encryption_configuration"]["archive"]["rule"]
    default = sse["apply_server_side_encryption_by_default"][0]
    assert default["sse_algorithm"] == "aws:kms"
    assert default["kms_master_key_id"] == "${aws_kms_key.archive.arn}"
    assert r["aws_kms_key"]["archive"]["enable_key_rotation"] is True
    block = r["aws_s3_bucket_public_access_block"]["archive"]
    assert all(block[k] is True for k in ("block_public_acls", "block_public_policy",
                                          "ignore_public_acls", "restrict_public_buckets"))
    ownership = r["aws_s3_bucket_ownership_controls"]["archive"]["rule"][0]
    assert ownership["object_ownership"] == "BucketOwnerEnforced"
    assert "aws_s3_bucket_logging" in r and "aws_s3_bucket_lifecycle_configuration" in r


def test_local_bucket_has_the_same_lifecycle_rules(tf: dict[str, Any]) -> None:
    import sys

    if str(REPO) not in sys.path:  # infra/ is not an installed package
        sys.path.insert(0, str(REPO))
    from infra.local.bootstrap import (
        ARCHIVE_INFREQUENT_ACCESS_AFTER_DAYS,
        REPORTS_NONCURRENT_DAYS,
        TERRAFORM_RETENTION_DAYS,
        BucketLayout,
        lifecycle_rules,
    )

    variables = tf["variable"]
    assert variables["archive_infrequent_access_after_days"]["default"] == \
        ARCHIVE_INFREQUENT_ACCESS_AFTER_DAYS
    assert variables["reports_noncurrent_days"]["default"] == REPORTS_NONCURRENT_DAYS
    assert variables["retention_days"]["default"] == TERRAFORM_RETENTION_DAYS
    layout = BucketLayout("b", variables["archive_prefix"]["default"],
                          variables["reports_prefix"]["default"])
    local = {r["ID"]: r for r in lifecycle_rules(layout, TERRAFORM_RETENTION_DAYS)}
    remote = tf["resource"]["aws_s3_bucket_lifecycle_configuration"]["archive"]["rule"]
    assert {r["id"] for r in remote} == set(local)
    for rule in remote:
        mine = local[rule["id"]]
        prefix = rule["filter"][0].get("prefix") if rule["filter"] else None
        assert (substitute(prefix, tf) if prefix else None) == mine["Filter"].get("Prefix")
        for block, key in (("transition", "Transitions"),
                           ("noncurrent_version_expiration", "NoncurrentVersionExpiration"),
                           ("abort_incomplete_multipart_upload",
                            "AbortIncompleteMultipartUpload")):
            assert (block in rule) == (key in mine), (rule["id"], block)


def test_terraform_fmt_if_terraform_is_there() -> None:
    terraform = shutil.which("terraform")
    if terraform is None:  # not installable from the registries here: optional
        pytest.skip("terraform is not on PATH (formatting is checked where it is)")
    result = run([terraform, "fmt", "-check", "-recursive", "-diff", str(TERRAFORM)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_hcl_files_all_parse() -> None:
    for path in sorted(Path(TERRAFORM).glob("*.tf")):
        hcl2.loads(path.read_text())
