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
