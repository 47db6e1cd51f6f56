"""Import: a DLIO workload config into a workload model (see :mod:`dlreplay.dlio`)."""

from __future__ import annotations

import datetime as _dt
import math
import os
from collections.abc import Mapping
from typing import Any

from dlreplay import __version__
from dlreplay.dlio.checkpoint import (
    DLIO_2_0_LAYER_PARAMETERS,
    DLIO_VERSIONS,
    LATER_SIZING,
    dlio_2_0_checkpoint,
    dlio_checkpoint_estimate,
)
from dlreplay.dlio.generator import (
    IMAGE_PROBE_PIXELS,
    JPEG_MAX_SIDE,
    array_file_bytes,
    dlio_dimension,
    generated_layout,
    image_file_bytes,
)
from dlreplay.dlio.keys import (
    DLIO_COMPRESSIONS,
    DLIO_DATA_LOADERS,
    DLIO_DEFAULTS,
    DLIO_FORMATS,
    DLIO_FRAMEWORKS,
    DLIO_NESTED_KEYS,
    DLIO_SHUFFLES,
    IGNORED_SECTIONS,
    NO_DLIO_KEY,
)
from dlreplay.dlio.reading import Importer, dlio_distribution, parse_sections
from dlreplay.dlio.storage import import_storage
from dlreplay.errors import ModelError, clipped, shown
from dlreplay.model import (
    MP_CONTEXTS,
    Distribution,
    ModelInfo,
    Parallelism,
    Transformer,
    WorkloadModel,
    load_yaml_file,
    model_from_dict,
    to_plain,
)


def _file_size(record: Distribution, n: int) -> Distribution | None:
    """Bytes per file implied by *n* records of size *record* (format overhead ignored)."""
    if record.type == "fixed":
        return Distribution.fixed(record.value * n)  # type: ignore[operator]
    if record.type == "normal":
        return Distribution(type="normal", mean=record.mean * n, stdev=record.stdev * math.sqrt(n))  # type: ignore[operator]
    return None


def _import_model_info(imp: Importer) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("name", "type"):
        value, given = imp.get(f"model.{key}", "str")
        if given:
            out[key] = value
            imp.mark(f"model.{key}", f"model.{key}")
    size, size_key = imp.first(
        ("model.model_size_bytes", "model.model_size", "checkpoint.model_size"), "int>=0"
    )
    if size_key:
        out["model_size"] = size
        imp.mark("model.model_size", size_key)
    layers, given = imp.get("model.num_layers", "int")
    if given and layers > 0:
        out["num_layers"] = layers
        imp.mark("model.num_layers", "model.num_layers")
    for key in ("model_datatype", "optimizer_datatype"):
        value, src = imp.first((f"model.{key}", f"checkpoint.{key}"), "str")
        if src:
            out[key] = value
            imp.mark(f"model.{key}", src)
    for sub, names in (
        ("parallelism", ("tensor", "pipeline", "data", "zero_stage")),
        ("transformer", sorted(DLIO_NESTED_KEYS["model.transformer"])),
    ):
        part = {}
        for name in names:
            kind = "int" if name == "zero_stage" else "int>0"
            value, given = imp.get(f"model.{sub}.{name}", kind)
            if given:
                part[name] = value
        if part:
            out[sub] = part
            imp.mark(f"model.{sub}", f"model.{sub}")
    return out


