"""Regenerate ``traces/mapped_posix/``: captures of ``examples/tokens_memmap.py`` (a nanoGPT-style
loop without a DataLoader that maps its token file anew every batch) with DFTracer's POSIX calls
alone (``--no-loader-hooks``), for tests/test_mapped_loops.py: distill finds the loop's steps (one map
of the training file each), its validation passes (bursts of maps of the validation file) and the
files' sizes. The two differ in every one of these: steps (30, 24), validation every 10 or 8 steps
of 3 or 2 batches, token files of 2 M or 1 M tokens (and windows of 128 or 1024 tokens, which such
a trace cannot see). ``expected.json`` holds the truth, from the job's arguments.

    python traces/make_mapped_traces.py [--only NAME] [--work /tmp/dlreplay-mapped-traces]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from make_stream_traces import capture_example, keep_capture, run_makers  # noqa: E402

#: name -> (the job's arguments, the truth distill must find)
TRACES: dict[str, tuple[list[str], dict[str, Any]]] = {
    "tokens_a": (
        ["--tokens", "2000000", "--block", "128", "--batch", "8", "--steps", "30"]
        + ["--eval-interval", "10", "--eval-iters", "3"],
        {"steps": 30, "eval_every_steps": 10, "eval_steps": 3, "passes": 3,
         "file_bytes": 4_000_000, "eval_file_bytes": 400_000},
    ),
    "tokens_b": (
        ["--tokens", "1000000", "--block", "1024", "--batch", "4", "--steps", "24"]
        + ["--eval-interval", "8", "--eval-iters", "2"],
        {"steps": 24, "eval_every_steps": 8, "eval_steps": 2, "passes": 3,
         "file_bytes": 2_000_000, "eval_file_bytes": 200_000},
    ),
}  # fmt: skip


def make(name: str, work: Path) -> None:
    args, truth = TRACES[name]
    out, command = capture_example(name, work, "tokens_memmap.py", args, loader_hooks=False)
    expected = {
        "source": "examples/tokens_memmap.py, dlreplay capture --no-loader-hooks",
        "command": ["examples/tokens_memmap.py", *command[2:]],
        "truth": truth,
    }
    keep_capture(out, HERE / "mapped_posix" / name, expected)


def main() -> None:
    run_makers(__doc__ or "", TRACES, make, "/tmp/dlreplay-mapped-traces")


if __name__ == "__main__":
    main()
