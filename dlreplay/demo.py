"""``dlreplay demo``: the whole pipeline on the bundled NPZ example job.

Like the CLI, this is an application layer over the stages; no stage imports it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlreplay.errors import DlreplayError, UsageError
from dlreplay.interrupt import INTERRUPT

_MARKER = ".dlreplay-demo"
_MARKER_TEXT = "made by dlreplay demo"


@dataclass(frozen=True)
class DemoConfig:
    """Where the demo writes (``out``) and the example job's size."""

    out: Path
    force: bool = False
    num_files: int = 24
    batch_size: int = 2
    workers: int = 2
    epochs: int = 3
    checkpoint_every: int = 4  # steps


def examples_dir() -> Path:
    """The repository's ``examples/`` folder (dlreplay installed from a checkout)."""
    here = Path(__file__).resolve().parent.parent / "examples"
    if not (here / "unet3d_npz.py").is_file():
        raise DlreplayError(
            "the example jobs are not next to this dlreplay install; run the demo from a source checkout "
            "(`git clone … && make demo`)."
        )
    return here


def _made_by_demo(out: Path) -> bool:
    """Whether *out* is a directory an earlier ``dlreplay demo`` made (its marker file)."""
    marker = out / _MARKER
    try:
        return not marker.is_symlink() and marker.read_text().startswith(_MARKER_TEXT)
    except (OSError, UnicodeDecodeError):
        return False


def _prepare(out: Path, force: bool) -> None:
    """Make *out* the demo's: new or empty, or made by an earlier demo, whose trace and replay
    are then cleared of their own files (anything else there refuses the run, nothing
    deleted). A directory the demo did not make is refused, ``force`` or not."""
    from dlreplay.osutil import is_empty_dir

    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory; choose another --out.")
    if not is_empty_dir(out):
        if not _made_by_demo(out):
            raise UsageError(
                f"{out} is not empty and was not made by `dlreplay demo` (no {_MARKER}); the demo "
                f"writes only into a new or empty directory or one it made, with or without --force, "
                f"and nothing was changed: choose another --out."
            )
        _clear_previous(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / _MARKER).write_text(_MARKER_TEXT + "\n")


def _clear_previous(out: Path) -> None:
    """Delete an earlier demo run's trace and replay files (those a capture and a replay write),
    after checking that their directories hold nothing else."""
    from dlreplay.capture.run import CAPTURE_FILES
    from dlreplay.osutil import not_owned, remove_owned
    from dlreplay.replay.prepare import REPLAY_FILES

    owned = {"trace": CAPTURE_FILES, "replay": CAPTURE_FILES + REPLAY_FILES}
    for sub, globs in owned.items():
        d = out / sub
        if not os.path.lexists(d):
            continue
        other = [d.name] if d.is_symlink() or not d.is_dir() else not_owned(d, globs)
        if other:
            shown = ", ".join(other[:3]) + (f" and {len(other) - 3} more" if len(other) > 3 else "")
            raise UsageError(
                f"{d} holds {shown}, which `dlreplay demo` did not write; the demo replaces only its "
                f"own files, and nothing was changed: move them or choose another --out."
            )
    for sub, globs in owned.items():
        if (out / sub).is_dir():
            remove_owned(out / sub, globs)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_demo(config: DemoConfig, echo: Callable[[str], None] = print) -> dict[str, str]:
    """Capture, analyse, distill, replay and export; returns the artifact paths."""
    out = config.out.resolve()
    _prepare(out, config.force)
    data = out / "data"
    job = _job_command(config, out, data)
    _generate_dataset(job, data, config, echo)
    trace_dir = _capture_job(job, out, data, echo)
    loaded, summary_path, report_path = _analyse(trace_dir, out, echo)
    INTERRUPT.check()  # a Ctrl-C that a finalizer swallowed (see dlreplay.interrupt)
    model, model_path = _distill(loaded, trace_dir, out, echo)
    INTERRUPT.check()  # a Ctrl-C that a finalizer swallowed (see dlreplay.interrupt)
    replay_dir = _replay(model, out, echo)
    timelines = _export_timelines(loaded, trace_dir, replay_dir, out)
    INTERRUPT.check()  # a Ctrl-C that a finalizer swallowed (see dlreplay.interrupt)
    compare_path = _compare(trace_dir, replay_dir, out, echo)
    paths = {
        "trace": str(trace_dir),
        "report": str(report_path),
        "comparison": str(compare_path),
        "summary": str(summary_path),
        "model": str(model_path),
        "replay": str(replay_dir),
        "metrics": str(replay_dir / "metrics.json"),
        "timeline_job": timelines["job"],
        "timeline_replay": timelines["replay"],
        "job_report": str(out / "job-report.json"),
    }
    INTERRUPT.check()  # a Ctrl-C that a finalizer swallowed (see dlreplay.interrupt)
    _print_outputs(paths, echo)
    return paths