def _dlio_2_0_size(imp: Importer, info: dict[str, Any]) -> tuple[int, int]:
    """:func:`dlio_2_0_checkpoint` of the config's ``checkpoint`` keys (DLIO 2.0.0's defaults
    for the rest); ``info``'s ``model_size`` becomes DLIO 2.0.0's."""
    size, size_given = imp.get("checkpoint.model_size", "int>=0", DLIO_DEFAULTS["model_size"])
    groups, _ = imp.get("checkpoint.optimization_groups", "ints>=0", [])
    layers, _ = imp.get("checkpoint.num_layers", "int>=0", 1)
    params, params_given = imp.get(
        "checkpoint.layer_parameters", "ints>=0", list(DLIO_2_0_LAYER_PARAMETERS)
    )
    tensor, _ = imp.get("checkpoint.tensor_parallelism", "int>0", 1)
    imp.get("checkpoint.pipeline_parallelism", "int>0")  # (which ranks write layers: rank 0 does)
    for later in LATER_SIZING:
        if imp.has(later):
            imp.notes.append(
                f"{later} is not read by DLIO 2.0.0 (its checkpoint sizing keys are in `checkpoint`)"
            )
    if info.get("model_size") != size:
        info["model_size"] = size
        imp.mark("model.model_size", "checkpoint.model_size" if size_given else None)
    nbytes, files = dlio_2_0_checkpoint(size, groups, layers, params, tensor)
    how = (
        "DLIO 2.0.0 checkpoint sizing: model_size, optimization_groups, num_layers x layer_parameters"
        + ("" if params_given else f" (default {list(DLIO_2_0_LAYER_PARAMETERS)})")
    )
    imp.mark("checkpoint.bytes_per_checkpoint", None, inferred=how)
    imp.mark("checkpoint.files_per_checkpoint", None, inferred=how)
    kind, _ = imp.get("checkpoint.type", "str", "rank_zero")
    if kind == "all_ranks":
        imp.notes.append(
            "checkpoint.type all_ranks: the checkpoint sizes are per rank (DLIO takes the ranks from mpirun)"
        )
    return nbytes, files


def _checkpoint_size(info: dict[str, Any], imp: Importer) -> tuple[int, int]:
    """Bytes and files per checkpoint, recorded in provenance."""
    if imp.dlio_version == "2.0.0" or (
        imp.dlio_version == "auto" and not any(imp.has(k) for k in LATER_SIZING)
    ):
        return _dlio_2_0_size(imp, info)
    model_info = ModelInfo(
        num_layers=info.get("num_layers"),
        model_size=info.get("model_size"),
        parallelism=Parallelism(**info["parallelism"]) if "parallelism" in info else None,
        transformer=Transformer(**info["transformer"]) if "transformer" in info else None,
    )
    estimate = dlio_checkpoint_estimate(model_info)
    if estimate is not None:
        how = "DLIO checkpoint sizing from model.num_layers/transformer/parallelism"
        imp.mark("checkpoint.bytes_per_checkpoint", None, inferred=how)
        imp.mark("checkpoint.files_per_checkpoint", None, inferred=how)
        return estimate
    if "model_size" in info:
        imp.mark(
            "checkpoint.bytes_per_checkpoint", None, inferred="model.model_size (DLIO model state)"
        )
        imp.mark(
            "checkpoint.files_per_checkpoint",
            None,
            inferred="DLIO writes one model-state file (rank 0)",
        )
        return info["model_size"], 1
    imp.mark("checkpoint.bytes_per_checkpoint", None)
    imp.mark("checkpoint.files_per_checkpoint", None)
    return DLIO_DEFAULTS["model_size"], 1


_FORMAT_MAP = {"hdf5_opt": "hdf5", "mmap_indexed_binary": "indexed_binary"}


def _import_format(imp: Importer) -> str:
    fmt, given = imp.get("dataset.format", "str", DLIO_DEFAULTS["format"])
    if fmt not in DLIO_FORMATS:
        raise imp.fail(
            "dataset.format", f"expected one of {', '.join(DLIO_FORMATS)}, got {shown(fmt)}"
        )
    if fmt == "synthetic":
        raise imp.fail(
            "dataset.format", "synthetic data has no files to replay; give the real format"
        )
    if fmt in _FORMAT_MAP:
        imp.notes.append(f"dataset.format {fmt} imported as {_FORMAT_MAP[fmt]}")
    imp.mark("dataset.format", "dataset.format" if given else None)
    return _FORMAT_MAP.get(fmt, fmt)


def _import_layout(imp: Importer, fmt: str) -> dict[str, Any]:
    layout: dict[str, Any] = {}
    comp, comp_given = imp.get("dataset.compression", "str", "none")
    if comp not in DLIO_COMPRESSIONS:
        raise imp.fail(
            "dataset.compression",
            f"expected one of {', '.join(DLIO_COMPRESSIONS)}, got {shown(comp)}",
        )
    if comp_given and comp != "none":
        if fmt == "npz":
            layout["compressed"] = True
        elif fmt == "hdf5":
            layout["hdf5_compression"] = comp
        else:
            imp.notes.append(f"dataset.compression {comp} ignored for format {fmt}")
    level, given = imp.get("dataset.compression_level", "int>=0")
    if given:
        layout["compression_level"] = level
    chunking, _ = imp.get("dataset.enable_chunking", "bool", False)
    chunk, given = imp.get("dataset.chunk_size", "int>=0")
    if chunking and given and chunk > 0:
        layout["hdf5_chunk_bytes"] = chunk
    dims, given = imp.get("dataset.hdf5.chunk_dims", "ints")
    if given:
        layout["hdf5_chunk_shape"] = dims
    if layout:
        layout["source"] = "dlio"
        imp.mark("dataset.layout", "dataset.compression/chunk_size/hdf5")
    return layout


