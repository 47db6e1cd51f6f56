"""Option and model values that cannot be honoured (issue #18, bad-input suite).

Options out of range or malformed (seeds, ports, scheduler addresses, sizes, process
counts): a usage error (exit 2) naming the option, never a traceback, nothing created.
Model values that cannot be honoured (a plan or a file larger than memory, a dataset or a
checkpoint larger than the free space, more loader processes than the system allows one
command, a step of 10^12 s): refused in seconds, before any file is written, naming the
field and the size or count it implies. (A dataset or a checkpoint larger than the free
space: test_bad_runs, on a small tmpfs, so that no test depends on this machine's disk.)
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from dlreplay.osutil import MAX_PROCESSES

from .conftest import TRACES, run_cli
from .test_replay import write_model

T = str(TRACES / "npz_spawn")
HUGE = str(10 * MAX_PROCESSES)

OPTIONS = [
    (("generate", "{m}", "--data-dir", "{d}", "--seed", "-1"), "--seed", "-1 is not in the range"),
    (
        ("generate", "{m}", "--data-dir", "{d}", "--seed", str(2**64)),
        "--seed",
        "is not in the range",
    ),
    (
        ("generate", "{m}", "--data-dir", "{d}", "--seed", "x1"),
        "--seed",
        "'x1' is not a valid integer",
    ),
    (
        ("generate", "{m}", "--data-dir", "{d}", "--jobs", HUGE),
        "--jobs",
        f"{HUGE} processes are more than",
    ),
    (
        ("generate", "{m}", "--data-dir", "{d}", "--jobs", "0"),
        "--jobs",
        "0 is not in the range x>=1",
    ),
    (
        ("replay", "{m}", "--data-dir", "{d}", "--out", "{o}", "--seed", "-5"),
        "--seed",
        "-5 is not in the range",
    ),
    (
        ("replay", "{m}", "--data-dir", "{d}", "--out", "{o}", "--accelerators", HUGE),
        "--accelerators",
        "processes are more than one command may start here",
    ),
    (
        ("replay", "{m}", "--data-dir", "{d}", "--out", "{o}", "--au-threshold", "nan"),
        "--au-threshold",
        "'nan' is not a finite number",
    ),
    (
        ("replay", "{m}", "--data-dir", "{d}", "--out", "{o}", "--au-threshold", "101"),
        "--au-threshold",
        "not in the range",
    ),
    (
        ("replay", "{m}", "--data-dir", "{d}", "--out", "{o}", "--epochs", "0"),
        "--epochs",
        "not in the range",
    ),
    (("view", T, "--port", "-1", "--no-browser"), "--port", "-1 is not in the range 0<=x<=65535"),
    (("view", T, "--port", "70000", "--no-browser"), "--port", "70000 is not in the range"),
    (("view", T, "--port", "http", "--no-browser"), "--port", "'http' is not a valid integer"),
    (
        ("analyze", T, "--scheduler", "garbage"),
        "--scheduler",
        "is not a Dask scheduler address like tcp://HOST:PORT",
    ),
    (("analyze", T, "--scheduler", "tcp://"), "--scheduler", "is not a Dask scheduler address"),
    (
        ("analyze", T, "--scheduler", "tcp://127.0.0.1:99999"),
        "--scheduler",
        "the port must be 1..65535",
    ),
    (
        ("analyze", T, "--scheduler", "tcp://host:port"),
        "--scheduler",
        "is not a Dask scheduler address",
    ),
    (
        ("analyze", T, "--workers", HUGE),
        "--workers",
        "processes are more than one command may start here",
    ),
    (("analyze", T, "--workers", "-2"), "--workers", "not in the range"),
    (("analyze", T, "--memory-limit", "-5GB"), "--memory-limit", "is not a size"),
    (("analyze", T, "--memory-limit", "0"), "--memory-limit", "is not a positive size"),
    (("analyze", T, "--memory-limit", "nan"), "--memory-limit", "is not a size"),
    (("analyze", T, "--memory-limit", "1e400"), "--memory-limit", "is not a size"),
    (
        ("analyze", T, "--verify", "--verify-epochs", str(10**30)),
        "--verify-epochs",
        "not in the range 1<=x<=1000",
    ),
    (
        ("compare", T, T, "--min-similarity", "nan"),
        "--min-similarity",
        "'nan' is not a finite number",
    ),
    (("compare", T, T, "--min-similarity", "2"), "--min-similarity", "not in the range"),
]


@pytest.mark.parametrize(
    ("args", "option", "expected"),
    OPTIONS,
    ids=[
        f"{a[0]}{a[-2]}={a[-1]}" if a[-1] != "--no-browser" else f"{a[0]}{a[-3]}={a[-2]}"
        for a, _, _ in OPTIONS
    ],
)
def test_bad_option_value_is_a_usage_error_naming_it(
    tmp_path: Path, args: tuple[str, ...], option: str, expected: str
) -> None:
    model = write_model(tmp_path)
    names = {"m": str(model), "d": str(tmp_path / "d"), "o": str(tmp_path / "o")}
    proc = run_cli(*(a.format(**names) for a in args), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert re.search(f"Invalid value for .?{option}.?:", proc.stderr) and expected in proc.stderr, (
        proc.stderr
    )
    assert not (tmp_path / "d").exists() and not (tmp_path / "o").exists()


MODEL_VALUES = [
    (
        ("generate",),
        ("dataset.num_files=1000000000000",),
        "dataset.num_files x dataset.num_samples_per_file = 1,000,000,000,000 x 2 = 2,000,000,000,000 samples",
    ),
    (
        ("generate",),
        ("dataset.num_samples_per_file=1000000000",),
        "6,000,000,000 samples: their sizes and order alone need",
    ),
    (
        ("generate",),
        ("dataset.record_length=1000000000000000",),
        "dataset.record_length x dataset.num_samples_per_file = 909.5 TiB x 2: one file of 1.8 PiB is generated in "
        "memory",
    ),
    (
        ("replay",),
        ("reader.read_threads=100000",),
        "reader.read_threads: 100000 loader worker(s) x 1 accelerator(s) = 100,000 processes, more than one command",
    ),
    (
        ("replay", "--accelerators", "4"),
        (f"reader.read_threads={MAX_PROCESSES // 2}",),
        f"= {MAX_PROCESSES * 2:,} processes",
    ),
    (
        ("replay",),
        (
            "dataset.num_files=1000",
            "dataset.num_samples_per_file=1",
            "dataset.record_length=10000000000",
            "reader.batch_size=1000",
        ),
        "reader.batch_size x dataset.record_length: 1,000 samples of 9.3 GiB",
    ),
    (
        ("replay",),
        (
            "checkpoint.enabled=true",
            "checkpoint.steps_between_checkpoints=1",
            "checkpoint.bytes_per_checkpoint=1000000000000000000",
        ),
        "checkpoint.bytes_per_checkpoint: 888.2 PiB per checkpoint, but the file system of",
    ),
    (
        ("replay",),
        ("train.computation_time=1000000000000",),
        "train.computation_time: 1e+12 s per step cannot be replayed",
    ),
    (
        ("replay",),
        ("reader.preprocess_time=1000000000",),
        "reader.preprocess_time: 1e+09 s per step cannot be replayed",
    ),
]


@pytest.mark.parametrize(
    ("command", "sets", "expected"), MODEL_VALUES, ids=[" ".join(s) for _, s, _ in MODEL_VALUES]
)
def test_model_values_that_cannot_be_honoured_are_refused_up_front(
    tmp_path: Path, command: tuple[str, ...], sets: tuple[str, ...], expected: str
) -> None:
    """Refused in seconds (not after minutes of work or an out-of-memory kill), nothing written."""
    model = write_model(tmp_path, "dataset.format=raw")
    extra = ["--out", str(tmp_path / "o"), "--no-trace"] if command[0] == "replay" else []
    t0 = time.monotonic()
    proc = run_cli(
        *command,
        str(model),
        "--data-dir",
        str(tmp_path / "d"),
        *extra,
        *[x for s in sets for x in ("--set", s)],
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("dlreplay: error: ") and expected in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert (
        time.monotonic() - t0 < 120
    )  # a bound for a slow machine; the refusal itself takes milliseconds
    assert not (tmp_path / "d").exists() and not (tmp_path / "o").exists()
