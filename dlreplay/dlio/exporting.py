"""Export: a workload model as a DLIO workload config, and the lossy steps it takes (see
:mod:`dlreplay.dlio`)."""

from __future__ import annotations

import math
import os
from typing import Any

from dlreplay import __version__
from dlreplay.dlio.checkpoint import DLIO_2_0_LAYER_PARAMETERS, dlio_checkpoint_estimate
from dlreplay.dlio.generator import generated_dims
from dlreplay.dlio.keys import DLIO_COMPRESSIONS, DLIO_DISTRIBUTION_KEYS, dlio_key_problems
from dlreplay.dlio.storage import export_storage
from dlreplay.errors import ModelError
from dlreplay.model import (
    AccessPattern,
    ArrayFile,
    ArrayMember,
    Distribution,
    Hdf5File,
    ImageFile,
    MetadataPerSample,
    WorkloadModel,
    atomic_write_text,
    dump_yaml,
)


def _dist_to_dlio(d: Distribution, what: str, warnings: list[str]) -> Any:
    """A distribution as DLIO's sleep spec: a number or a typed mapping (None = leave out)."""
    if d.type == "fixed":
        return d.value
    if d.type == "unknown":
        warnings.append(f"{what} is unknown: left out (DLIO's default is 0)")
        return None
    if d.type == "empirical":
        warnings.append(
            f"{what}: empirical distribution exported as normal(mean={d.mean:g}, stdev={d.stdev:g})"
        )
        return {"type": "normal", "mean": d.mean, "stdev": d.stdev or 0.0}
    if d.type not in ("uniform",) and (d.min is not None or d.max is not None):
        warnings.append(
            f"{what}: min/max bounds dropped (DLIO has none; it takes abs() of samples)"
        )
    keys = sorted(DLIO_DISTRIBUTION_KEYS[d.type] - {"type"})
    return {"type": d.type, **{k: getattr(d, k) for k in keys}}


def _export_model_info(model: WorkloadModel) -> dict[str, Any]:
    info, ck = model.model, model.checkpoint
    out: dict[str, Any] = {}
    for key in ("name", "type"):
        if getattr(info, key) is not None:
            out[key] = getattr(info, key)
    if info.model_size is not None:
        out["model_size_bytes"] = info.model_size
    elif not info.num_layers and ck.enabled and ck.bytes_per_checkpoint > 0:
        out["model_size_bytes"] = ck.bytes_per_checkpoint
    for key in ("num_layers", "model_datatype", "optimizer_datatype"):
        if getattr(info, key) is not None:
            out[key] = getattr(info, key)
    if info.parallelism is not None:
        out["parallelism"] = {k: v for k, v in vars(info.parallelism).items() if v is not None}
    if info.transformer is not None:
        out["transformer"] = {k: v for k, v in vars(info.transformer).items() if v is not None}
    return out


def _export_format(model: WorkloadModel, warnings: list[str]) -> str:
    ds = model.dataset
    if ds.format == "indexed_binary" and model.reader.memory_map:
        return "mmap_indexed_binary"
    if ds.format in ("tar", "arrow"):
        warnings.append(
            f"dataset.format {ds.format} exported as indexed_binary (DLIO has no shards streamed "
            "by an IterableDataset: it reads each sample by its offset, not each shard through)"
        )
        return "indexed_binary"
    if ds.format == "pt":
        warnings.append(
            "dataset.format pt exported as npz (DLIO has no torch.save archives: it reads each "
            "sample's file as a zip of arrays, with numpy's reads, not torch.load's)"
        )
        return "npz"
    if ds.format != "raw":
        return ds.format
    fmt = "npy" if ds.num_samples_per_file == 1 else "indexed_binary"
    warnings.append(f"dataset.format raw exported as {fmt} (DLIO has no headerless raw format)")
    return fmt


