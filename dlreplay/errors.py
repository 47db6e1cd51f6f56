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


class IneffectiveOverride(ModelError):
    """An override (``--set``) that cannot take effect: another field of the model decides the
    value it sets (the message names that field)."""


class InUseError(DlreplayError):
    """An output directory is claimed by another running dlreplay command (one writer per directory)."""


class UnsafePathError(DlreplayError):
    """A file lists a path outside the directory it belongs to (absolute, ``..``, a symlink out)."""


#: Characters of a value an error message shows: a config's value can be megabytes long, and
#: a one-line message that echoes it whole is no longer one line nor readable.
SHOWN_CHARS = 80


def clipped(text: str, limit: int = SHOWN_CHARS) -> str:
    """*text* as it is, or its first *limit* characters and how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """How a value is quoted in an error message: its ``repr``, cut to about *limit* characters
    (a long string says how long it was, a container how many items it held)."""
    import reprlib

    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}... ({len(value):,} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        # int's repr refuses more than 4,300 digits, and a number that long is no count of anything
        return f"an integer of about {int(value.bit_length() * 0.30103):,} digits"
    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother = 3, limit, limit
    short.maxlist = short.maxtuple = short.maxdict = short.maxset = 8
    try:
        text = short.repr(value)
    except (RecursionError, ValueError):
        text = f"a {type(value).__name__}"
    size = len(value) if isinstance(value, (list, tuple, dict, set)) else None
    if len(text) > limit or (size is not None and size > 8):
        text = text[:limit] + ("..." if len(text) > limit else "")
        text += f" ({size:,} items)" if size is not None else ""
    return text
