"""A model as readable text (``dlreplay model show``, distill's summary)."""

from __future__ import annotations

from typing import Any

from dlreplay.model.distribution import Distribution
from dlreplay.model.layout import ArrayFile, ArrayMember, ImageFile, Layout, TableFile
from dlreplay.model.sections import Checkpoint, WorkloadModel, default_fields
from dlreplay.units import human_bytes


def _fmt_bytes(n: float | None) -> str:
    return human_bytes(n, missing="?")


def _fmt_seconds(s: float | None) -> str:
    if s is None:
        return "?"
    return f"{s * 1000:.3g} ms" if abs(s) < 1 else f"{s:.3g} s"


def _fmt_dist(d: Distribution, fmt: Any) -> str:
    if d.type == "unknown":
        return "unknown"
    if d.type == "fixed":
        return fmt(d.value)
    spread = f" ± {fmt(d.stdev)}" if d.stdev else ""
    rng = f", {fmt(d.min)}..{fmt(d.max)}" if d.min is not None and d.max is not None else ""
    return f"{fmt(d.mean)}{spread} ({d.type}{rng})"


def _summary_checkpoint(c: Checkpoint) -> str:
    if not c.enabled:
        return "off"
    if c.steps_between_checkpoints:
        when = f"every {c.steps_between_checkpoints} steps"
    elif c.time_between_checkpoints:
        when = f"every {_fmt_seconds(c.time_between_checkpoints)}"
    else:
        when = f"every {c.epochs_between_checkpoints or 1} epoch(s) from epoch {c.checkpoint_after_epoch}"
    limit = f", {c.num_checkpoints_write} in all" if c.num_checkpoints_write else ""
    return (
        f"{when}{limit}: {c.files_per_checkpoint} file(s), {_fmt_bytes(c.bytes_per_checkpoint)}, "
        f"writes {_fmt_dist(c.write_transfer_size, _fmt_bytes)}, fsync {'yes' if c.fsync else 'no'}"
    )


def _summary_member(m: ArrayMember) -> str:
    """One array: name, dtype, shape and how it is stored."""
    how = m.storage or ""
    if m.chunks:
        how += f" {'x'.join(map(str, m.chunks))}"
    if m.compression and m.storage != "deflated":
        how += f" {m.compression}"
    if m.chunk_order == "scattered":
        how += " scattered"
    return f"{m.name or 'array'} {m.dtype} {list(m.shape)} {how}".rstrip()


def _summary_arrays(s: ArrayFile) -> list[str]:
    """The first three arrays of an array file's structure, and how many more."""
    parts = [_summary_member(m) for m in s.members[:3]]
    if len(s.members) > 3:
        parts.append(f"+{len(s.members) - 3} more")
    return parts


def _summary_image(i: ImageFile) -> str:
    coding = " ".join(
        x
        for x in (
            f"q{i.quality}" if i.quality else "",
            i.subsampling or "",
            "progressive" if i.progressive else "",
        )
        if x
    )
    return f"{i.width}x{i.height} {i.mode} {coding}".rstrip()


def _summary_table(t: TableFile) -> str:
    return f"{len(t.columns)} column(s)" + (
        f", {t.row_groups} row group(s)" if t.row_groups else ""
    )


def _summary_chunks(lay: Layout) -> list[str]:
    """The layout's summary fields (HDF5 chunks, NPZ deflation) when no structure is known."""
    if not (lay.hdf5_chunk_bytes or lay.hdf5_chunk_shape or lay.compressed):
        return []
    if lay.hdf5_chunk_bytes or lay.hdf5_chunk_shape:
        return [
            "chunks "
            + (
                f"{lay.hdf5_chunk_shape}"
                if lay.hdf5_chunk_shape
                else _fmt_bytes(lay.hdf5_chunk_bytes)
            )
        ]
    return ["deflated members"]


def _summary_layout(lay: Layout) -> str:
    """One line: the files' inside (first structure), where it came from."""
    if lay.arrays:
        parts = _summary_arrays(lay.arrays[0])
    elif lay.images:
        parts = [_summary_image(lay.images[0])]
    elif lay.tables:
        parts = [_summary_table(lay.tables[0])]
    else:
        parts = _summary_chunks(lay)
    if not parts:
        return ""
    kinds = len(lay.arrays or lay.images or lay.tables or [])
    more = f"; {kinds} kinds of files" if kinds > 1 else ""
    return f"{', '.join(parts)}{more} ({lay.source or 'given'})"