def _export_dataset(model: WorkloadModel, warnings: list[str]) -> dict[str, Any]:
    ds = model.dataset
    out: dict[str, Any] = {}
    if ds.data_folder is not None:
        out["data_folder"] = ds.data_folder
    out.update(
        format=_export_format(model, warnings),
        num_files_train=ds.num_files,
        num_files_eval=ds.num_files_eval,
        num_samples_per_file=ds.num_samples_per_file,
    )
    rec = ds.record_length
    mean = rec.value if rec.type == "fixed" else rec.mean
    if rec.type not in ("fixed", "normal"):
        warnings.append(
            f"dataset.record_length: {rec.type} exported as normal (DLIO generates normal record sizes)"
        )
    if mean is not None and not float(mean).is_integer():
        warnings.append(f"dataset.record_length mean {mean:g} rounded to whole bytes")
    out["record_length_bytes"] = round(mean or 0)
    if rec.type != "fixed" and rec.stdev:
        out["record_length_bytes_stdev"] = round(rec.stdev)
    if ds.record_length_resize is not None:
        out["record_length_bytes_resize"] = ds.record_length_resize
    out["num_subfolders_train"] = ds.num_subfolders
    _export_layout(model, out, warnings)
    return out


def _export_layout(model: WorkloadModel, out: dict[str, Any], warnings: list[str]) -> None:
    fmt, lay = model.dataset.format, model.dataset.layout
    if lay.compressed and fmt == "npz":
        out["compression"] = "zip"
    elif lay.hdf5_compression and fmt == "hdf5":
        if lay.hdf5_compression not in DLIO_COMPRESSIONS:
            warnings.append(
                f"dataset.layout.hdf5_compression {lay.hdf5_compression} has no DLIO name: left out"
            )
        else:
            out["compression"] = lay.hdf5_compression
    if lay.compression_level is not None:
        out["compression_level"] = lay.compression_level
    if lay.hdf5_chunk_bytes:
        out.update(enable_chunking=True, chunk_size=lay.hdf5_chunk_bytes)
    if lay.hdf5_chunk_shape:
        out["hdf5"] = {"chunk_dims": list(lay.hdf5_chunk_shape)}
    if lay.records_per_file is not None:
        warnings.append("dataset.layout.records_per_file has no DLIO key: left out")
    dims = generated_dims(fmt, model.dataset.num_samples_per_file, lay)
    if dims is not None:
        # the files DLIO's own generator writes: DLIO makes them from the record length (the
        # decoded sample's bytes; for images not their size on disk)
        out["record_length_bytes"] = dims[0] * dims[1]
        out.pop("record_length_bytes_stdev", None)
        return
    _export_structures(model, out, warnings)


#: numpy dtype strings -> DLIO record_element_type names.
_DLIO_ELEMENT_TYPES = {
    "|u1": "uint8",
    "|i1": "int8",
    "<u2": "uint16",
    "<i2": "int16",
    "<u4": "uint32",
    "<i4": "int32",
    "<u8": "uint64",
    "<i8": "int64",
    "<f2": "float16",
    "<f4": "float32",
    "<f8": "float64",
}


def _export_main_array(fmt: str, s: ArrayFile, main: ArrayMember, out: dict[str, Any]) -> list[str]:
    """The file's largest array as DLIO's record dims and element type; what else it shows, listed."""
    lost: list[str] = []
    dims = (
        list(main.shape[1:])
        if s.samples and main.shape and main.shape[0] == s.samples
        else list(main.shape)
    )
    if dims:
        out["record_dims"] = dims
    if main.dtype in _DLIO_ELEMENT_TYPES:
        out["record_element_type"] = _DLIO_ELEMENT_TYPES[main.dtype]
    else:
        lost.append(f"element type {main.dtype}")
    others = [m.name for m in s.members if m is not main]
    if others:
        lost.append(
            f"other arrays per file ({', '.join(others[:4])}{', ...' if len(others) > 4 else ''}; "
            f"DLIO writes one records array and labels)"
        )
    if main.chunk_order == "scattered":
        lost.append("chunks scattered in the file (DLIO writes them in order)")
    if main.shuffle or main.fletcher32 or main.scaleoffset is not None:
        lost.append("HDF5 shuffle/fletcher32/scale-offset filters")
    if fmt == "npz" and {m.storage for m in s.members} == {"stored", "deflated"}:
        lost.append("mixed stored/deflated NPZ members")
    return lost


