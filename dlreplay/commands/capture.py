"""``dlreplay capture``: run a training job under DFTracer and keep its trace."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from dlreplay.commands.common import echo, signal_name, why_no_events


@click.command(
    short_help="Run a training job under DFTracer and keep its trace.",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "--out",
    "-o",
    type=click.Path(path_type=Path),
    help="Trace directory (default traces/<name>-<UTC time>).",
)
@click.option(
    "--data-dir",
    "data_dirs",
    multiple=True,
    help="Trace only files under this path (repeatable). Default: every file.",
)
@click.option(
    "--name",
    callback=lambda ctx, param, value: _plain_name(value),
    help="Name of the capture (default: the command's name): a name, not a path.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace a previous capture in --out (only its own files; a directory that holds no "
    "capture is never written).",
)
@click.option(
    "--no-loader-hooks",
    is_flag=True,
    help="Record POSIX/STDIO only, as DFTracer's preload alone does (no data-loader or checkpoint events; "
    "distill then infers the loop from the I/O).",
)
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors and warnings.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def capture(
    out: Path | None,
    data_dirs: tuple[str, ...],
    name: str | None,
    force: bool,
    no_loader_hooks: bool,
    quiet: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND under DFTracer and keep its trace.

    \b
    Example:
      dlreplay capture --data-dir data -- python train.py --epochs 2

    Every process is traced (DataLoader workers started by fork or spawn,
    multiprocessing pools, children of torchrun/mpiexec). PyTorch jobs also get
    data-loader events (epoch, fetch, step, item) and torch.save/torch.load
    checkpoint bytes, without code changes. After the job, the --data-dir trees
    (else the dataset files the job opened) are fingerprinted into
    dataset-fingerprint.json: the files' layout, not their content, from a
    bounded sample. Exits with the job's exit code.
    """
    from dlreplay.capture import CaptureConfig, run_capture

    result = run_capture(
        CaptureConfig(
            command=tuple(command),
            out=out,
            data_dirs=tuple(data_dirs),
            name=name,
            force=force,
            loader_hooks=not no_loader_hooks,
        )
    )
    if not quiet:
        print_capture_summary(result)
    else:  # warnings are not chatter: a wrong --data-dir leaves a trace without the dataset
        for w in result.warnings:
            echo(f"dlreplay: warning: {w}", err=True)
    sys.exit(result.exit_code)


def _plain_name(value: str | None) -> str | None:
    """``--name``: a name, never a path (a usage error naming the option otherwise)."""
    if value is None:
        return None
    from dlreplay.errors import UsageError
    from dlreplay.osutil import check_plain_name

    try:
        return check_plain_name(value, "--name")
    except UsageError as exc:
        raise click.BadParameter(str(exc).removeprefix("--name "), param_hint="--name") from None


def print_capture_summary(result: Any) -> None:
    """How the capture ended and what the trace holds, on stderr (stdout is the job's)."""
    from dlreplay.analyze import load_trace, summarize
    from dlreplay.analyze.distill.mapped import mapped_summary
    from dlreplay.analyze.trace.hidden import recovered_note
    from dlreplay.errors import DlreplayError
    from dlreplay.units import human_bytes

    echo("", err=True)
    how = f"exit code {result.exit_code}"
    if result.killed_by_signal:
        how += f", killed by {signal_name(result.killed_by_signal)}"
    echo(f"dlreplay: capture {result.status} ({how}) in {result.wall_time_s:.1f} s", err=True)
    try:
        loaded = load_trace(result.trace_dir)
        s = summarize(
            loaded.events,
            data_dirs=(loaded.manifest or {}).get("data_dirs"),
            per_process=loaded.per_process,
        )
        echo(
            f"  processes traced: {s.processes}   events: {loaded.events.height:,}   "
            f"dataset files: {s.dataset_files}   dataset bytes read: {human_bytes(s.dataset_bytes_read)}",
            err=True,
        )
        mapped = mapped_summary(result.trace_dir)  # page faults: no reads the tracer sees
        if mapped:
            echo(
                f"  mapped files: {mapped['files']}   windows taken: {mapped['windows']:,} "
                f"({human_bytes(mapped['bytes'])}; not in the page cache when taken: "
                f"{human_bytes(mapped['cold_bytes'])})",
                err=True,
            )
        recovered = recovered_note(loaded.files)
        if recovered:  # reads the tracer did not see, counted in the bytes above
            echo(f"  note: {recovered}", err=True)
        if loaded.damaged:
            echo(f"  warning: {loaded.describe_damage()}", err=True)
        if loaded.events.height == 0:
            echo(f"  warning: {why_no_events(loaded.files, loaded.manifest)}", err=True)
    except DlreplayError as exc:
        echo(f"  (trace could not be summarised: {exc})", err=True)
    for problem in getattr(result, "fingerprint_problems", []):
        echo(f"  dataset fingerprint: {problem}", err=True)
    for w in result.warnings:
        echo(f"  warning: {w}", err=True)
    echo(f"  trace: {result.trace_dir}", err=True)
    echo(f"next: dlreplay analyze {result.trace_dir}", err=True)
