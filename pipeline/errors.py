"""One error hierarchy for the whole pipeline.

Every error vakpipe raises on purpose derives from :class:`PipelineError` and also from
the builtin that best describes it, so callers may catch either (as pyarrow does).
Errors of fsspec, s3fs and botocore are translated at the IO edge only, with
``raise ... from err`` so the original stays attached.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base class of every error vakpipe raises on purpose."""


class UsageError(PipelineError, ValueError):
    """The command line or a function call asked for something impossible."""


class StorageError(PipelineError, OSError):
    """The storage behind a URL cannot be used: no bucket, no endpoint, no access."""


class ObjectChangedError(StorageError):
    """An object's bytes changed between its listing and its read, or during the read."""


class RunReplacedError(StorageError):
    """A committed run being read was replaced by a newer commit while it was read (a
    file its manifest names is gone): read it again."""


class ExpiredVersionError(StorageError):
    """A past version of a Delta table whose files retention (``nightly --keep-days``)
    deleted: the night that version belongs to no longer reads."""


class CorruptTableError(PipelineError, ValueError):
    """A table of a committed run does not read as the Parquet its manifest names (a
    part cut short, overwritten, or of another schema)."""


class EmptyInputError(PipelineError, FileNotFoundError):
    """The root holds no session ledger at all."""


class OutputInsideArchiveError(PipelineError, ValueError):
    """The output location lies inside the archive being read; refused."""


class CommitError(PipelineError, OSError):
    """A run's staged output could not be committed; the previous output stands."""


class ConcurrentRunError(CommitError):
    """Another run committed under the output while this one went on: this one is not
    committed, never silently replacing it (one run at a time per output)."""


class ClusterError(PipelineError, OSError):
    """The Dask scheduler to join cannot be reached."""


class BaselineError(PipelineError, ValueError):
    """A nightly run's baseline partition is gone or unreadable while earlier nights
    exist: starting over in silence would hide any history break made meanwhile."""


class UnsafeOutputError(PipelineError, ValueError):
    """A path a run would write, move or delete under its output is unsafe: a symbolic
    link on the way (it could lead anywhere, the archive included) or a name that is not
    a plain path below the output. Refused before anything is touched."""


class CorruptManifestError(PipelineError, ValueError):
    """An output's ``_manifest.json`` does not read as a manifest vakpipe writes (not
    JSON, another shape, or names that are not plain paths below the output)."""


class PluginError(PipelineError, ValueError):
    """An installed plug-in (an entry point of a ``vakpipe.*`` group) asked for by name
    cannot be used: its module does not import, its object is missing or is not the kind
    of thing its group holds. One line names the plug-in and why."""


class TelemetryExportError(PipelineError, OSError):
    """An OpenTelemetry endpoint did not take the spans sent (unreachable, refused, or an
    error status); the message says how many were delivered before."""
