"""The archive bucket and its prefixes on a local S3 endpoint (moto's server).

``python -m infra.local`` creates them against ``AWS_ENDPOINT_URL[_S3]``;
``python -m infra.local --serve`` starts moto's server first and keeps it running.
"""

from infra.local.bootstrap import BucketLayout, bootstrap

__all__ = ["BucketLayout", "bootstrap"]