def _import_dataset(imp: Importer) -> dict[str, Any]:
    fmt = _import_format(imp)
    out: dict[str, Any] = {"format": fmt}
    for path, key, kind in (
        ("num_files", "num_files_train", "int>0"),
        ("num_files_eval", "num_files_eval", "int>=0"),
        ("num_samples_per_file", "num_samples_per_file", "int>0"),
        ("num_subfolders", "num_subfolders_train", "int>=0"),
        ("data_folder", "data_folder", "str"),
    ):
        value, given = imp.get(f"dataset.{key}", kind, DLIO_DEFAULTS.get(key, 0))
        out[path] = value
        imp.mark(f"dataset.{path}", f"dataset.{key}" if given else None)
    length, length_key = imp.first(
        ("dataset.record_length_bytes", "dataset.record_length"),
        "num>=0",
        DLIO_DEFAULTS["record_length_bytes"],
    )
    stdev, stdev_key = imp.first(
        ("dataset.record_length_bytes_stdev", "dataset.record_length_stdev"), "num>=0", 0
    )
    record = (
        Distribution(type="normal", mean=length, stdev=stdev)
        if stdev > 0
        else Distribution.fixed(length)
    )
    out["record_length"] = record
    imp.mark("dataset.record_length", "/".join(k for k in (length_key, stdev_key) if k) or None)
    _check_file_bytes(imp, out["num_samples_per_file"], length, length_key)
    resize, resize_key = imp.first(
        ("dataset.record_length_bytes_resize", "dataset.record_length_resize"), "int>=0"
    )
    if resize_key and resize > 0:
        out["record_length_resize"] = resize
        imp.mark("dataset.record_length_resize", resize_key)
    size = _file_size(record, out["num_samples_per_file"])
    if size is not None:
        out["file_size"] = size
        imp.mark(
            "dataset.file_size",
            None,
            inferred="num_samples_per_file x record_length (format overhead ignored)",
        )
    layout = _import_layout(imp, fmt)
    if stdev == 0:
        _import_generated(
            imp, fmt, out, layout, length, resize if resize_key and resize > 0 else None
        )
    if fmt == "indexed_binary":  # DLIO's generator writes each file's record index beside it
        layout["index"] = "dlio"
    if layout:
        out["layout"] = layout
    return out


#: The most bytes a file can hold (the largest file offset, 8 EiB).
MAX_FILE_BYTES = 2**63 - 1


def _check_file_bytes(imp: Importer, spf: int, length: float, length_key: str | None) -> None:
    """Refuse a file no file system holds: *spf* samples of *length* bytes past
    :data:`MAX_FILE_BYTES` (integers: a count of thousands of digits overflows a float)."""
    if max(int(length), 1) * spf <= MAX_FILE_BYTES:  # a sample takes a byte at least
        return
    too_long = length > MAX_FILE_BYTES
    key = (
        (length_key or "dataset.record_length_bytes")
        if too_long
        else "dataset.num_samples_per_file"
    )
    bytes_ = f"{length:.3g}" if too_long else f"{length:,.0f}"
    raise imp.fail(
        key,
        f"num_samples_per_file x record length = {shown(spf)} x {bytes_} bytes: files larger "
        f"than any file can be (8 EiB); lower num_samples_per_file or the record length",
    )


