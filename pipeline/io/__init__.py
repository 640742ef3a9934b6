"""IO layer: fsspec locations and listings, streamed reads, Parquet writes and commits.

Errors of fsspec, s3fs and botocore are translated here, and only here, into
:mod:`pipeline.errors` types.
"""