def _per_file(ds: Any) -> str:
    """How the dataset's samples sit in its files: samples a file, or files a sample."""
    if ds.files_per_sample > 1:
        return f"({ds.files_per_sample} a sample: {ds.num_files // ds.files_per_sample} samples)"
    return f"x {ds.num_samples_per_file} sample(s)/file"


def summarize_model(model: WorkloadModel) -> str:
    """A readable multi-line summary, ending with the fields left at defaults."""
    m, ds, rd, tr, pr = model.model, model.dataset, model.reader, model.train, model.processes
    name = m.name or "(unnamed)"
    lines = [
        f"workload {name}" + (f" ({m.type})" if m.type else "") + f", framework {model.framework}"
    ]
    lines.append(
        f"  dataset     {ds.format}, {ds.num_files} files {_per_file(ds)}"
        + (f", {ds.num_files_eval} eval files" if ds.num_files_eval else "")
        + (f", in {ds.data_folder}" if ds.data_folder else "")
    )
    lines.append(
        f"  record      {_fmt_dist(ds.record_length, _fmt_bytes)}; file {_fmt_dist(ds.file_size, _fmt_bytes)}"
    )
    layout = _summary_layout(ds.layout)
    if layout:
        lines.append(f"  layout      {layout}")
    lines.append(
        f"  reader      {rd.data_loader}, {rd.read_threads} {rd.worker_kind} worker(s)/rank, "
        f"batch {rd.batch_size}, prefetch {rd.prefetch_factor}, shuffle files={rd.file_shuffle} "
        f"samples={rd.sample_shuffle}, {'open per sample' if rd.open_per_sample else 'files kept open'}"
    )
    lines.append(f"  reads       {_fmt_dist(rd.transfer_size, _fmt_bytes)} per call")
    if rd.streaming is not None:
        st = rd.streaming
        lines.append(
            f"  streaming   whole shards through {st.library}, split {st.split} over ranks then "
            f"workers, shuffle buffer {st.shuffle_buffer or 'none'}"
        )
    if tr.enabled:
        steps = f", {tr.steps_per_epoch} steps/epoch" if tr.steps_per_epoch else ""
        timed = " (timed between reads: the job's loader work in it)" * tr.timed_between_reads
        lines.append(
            f"  train       {tr.epochs} epoch(s){steps}, compute {_fmt_dist(tr.computation_time, _fmt_seconds)}"
            f"/step{timed}"
        )
        cpu = tr.computation_host_cpu
        if cpu.is_known and (cpu.mean or 0) > 0:
            lines.append(
                f"  host CPU    {_fmt_dist(cpu, _fmt_seconds)}/step in {tr.computation_host_threads} "
                f"thread(s), spent inside the compute time"
            )
        else:
            lines.append("  host CPU    none: the compute is a pure sleep (an accelerator's)")
        extra = []
        if tr.warmup_computation_time:
            extra.append(
                f"{len(tr.warmup_computation_time)} warm-up step(s) "
                f"{_fmt_seconds(sum(tr.warmup_computation_time))}"
            )
        if tr.epoch_warmup_computation_time:
            extra.append(
                f"{len(tr.epoch_warmup_computation_time)} leading step(s) per later epoch "
                f"{_fmt_seconds(sum(tr.epoch_warmup_computation_time))}"
            )
        if tr.epoch_end_time.is_known and (tr.epoch_end_time.mean or 0) > 0:
            extra.append(f"epoch end {_fmt_dist(tr.epoch_end_time, _fmt_seconds)}")
        if extra:
            lines.append(f"  timing      {'; '.join(extra)}")
    else:
        lines.append("  train       off")
    if tr.evaluation is not None:
        ev = tr.evaluation
        lines.append(
            f"  evaluation  every {ev.every_n_epochs} epoch(s), compute "
            f"{_fmt_dist(ev.computation_time, _fmt_seconds)}/step"
        )
    lines.append(f"  checkpoint  {_summary_checkpoint(model.checkpoint)}")
    lines.append(f"  processes   {pr.ranks} rank(s) x {pr.workers_per_rank} worker(s)")
    source = model.provenance.source_trace or model.provenance.source_config
    if source:
        lines.append(f"  source      {source}")
    defaults = default_fields(model)
    if defaults:
        lines.append(
            f"  defaults    {len(defaults)} field(s) could not be inferred: {', '.join(defaults)}"
        )
    return "\n".join(lines)