def _import_generated(
    imp: Importer,
    fmt: str,
    out: dict[str, Any],
    layout: dict[str, Any],
    length: float,
    resize: int | None,
) -> None:
    """The files DLIO 2.0.0's generator writes (:mod:`dlreplay.dlio.generator`) into *layout* and the
    sizes in *out*: square uint8 samples of side ``int(sqrt(record_length))``; images are
    their encoded size on disk (``record_length`` is DLIO's decoded bytes); the sample a reader
    hands over is DLIO's ``resized_image`` unless the config resizes it."""
    side = dlio_dimension(length)
    if fmt == "jpeg" and side > JPEG_MAX_SIDE:
        raise imp.fail(
            "dataset.record_length_bytes",
            f"{length:,.0f} bytes: a JPEG of {side:,} x {side:,} pixels (DLIO's side, "
            f"int(sqrt(record_length))), more than JPEG allows ({JPEG_MAX_SIDE:,} a side); lower it",
        )
    chunking, _ = imp.get("dataset.enable_chunking", "bool", False)
    gen = generated_layout(
        fmt,
        out["num_samples_per_file"],
        (side, side),
        compression=str(imp.raw("dataset.compression")[0] or "none"),
        compression_level=layout.get("compression_level"),
        chunk_size=layout.get("hdf5_chunk_bytes") if chunking else None,
    )
    if gen is None:
        return
    how = f"DLIO 2.0.0's {fmt} generator: {side}x{side} uint8 samples (int(sqrt(record_length)))"
    plain = to_plain(gen)
    for key in ("arrays", "images"):
        if plain.get(key):
            layout[key] = plain[key]
    layout["source"] = "dlio"
    imp.mark("dataset.layout", None, inferred=how)
    if fmt in ("jpeg", "png"):
        encoded = image_file_bytes(fmt, (side, side))
        out["record_length"] = Distribution.fixed(encoded)
        out["file_size"] = Distribution.fixed(encoded)
        saved = (
            f"saved by Pillow: {encoded:,} B on disk"
            if side * side <= IMAGE_PROBE_PIXELS
            else f"~{encoded:,} B on disk (estimated from a smaller image's bytes per pixel)"
        )
        imp.mark(
            "dataset.record_length",
            None,
            inferred=f"{how}, {saved} (DLIO's record_length {int(length):,} B is the decoded image)",
        )
        imp.mark("dataset.file_size", None, inferred="the encoded image")
    else:
        nbytes = array_file_bytes(fmt, out["num_samples_per_file"], (side, side))
        if (
            nbytes is not None
            and not layout.get("compressed")
            and not layout.get("hdf5_compression")
        ):
            out["file_size"] = Distribution.fixed(nbytes)
            imp.mark("dataset.file_size", None, inferred=f"{how}: the file DLIO writes")
    if resize is None:
        out["record_length_resize"] = side * side
        imp.mark(
            "dataset.record_length_resize",
            None,
            inferred="DLIO's readers hand over resized_image, max_dimension^2 bytes (no record_length_resize)",
        )


def _import_shuffle(imp: Importer, key: str) -> str:
    value, present = imp.raw(key)
    if not present or value is None or value is False:
        imp.mark(key, key if present else None)
        return "off"
    if value not in DLIO_SHUFFLES:
        raise imp.fail(key, f"expected one of {', '.join(DLIO_SHUFFLES)}, got {shown(value)}")
    imp.mark(key, key)
    return value


def _import_reader(imp: Importer, framework: str) -> dict[str, Any]:
    """The ``reader`` section: loader, threads, order, I/O, and what DLIO's PyTorch loader fixes."""
    out = _import_data_loader(imp, framework)
    out.update(_import_reader_threads(imp, out["data_loader"]))
    out.update(_import_reader_order(imp))
    out.update(_import_reader_io(imp))
    if out["data_loader"] == "pytorch":
        out.update(_dlio_torch_loader(imp, out["read_threads"], out["file_shuffle"]))
    return out


def _import_data_loader(imp: Importer, framework: str) -> dict[str, Any]:
    """``memory_map`` (the mmap reader's format), ``data_loader`` and its ``worker_kind``."""
    out: dict[str, Any] = {}
    if imp.raw("dataset.format")[0] == "mmap_indexed_binary":  # its reader maps the files
        out["memory_map"] = True
        imp.mark("reader.memory_map", "dataset.format")
    loader, given = imp.get("reader.data_loader", "str", framework)
    if loader not in DLIO_DATA_LOADERS:
        raise imp.fail(
            "reader.data_loader",
            f"expected one of {', '.join(DLIO_DATA_LOADERS)}, got {shown(loader)}",
        )
    if loader == "native_dali":
        imp.notes.append("reader.data_loader native_dali imported as dali")
        loader = "dali"
    out["data_loader"] = loader
    imp.mark("reader.data_loader", "reader.data_loader" if given else None)
    out["worker_kind"] = "process" if loader == "pytorch" else "thread"
    imp.mark(
        "reader.worker_kind",
        None,
        inferred=f"DLIO's {loader} loader uses {out['worker_kind']} workers",
    )
    return out


