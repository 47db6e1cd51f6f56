"""One exception hierarchy for dlreplay.

The CLI turns every :class:`DlreplayError` into a one-line message on stderr and
exit code 1 (usage conflicts exit 2, as click does). Library users catch
``DlreplayError``. Messages name the file concerned and say what to do next.
"""

from __future__ import annotations


class DlreplayError(Exception):
    """Base class of every error dlreplay raises on purpose."""

    exit_code: int = 1


class UsageError(DlreplayError):
    """The command line or API call contradicts itself."""

    exit_code = 2


class TraceError(DlreplayError):
    """A trace directory or file cannot be used (missing, empty, unreadable)."""


class ArtifactVersionError(DlreplayError):
    """A saved artifact names another schema or an unsupported format_version."""


class CaptureError(DlreplayError):
    """A capture could not be set up (no DFTracer preload library, output dir refused)."""


class ModelError(DlreplayError):
    """A workload model is invalid; the message names the file and the field path."""


class InUseError(DlreplayError):
    """An output directory is claimed by another running dlreplay command (one writer per directory)."""


class UnsafePathError(DlreplayError):
    """A file lists a path outside the directory it belongs to (absolute, ``..``, a symlink out)."""
