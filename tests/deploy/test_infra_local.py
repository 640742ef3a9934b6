"""infra/local on moto's server: ``python -m infra.local`` creates the bucket as the
Terraform does (as far as a local endpoint can), and vakpipe runs against it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
import s3fs

from pipeline.io.storage import resolve
from pipeline.run.orchestrate import run_audit
from pipeline.synth.fleet import write_fleet
from pipeline.synth.local_s3 import LocalS3
from tests.deploy.deploy_helpers import REPO

BUCKET = "vakpipe-archive-local"


def bootstrap(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infra.local", *args], cwd=REPO,
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def endpoint(s3_server: LocalS3) -> Iterator[Any]:
    s3_server.reset()
    s3fs.S3FileSystem.clear_instance_cache()
    yield boto3.client("s3", endpoint_url=s3_server.endpoint)
    s3_server.reset()


def test_bootstrap_creates_the_bucket_like_the_terraform(endpoint: Any) -> None:
    result = bootstrap("--bucket", BUCKET)
    assert result.returncode == 0, result.stderr
    assert f"s3://{BUCKET}/archive" in result.stdout and f"s3://{BUCKET}/reports" in result.stdout
    assert endpoint.get_bucket_versioning(Bucket=BUCKET)["Status"] == "Enabled"
    lock = endpoint.get_object_lock_configuration(Bucket=BUCKET)["ObjectLockConfiguration"]
    assert lock["ObjectLockEnabled"] == "Enabled" and "Rule" not in lock
    block = endpoint.get_public_access_block(Bucket=BUCKET)["PublicAccessBlockConfiguration"]
    assert all(block.values()) and len(block) == 4
    (rule,) = endpoint.get_bucket_encryption(Bucket=BUCKET)[
        "ServerSideEncryptionConfiguration"]["Rules"]
    assert rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    rules = {r["ID"]: r for r in
             endpoint.get_bucket_lifecycle_configuration(Bucket=BUCKET)["Rules"]}
    assert rules["archive-to-infrequent-access"]["Filter"] == {"Prefix": "archive/"}
    assert rules["reports-drop-old-versions"]["Filter"] == {"Prefix": "reports/"}
    ownership = endpoint.get_bucket_ownership_controls(Bucket=BUCKET)["OwnershipControls"]
    assert ownership["Rules"] == [{"ObjectOwnership": "BucketOwnerEnforced"}]
    # Idempotent: a second run brings the same bucket up to date.
    again = bootstrap("--bucket", BUCKET)
    assert again.returncode == 0, again.stderr


def test_retention_on_request(endpoint: Any) -> None:
    assert bootstrap("--bucket", BUCKET, "--retention-days", "2").returncode == 0
    lock = endpoint.get_object_lock_configuration(Bucket=BUCKET)["ObjectLockConfiguration"]
    retention = lock["Rule"]["DefaultRetention"]
    assert (retention["Mode"], retention["Days"]) == ("GOVERNANCE", 2)
    rules = {r["ID"]: r for r in
             endpoint.get_bucket_lifecycle_configuration(Bucket=BUCKET)["Rules"]}
    assert rules["archive-to-infrequent-access"]["NoncurrentVersionExpiration"] == \
        {"NoncurrentDays": 3}


def test_refuses_without_a_local_endpoint() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT_URL")}
    result = bootstrap("--bucket", BUCKET, env=env)
    assert result.returncode == 2 and "no local endpoint" in result.stderr


def test_refuses_a_bucket_without_object_lock(endpoint: Any) -> None:
    endpoint.create_bucket(Bucket=BUCKET)
    result = bootstrap("--bucket", BUCKET)
    assert result.returncode == 2 and "without object lock" in result.stderr


@pytest.mark.slow
def test_vakpipe_audits_the_archive_and_reports_into_the_prefixes(
    endpoint: Any, scheduler: str
) -> None:
    assert bootstrap("--bucket", BUCKET).returncode == 0
    archive, reports = resolve(f"s3://{BUCKET}/archive"), resolve(f"s3://{BUCKET}/reports/audit")
    write_fleet(archive, sessions=12, seed=5)
    summary = run_audit(archive, reports, scheduler=scheduler, progress=False)
    # The bootstrap wrote no marker objects the audit would have to skip.
    assert summary.sessions == 12 and summary.skipped_objects == 1  # ground-truth.json
    keys = [o["Key"] for o in endpoint.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert all(k.startswith(("archive/", "reports/")) for k in keys)
    assert "reports/audit/_SUCCESS" in keys
    # Versioned: the commit's replaced and deleted files are versions, not gone.
    versions = endpoint.list_object_versions(Bucket=BUCKET, Prefix="reports/")
    assert versions.get("DeleteMarkers")
