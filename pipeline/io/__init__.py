"""IO layer: fsspec locations and listings, streamed reads, Parquet writes and commits.

Errors of fsspec, s3fs and botocore are translated here, and only here, into
:mod:`pipeline.errors` types. Storage (:mod:`~pipeline.io.storage`), the atomic commit
(:mod:`~pipeline.io.commit`) and the compacted archive (:mod:`~pipeline.io.archive`).

Contract: fsspec and Parquet only: imports the pure packages below it (it sniffs a file's
format with :mod:`pipeline.formats`), never :mod:`pipeline.run`, ``jobs`` or the CLI.
"""
