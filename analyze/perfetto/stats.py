"""What an export wrote (:class:`ExportStats`) and the time range a timeline can hold.

Shared by the entry point (:mod:`.export`) and both writers (:mod:`.json_writer`,
:mod:`.proto_writer`), which fill in the counts as they write.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MAX_TS_US", "ExportStats"]

#: Latest time a timeline can hold (µs): nanoseconds must fit a signed 64-bit integer.
MAX_TS_US = (2**63 - 1) // 1000


@dataclass
class ExportStats:
    """What :func:`~.export.export_trace` wrote. Times are seconds, sizes bytes."""

    path: Path
    format: str  # "perfetto" or "json"
    slices: int = 0  # events written as slices (one per event row)
    clipped: int = 0  # slices shortened to end with their parent (nesting repair)
    dropped: int = (
        0  # rows without pid, tid or timestamp, or with a timestamp out of range (not written)
    )
    repaired: int = (
        0  # negative durations (set to 0) or durations ending past MAX_TS_US (shortened)
    )
    processes: int = 0
    threads: int = 0
    counter_points: int = 0  # values on the two counter tracks
    flows: int = 0  # item -> fetch arrows
    bytes_written: int = 0
    seconds: float = 0.0
    process_names: dict[int, str] = field(default_factory=dict)

    def summary(self) -> str:
        """One line for the CLI."""
        line = (
            f"{self.path}: {self.format}, {self.slices} slices on {self.threads} threads of "
            f"{self.processes} processes, {self.flows} flows, {self.counter_points} counter values, "
            f"{self.clipped} clipped to nest, {self.bytes_written / 1e6:.1f} MB in {self.seconds:.1f} s"
        )
        if self.dropped:
            line += (
                f"; {self.dropped} event(s) not written (no pid, tid or timestamp, or a timestamp "
                f"outside 0..{MAX_TS_US} µs)"
            )
        if self.repaired:
            line += f"; {self.repaired} negative or overlong duration(s) repaired"
        return line