def _import_reader_threads(imp: Importer, loader: str) -> dict[str, Any]:
    """Batch sizes, thread counts and the prefetch factor."""
    out: dict[str, Any] = {}
    for key, kind in (
        ("batch_size", "int>0"),
        ("batch_size_eval", "int>0"),
        ("read_threads", "int>=0"),
        ("computation_threads", "int>0"),
    ):
        out[key], given = imp.get(f"reader.{key}", kind, DLIO_DEFAULTS[key])
        imp.mark(f"reader.{key}", f"reader.{key}" if given else None)
    prefetch, given = imp.get("reader.prefetch_size", "int>=0", DLIO_DEFAULTS["prefetch_size"])
    out["prefetch_factor"] = _prefetch_factor(prefetch, out["read_threads"], loader)
    imp.mark(
        "reader.prefetch_factor",
        None,
        inferred=f"from DLIO reader.prefetch_size={prefetch}"
        + ("" if given else " (DLIO default)"),
    )
    return out


def _import_reader_order(imp: Importer) -> dict[str, Any]:
    """File and sample shuffles, their seed and the shuffle buffer."""
    out: dict[str, Any] = {}
    for key in ("file_shuffle", "sample_shuffle"):
        out[key] = _import_shuffle(imp, f"reader.{key}")
    out["shuffle_seed"], given = imp.get("train.seed", "int", DLIO_DEFAULTS["seed"])
    imp.mark("reader.shuffle_seed", "train.seed" if given else None)
    size, given = imp.get("reader.shuffle_size", "int>0")
    if given:
        out["shuffle_size"] = size
        imp.mark("reader.shuffle_size", "reader.shuffle_size")
    return out


def _import_reader_io(imp: Importer) -> dict[str, Any]:
    """Transfer size, preprocessing time and the workers' multiprocessing context."""
    out: dict[str, Any] = {}
    transfer, given = imp.get("reader.transfer_size", "int>0")
    if given:
        out["transfer_size"] = Distribution.fixed(transfer)
        imp.mark("reader.transfer_size", "reader.transfer_size")
    out["preprocess_time"], given = dlio_distribution(
        imp, "reader.preprocess_time", "reader.preprocess_time_stdev", 0.0
    )
    imp.mark("reader.preprocess_time", "reader.preprocess_time" if given else None)
    ctx, given = imp.get("reader.multiprocessing_context", "str", "fork")
    if ctx not in MP_CONTEXTS:
        raise imp.fail(
            "reader.multiprocessing_context",
            f"expected one of {', '.join(MP_CONTEXTS)}, got {shown(ctx)}",
        )
    out["multiprocessing_context"] = ctx
    imp.mark("reader.multiprocessing_context", "reader.multiprocessing_context" if given else None)
    odirect, given = imp.get("reader.odirect", "bool", False)
    out["direct_io"] = "on" if odirect else "off"
    imp.mark("reader.direct_io", "reader.odirect" if given else None)
    return out


def _dlio_torch_loader(imp: Importer, read_threads: int, file_shuffle: str) -> dict[str, Any]:
    """What DLIO 2.0's TorchDataLoader fixes: DataLoader(persistent_workers=True,
    pin_memory=True, drop_last=True, sampler=dlio_sampler); replayed the same way unless
    overridden (--set)."""
    out = {
        "persistent_workers": read_threads > 0,
        "pin_memory": True,
        "drop_last": True,
        "sample_order": "dlio",
    }
    for path in ("persistent_workers", "pin_memory", "drop_last"):
        imp.mark(f"reader.{path}", None, inferred=f"DLIO's PyTorch loader sets {path}=True")
    imp.mark(
        "reader.sample_order",
        None,
        inferred="DLIO's PyTorch sampler (contiguous samples per rank, "
        "seeded shuffle re-applied every epoch, file_shuffle without effect)",
    )
    if file_shuffle != "off":
        imp.notes.append(
            f"reader.file_shuffle={file_shuffle} has no effect on DLIO's PyTorch loader "
            "(its index sampler orders samples); replayed the same way (reader.sample_order=dlio)"
        )
    return out