def _export_arrays(fmt: str, arrays: list[ArrayFile], out: dict[str, Any]) -> list[str]:
    """The first array structure, as far as DLIO's keys reach; the rest listed."""
    s = arrays[0]
    main = max(s.members, key=lambda m: math.prod(m.shape or [0]), default=None)
    lost = _export_main_array(fmt, s, main, out) if main is not None else []
    if len(arrays) > 1:
        lost.append(f"{len(arrays)} file structures (DLIO's files are all alike)")
    return lost


def _hdf5_settings_set(h: Hdf5File | None) -> bool:
    """Whether the HDF5 file settings differ from h5py's defaults (DLIO writes those)."""
    return h is not None and bool(
        h.superblock_version
        or h.alignment_interval
        or h.file_space_strategy not in (None, "fsm_aggr")
        or h.userblock_size
        or h.meta_block_size
    )


def _image_lost(i: ImageFile) -> str:
    return (
        f"image {i.width}x{i.height} {i.mode}"
        + (f" quality {i.quality}" if i.quality else "")
        + (f" {i.subsampling}" if i.subsampling else "")
        + (" progressive" if i.progressive else "")
        + " (DLIO sizes images from record_length only)"
    )


def _export_structures(model: WorkloadModel, out: dict[str, Any], warnings: list[str]) -> None:
    """The fingerprinted layout, as far as DLIO's keys reach; the rest listed, once."""
    fmt, lay = model.dataset.format, model.dataset.layout
    lost: list[str] = []
    if lay.arrays:
        lost.extend(_export_arrays(fmt, lay.arrays, out))
    if _hdf5_settings_set(lay.hdf5):
        lost.append(
            "HDF5 file settings (libver, alignment, metadata block size, file-space strategy, user block)"
        )
    if lay.images:
        lost.append(_image_lost(lay.images[0]))
    if lay.tables:
        lost.append("table columns, codecs and row groups")
    if lay.record_bytes is not None:
        lost.append("TFRecord record size distribution (beyond record_length mean/stdev)")
    if lost:
        warnings.append(
            f"dataset.layout ({lay.source or 'given'}): DLIO cannot express: {'; '.join(lost)}"
        )


def _export_reader(model: WorkloadModel, warnings: list[str]) -> dict[str, Any]:
    rd = model.reader
    loader = rd.data_loader
    if loader == "native":
        loader = model.framework
        warnings.append(
            f"reader.data_loader native exported as {loader} (DLIO always uses a framework loader)"
        )
    if model.dataset.format == "tfrecord" and loader == "pytorch":
        warnings.append("DLIO has no PyTorch reader for tfrecord; it will refuse this config")
    prefetch = (
        rd.prefetch_factor * max(rd.read_threads, 1) if loader == "pytorch" else rd.prefetch_factor
    )
    k = model.dataset.files_per_sample
    if k > 1:
        warnings.append(
            f"dataset.files_per_sample={k} has no DLIO key: DLIO reads each file as a sample, so "
            f"batch_size is exported as {rd.batch_size} x {k} = {rd.batch_size * k}: the same files, "
            "bytes and steps (DLIO's samples/s counts files, and it spends reader.preprocess_time, "
            "a sample's, per file)"
        )
    out: dict[str, Any] = {
        "data_loader": loader,
        "batch_size": rd.batch_size * k,
        "batch_size_eval": rd.batch_size_eval,
        "read_threads": rd.read_threads,
        "computation_threads": rd.computation_threads,
        "prefetch_size": prefetch,
        "file_shuffle": rd.file_shuffle,
        "sample_shuffle": rd.sample_shuffle,
    }
    if rd.shuffle_size is not None:
        out["shuffle_size"] = rd.shuffle_size
    if rd.multiprocessing_context != "fork":
        out["multiprocessing_context"] = rd.multiprocessing_context
    if rd.direct_io == "on":
        out["odirect"] = True
        if model.dataset.format not in ("npy", "npz"):
            warnings.append(
                "DLIO's reader.odirect reads npy and npz only; it will refuse this config"
            )
    ts = rd.transfer_size
    if ts.is_known:
        size = ts.value if ts.type == "fixed" else ts.mean
        if ts.type != "fixed":
            warnings.append(
                f"reader.transfer_size: {ts.type} exported as its mean ({size:g} bytes)"
            )
        out["transfer_size"] = max(1, round(size or 0))
    if rd.preprocess_time != Distribution.fixed(0.0):
        spec = _dist_to_dlio(rd.preprocess_time, "reader.preprocess_time", warnings)
        if spec is not None:
            out["preprocess_time"] = spec
    return out


