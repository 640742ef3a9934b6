"""Create the archive bucket on a local S3 endpoint, as ``infra/terraform`` does on AWS.

Like the Terraform: one bucket created with object lock enabled, versioning on, default
encryption, ACLs off, the public access block, and the same lifecycle rules (same ids,
prefixes and days) for the ``archive/`` and ``reports/`` prefixes.

Unlike it, on purpose:

- SSE-S3 (AES256) rather than SSE-KMS: there is no KMS key locally.
- No default retention unless ``--retention-days`` is given: moto refuses a
  ``CopyObject`` into a bucket with default retention unless the request carries a
  checksum header, and the commit's copies carry none (see deploy/README.md, "Before
  the first night").
- No bucket policy denying plain HTTP: the local endpoint *is* plain HTTP.
- No marker objects for the prefixes: a prefix exists once an object is under it, and
  a zero-byte ``archive/`` key would be counted by the audit as a skipped object.

It only ever talks to an explicit endpoint (``--endpoint-url``, ``AWS_ENDPOINT_URL_S3``
or ``AWS_ENDPOINT_URL``): it is not a way to create the real bucket.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Lifecycle figures of infra/terraform/variables.tf (a test keeps them equal).
ARCHIVE_INFREQUENT_ACCESS_AFTER_DAYS = 30
REPORTS_NONCURRENT_DAYS = 30
#: Retention the lifecycle counts with when no default retention is set locally.
TERRAFORM_RETENTION_DAYS = 90
EXIT_OK, EXIT_SETUP = 0, 2


class BootstrapError(Exception):
    """The endpoint or the existing bucket cannot be used."""


@dataclass(frozen=True)
class BucketLayout:
    """The bucket and the two prefixes vakpipe uses in it."""

    bucket: str
    archive_prefix: str = "archive"
    reports_prefix: str = "reports"

    @property
    def archive_url(self) -> str:
        """ROOT of ``vakpipe audit``/``nightly``."""
        return f"s3://{self.bucket}/{self.archive_prefix}"

    @property
    def reports_url(self) -> str:
        """Base of ``--out``."""
        return f"s3://{self.bucket}/{self.reports_prefix}"


def lifecycle_rules(layout: BucketLayout, retention_days: int) -> list[dict[str, Any]]:
    """The lifecycle rules of ``infra/terraform/bucket.tf``, as S3's API takes them."""
    return [
        {
            "ID": "abort-incomplete-multipart-uploads",
            "Status": "Enabled",
            "Filter": {},
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 7},
        },
        {
            "ID": "archive-to-infrequent-access",
            "Status": "Enabled",
            "Filter": {"Prefix": f"{layout.archive_prefix}/"},
            "Transitions": [{"Days": ARCHIVE_INFREQUENT_ACCESS_AFTER_DAYS,
                             "StorageClass": "STANDARD_IA"}],
            "NoncurrentVersionExpiration": {"NoncurrentDays": retention_days + 1},
        },
        {
            "ID": "reports-drop-old-versions",
            "Status": "Enabled",
            "Filter": {"Prefix": f"{layout.reports_prefix}/"},
            "NoncurrentVersionExpiration": {
                "NoncurrentDays": retention_days + REPORTS_NONCURRENT_DAYS},
            "Expiration": {"ExpiredObjectDeleteMarker": True},
        },
    ]