def _prefetch_factor(prefetch_size: int, read_threads: int, loader: str) -> int:
    """PyTorch prefetch_factor as DLIO derives it from prefetch_size (0 means 2)."""
    if loader != "pytorch":
        return prefetch_size
    factor = math.ceil(prefetch_size / read_threads) if read_threads >= 1 else prefetch_size
    return factor if factor > 0 else 2


def _import_train(imp: Importer) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["enabled"], given = imp.get("workflow.train", "bool", True)
    imp.mark("train.enabled", "workflow.train" if given else None)
    out["epochs"], given = imp.get("train.epochs", "int>0", DLIO_DEFAULTS["epochs"])
    imp.mark("train.epochs", "train.epochs" if given else None)
    steps, given = imp.get("train.total_training_steps", "int")
    if given and steps > 0:
        out["total_training_steps"] = steps
        imp.mark("train.total_training_steps", "train.total_training_steps")
    out["computation_time"], given = dlio_distribution(
        imp, "train.computation_time", "train.computation_time_stdev", 0.0
    )
    imp.mark("train.computation_time", "train.computation_time" if given else None)
    out["au_first_steps"] = "epoch"
    imp.mark(
        "train.au_first_steps", None, inferred="DLIO leaves every epoch's first step out of AU"
    )
    evaluate, _ = imp.get("workflow.evaluation", "bool", False)
    if evaluate:
        out["evaluation"] = _import_evaluation(imp)
        imp.mark("train.evaluation", "workflow.evaluation/evaluation")
    elif imp.sections.get("evaluation"):
        imp.notes.append("evaluation section ignored: workflow.evaluation is not true")
    return out


def _import_evaluation(imp: Importer) -> dict[str, Any]:
    every, _ = imp.get(
        "evaluation.epochs_between_evals", "int>0", DLIO_DEFAULTS["epochs_between_evals"]
    )
    after, _ = imp.get("evaluation.eval_after_epoch", "int>=0", DLIO_DEFAULTS["eval_after_epoch"])
    compute, _ = dlio_distribution(imp, "evaluation.eval_time", "evaluation.eval_time_stdev", 0.0)
    return {"every_n_epochs": every, "after_epoch": after, "computation_time": compute}


