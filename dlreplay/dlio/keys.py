"""DLIO's vocabulary: the sections and keys its ``LoadConfig`` reads, the values it accepts,
its defaults, and a check of a config against them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dlreplay.errors import shown

# --------------------------------------------------------------------------- DLIO vocabulary

DLIO_FRAMEWORKS = ("pytorch", "tensorflow")
DLIO_FORMATS = (
    "tfrecord",
    "hdf5",
    "csv",
    "npz",
    "npy",
    "hdf5_opt",
    "jpeg",
    "png",
    "indexed_binary",
    "mmap_indexed_binary",
    "synthetic",
    "parquet",
)
DLIO_DATA_LOADERS = ("tensorflow", "pytorch", "dali", "native_dali")
DLIO_SHUFFLES = ("off", "seed", "random")
DLIO_COMPRESSIONS = ("none", "gzip", "lzf", "bz2", "zip", "xz")

#: Keys DLIO's ``LoadConfig`` reads, per section: export writes nothing else.
#: ``framework`` is a scalar section (one of :data:`DLIO_FRAMEWORKS`).
DLIO_ALLOWED_KEYS: dict[str, frozenset[str]] = {
    "model": frozenset(
        {
            "name",
            "type",
            "model_size_bytes",
            "optimization_groups",
            "num_layers",
            "layer_parameters",
            "model_datatype",
            "optimizer_datatype",
            "parallelism",
            "transformer",
        }
    ),
    "framework": frozenset(),
    "workflow": frozenset({"generate_data", "train", "evaluation", "checkpoint", "profiling"}),
    "dataset": frozenset(
        {
            "record_length_bytes",
            "record_length_bytes_stdev",
            "record_length_bytes_resize",
            "num_files_train",
            "num_files_eval",
            "generation_buffer_size",
            "num_samples_per_file",
            "data_folder",
            "num_subfolders_train",
            "num_subfolders_eval",
            "enable_chunking",
            "chunk_size",
            "compression",
            "compression_level",
            "file_prefix",
            "format",
            "keep_files",
            "record_element_bytes",
            "record_element_type",
            "record_dims",
            "hdf5",
        }
    ),
    "reader": frozenset(
        {
            "dont_use_mmap",
            "reader_classname",
            "multiprocessing_context",
            "data_loader",
            "data_loader_classname",
            "data_loader_sampler",
            "read_threads",
            "computation_threads",
            "batch_size",
            "batch_size_eval",
            "prefetch_size",
            "file_shuffle",
            "file_access",
            "shuffle_size",
            "sample_shuffle",
            "read_type",
            "transfer_size",
            "odirect",
            "preprocess_time",
            "preprocess_time_stdev",
            "pin_memory",
            "transformed_record_dims",
            "transformed_record_element_type",
        }
    ),
    "train": frozenset(
        {
            "epochs",
            "total_training_steps",
            "seed_change_epoch",
            "computation_time",
            "computation_time_stdev",
            "seed",
        }
    ),
    "evaluation": frozenset(
        {"eval_time", "eval_time_stdev", "eval_after_epoch", "epochs_between_evals"}
    ),
    "checkpoint": frozenset(
        {
            "checkpoint_folder",
            "checkpoint_after_epoch",
            "epochs_between_checkpoints",
            "steps_between_checkpoints",
            "type",
            "checkpoint_mechanism_classname",
            "fsync",
            "time_between_checkpoints",
            "num_checkpoints_write",
            "num_checkpoints_read",
            "recovery_rank_shift",
            "rank_sync",
            "mode",
            "randomize_tensor",
            "ksm",
        }
    ),
    "output": frozenset({"folder", "log_file", "metric"}),
    "profiling": frozenset({"profiler", "iostat_devices"}),
    "metric": frozenset({"au"}),
    "storage": frozenset({"storage_type", "storage_root", "storage_options"}),
}
#: Keys of nested mappings DLIO reads.
DLIO_NESTED_KEYS: dict[str, frozenset[str]] = {
    "model.parallelism": frozenset({"tensor", "pipeline", "data", "zero_stage"}),
    "model.transformer": frozenset(
        {"vocab_size", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads"}
    ),
    "dataset.hdf5": frozenset({"chunk_dims", "num_dset_per_record", "max_shape"}),
}
#: Fields DLIO samples with ``sleep()``: a number (seconds) or a mapping below.
DLIO_DISTRIBUTION_FIELDS = frozenset(
    {"train.computation_time", "reader.preprocess_time", "evaluation.eval_time"}
)
#: Distribution types DLIO's ``sleep()`` understands and the keys each reads.
DLIO_DISTRIBUTION_KEYS: dict[str, frozenset[str]] = {
    "normal": frozenset({"type", "mean", "stdev"}),
    "uniform": frozenset({"type", "min", "max"}),
    "gamma": frozenset({"type", "shape", "scale"}),
    "exponential": frozenset({"type", "scale"}),
    "poisson": frozenset({"type", "lam"}),
}
#: Values DLIO accepts for enumerated keys.
DLIO_ENUM_VALUES: dict[str, tuple[str, ...]] = {
    "framework": DLIO_FRAMEWORKS,
    "dataset.format": DLIO_FORMATS,
    "dataset.compression": DLIO_COMPRESSIONS,
    "reader.data_loader": DLIO_DATA_LOADERS,
    "reader.file_shuffle": DLIO_SHUFFLES,
    "reader.sample_shuffle": DLIO_SHUFFLES,
}
#: Older spellings import also reads (section, key) -> current key.
_LEGACY_KEYS = {
    ("dataset", "record_length"): "record_length_bytes",
    ("dataset", "record_length_stdev"): "record_length_bytes_stdev",
    ("dataset", "record_length_resize"): "record_length_bytes_resize",
    ("model", "model_size"): "model_size_bytes",
    ("checkpoint", "model_size"): "model.model_size_bytes",
    ("checkpoint", "model_datatype"): "model.model_datatype",
    ("checkpoint", "optimizer_datatype"): "model.optimizer_datatype",
}
# DLIO's defaults (dlio_benchmark/utils/config.py, ConfigArguments).
DLIO_DEFAULTS: dict[str, Any] = {
    "framework": "tensorflow",
    "format": "tfrecord",
    "num_files_train": 8,
    "num_files_eval": 0,
    "num_samples_per_file": 1,
    "record_length_bytes": 65536,
    "data_folder": "./data/",
    "batch_size": 1,
    "batch_size_eval": 1,
    "read_threads": 1,
    "computation_threads": 1,
    "prefetch_size": 2,
    "seed": 123,
    "epochs": 1,
    "checkpoint_folder": "./checkpoints/",
    "checkpoint_after_epoch": 1,
    "epochs_between_checkpoints": 1,
    "model_size": 10240,
    "eval_after_epoch": 1,
    "epochs_between_evals": 1,
}
IGNORED_SECTIONS = ("output", "profiling", "metric")
#: Model fields DLIO has no key for (import leaves them at dlreplay's defaults).
NO_DLIO_KEY = (
    "reader.open_per_sample",
    "reader.file_buffering",
    "reader.direct_io_threshold",
    "reader.access_pattern",
    "reader.metadata_per_sample",
    "train.steps_per_epoch",
    "checkpoint.write_transfer_size",
    "checkpoint.read_at_start",
    "dataset.layout.records_per_file",
)


def dlio_key_problems(config: Mapping[str, Any]) -> list[str]:
    """Keys or values of a DLIO config that DLIO does not read (empty: all accepted)."""
    problems: list[str] = []
    for section, body in config.items():
        if section not in DLIO_ALLOWED_KEYS:
            problems.append(f"{section}: not a DLIO section")
        elif section == "framework":
            if body not in DLIO_FRAMEWORKS:
                problems.append(f"framework: {shown(body)} not one of {DLIO_FRAMEWORKS}")
        elif not isinstance(body, Mapping):
            problems.append(f"{section}: expected a mapping")
        else:
            problems.extend(_section_problems(section, body, DLIO_ALLOWED_KEYS[section]))
    return problems


def _section_problems(prefix: str, body: Mapping[str, Any], allowed: frozenset[str]) -> list[str]:
    problems = []
    for key, value in body.items():
        dotted = f"{prefix}.{key}"
        if key not in allowed:
            problems.append(f"{dotted}: not a key DLIO reads")
        elif dotted in DLIO_NESTED_KEYS:
            if not isinstance(value, Mapping):
                problems.append(f"{dotted}: expected a mapping")
            else:
                problems.extend(_section_problems(dotted, value, DLIO_NESTED_KEYS[dotted]))
        elif dotted in DLIO_DISTRIBUTION_FIELDS and isinstance(value, Mapping):
            kind = value.get("type")
            if kind not in DLIO_DISTRIBUTION_KEYS:
                problems.append(
                    f"{dotted}.type: {shown(kind)} not one of {sorted(DLIO_DISTRIBUTION_KEYS)}"
                )
            elif set(value) != DLIO_DISTRIBUTION_KEYS[kind]:
                problems.append(
                    f"{dotted}: keys {sorted(value)} != {sorted(DLIO_DISTRIBUTION_KEYS[kind])}"
                )
        elif dotted in DLIO_ENUM_VALUES and value not in DLIO_ENUM_VALUES[dotted]:
            problems.append(f"{dotted}: {shown(value)} not one of {DLIO_ENUM_VALUES[dotted]}")
    return problems