def _job_command(config: DemoConfig, out: Path, data: Path) -> list[str]:
    """The example training job's command line (its dataset in ``data``, its files in ``out``)."""
    script = examples_dir() / "unet3d_npz.py"
    return [
        sys.executable,
        str(script),
        "--data-dir",
        str(data),
        "--num-files",
        str(config.num_files),
        "--batch-size",
        str(config.batch_size),
        "--workers",
        str(config.workers),
        "--epochs",
        str(config.epochs),
        "--checkpoint-every",
        str(config.checkpoint_every),
        "--checkpoint-dir",
        str(out / "checkpoints"),
        "--report",
        str(out / "job-report.json"),
        "--quiet",
    ]


def _generate_dataset(
    job: list[str], data: Path, config: DemoConfig, echo: Callable[[str], None]
) -> None:
    """Step 1: the example job writes its dataset (not traced)."""
    echo(f"[1/6] dataset: {data}")
    gen = subprocess.run(
        [*job[:4], "--num-files", str(config.num_files), "--generate-only"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    INTERRUPT.check()  # a Ctrl-C reached the generator too: its own output is not the demo's
    if gen.returncode != 0:
        raise DlreplayError(
            f"generating the example dataset in {data} failed (exit code {gen.returncode}):\n"
            f"{_tail(gen.stderr)}"
        )


def _capture_job(job: list[str], out: Path, data: Path, echo: Callable[[str], None]) -> Path:
    """Step 2: the training job under DFTracer; returns its trace directory."""
    from dlreplay.capture import CaptureConfig, run_capture

    echo("[2/6] capturing the training job under DFTracer …")
    t0 = time.perf_counter()
    log = out / "job.log"
    result = run_capture(
        CaptureConfig(
            command=tuple(job),
            out=out / "trace",
            data_dirs=(str(data), str(out / "checkpoints")),
            name="unet3d_npz",
            force=True,
            job_output=log,
        )
    )
    if result.status == "interrupted":
        raise KeyboardInterrupt
    if result.exit_code != 0:
        raise DlreplayError(
            f"the example job failed with exit code {result.exit_code} (its output: {log}; its trace: "
            f"{result.trace_dir}):\n{_tail(log.read_text(errors='replace'))}"
        )
    echo(
        f"      {result.events:,} events in {len(result.files)} trace files, {time.perf_counter() - t0:.1f} s "
        f"(the job's output: {log})"
    )
    INTERRUPT.check()
    return result.trace_dir


def _analyse(trace_dir: Path, out: Path, echo: Callable[[str], None]) -> tuple[Any, Path, Path]:
    """Step 3: the trace's summary (``summary.json``) and findings (``report.html``);
    returns the loaded trace and the two files."""
    from dlreplay.analyze import load_trace, render_text, summarize
    from dlreplay.analyze.analysis import analyze_trace, render_findings_text
    from dlreplay.analyze.report import write_report

    echo("[3/6] analysing the trace")
    loaded = load_trace(trace_dir)
    summary = summarize(
        loaded.events,
        data_dirs=(loaded.manifest or {}).get("data_dirs"),
        per_process=loaded.per_process,
    )
    summary_path = out / "summary.json"
    summary_path.write_text(json.dumps(summary.to_dict(), indent=2) + "\n")
    echo(render_text(summary))
    report = analyze_trace(trace_dir)
    report_path = write_report(report, out / "report.html")
    echo("")
    echo(render_findings_text(report))
    return loaded, summary_path, report_path


def _distill(
    loaded: Any, trace_dir: Path, out: Path, echo: Callable[[str], None]
) -> tuple[Any, Path]:
    """Step 4: the workload model, written to ``model.yaml``."""
    from dlreplay.analyze.distill import distill
    from dlreplay.model import save_model, summarize_model

    echo("\n[4/6] distilling the workload model")
    model = distill(loaded.events, manifest=loaded.manifest, source=str(trace_dir))
    model_path = out / "model.yaml"
    save_model(model, model_path)
    echo(summarize_model(model))
    return model, model_path


def _replay(model: Any, out: Path, echo: Callable[[str], None]) -> Path:
    """Step 5: the model replayed under DFTracer, its epoch times beside the real job's;
    returns the replay's directory."""
    from dlreplay.replay import ReplayConfig, render_result, run_replay

    echo("\n[5/6] replaying the model (compute replaced by sleep) under DFTracer …")
    replay_dir = out / "replay"  # an earlier run's: emptied of its own files by _prepare
    replayed = run_replay(
        ReplayConfig(model=model, data_dir=out / "replay-data", out=replay_dir, trace=True),
        echo=lambda s: None,
    )
    if not replayed.complete:  # a Ctrl-C stopped it (run_replay answers one with partial metrics)
        raise KeyboardInterrupt
    echo(render_result(replayed))
    _print_epoch_times(out, replayed.metrics, echo)
    return replay_dir


def _print_epoch_times(out: Path, metrics: dict[str, Any], echo: Callable[[str], None]) -> None:
    """The real job's epoch times (its ``job-report.json``) beside the replay's."""
    job_report = json.loads((out / "job-report.json").read_text())
    real_epochs = job_report.get("epoch_times_s", [])
    replay_epochs = [e.get("epoch_time_s") for e in metrics.get("epochs", [])]
    echo("      epoch time (s)   real job   replay")
    for i, (a, b) in enumerate(zip(real_epochs, replay_epochs, strict=False)):
        echo(
            f"      epoch {i + 1:<10} {a:8.2f}   {b:6.2f}"
            if b is not None
            else f"      epoch {i + 1:<10} {a:8.2f}        -"
        )


def _export_timelines(loaded: Any, trace_dir: Path, replay_dir: Path, out: Path) -> dict[str, str]:
    """Both traces as Perfetto timelines (``job.perfetto-trace``, ``replay.perfetto-trace``)."""
    from dlreplay.analyze import load_trace
    from dlreplay.analyze.perfetto import export_trace

    timelines = {}
    for label, where in (("job", trace_dir), ("replay", replay_dir)):
        lt = loaded if label == "job" else load_trace(where)
        path = out / f"{label}.perfetto-trace"
        export_trace(lt.events, path, manifest=lt.manifest)
        timelines[label] = str(path)
    return timelines


def _compare(trace_dir: Path, replay_dir: Path, out: Path, echo: Callable[[str], None]) -> Path:
    """Step 6: the real job against its replay (``compare.html``)."""
    from dlreplay.analyze.compare import compare_traces, write_comparison_report

    echo("\n[6/6] comparing the real job with its replay")
    cmp = compare_traces(trace_dir, replay_dir)
    compare_path = write_comparison_report(cmp, out / "compare.html")
    echo(
        f"      similarity (DLIO features, cosine): {cmp.similarity:.4f}; KS read sizes "
        f"{cmp.ks_read_sizes if cmp.ks_read_sizes is None else round(cmp.ks_read_sizes, 3)}"
    )
    return compare_path


def _print_outputs(paths: dict[str, str], echo: Callable[[str], None]) -> None:
    """Where everything is, and what to run next."""
    echo("\nOutputs:")
    for key, value in paths.items():
        echo(f"  {key:<16} {value}")
    echo("next:")
    echo(f"  open {paths['report']}          # findings, figures, tables")
    echo(f"  dlreplay analyze {paths['trace']} --verify")
    echo(f"  dlreplay view {paths['timeline_job']}          # the captured job in Perfetto")
    echo(f"  dlreplay view {paths['timeline_replay']}       # the replay in Perfetto")
    echo(f"  dlreplay replay {paths['model']} --data-dir /your/storage --set reader.read_threads=4")