def _import_checkpoint(imp: Importer, info: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["enabled"], given = imp.get("workflow.checkpoint", "bool", False)
    imp.mark("checkpoint.enabled", "workflow.checkpoint" if given else None)
    for key, kind in (("checkpoint_folder", "str"), ("checkpoint_after_epoch", "int>=0")):
        value, given = imp.get(f"checkpoint.{key}", kind, DLIO_DEFAULTS[key])
        if given or out["enabled"]:  # DLIO's defaults matter only when checkpointing
            out[key] = value
            imp.mark(f"checkpoint.{key}", f"checkpoint.{key}" if given else None)
    steps, _ = imp.get("checkpoint.steps_between_checkpoints", "int", -1)
    seconds, _ = imp.get("checkpoint.time_between_checkpoints", "num", -1.0)
    epochs, epochs_given = imp.get("checkpoint.epochs_between_checkpoints", "int>0")
    if steps > 0:
        out["steps_between_checkpoints"] = steps
        imp.mark("checkpoint.steps_between_checkpoints", "checkpoint.steps_between_checkpoints")
    elif seconds > 0:
        out["time_between_checkpoints"] = seconds
        imp.mark("checkpoint.time_between_checkpoints", "checkpoint.time_between_checkpoints")
    elif epochs_given or out["enabled"]:
        out["epochs_between_checkpoints"] = (
            epochs if epochs_given else DLIO_DEFAULTS["epochs_between_checkpoints"]
        )
        imp.mark(
            "checkpoint.epochs_between_checkpoints",
            "checkpoint.epochs_between_checkpoints" if epochs_given else None,
        )
    if sum(1 for v in (steps > 0, seconds > 0, epochs_given) if v) > 1:
        imp.notes.append("several checkpoint intervals given; kept steps, else time, else epochs")
    for key in ("num_checkpoints_write", "num_checkpoints_read"):
        value, given = imp.get(f"checkpoint.{key}", "int")
        if given and value >= (1 if key.endswith("write") else 0):
            out[key] = value
            imp.mark(f"checkpoint.{key}", f"checkpoint.{key}")
    out["fsync"], given = imp.get("checkpoint.fsync", "bool", False)
    imp.mark("checkpoint.fsync", "checkpoint.fsync" if given else None)
    if out["enabled"] or imp.sections.get("checkpoint") or "model_size" in info:
        out["bytes_per_checkpoint"], out["files_per_checkpoint"] = _checkpoint_size(info, imp)
    return out


def _import_processes(imp: Importer, info: dict[str, Any], read_threads: int) -> dict[str, Any]:
    out: dict[str, Any] = {"workers_per_rank": read_threads}
    imp.mark("processes.workers_per_rank", None, inferred="reader.read_threads")
    par = info.get("parallelism")
    if par:
        out["ranks"] = par.get("tensor", 1) * par.get("pipeline", 1) * par.get("data", 1)
        imp.mark("processes.ranks", None, inferred="model.parallelism tensor x pipeline x data")
    return out


def _note_unused(imp: Importer) -> None:
    unused = []
    for name, section in imp.sections.items():
        if name == "framework":
            continue
        if name in IGNORED_SECTIONS or not isinstance(section, Mapping):
            unused.append(name)
            continue
        for key, value in section.items():
            dotted = f"{name}.{key}"
            if dotted in imp.used:
                continue
            if isinstance(value, Mapping) and any(u.startswith(dotted + ".") for u in imp.used):
                continue
            unused.append(dotted)
    if unused:
        imp.notes.append(
            "DLIO keys without effect on the model: "
            + ", ".join(clipped(k) for k in sorted(unused))
        )


def dlio_to_model(config: Any, source: str = "<dict>", dlio_version: str = "auto") -> WorkloadModel:
    """Build a workload model from a parsed DLIO workload config (see the module docs);
    ``dlio_version`` (:data:`DLIO_VERSIONS`): whose checkpoint sizing to follow."""
    if dlio_version not in DLIO_VERSIONS:
        raise ModelError(
            f"unknown DLIO version {dlio_version!r}: expected one of {', '.join(DLIO_VERSIONS)}"
        )
    imp = Importer(source, parse_sections(config, source), dlio_version=dlio_version)
    framework, given = imp.get("framework", "str", DLIO_DEFAULTS["framework"])
    if framework not in DLIO_FRAMEWORKS:
        raise imp.fail(
            "framework", f"expected one of {', '.join(DLIO_FRAMEWORKS)}, got {shown(framework)}"
        )
    imp.mark("framework", "framework" if given else None)
    info = _import_model_info(imp)
    reader = _import_reader(imp, framework)
    model = {
        "model": info,
        "framework": framework,
        "dataset": _import_dataset(imp),
        "reader": reader,
        "train": _import_train(imp),
        "checkpoint": _import_checkpoint(imp, info),
        "processes": _import_processes(imp, info, reader["read_threads"]),
    }
    if (storage := import_storage(imp)) is not None:
        model["storage"] = storage
    imp.get("workflow.generate_data", "bool")
    _note_unused(imp)
    for path in NO_DLIO_KEY:
        imp.prov.setdefault(
            path, {"method": "no DLIO key; dlreplay default", "confidence": "default"}
        )
    model["provenance"] = {
        "source_config": source,
        "dlreplay_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "fields": imp.prov,
        "notes": [f"imported from DLIO config {source}", *imp.notes],
    }
    plain = {"schema": "dlreplay.workload", "format_version": 1, **_plain(model)}
    return model_from_dict(
        plain, source=source, default_method="not in the DLIO config; dlreplay default"
    )


def _plain(obj: Any) -> Any:
    if isinstance(obj, Distribution):
        return {k: v for k, v in vars(obj).items() if v is not None}
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def import_dlio(path: str | os.PathLike[str], dlio_version: str = "auto") -> WorkloadModel:
    """Read a DLIO workload YAML file into a workload model (``dlio_version``: see
    :data:`DLIO_VERSIONS`). Errors name the file and key."""
    return dlio_to_model(load_yaml_file(path), source=str(path), dlio_version=dlio_version)
