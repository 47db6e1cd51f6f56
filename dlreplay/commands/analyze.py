"""``dlreplay analyze``: characterise a trace and diagnose its I/O bottlenecks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from dlreplay.commands.common import Processes, Status, check_report, echo, why_no_events


def _scheduler_address(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--scheduler``: a Dask address with a host and a port in 1..65535 (``tcp://host:port``)."""
    if value is None:
        return None
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, loc = parse_address(value)
        if scheme != "inproc":
            host, port = parse_host_port(loc)
            if not host or not 0 < int(port) < 65536:
                raise ValueError("the port must be 1..65535")
    except (ValueError, TypeError) as exc:
        raise click.BadParameter(
            f"{value!r} is not a Dask scheduler address like tcp://HOST:PORT ({exc})",
            ctx=ctx,
            param=param,
        ) from None
    return value


def _memory_limit(memory_limit: str | None) -> int | None:
    """``--memory-limit`` in bytes (a usage error naming the option where it is no size)."""
    if memory_limit is None:
        return None
    from dlreplay.units import parse_bytes

    try:
        return parse_bytes(memory_limit)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--memory-limit") from None


@click.command(short_help="Summarise a trace and diagnose its I/O bottlenecks.")
@click.argument("trace", type=click.Path(path_type=Path))
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print summary, findings and passes as JSON (schema dlreplay.analysis).",
)
@click.option(
    "--data-dir", "data_dirs", multiple=True, help="Treat files under this path as the dataset."
)
@click.option(
    "--report",
    "report_path",
    type=click.Path(path_type=Path),
    help="Write a report: .html (self-contained) or .md (figures beside it).",
)
@click.option(
    "--config",
    "config",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="YAML with `thresholds:` overrides and `disable:` rule ids.",
)
@click.option(
    "--verify",
    is_flag=True,
    help="Replay the distilled model as traced and with each recommended "
    "change; show predicted AU / samples/s side by side.",
)
@click.option(
    "--verify-dir",
    type=click.Path(path_type=Path),
    help="Where --verify generates datasets and replays (default: a temporary directory, removed).",
)
@click.option(
    "--verify-epochs",
    type=click.IntRange(min=1, max=1000),
    default=4,
    show_default=True,
    help="Epochs per --verify replay (may exceed the traced epochs: steadier predictions).",
)
@click.option(
    "--scheduler",
    metavar="ADDRESS",
    callback=_scheduler_address,
    help="Analyse on this Dask cluster (tcp://host:port): files are parsed "
    "in parallel tasks and the passes run on a worker, so the event table never comes to this "
    "machine; the workers must see the trace path. Waits up to 10 s for the scheduler "
    "(DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT, e.g. 60s, sets that).",
)
@click.option(
    "--workers",
    type=Processes(),
    help="Analyse on a local Dask cluster of N processes (as --scheduler, on this machine).",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=None,
    help="Threads that decompress and parse the trace (default: the cores available to this process).",
)
@click.option(
    "--memory-limit",
    metavar="SIZE",
    help="Memory budget (e.g. 2GiB, 500MB): a trace whose analysis "
    "would not fit is spilled to Parquet and analysed with streaming queries.",
)
@click.option(
    "--spill-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Where --memory-limit spills (a temporary directory inside it, removed; default: system temp).",
)
@click.option("--force", is_flag=True, help="Overwrite an existing --report file.")
def analyze(
    trace: Path,
    as_json: bool,
    data_dirs: tuple[str, ...],
    report_path: Path | None,
    config: Path | None,
    verify: bool,
    verify_dir: Path | None,
    verify_epochs: int,
    scheduler: str | None,
    workers: int | None,
    jobs: int | None,
    memory_limit: str | None,
    spill_dir: Path | None,
    force: bool,
) -> None:
    """Characterise the trace at TRACE and diagnose its I/O bottlenecks.

    Prints duration, processes, a per-operation table (count, bytes, time), the top
    files, the read transfer-size histogram (Darshan buckets), then the findings:
    what slows the input pipeline, why, what to change and the `dlreplay replay
    --set` that tries it. Damaged files are salvaged and the dropped count shown.
    """
    from dlreplay.analyze.analysis import analyze_trace
    from dlreplay.analyze.report import write_report

    if report_path is not None:
        check_report(report_path, force, inputs=(trace,))
    limit = _memory_limit(memory_limit)
    say = (lambda s: echo(s, err=True)) if not as_json else None
    with Status(f"analysing {trace}"):
        report = analyze_trace(
            trace,
            data_dirs=list(data_dirs) or None,
            config=config,
            verify=verify,
            verify_dir=verify_dir,
            verify_epochs=verify_epochs,
            scheduler=scheduler,
            workers=workers,
            figures=report_path is not None,
            echo=say,
            memory_limit=limit,
            spill_dir=spill_dir,
            jobs=jobs,
        )
    if report_path is not None:
        with Status(f"writing {report_path}"):
            write_report(report, report_path)
    if as_json:
        for w in report.warnings:  # stdout stays JSON (its "warnings"); said first all the same
            echo(f"warning: {w}", err=True)
        echo(json.dumps(_json_payload(report, trace), indent=2, default=str))
        return
    _print_analysis(report, trace, report_path)


def _json_payload(report: Any, trace: Path) -> dict[str, Any]:
    """``--json``: the overview, the report's own dict, and each trace file's account."""
    payload = dict(report.characterization["overview"])
    payload.update(report.to_dict())
    payload["trace"] = str(trace)
    payload["incomplete"] = bool(report.warnings)
    payload["dropped_lines"] = report.dropped_lines
    payload["dropped_bytes"] = report.dropped_bytes
    payload["files"] = [
        {
            "name": f.name,
            "bytes": f.bytes,
            "members": f.members,
            "lines": f.lines,
            "events": f.events,
            "dropped_lines": f.dropped_lines,
            "dropped_bytes": f.dropped_bytes,
            "problems": list(f.problems),
        }
        for f in report.file_reports
    ]
    return payload


def _print_analysis(report: Any, trace: Path, report_path: Path | None) -> None:
    """The text answer: warnings, the summary, the findings, and the next commands."""
    from dlreplay.analyze.analysis import render_findings_text
    from dlreplay.analyze.summary import render_text
    from dlreplay.analyze.trace.hidden import recovered_note

    for w in report.warnings:  # before any number derived from the trace
        echo(f"warning: {w}")
    if report.warnings:
        echo("")
    echo(render_text(report.characterization.view.summary))
    recovered = recovered_note(report.file_reports)
    if recovered:
        echo(f"note: {recovered}")
    if not report.characterization["overview"]["events"]:
        echo(f"\nwarning: {why_no_events(report.file_reports, report.manifest)}")
    else:
        echo("")
        echo(render_findings_text(report))
    if report.damage:
        echo(f"\nwarning: {report.damage}")
    echo("")
    if report_path is not None:
        echo(f"report: {report_path}")
    echo("next:")
    if report_path is None:
        echo(f"  dlreplay analyze {trace} --report report.html")
    echo(f"  dlreplay distill {trace} -o model.yaml")
    echo(f"  dlreplay export {trace}          # timeline for Perfetto")