def _export_train(model: WorkloadModel, warnings: list[str]) -> dict[str, Any]:
    tr = model.train
    out: dict[str, Any] = {"epochs": tr.epochs}
    spec = _dist_to_dlio(tr.computation_time, "train.computation_time", warnings)
    if spec is not None:
        out["computation_time"] = spec
    if tr.total_training_steps is not None:
        out["total_training_steps"] = tr.total_training_steps
    if tr.timed_between_reads:
        warnings.append(
            "train.computation_time (and reader.preprocess_time) are the job's silences between "
            "its reads, its own collate and loop in them: DLIO adds its loader's to them "
            "(dlreplay's replay takes its own out)"
        )
    if tr.steps_per_epoch is not None:
        warnings.append(
            f"train.steps_per_epoch={tr.steps_per_epoch} has no DLIO key: DLIO derives steps from "
            f"files x samples / (batch_size x ranks)"
        )
    if model.reader.shuffle_seed is not None:
        out["seed"] = model.reader.shuffle_seed
    return out


def _export_evaluation(model: WorkloadModel, warnings: list[str]) -> dict[str, Any]:
    ev = model.train.evaluation
    assert ev is not None
    out: dict[str, Any] = {
        "epochs_between_evals": ev.every_n_epochs,
        "eval_after_epoch": ev.after_epoch,
    }
    spec = _dist_to_dlio(ev.computation_time, "train.evaluation.computation_time", warnings)
    if spec is not None:
        out["eval_time"] = spec
    if ev.steps is not None:
        warnings.append(
            "train.evaluation.steps has no DLIO key: DLIO evaluates all num_files_eval files"
        )
    return out


def _export_checkpoint(model: WorkloadModel, warnings: list[str]) -> dict[str, Any] | None:
    ck = model.checkpoint
    if not ck.enabled and ck == type(ck)():
        return None
    out: dict[str, Any] = {}
    if ck.checkpoint_folder is not None:
        out["checkpoint_folder"] = ck.checkpoint_folder
    out["checkpoint_after_epoch"] = ck.checkpoint_after_epoch
    for key in (
        "epochs_between_checkpoints",
        "steps_between_checkpoints",
        "time_between_checkpoints",
        "num_checkpoints_write",
        "num_checkpoints_read",
    ):
        if getattr(ck, key) is not None:
            out[key] = getattr(ck, key)
    out["fsync"] = ck.fsync
    if ck.enabled:
        _warn_checkpoint_size(model, warnings)
        if not model.model.num_layers:
            size = (
                model.model.model_size
                if model.model.model_size is not None
                else ck.bytes_per_checkpoint
            )
            warnings.append(
                f"checkpoint: written for DLIO releases after 2.0.0 (model.model_size_bytes); DLIO 2.0.0 "
                f"reads checkpoint.model_size and adds its default {sum(DLIO_2_0_LAYER_PARAMETERS)}-byte layer "
                f"file: for it, set checkpoint.model_size: {size} and checkpoint.num_layers: 0"
            )
    return out


