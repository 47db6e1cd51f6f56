"""Human-readable units for terminal output (one formatter for every command)."""

from __future__ import annotations

import re


def human_bytes(n: float | int | None, missing: str = "-") -> str:
    """``1536`` -> ``"1.5 KiB"`` (powers of 1024; whole bytes below 1 KiB); None -> ``missing``."""
    if n is None:
        return missing
    value = float(n)
    if abs(value) < 1024:
        return f"{int(value)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "PiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def human_seconds(s: float) -> str:
    """Seconds with a unit that keeps about 3 significant digits (µs, ms, s, min, h)."""
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.2f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def parse_bytes(text: str) -> int:
    """``"2GiB"`` -> 2147483648, ``"500MB"`` -> 500000000, ``"1.5G"`` -> 1500000000, ``"4096"`` -> 4096.

    Units: B, kB/MB/GB/TB (and K/M/G/T: powers of 1000), KiB/MiB/GiB/TiB (powers of 1024),
    case-insensitive, optional blank before the unit. Raises ValueError naming the text.
    """
    import re

    from dlreplay.errors import shown

    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _SIZE_UNITS:
        raise ValueError(
            f"{shown(text)} is not a size: use e.g. 2GiB, 500MB, 1.5G or a number of bytes"
        )
    value = float(m.group(1)) * _SIZE_UNITS[unit or ""]
    if value < 1:
        raise ValueError(f"{shown(text)} is not a positive size")
    if value >= 2**63:  # no byte count of this machine's (and float's infinity has no int)
        raise ValueError(f"{shown(text)} is too large a size (at most 8 EiB)")
    return int(value)


#: Characters a name from a trace must not bring to a terminal or a document as they are:
#: C0/C1 controls and DEL (cursor moves, screen clears, bells, line breaks) and the Unicode
#: marks that reorder or hide text (bidirectional overrides and isolates, zero-width).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def printable(text: object, keep: str = "") -> str:
    """*text* with every unsafe character (see ``_UNSAFE``) written as an escape (``\\x1b``,
    ``\\n``, ``\\u202e``), except those in *keep*: file names from a trace shown as they
    are named, never interpreted by the terminal."""

    def esc(m: re.Match[str]) -> str:
        c = m.group()
        if c in keep:
            return c
        return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")

    return _UNSAFE.sub(esc, str(text))


def terminal_safe(text: object) -> str:
    """Output for a terminal: unsafe characters escaped, line breaks and tabs kept."""
    return printable(text, keep="\n\t")


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+!|~])")


def markdown_text(text: object) -> str:
    """Prose for Markdown: unsafe characters escaped and ``<``, ``>``, ``&`` as entities, so a
    name in it can neither inject HTML nor break the document."""
    return terminal_safe(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def markdown_cell(text: object) -> str:
    """A Markdown table cell: :func:`markdown_text`, every Markdown special character
    backslash-escaped and line breaks written as ``\\n`` (a name cannot end the row)."""
    return _MD_SPECIAL.sub(r"\\\1", markdown_text(printable(text)))
