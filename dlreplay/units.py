"""Human-readable units for terminal output (one formatter for every command)."""

from __future__ import annotations


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
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}


def parse_bytes(text: str) -> int:
    """``"2GiB"`` -> 2147483648, ``"500MB"`` -> 500000000, ``"1.5G"`` -> 1500000000, ``"4096"`` -> 4096.

    Units: B, kB/MB/GB/TB (and K/M/G/T: powers of 1000), KiB/MiB/GiB/TiB (powers of 1024),
    case-insensitive, optional blank before the unit. Raises ValueError naming the text.
    """
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size: use e.g. 2GiB, 500MB, 1.5G or a number of bytes")
    value = float(m.group(1)) * _SIZE_UNITS[unit or ""]
    if value < 1:
        raise ValueError(f"{text!r} is not a positive size")
    return int(value)