def _warn_checkpoint_size(model: WorkloadModel, warnings: list[str]) -> None:
    ck, info = model.checkpoint, model.model
    estimate = dlio_checkpoint_estimate(info)
    if estimate is None:
        size = info.model_size if info.model_size is not None else ck.bytes_per_checkpoint
        estimate = (size, 1)
    if estimate != (ck.bytes_per_checkpoint, ck.files_per_checkpoint):
        warnings.append(
            f"checkpoint: DLIO will write about {estimate[0]} bytes in {estimate[1]} file(s) per "
            f"checkpoint; the model says {ck.bytes_per_checkpoint} bytes in "
            f"{ck.files_per_checkpoint} file(s)"
        )


def _spends(d: Distribution) -> bool:
    """Whether a time distribution is known and spends time (a mean above zero)."""
    return d.is_known and (d.mean or 0) > 0


def _io_inexpressible(model: WorkloadModel) -> list[str]:
    """How the reader, the checkpoint and the workers do their I/O, where DLIO has no key for it."""
    rd, ck, pr = model.reader, model.checkpoint, model.processes
    lost = []
    expected_kind = "process" if rd.data_loader == "pytorch" else "thread"
    if rd.worker_kind != expected_kind:
        lost.append(f"reader.worker_kind={rd.worker_kind}")
    if not rd.open_per_sample:
        lost.append("reader.open_per_sample=false")
    if rd.memory_map and model.dataset.format == "npy":
        lost.append(
            "reader.memory_map=true (the rows taken out of a mapped NPY file: DLIO reads each "
            "sample's file whole)"
        )
    if rd.row_group_reads and model.dataset.format == "parquet":
        lost.append(
            "reader.row_group_reads=true (a sample's row group read, the last one kept: DLIO "
            "reads each sample's whole file)"
        )
    if rd.file_buffering != "buffered":
        lost.append(f"reader.file_buffering={rd.file_buffering}")
    if rd.direct_io == "hybrid":
        lost.append(f"reader.direct_io=hybrid (threshold {rd.direct_io_threshold} bytes)")
    if rd.access_pattern != AccessPattern():
        lost.append("reader.access_pattern")
    if rd.metadata_per_sample != MetadataPerSample():
        lost.append("reader.metadata_per_sample")
    if ck.write_transfer_size.is_known:
        lost.append("checkpoint.write_transfer_size")
    if ck.read_at_start:
        lost.append("checkpoint.read_at_start=true")
    if ck.layout != "parts":
        lost.append(f"checkpoint.layout={ck.layout}")
    if ck.file_ranks is not None:
        lost.append("checkpoint.file_ranks")
    if pr.workers_per_rank != rd.read_threads:
        lost.append(f"processes.workers_per_rank={pr.workers_per_rank}")
    if model.dataset.scan_read_size:
        lost.append(
            f"dataset.scan_read_size (a pass over every file in {model.dataset.scan_read_size:,} B "
            "reads before the first epoch: DLIO reads no file before it)"
        )
    if model.dataset.side_files:
        lost.append(
            f"dataset.side_files ({len(model.dataset.side_files)}: DLIO reads only sample files)"
        )
    return lost


def _time_inexpressible(model: WorkloadModel) -> list[str]:
    """Where the job spends its time beyond DLIO's sleeps (warm-up, epoch ends, host CPU, ...)."""
    tr = model.train
    lost = []
    if tr.warmup_computation_time:
        lost.append("train.warmup_computation_time")
    if tr.epoch_warmup_computation_time:
        lost.append("train.epoch_warmup_computation_time")
    if _spends(tr.epoch_end_time):
        lost.append("train.epoch_end_time")
    if _spends(model.reader.preprocess_host_cpu):
        lost.append("reader.preprocess_host_cpu (DLIO's preprocessing is a sleep)")
    if _spends(tr.computation_host_cpu):
        lost.append("train.computation_host_cpu (DLIO's compute is a sleep)")
    if model.reader.batch_tensors != 1:
        lost.append(
            f"reader.batch_tensors={model.reader.batch_tensors} (DLIO's batch is one tensor)"
        )
    if _spends(model.checkpoint.serialization_time):
        lost.append("checkpoint.serialization_time")
    return lost