def endpoint_from_env(explicit: str | None = None) -> str:
    """The local endpoint: ``explicit``, else ``AWS_ENDPOINT_URL_S3``, else
    ``AWS_ENDPOINT_URL``.

    Raises
    ------
    BootstrapError
        None is set (without one, boto3 would go to the real AWS).
    """
    endpoint = (explicit or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL"))
    if not endpoint:
        raise BootstrapError("no local endpoint: pass --endpoint-url or set AWS_ENDPOINT_URL "
                             "(infra/terraform creates the real bucket, not this)")
    return endpoint


def s3_client(endpoint: str) -> Any:
    """A boto3 S3 client on ``endpoint`` (credentials from the environment)."""
    import boto3

    return boto3.client("s3", endpoint_url=endpoint)


def _bucket_exists(client: Any, bucket: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        client.head_bucket(Bucket=bucket)
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("404", "NoSuchBucket"):
            return False
        raise
    return True


def _object_lock_enabled(client: Any, bucket: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        lock = client.get_object_lock_configuration(Bucket=bucket)
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") == "ObjectLockConfigurationNotFoundError":
            return False
        raise
    return bool(lock.get("ObjectLockConfiguration", {}).get("ObjectLockEnabled") == "Enabled")


def bootstrap(client: Any, layout: BucketLayout, *, retention_days: int | None = None,
              lock_mode: str = "GOVERNANCE") -> None:
    """Create (or bring up to date) the bucket of ``layout``; idempotent.

    Parameters
    ----------
    client:
        A boto3 S3 client on the local endpoint.
    layout:
        Bucket and prefixes.
    retention_days:
        Default object lock retention; ``None`` (the default) sets none (see the
        module's docstring for why).
    lock_mode:
        ``GOVERNANCE`` (the default here, so a developer can still clean up) or
        ``COMPLIANCE``.

    Raises
    ------
    BootstrapError
        The bucket exists without object lock (it can only be enabled at creation).
    """
    if not _bucket_exists(client, layout.bucket):
        client.create_bucket(Bucket=layout.bucket, ObjectLockEnabledForBucket=True)
    if not _object_lock_enabled(client, layout.bucket):
        raise BootstrapError(f"bucket {layout.bucket!r} exists without object lock; "
                             "delete it or choose another name")
    client.put_bucket_versioning(Bucket=layout.bucket,
                                 VersioningConfiguration={"Status": "Enabled"})
    client.put_bucket_ownership_controls(
        Bucket=layout.bucket,
        OwnershipControls={"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]})
    client.put_public_access_block(
        Bucket=layout.bucket,
        PublicAccessBlockConfiguration={"BlockPublicAcls": True, "IgnorePublicAcls": True,
                                        "BlockPublicPolicy": True,
                                        "RestrictPublicBuckets": True})
    client.put_bucket_encryption(
        Bucket=layout.bucket,
        ServerSideEncryptionConfiguration={"Rules": [{
            "ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"},
            "BucketKeyEnabled": True,
        }]})
    config: dict[str, Any] = {"ObjectLockEnabled": "Enabled"}
    if retention_days is not None:
        config["Rule"] = {"DefaultRetention": {"Mode": lock_mode, "Days": retention_days}}
    client.put_object_lock_configuration(Bucket=layout.bucket, ObjectLockConfiguration=config)
    client.put_bucket_lifecycle_configuration(
        Bucket=layout.bucket,
        LifecycleConfiguration={"Rules": lifecycle_rules(
            layout, retention_days if retention_days is not None else TERRAFORM_RETENTION_DAYS)})


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m infra.local",
        description="Create vakpipe's archive bucket and prefixes on a local S3 endpoint.")
    ap.add_argument("--bucket", default=os.environ.get("VAKPIPE_BUCKET", "vakpipe-archive"),
                    help="bucket name (default $VAKPIPE_BUCKET or vakpipe-archive)")
    ap.add_argument("--archive-prefix", default="archive")
    ap.add_argument("--reports-prefix", default="reports")
    ap.add_argument("--endpoint-url", default=None,
                    help="local endpoint (default $AWS_ENDPOINT_URL_S3 or $AWS_ENDPOINT_URL)")
    ap.add_argument("--retention-days", type=int, default=None,
                    help="default object lock retention (default: none, see the docstring)")
    ap.add_argument("--lock-mode", choices=["GOVERNANCE", "COMPLIANCE"], default="GOVERNANCE")
    ap.add_argument("--serve", action="store_true",
                    help="start moto's server on 127.0.0.1 first and keep it running")
    return ap


def _print_usage(layout: BucketLayout, env: dict[str, str]) -> None:
    for name, value in sorted(env.items()):
        print(f"export {name}={value}")
    print(f"# archive: {layout.archive_url}")
    print(f"# reports: {layout.reports_url}")
    print(f"# e.g.: vakpipe audit {layout.archive_url} --out {layout.reports_url}/integrity")


def _wait_for_a_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m infra.local``; returns the exit code."""
    args = _parser().parse_args(argv)
    layout = BucketLayout(args.bucket, args.archive_prefix, args.reports_prefix)
    try:
        if args.serve:
            from pipeline.synth.local_s3 import local_s3

            with local_s3() as server:
                bootstrap(s3_client(server.endpoint), layout,
                          retention_days=args.retention_days, lock_mode=args.lock_mode)
                _print_usage(layout, server.env())
                sys.stdout.flush()
                _wait_for_a_signal()
            return EXIT_OK
        endpoint = endpoint_from_env(args.endpoint_url)
        bootstrap(s3_client(endpoint), layout, retention_days=args.retention_days,
                  lock_mode=args.lock_mode)
    except BootstrapError as err:
        print(f"infra.local: error: {err}", file=sys.stderr)
        return EXIT_SETUP
    except Exception as err:  # botocore's errors: one line, not a traceback
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"infra.local: error: {type(err).__name__}: {text}", file=sys.stderr)
        return EXIT_SETUP
    _print_usage(layout, {"AWS_ENDPOINT_URL_S3": endpoint})
    return EXIT_OK
