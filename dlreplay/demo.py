"""``dlreplay demo``: the whole pipeline on the bundled NPZ example job.

Like the CLI, this is an application layer over the stages; no stage imports it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dlreplay.errors import DlreplayError, UsageError

_MARKER = ".dlreplay-demo"


@dataclass(frozen=True)
class DemoConfig:
    """Where the demo writes (``out``) and the example job's size."""

    out: Path
    force: bool = False
    num_files: int = 24
    batch_size: int = 2
    workers: int = 2
    epochs: int = 3
    checkpoint_every: int = 4


def examples_dir() -> Path:
    """The repository's ``examples/`` folder (dlreplay installed from a checkout)."""
    here = Path(__file__).resolve().parent.parent / "examples"
    if not (here / "unet3d_npz.py").is_file():
        raise DlreplayError(
            "the example jobs are not next to this dlreplay install; run the demo from a source checkout "
            "(`git clone … && make demo`)."
        )
    return here


def _prepare(out: Path, force: bool) -> None:
    if out.exists() and any(out.iterdir()) and not (out / _MARKER).exists():
        if not force:
            raise UsageError(f"{out} is not empty and was not made by `dlreplay demo`; choose another --out.")
    out.mkdir(parents=True, exist_ok=True)
    (out / _MARKER).write_text("made by dlreplay demo\n")


def run_demo(config: DemoConfig, echo: Callable[[str], None] = print) -> dict[str, str]:
    """Generate the dataset, capture the job, analyse the trace; returns the artifact paths."""
    from dlreplay.analyze import load_trace, render_text, summarize
    from dlreplay.capture import CaptureConfig, run_capture

    out = config.out.resolve()
    _prepare(out, config.force)
    script = examples_dir() / "unet3d_npz.py"
    data = out / "data"
    job = [
        sys.executable, str(script),
        "--data-dir", str(data),
        "--num-files", str(config.num_files),
        "--batch-size", str(config.batch_size),
        "--workers", str(config.workers),
        "--epochs", str(config.epochs),
        "--checkpoint-every", str(config.checkpoint_every),
        "--checkpoint-dir", str(out / "checkpoints"),
        "--report", str(out / "job-report.json"),
    ]
    echo(f"[1/3] dataset: {data}")
    subprocess.run([*job[:4], "--num-files", str(config.num_files), "--generate-only"], check=True,
                   stdout=subprocess.DEVNULL)

    echo("[2/3] capturing the training job under DFTracer …")
    t0 = time.perf_counter()
    result = run_capture(
        CaptureConfig(command=tuple(job), out=out / "trace", data_dirs=(str(data), str(out / "checkpoints")),
                      name="unet3d_npz", force=True)
    )
    if result.exit_code != 0:
        raise DlreplayError(f"the example job failed with exit code {result.exit_code}; its trace is in {result.trace_dir}")
    echo(f"      {result.events:,} events in {len(result.files)} trace files, {time.perf_counter() - t0:.1f} s")

    echo("[3/3] analysing the trace")
    loaded = load_trace(result.trace_dir)
    summary = summarize(loaded.events, data_dirs=(loaded.manifest or {}).get("data_dirs"))
    summary_path = out / "summary.json"
    summary_path.write_text(json.dumps(summary.to_dict(), indent=2) + "\n")
    echo("")
    echo(render_text(summary))
    echo("")
    paths = {
        "trace": str(result.trace_dir),
        "summary": str(summary_path),
        "job_report": str(out / "job-report.json"),
    }
    echo("Outputs:")
    for key, value in paths.items():
        echo(f"  {key:<11} {value}")
    echo(f"next: dlreplay analyze {result.trace_dir}")
    return paths