def _inexpressible(model: WorkloadModel) -> list[str]:
    """Model facts DLIO has no key for (they are lost on export)."""
    rd, pr = model.reader, model.processes
    lost = _io_inexpressible(model) + _time_inexpressible(model)
    if rd.data_loader == "pytorch":
        dlio_way = {
            "reader.persistent_workers": rd.persistent_workers or rd.read_threads == 0,
            "reader.pin_memory": rd.pin_memory,
            "reader.drop_last": rd.drop_last,
            "reader.sample_order": rd.sample_order == "dlio",
        }
        lost.extend(
            f"{k}={getattr(rd, k.split('.')[1])} (DLIO's PyTorch loader differs)"
            for k, same in dlio_way.items()
            if not same
        )
    par = model.model.parallelism
    implied = par.tensor * par.pipeline * (par.data or 1) if par else 1
    if pr.ranks != implied:
        lost.append(f"processes.ranks={pr.ranks} (run DLIO with mpirun -np {pr.ranks})")
    return [f"no DLIO key for: {', '.join(lost)}"] if lost else []


def model_to_dlio(model: WorkloadModel) -> tuple[dict[str, Any], list[str]]:
    """The DLIO workload config for *model* and the list of lossy steps taken."""
    warnings: list[str] = []
    cfg: dict[str, Any] = {}
    info = _export_model_info(model)
    if info:
        cfg["model"] = info
    cfg["framework"] = model.framework
    tr = model.train
    cfg["workflow"] = {
        "generate_data": False,
        "train": tr.enabled,
        "evaluation": tr.enabled and tr.evaluation is not None,
        "checkpoint": model.checkpoint.enabled,
    }
    if tr.enabled:
        cfg["dataset"] = _export_dataset(model, warnings)
        cfg["reader"] = _export_reader(model, warnings)
        cfg["train"] = _export_train(model, warnings)
        if tr.evaluation is not None:
            cfg["evaluation"] = _export_evaluation(model, warnings)
    else:
        warnings.append(
            "training is off: dataset, reader and train sections left out "
            "(DLIO reads no data in a checkpoint-only run)"
        )
        if tr.evaluation is not None:
            warnings.append("train.evaluation left out: DLIO evaluates only while training")
    ck = _export_checkpoint(model, warnings)
    if ck is not None:
        cfg["checkpoint"] = ck
    if (storage := export_storage(model.storage)) is not None:
        cfg["storage"] = storage
    warnings.extend(_inexpressible(model))
    problems = dlio_key_problems(cfg)
    if problems:  # a bug in this module, not in the model
        raise AssertionError(f"export produced keys DLIO does not read: {problems}")
    return cfg, warnings


def export_dlio(model: WorkloadModel, path: str | os.PathLike[str]) -> list[str]:
    """Write *model* as a DLIO workload YAML (atomically); returns the lossy steps taken."""
    cfg, warnings = model_to_dlio(model)
    source = (
        model.provenance.source_trace
        or model.provenance.source_config
        or "a dlreplay workload model"
    )
    header = [
        f"# DLIO workload exported by dlreplay {__version__} from {source}",
        "# units: bytes, seconds",
    ]
    header += [f"# lossy: {w}" for w in warnings]
    try:
        atomic_write_text(path, "\n".join(header) + "\n" + dump_yaml(cfg))
    except OSError as exc:
        raise ModelError(f"{path}: cannot write the DLIO config ({exc.strerror or exc})") from None
    return warnings
