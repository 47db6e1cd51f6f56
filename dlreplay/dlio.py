"""DLIO interoperability: import DLIO workload YAML into a workload model, export it back.

`DLIO <https://github.com/argonne-lcf/dlio_benchmark>`_ describes a workload with
the sections ``model``, ``framework``, ``workflow``, ``dataset``, ``reader``,
``train``, ``evaluation``, ``checkpoint`` (plus ``output``, ``profiling``, ...).
A section may also be a YAML block string (``reader: |`` followed by
``key: value`` lines); it is parsed as a mapping.

Import (:func:`import_dlio`) reads every key DLIO reads for these sections,
including older spellings (``record_length`` for ``record_length_bytes``,
``model.model_size`` / ``checkpoint.model_size`` for ``model.model_size_bytes``,
``computation_time_stdev``), fills what the file leaves out with *DLIO's*
defaults, and records provenance: ``measured`` for values taken from the file,
``inferred`` for values derived from them, ``default`` for the rest. Keys that do
not shape I/O (``output``, ``profiling``, ``file_prefix``, ...) are listed in
``provenance.notes``.

Export (:func:`export_dlio`) writes only keys in :data:`DLIO_ALLOWED_KEYS` (what
DLIO's ``LoadConfig`` reads) and only the distribution types DLIO's ``sleep``
understands (:data:`DLIO_DISTRIBUTION_KEYS`). Lossy steps are returned as
warnings and written as comments at the top of the file:

* ``empirical`` distributions become ``normal`` with the same mean and stdev;
  ``min``/``max`` bounds are dropped (DLIO takes ``abs()`` of samples instead);
* ``raw`` datasets (headerless binary files) become ``npy`` when a file holds
  one sample (DLIO's NPY reader reads the whole file, as a raw reader would, plus
  a <= 128-byte header) and ``indexed_binary`` when it holds several (records
  read one by one at their offsets, plus DLIO's index file);
* fields DLIO has no key for (worker kind, kept-open files, access pattern,
  metadata calls, checkpoint write sizes, ranks, ...) are named in a warning;
* ``fixed`` distributions are written as plain numbers (DLIO has no ``fixed``
  type: a mapping without ``type`` is read as a mean).

Mappings between the two vocabularies:

* PyTorch's ``prefetch_factor`` (batches per worker) = ``ceil(prefetch_size /
  read_threads)``, as DLIO computes it (``prefetch_size`` 0 means 2); the
  TensorFlow/DALI loaders use ``prefetch_size`` as is;
* ``train.seed`` is the model's ``reader.shuffle_seed``;
* checkpoint bytes and files per checkpoint follow DLIO's checkpoint sizing, of the
  release the config is for (:data:`DLIO_VERSIONS`; ``import-dlio --dlio-version``):
  DLIO 2.0.0 sizes it in ``checkpoint`` (``model_size``, ``optimization_groups``,
  ``num_layers`` x ``layer_parameters``, whose defaults add a 24.8 MB layer file to
  every checkpoint: :func:`dlio_2_0_checkpoint`); later releases in ``model``:
  ``model_size_bytes`` (one file from rank 0), or for transformer models
  (``model.num_layers`` set) DLIO's parameter count with fp16 layer states and
  three fp32 optimizer tensors per parameter (:func:`dlio_checkpoint_estimate`);
* ranks are ``tensor x pipeline x data`` parallelism when the model gives them
  (DLIO itself takes the process count from ``mpirun``).
"""

from __future__ import annotations

import datetime as _dt
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from dlreplay import __version__
from dlreplay.errors import ModelError
from dlreplay.model import (
    MP_CONTEXTS,
    AccessPattern,
    Distribution,
    MetadataPerSample,
    ModelInfo,
    Parallelism,
    Transformer,
    WorkloadModel,
    as_int,
    atomic_write_text,
    dump_yaml,
    load_yaml_file,
    model_from_dict,
)

__all__ = [
    "DLIO_ALLOWED_KEYS",
    "DLIO_COMPRESSIONS",
    "DLIO_DATA_LOADERS",
    "DLIO_DISTRIBUTION_FIELDS",
    "DLIO_DISTRIBUTION_KEYS",
    "DLIO_ENUM_VALUES",
    "DLIO_FORMATS",
    "DLIO_FRAMEWORKS",
    "DLIO_NESTED_KEYS",
    "DLIO_SHUFFLES",
    "dlio_checkpoint_estimate",
    "dlio_key_problems",
    "dlio_to_model",
    "export_dlio",
    "import_dlio",
    "model_to_dlio",
]

# --------------------------------------------------------------------------- DLIO vocabulary

DLIO_FRAMEWORKS = ("pytorch", "tensorflow")
DLIO_FORMATS = ("tfrecord", "hdf5", "csv", "npz", "npy", "hdf5_opt", "jpeg", "png", "indexed_binary",
                "mmap_indexed_binary", "synthetic", "parquet")
DLIO_DATA_LOADERS = ("tensorflow", "pytorch", "dali", "native_dali")
DLIO_SHUFFLES = ("off", "seed", "random")
DLIO_COMPRESSIONS = ("none", "gzip", "lzf", "bz2", "zip", "xz")

#: Keys DLIO's ``LoadConfig`` reads, per section: export writes nothing else.
#: ``framework`` is a scalar section (one of :data:`DLIO_FRAMEWORKS`).
DLIO_ALLOWED_KEYS: dict[str, frozenset[str]] = {
    "model": frozenset({"name", "type", "model_size_bytes", "optimization_groups", "num_layers",
                        "layer_parameters", "model_datatype", "optimizer_datatype", "parallelism",
                        "transformer"}),
    "framework": frozenset(),
    "workflow": frozenset({"generate_data", "train", "evaluation", "checkpoint", "profiling"}),
    "dataset": frozenset({"record_length_bytes", "record_length_bytes_stdev", "record_length_bytes_resize",
                          "num_files_train", "num_files_eval", "generation_buffer_size",
                          "num_samples_per_file", "data_folder", "num_subfolders_train",
                          "num_subfolders_eval", "enable_chunking", "chunk_size", "compression",
                          "compression_level", "file_prefix", "format", "keep_files",
                          "record_element_bytes", "record_element_type", "record_dims", "hdf5"}),
    "reader": frozenset({"dont_use_mmap", "reader_classname", "multiprocessing_context", "data_loader",
                         "data_loader_classname", "data_loader_sampler", "read_threads",
                         "computation_threads", "batch_size", "batch_size_eval", "prefetch_size",
                         "file_shuffle", "file_access", "shuffle_size", "sample_shuffle", "read_type",
                         "transfer_size", "odirect", "preprocess_time", "preprocess_time_stdev",
                         "pin_memory", "transformed_record_dims", "transformed_record_element_type"}),
    "train": frozenset({"epochs", "total_training_steps", "seed_change_epoch", "computation_time",
                        "computation_time_stdev", "seed"}),
    "evaluation": frozenset({"eval_time", "eval_time_stdev", "eval_after_epoch", "epochs_between_evals"}),
    "checkpoint": frozenset({"checkpoint_folder", "checkpoint_after_epoch", "epochs_between_checkpoints",
                             "steps_between_checkpoints", "type", "checkpoint_mechanism_classname",
                             "fsync", "time_between_checkpoints", "num_checkpoints_write",
                             "num_checkpoints_read", "recovery_rank_shift", "rank_sync", "mode",
                             "randomize_tensor", "ksm"}),
    "output": frozenset({"folder", "log_file", "metric"}),
    "profiling": frozenset({"profiler", "iostat_devices"}),
    "metric": frozenset({"au"}),
    "storage": frozenset({"storage_type", "storage_root", "storage_options"}),
}
#: Keys of nested mappings DLIO reads.
DLIO_NESTED_KEYS: dict[str, frozenset[str]] = {
    "model.parallelism": frozenset({"tensor", "pipeline", "data", "zero_stage"}),
    "model.transformer": frozenset({"vocab_size", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                                    "num_kv_heads"}),
    "dataset.hdf5": frozenset({"chunk_dims", "num_dset_per_record", "max_shape"}),
}
#: Fields DLIO samples with ``sleep()``: a number (seconds) or a mapping below.
DLIO_DISTRIBUTION_FIELDS = frozenset({"train.computation_time", "reader.preprocess_time", "evaluation.eval_time"})
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
_DLIO_DEFAULTS: dict[str, Any] = {
    "framework": "tensorflow", "format": "tfrecord", "num_files_train": 8, "num_files_eval": 0,
    "num_samples_per_file": 1, "record_length_bytes": 65536, "data_folder": "./data/",
    "batch_size": 1, "batch_size_eval": 1, "read_threads": 1, "computation_threads": 1,
    "prefetch_size": 2, "seed": 123, "epochs": 1, "checkpoint_folder": "./checkpoints/",
    "checkpoint_after_epoch": 1, "epochs_between_checkpoints": 1, "model_size": 10240,
    "eval_after_epoch": 1, "epochs_between_evals": 1,
}
_IGNORED_SECTIONS = ("output", "profiling", "metric", "storage")
#: Model fields DLIO has no key for (import leaves them at dlreplay's defaults).
_NO_DLIO_KEY = ("reader.open_per_sample", "reader.file_buffering", "reader.access_pattern", "reader.metadata_per_sample",
                "train.steps_per_epoch", "checkpoint.write_transfer_size", "checkpoint.read_at_start",
                "dataset.layout.records_per_file")


# --------------------------------------------------------------------------- import


@dataclass
class _Importer:
    """Reads DLIO keys with type checks, tracking which keys were used and provenance."""

    source: str
    sections: dict[str, dict[str, Any]]
    used: set[str] = field(default_factory=set)
    prov: dict[str, dict[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: whose checkpoint sizing to follow (:data:`DLIO_VERSIONS`)
    dlio_version: str = "auto"

    def fail(self, key: str, message: str) -> ModelError:
        err = ModelError(f"{self.source}: {key}: {message}")
        err.field_path = key  # type: ignore[attr-defined]
        return err

    def _lookup(self, dotted: str) -> tuple[Any, bool]:
        """(value, present) of a dotted DLIO key such as ``model.parallelism.tensor``; a
        top-level key (``framework``) the config leaves out is absent too."""
        node: Any = self.sections
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return None, False
            node = node[part]
        return node, True

    def raw(self, dotted: str) -> tuple[Any, bool]:
        """:meth:`_lookup`, the key counted as used when present."""
        value, present = self._lookup(dotted)
        if present:
            self.used.add(dotted)
        return value, present

    def has(self, dotted: str) -> bool:
        """Whether the config holds the dotted key (not counted as used)."""
        return self._lookup(dotted)[1]

    def get(self, dotted: str, kind: str, default: Any = None) -> tuple[Any, bool]:
        """(value, given) of a DLIO key checked against *kind*; *default* when absent or null."""
        value, present = self.raw(dotted)
        if not present or value is None:
            return default, False
        return _check_kind(value, kind, lambda msg: self.fail(dotted, msg)), True

    def first(self, keys: tuple[str, ...], kind: str, default: Any = None) -> tuple[Any, str | None]:
        """The first of *keys* present: (value, key) or (default, None)."""
        for key in keys:
            value, given = self.get(key, kind)
            if given:
                return value, key
        return default, None

    def mark(self, path: str, dlio_key: str | None, *, inferred: str | None = None) -> None:
        """Record provenance of model field *path*: from *dlio_key*, derived, or DLIO's default."""
        if inferred is not None:
            self.prov[path] = {"method": inferred, "confidence": "inferred"}
        elif dlio_key is not None:
            self.prov[path] = {"method": f"DLIO {dlio_key}", "confidence": "measured"}
        else:
            self.prov[path] = {"method": "DLIO default", "confidence": "default"}


_KIND_TEXT = {
    "int>0": "a positive integer", "int>=0": "a non-negative integer", "int": "an integer",
    "num>0": "a positive number", "num>=0": "a non-negative number", "num": "a number",
    "bool": "true or false", "str": "a string", "ints": "a list of positive integers",
    "ints>=0": "a list of non-negative integers",
}


def _check_kind(value: Any, kind: str, fail: Any) -> Any:
    """Check one DLIO value; *fail(message)* builds the error."""
    bad = fail(f"expected {_KIND_TEXT[kind]}, got {value!r}")
    if kind == "bool":
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise bad
        return value
    if kind == "str":
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise bad
        return str(value)
    if kind in ("ints", "ints>=0"):
        least = 1 if kind == "ints" else 0
        if not isinstance(value, (list, tuple)) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= least for v in value):
            raise bad
        return [int(v) for v in value]
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise bad
    if kind.startswith("int"):
        value = as_int(value)
        if value is None:
            raise bad
    else:
        value = float(value)
    if (kind.endswith(">0") and value <= 0) or (kind.endswith(">=0") and value < 0):
        raise bad
    return value


def _parse_sections(config: Any, source: str) -> dict[str, Any]:
    """Top-level mapping of a DLIO config with block-string sections parsed."""
    if isinstance(config, Mapping) and set(config) == {"workload"} and isinstance(config["workload"], Mapping):
        config = config["workload"]  # a config nested as hydra's `workload` group
    if not isinstance(config, Mapping):
        raise ModelError(f"{source}: (top level): expected a DLIO workload mapping, got {type(config).__name__}")
    out: dict[str, Any] = {}
    for name, value in config.items():
        if isinstance(value, str) and name != "framework":
            try:
                parsed = yaml.safe_load(value)
            except yaml.YAMLError as exc:
                raise ModelError(f"{source}: {name}: not valid YAML inside the block string ({exc})") from None
            value = {"name": parsed} if name == "model" and isinstance(parsed, str) else parsed
        if value is None:
            value = {}
        if name != "framework" and not isinstance(value, Mapping):
            raise ModelError(f"{source}: {name}: expected a mapping, got {value!r}")
        out[str(name)] = value
    return out


def _dlio_distribution(imp: _Importer, key: str, stdev_key: str | None, default: float) -> tuple[Distribution, bool]:
    """A DLIO sleep spec (number, or mapping with optional type) as a Distribution."""
    value, present = imp.raw(key)
    stdev, has_stdev = imp.get(stdev_key, "num>=0") if stdev_key else (None, False)
    if not present or value is None:
        return Distribution.fixed(default), False
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = {"mean": value}
    if not isinstance(value, Mapping):
        raise imp.fail(key, f"expected a number of seconds or a mapping with type, got {value!r}")
    spec = dict(value)
    if has_stdev and "type" not in spec:
        spec["stdev"] = stdev
    return _distribution_from_spec(spec, lambda sub, msg: imp.fail(f"{key}.{sub}" if sub else key, msg)), True


def _distribution_from_spec(spec: dict[str, Any], fail: Any) -> Distribution:
    kind = spec.get("type")

    def num(name: str, check: str = "num>=0", default: Any = None) -> float:
        if spec.get(name) is None:
            if default is not None:
                return default
            raise fail(name, f"missing required key for type {kind or 'normal'}")
        return _check_kind(spec[name], check, lambda msg: fail(name, msg))

    if kind is None:
        mean = num("mean", "num>=0", 0.0)
        stdev = num("stdev", "num>=0", 0.0)
        return Distribution(type="normal", mean=mean, stdev=stdev) if stdev > 0 else Distribution.fixed(mean)
    if kind == "fixed":
        return Distribution.fixed(num("value", "num>=0", None) if "value" in spec else num("mean"))
    if kind == "normal":
        return Distribution(type="normal", mean=num("mean"), stdev=num("stdev"))
    if kind == "uniform":
        lo, hi = num("min"), num("max")
        if lo > hi:
            raise fail("max", f"expected max >= min ({lo!r}), got {hi!r}")
        return Distribution(type="uniform", min=lo, max=hi)
    if kind == "gamma":
        return Distribution(type="gamma", shape=num("shape", "num>0"), scale=num("scale", "num>0"))
    if kind == "exponential":
        return Distribution(type="exponential", scale=num("scale", "num>0"))
    if kind == "poisson":
        return Distribution(type="poisson", lam=num("lambda" if "lam" not in spec and "lambda" in spec else "lam"))
    types_ = ", ".join((*DLIO_DISTRIBUTION_KEYS, "fixed"))
    raise fail("type", f"expected one of {types_} (or a plain number), got {kind!r}")


def _file_size(record: Distribution, n: int) -> Distribution | None:
    """Bytes per file implied by *n* records of size *record* (format overhead ignored)."""
    if record.type == "fixed":
        return Distribution.fixed(record.value * n)  # type: ignore[operator]
    if record.type == "normal":
        return Distribution(type="normal", mean=record.mean * n, stdev=record.stdev * math.sqrt(n))  # type: ignore[operator]
    return None


def _import_model_info(imp: _Importer) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("name", "type"):
        value, given = imp.get(f"model.{key}", "str")
        if given:
            out[key] = value
            imp.mark(f"model.{key}", f"model.{key}")
    size, size_key = imp.first(("model.model_size_bytes", "model.model_size", "checkpoint.model_size"), "int>=0")
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
    for sub, names in (("parallelism", ("tensor", "pipeline", "data", "zero_stage")),
                       ("transformer", sorted(DLIO_NESTED_KEYS["model.transformer"]))):
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


def dlio_checkpoint_estimate(info: ModelInfo) -> tuple[int, int] | None:
    """(bytes, files) DLIO writes per checkpoint of a transformer model, or None without layers.

    Follows DLIO's ``base_checkpointing.py``: parameters ``P = 2*vocab*h + h +
    L*(2h + 4h^2 + 3h*ffn)``; layer states in fp16 (2 bytes/parameter, one copy,
    ``(L + 3) * tensor`` files unless ZeRO-3); three fp32 optimizer tensors per
    parameter (12 bytes, one file per rank; ZeRO-0 keeps one copy per data-parallel
    replica); plus ``model_size`` bytes and one file per rank when set. Missing
    transformer dimensions take DLIO's defaults (h 2048, ffn 8192, vocab 32000).
    """
    if not info.num_layers:
        return None
    t = info.transformer or Transformer()
    h, ffn, voc = t.hidden_size or 2048, t.ffn_hidden_size or 8192, t.vocab_size or 32000
    layers = info.num_layers
    params = 2 * voc * h + h + layers * (2 * h + 4 * h * h + 3 * h * ffn)
    par = info.parallelism or Parallelism()
    dp = par.data or 1
    mp = par.tensor * par.pipeline
    ranks = mp * dp
    writers = mp if par.zero_stage == -1 else ranks
    optim = 12 * params * (dp if par.zero_stage == 0 else 1)
    layer_files = (layers + 3) * par.tensor if par.zero_stage < 3 else ranks
    total, files = 2 * params + optim, layer_files + writers
    if info.model_size:
        total += info.model_size * writers
        files += writers
    return total, files


#: DLIO 2.0.0's ``checkpoint.layer_parameters`` default: with ``num_layers`` 1 (its default)
#: every checkpoint writes one layer file of these int8 tensors (24.8 MB) beside the model's.
DLIO_2_0_LAYER_PARAMETERS = (17371, 24740228)
#: DLIO releases whose checkpoint sizing :func:`import_dlio` follows: ``2.0.0`` (the PyPI
#: release: ``checkpoint.model_size``, ``optimization_groups``, ``num_layers``,
#: ``layer_parameters``, ``tensor_parallelism``), ``later`` (the ``model`` section:
#: ``model_size_bytes``, ``num_layers``, ``parallelism``, ``transformer``), or ``auto``:
#: ``later`` when the ``model`` section sizes the model, else ``2.0.0``.
DLIO_VERSIONS = ("auto", "2.0.0", "later")
_LATER_SIZING = ("model.model_size_bytes", "model.model_size", "model.num_layers", "model.layer_parameters",
                 "model.optimization_groups", "model.parallelism", "model.transformer")


def dlio_2_0_checkpoint(model_size: int = 10240, optimization_groups: tuple[int, ...] | list[int] = (),
                        num_layers: int = 1, layer_parameters: tuple[int, ...] | list[int] = DLIO_2_0_LAYER_PARAMETERS,
                        tensor_parallelism: int = 1) -> tuple[int, int]:
    """(bytes, files) DLIO 2.0.0 writes per checkpoint and writing rank (its
    ``base_checkpointing.py``; tensors of int8, so bytes = elements, ``torch.save``'s few
    hundred bytes of framing aside): a model file of ``model_size``; with optimization
    groups, one optimizer file of two tensors per group and one of their sum (3 x the
    sum); with layer parameters, ``num_layers`` (plus ``tensor_parallelism`` when above
    1) layer files of their sum each."""
    nbytes = files = 0
    if model_size > 0:
        nbytes, files = model_size, 1
    if optimization_groups:
        nbytes += 3 * sum(g for g in optimization_groups if g > 0)
        files += 1
    layer = sum(p for p in layer_parameters if p > 0)
    if layer and num_layers > 0:
        layers = num_layers + (tensor_parallelism if tensor_parallelism > 1 else 0)
        nbytes += layers * layer
        files += layers
    return nbytes, files


def _dlio_2_0_size(imp: _Importer, info: dict[str, Any]) -> tuple[int, int]:
    """:func:`dlio_2_0_checkpoint` of the config's ``checkpoint`` keys (DLIO 2.0.0's defaults
    for the rest); ``info``'s ``model_size`` becomes DLIO 2.0.0's."""
    size, size_given = imp.get("checkpoint.model_size", "int>=0", _DLIO_DEFAULTS["model_size"])
    groups, _ = imp.get("checkpoint.optimization_groups", "ints>=0", [])
    layers, _ = imp.get("checkpoint.num_layers", "int>=0", 1)
    params, params_given = imp.get("checkpoint.layer_parameters", "ints>=0", list(DLIO_2_0_LAYER_PARAMETERS))
    tensor, _ = imp.get("checkpoint.tensor_parallelism", "int>0", 1)
    imp.get("checkpoint.pipeline_parallelism", "int>0")  # (which ranks write layers: rank 0 does)
    for later in _LATER_SIZING:
        if imp.has(later):
            imp.notes.append(f"{later} is not read by DLIO 2.0.0 (its checkpoint sizing keys are in `checkpoint`)")
    if info.get("model_size") != size:
        info["model_size"] = size
        imp.mark("model.model_size", "checkpoint.model_size" if size_given else None)
    nbytes, files = dlio_2_0_checkpoint(size, groups, layers, params, tensor)
    how = ("DLIO 2.0.0 checkpoint sizing: model_size, optimization_groups, num_layers x layer_parameters"
           + ("" if params_given else f" (default {list(DLIO_2_0_LAYER_PARAMETERS)})"))
    imp.mark("checkpoint.bytes_per_checkpoint", None, inferred=how)
    imp.mark("checkpoint.files_per_checkpoint", None, inferred=how)
    kind, _ = imp.get("checkpoint.type", "str", "rank_zero")
    if kind == "all_ranks":
        imp.notes.append("checkpoint.type all_ranks: the checkpoint sizes are per rank (DLIO takes the ranks from mpirun)")
    return nbytes, files


def _checkpoint_size(info: dict[str, Any], imp: _Importer) -> tuple[int, int]:
    """Bytes and files per checkpoint, recorded in provenance."""
    if imp.dlio_version == "2.0.0" or (
            imp.dlio_version == "auto" and not any(imp.has(k) for k in _LATER_SIZING)):
        return _dlio_2_0_size(imp, info)
    model_info = ModelInfo(
        num_layers=info.get("num_layers"), model_size=info.get("model_size"),
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
        imp.mark("checkpoint.bytes_per_checkpoint", None, inferred="model.model_size (DLIO model state)")
        imp.mark("checkpoint.files_per_checkpoint", None, inferred="DLIO writes one model-state file (rank 0)")
        return info["model_size"], 1
    imp.mark("checkpoint.bytes_per_checkpoint", None)
    imp.mark("checkpoint.files_per_checkpoint", None)
    return _DLIO_DEFAULTS["model_size"], 1


_FORMAT_MAP = {"hdf5_opt": "hdf5", "mmap_indexed_binary": "indexed_binary"}


def _import_format(imp: _Importer) -> str:
    fmt, given = imp.get("dataset.format", "str", _DLIO_DEFAULTS["format"])
    if fmt not in DLIO_FORMATS:
        raise imp.fail("dataset.format", f"expected one of {', '.join(DLIO_FORMATS)}, got {fmt!r}")
    if fmt == "synthetic":
        raise imp.fail("dataset.format", "synthetic data has no files to replay; give the real format")
    if fmt in _FORMAT_MAP:
        imp.notes.append(f"dataset.format {fmt} imported as {_FORMAT_MAP[fmt]}")
    imp.mark("dataset.format", "dataset.format" if given else None)
    return _FORMAT_MAP.get(fmt, fmt)


def _import_layout(imp: _Importer, fmt: str) -> dict[str, Any]:
    layout: dict[str, Any] = {}
    comp, comp_given = imp.get("dataset.compression", "str", "none")
    if comp not in DLIO_COMPRESSIONS:
        raise imp.fail("dataset.compression", f"expected one of {', '.join(DLIO_COMPRESSIONS)}, got {comp!r}")
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


def _import_dataset(imp: _Importer) -> dict[str, Any]:
    fmt = _import_format(imp)
    out: dict[str, Any] = {"format": fmt}
    for path, key, kind in (("num_files", "num_files_train", "int>0"), ("num_files_eval", "num_files_eval", "int>=0"),
                            ("num_samples_per_file", "num_samples_per_file", "int>0"),
                            ("num_subfolders", "num_subfolders_train", "int>=0"),
                            ("data_folder", "data_folder", "str")):
        value, given = imp.get(f"dataset.{key}", kind, _DLIO_DEFAULTS.get(key, 0))
        out[path] = value
        imp.mark(f"dataset.{path}", f"dataset.{key}" if given else None)
    length, length_key = imp.first(("dataset.record_length_bytes", "dataset.record_length"), "num>=0",
                                   _DLIO_DEFAULTS["record_length_bytes"])
    stdev, stdev_key = imp.first(("dataset.record_length_bytes_stdev", "dataset.record_length_stdev"), "num>=0", 0)
    record = Distribution(type="normal", mean=length, stdev=stdev) if stdev > 0 else Distribution.fixed(length)
    out["record_length"] = record
    imp.mark("dataset.record_length", "/".join(k for k in (length_key, stdev_key) if k) or None)
    resize, resize_key = imp.first(("dataset.record_length_bytes_resize", "dataset.record_length_resize"), "int>=0")
    if resize_key and resize > 0:
        out["record_length_resize"] = resize
        imp.mark("dataset.record_length_resize", resize_key)
    size = _file_size(record, out["num_samples_per_file"])
    if size is not None:
        out["file_size"] = size
        imp.mark("dataset.file_size", None, inferred="num_samples_per_file x record_length (format overhead ignored)")
    layout = _import_layout(imp, fmt)
    if stdev == 0:
        _import_generated(imp, fmt, out, layout, length, resize if resize_key and resize > 0 else None)
    if fmt == "indexed_binary":  # DLIO's generator writes each file's record index beside it
        layout["index"] = "dlio"
    if layout:
        out["layout"] = layout
    return out


def _import_generated(imp: _Importer, fmt: str, out: dict[str, Any], layout: dict[str, Any], length: float,
                      resize: int | None) -> None:
    """The files DLIO 2.0.0's generator writes (:mod:`dlreplay.dliogen`) into *layout* and the
    sizes in *out*: square uint8 samples of side ``int(sqrt(record_length))``; images are
    their encoded size on disk (``record_length`` is DLIO's decoded bytes); the sample a reader
    hands over is DLIO's ``resized_image`` unless the config resizes it."""
    from dlreplay.dliogen import (
        array_file_bytes,
        dlio_dimension,
        generated_layout,
        image_file_bytes,
    )
    from dlreplay.model import to_plain

    side = dlio_dimension(length)
    chunking, _ = imp.get("dataset.enable_chunking", "bool", False)
    gen = generated_layout(fmt, out["num_samples_per_file"], (side, side),
                           compression=str(imp.raw("dataset.compression")[0] or "none"),
                           compression_level=layout.get("compression_level"),
                           chunk_size=layout.get("hdf5_chunk_bytes") if chunking else None)
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
        imp.mark("dataset.record_length", None, inferred=f"{how}, saved by Pillow: {encoded:,} B on disk "
                                                          f"(DLIO's record_length {int(length):,} B is the decoded image)")
        imp.mark("dataset.file_size", None, inferred="the encoded image")
    else:
        nbytes = array_file_bytes(fmt, out["num_samples_per_file"], (side, side))
        if nbytes is not None and not layout.get("compressed") and not layout.get("hdf5_compression"):
            out["file_size"] = Distribution.fixed(nbytes)
            imp.mark("dataset.file_size", None, inferred=f"{how}: the file DLIO writes")
    if resize is None:
        out["record_length_resize"] = side * side
        imp.mark("dataset.record_length_resize", None,
                 inferred="DLIO's readers hand over resized_image, max_dimension^2 bytes (no record_length_resize)")


def _import_shuffle(imp: _Importer, key: str) -> str:
    value, present = imp.raw(key)
    if not present or value is None or value is False:
        imp.mark(key, key if present else None)
        return "off"
    if value not in DLIO_SHUFFLES:
        raise imp.fail(key, f"expected one of {', '.join(DLIO_SHUFFLES)}, got {value!r}")
    imp.mark(key, key)
    return value


def _import_reader(imp: _Importer, framework: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if imp.raw("dataset.format")[0] == "mmap_indexed_binary":  # its reader maps the files
        out["memory_map"] = True
        imp.mark("reader.memory_map", "dataset.format")
    loader, given = imp.get("reader.data_loader", "str", framework)
    if loader not in DLIO_DATA_LOADERS:
        raise imp.fail("reader.data_loader", f"expected one of {', '.join(DLIO_DATA_LOADERS)}, got {loader!r}")
    if loader == "native_dali":
        imp.notes.append("reader.data_loader native_dali imported as dali")
        loader = "dali"
    out["data_loader"] = loader
    imp.mark("reader.data_loader", "reader.data_loader" if given else None)
    out["worker_kind"] = "process" if loader == "pytorch" else "thread"
    imp.mark("reader.worker_kind", None, inferred=f"DLIO's {loader} loader uses {out['worker_kind']} workers")
    for key, kind in (("batch_size", "int>0"), ("batch_size_eval", "int>0"), ("read_threads", "int>=0"),
                      ("computation_threads", "int>0")):
        out[key], given = imp.get(f"reader.{key}", kind, _DLIO_DEFAULTS[key])
        imp.mark(f"reader.{key}", f"reader.{key}" if given else None)
    prefetch, given = imp.get("reader.prefetch_size", "int>=0", _DLIO_DEFAULTS["prefetch_size"])
    out["prefetch_factor"] = _prefetch_factor(prefetch, out["read_threads"], loader)
    imp.mark("reader.prefetch_factor", None, inferred=f"from DLIO reader.prefetch_size={prefetch}"
             + ("" if given else " (DLIO default)"))
    for key in ("file_shuffle", "sample_shuffle"):
        out[key] = _import_shuffle(imp, f"reader.{key}")
    out["shuffle_seed"], given = imp.get("train.seed", "int", _DLIO_DEFAULTS["seed"])
    imp.mark("reader.shuffle_seed", "train.seed" if given else None)
    size, given = imp.get("reader.shuffle_size", "int>0")
    if given:
        out["shuffle_size"] = size
        imp.mark("reader.shuffle_size", "reader.shuffle_size")
    transfer, given = imp.get("reader.transfer_size", "int>0")
    if given:
        out["transfer_size"] = Distribution.fixed(transfer)
        imp.mark("reader.transfer_size", "reader.transfer_size")
    out["preprocess_time"], given = _dlio_distribution(imp, "reader.preprocess_time", "reader.preprocess_time_stdev", 0.0)
    imp.mark("reader.preprocess_time", "reader.preprocess_time" if given else None)
    ctx, given = imp.get("reader.multiprocessing_context", "str", "fork")
    if ctx not in MP_CONTEXTS:
        raise imp.fail("reader.multiprocessing_context", f"expected one of {', '.join(MP_CONTEXTS)}, got {ctx!r}")
    out["multiprocessing_context"] = ctx
    imp.mark("reader.multiprocessing_context", "reader.multiprocessing_context" if given else None)
    if loader == "pytorch":
        # DLIO 2.0's TorchDataLoader: DataLoader(persistent_workers=True, pin_memory=True, drop_last=True,
        # sampler=dlio_sampler); replayed the same way unless overridden (--set)
        out.update(persistent_workers=out["read_threads"] > 0, pin_memory=True, drop_last=True,
                   sample_order="dlio")
        for path in ("persistent_workers", "pin_memory", "drop_last"):
            imp.mark(f"reader.{path}", None, inferred=f"DLIO's PyTorch loader sets {path}=True")
        imp.mark("reader.sample_order", None, inferred="DLIO's PyTorch sampler (contiguous samples per rank, "
                 "seeded shuffle re-applied every epoch, file_shuffle without effect)")
        if out["file_shuffle"] != "off":
            imp.notes.append(f"reader.file_shuffle={out['file_shuffle']} has no effect on DLIO's PyTorch loader "
                             "(its index sampler orders samples); replayed the same way (reader.sample_order=dlio)")
    return out


def _prefetch_factor(prefetch_size: int, read_threads: int, loader: str) -> int:
    """PyTorch prefetch_factor as DLIO derives it from prefetch_size (0 means 2)."""
    if loader != "pytorch":
        return prefetch_size
    factor = math.ceil(prefetch_size / read_threads) if read_threads >= 1 else prefetch_size
    return factor if factor > 0 else 2


def _import_train(imp: _Importer) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["enabled"], given = imp.get("workflow.train", "bool", True)
    imp.mark("train.enabled", "workflow.train" if given else None)
    out["epochs"], given = imp.get("train.epochs", "int>0", _DLIO_DEFAULTS["epochs"])
    imp.mark("train.epochs", "train.epochs" if given else None)
    steps, given = imp.get("train.total_training_steps", "int")
    if given and steps > 0:
        out["total_training_steps"] = steps
        imp.mark("train.total_training_steps", "train.total_training_steps")
    out["computation_time"], given = _dlio_distribution(imp, "train.computation_time", "train.computation_time_stdev", 0.0)
    imp.mark("train.computation_time", "train.computation_time" if given else None)
    out["au_first_steps"] = "epoch"
    imp.mark("train.au_first_steps", None, inferred="DLIO leaves every epoch's first step out of AU")
    evaluate, _ = imp.get("workflow.evaluation", "bool", False)
    if evaluate:
        out["evaluation"] = _import_evaluation(imp)
        imp.mark("train.evaluation", "workflow.evaluation/evaluation")
    elif imp.sections.get("evaluation"):
        imp.notes.append("evaluation section ignored: workflow.evaluation is not true")
    return out


def _import_evaluation(imp: _Importer) -> dict[str, Any]:
    every, _ = imp.get("evaluation.epochs_between_evals", "int>0", _DLIO_DEFAULTS["epochs_between_evals"])
    after, _ = imp.get("evaluation.eval_after_epoch", "int>=0", _DLIO_DEFAULTS["eval_after_epoch"])
    compute, _ = _dlio_distribution(imp, "evaluation.eval_time", "evaluation.eval_time_stdev", 0.0)
    return {"every_n_epochs": every, "after_epoch": after, "computation_time": compute}


def _import_checkpoint(imp: _Importer, info: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["enabled"], given = imp.get("workflow.checkpoint", "bool", False)
    imp.mark("checkpoint.enabled", "workflow.checkpoint" if given else None)
    for key, kind in (("checkpoint_folder", "str"), ("checkpoint_after_epoch", "int>=0")):
        value, given = imp.get(f"checkpoint.{key}", kind, _DLIO_DEFAULTS[key])
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
        out["epochs_between_checkpoints"] = epochs if epochs_given else _DLIO_DEFAULTS["epochs_between_checkpoints"]
        imp.mark("checkpoint.epochs_between_checkpoints",
                 "checkpoint.epochs_between_checkpoints" if epochs_given else None)
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


def _import_processes(imp: _Importer, info: dict[str, Any], read_threads: int) -> dict[str, Any]:
    out: dict[str, Any] = {"workers_per_rank": read_threads}
    imp.mark("processes.workers_per_rank", None, inferred="reader.read_threads")
    par = info.get("parallelism")
    if par:
        out["ranks"] = par.get("tensor", 1) * par.get("pipeline", 1) * par.get("data", 1)
        imp.mark("processes.ranks", None, inferred="model.parallelism tensor x pipeline x data")
    return out


def _note_unused(imp: _Importer) -> None:
    unused = []
    for name, section in imp.sections.items():
        if name == "framework":
            continue
        if name in _IGNORED_SECTIONS or not isinstance(section, Mapping):
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
        imp.notes.append("DLIO keys without effect on the model: " + ", ".join(sorted(unused)))


def dlio_to_model(config: Any, source: str = "<dict>", dlio_version: str = "auto") -> WorkloadModel:
    """Build a workload model from a parsed DLIO workload config (see the module docs);
    ``dlio_version`` (:data:`DLIO_VERSIONS`): whose checkpoint sizing to follow."""
    if dlio_version not in DLIO_VERSIONS:
        raise ModelError(f"unknown DLIO version {dlio_version!r}: expected one of {', '.join(DLIO_VERSIONS)}")
    imp = _Importer(source, _parse_sections(config, source), dlio_version=dlio_version)
    framework, given = imp.get("framework", "str", _DLIO_DEFAULTS["framework"])
    if framework not in DLIO_FRAMEWORKS:
        raise imp.fail("framework", f"expected one of {', '.join(DLIO_FRAMEWORKS)}, got {framework!r}")
    imp.mark("framework", "framework" if given else None)
    info = _import_model_info(imp)
    reader = _import_reader(imp, framework)
    model = {
        "model": info, "framework": framework, "dataset": _import_dataset(imp), "reader": reader,
        "train": _import_train(imp), "checkpoint": _import_checkpoint(imp, info),
        "processes": _import_processes(imp, info, reader["read_threads"]),
    }
    imp.get("workflow.generate_data", "bool")
    _note_unused(imp)
    for path in _NO_DLIO_KEY:
        imp.prov.setdefault(path, {"method": "no DLIO key; dlreplay default", "confidence": "default"})
    model["provenance"] = {
        "source_config": source, "dlreplay_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "fields": imp.prov, "notes": [f"imported from DLIO config {source}", *imp.notes],
    }
    plain = {"schema": "dlreplay.workload", "format_version": 1, **_plain(model)}
    return model_from_dict(plain, source=source, default_method="not in the DLIO config; dlreplay default")


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


# --------------------------------------------------------------------------- export


def _dist_to_dlio(d: Distribution, what: str, warnings: list[str]) -> Any:
    """A distribution as DLIO's sleep spec: a number or a typed mapping (None = leave out)."""
    if d.type == "fixed":
        return d.value
    if d.type == "unknown":
        warnings.append(f"{what} is unknown: left out (DLIO's default is 0)")
        return None
    if d.type == "empirical":
        warnings.append(f"{what}: empirical distribution exported as normal(mean={d.mean:g}, stdev={d.stdev:g})")
        return {"type": "normal", "mean": d.mean, "stdev": d.stdev or 0.0}
    if d.type not in ("uniform",) and (d.min is not None or d.max is not None):
        warnings.append(f"{what}: min/max bounds dropped (DLIO has none; it takes abs() of samples)")
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
    out.update(format=_export_format(model, warnings), num_files_train=ds.num_files,
               num_files_eval=ds.num_files_eval, num_samples_per_file=ds.num_samples_per_file)
    rec = ds.record_length
    mean = rec.value if rec.type == "fixed" else rec.mean
    if rec.type not in ("fixed", "normal"):
        warnings.append(f"dataset.record_length: {rec.type} exported as normal (DLIO generates normal record sizes)")
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
            warnings.append(f"dataset.layout.hdf5_compression {lay.hdf5_compression} has no DLIO name: left out")
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
    from dlreplay.dliogen import generated_dims

    dims = generated_dims(fmt, model.dataset.num_samples_per_file, lay)
    if dims is not None:
        # the files DLIO's own generator writes: DLIO makes them from the record length (the
        # decoded sample's bytes; for images not their size on disk)
        out["record_length_bytes"] = dims[0] * dims[1]
        out.pop("record_length_bytes_stdev", None)
        return
    _export_structures(model, out, warnings)


#: numpy dtype strings -> DLIO record_element_type names.
_DLIO_ELEMENT_TYPES = {"|u1": "uint8", "|i1": "int8", "<u2": "uint16", "<i2": "int16", "<u4": "uint32",
                       "<i4": "int32", "<u8": "uint64", "<i8": "int64", "<f2": "float16", "<f4": "float32",
                       "<f8": "float64"}


def _export_structures(model: WorkloadModel, out: dict[str, Any], warnings: list[str]) -> None:
    """The fingerprinted layout, as far as DLIO's keys reach; the rest listed, once."""
    fmt, lay = model.dataset.format, model.dataset.layout
    lost: list[str] = []
    if lay.arrays:
        s = lay.arrays[0]
        main = max(s.members, key=lambda m: math.prod(m.shape or [0]), default=None)
        if main is not None:
            dims = list(main.shape[1:]) if s.samples and main.shape and main.shape[0] == s.samples else list(main.shape)
            if dims:
                out["record_dims"] = dims
            if main.dtype in _DLIO_ELEMENT_TYPES:
                out["record_element_type"] = _DLIO_ELEMENT_TYPES[main.dtype]
            else:
                lost.append(f"element type {main.dtype}")
            others = [m.name for m in s.members if m is not main]
            if others:
                lost.append(f"other arrays per file ({', '.join(others[:4])}{', ...' if len(others) > 4 else ''}; "
                            f"DLIO writes one records array and labels)")
            if main.chunk_order == "scattered":
                lost.append("chunks scattered in the file (DLIO writes them in order)")
            if main.shuffle or main.fletcher32 or main.scaleoffset is not None:
                lost.append("HDF5 shuffle/fletcher32/scale-offset filters")
            if fmt == "npz" and {m.storage for m in s.members} == {"stored", "deflated"}:
                lost.append("mixed stored/deflated NPZ members")
        if len(lay.arrays) > 1:
            lost.append(f"{len(lay.arrays)} file structures (DLIO's files are all alike)")
    if lay.hdf5 is not None and (lay.hdf5.superblock_version or lay.hdf5.alignment_interval
                                 or lay.hdf5.file_space_strategy not in (None, "fsm_aggr") or lay.hdf5.userblock_size
                                 or lay.hdf5.meta_block_size):
        lost.append("HDF5 file settings (libver, alignment, metadata block size, file-space strategy, user block)")
    if lay.images:
        i = lay.images[0]
        lost.append(f"image {i.width}x{i.height} {i.mode}" + (f" quality {i.quality}" if i.quality else "")
                    + (f" {i.subsampling}" if i.subsampling else "") + (" progressive" if i.progressive else "")
                    + " (DLIO sizes images from record_length only)")
    if lay.tables:
        lost.append("table columns, codecs and row groups")
    if lay.record_bytes is not None:
        lost.append("TFRecord record size distribution (beyond record_length mean/stdev)")
    if lost:
        warnings.append(f"dataset.layout ({lay.source or 'given'}): DLIO cannot express: {'; '.join(lost)}")


def _export_reader(model: WorkloadModel, warnings: list[str]) -> dict[str, Any]:
    rd = model.reader
    loader = rd.data_loader
    if loader == "native":
        loader = model.framework
        warnings.append(f"reader.data_loader native exported as {loader} (DLIO always uses a framework loader)")
    if model.dataset.format == "tfrecord" and loader == "pytorch":
        warnings.append("DLIO has no PyTorch reader for tfrecord; it will refuse this config")
    prefetch = rd.prefetch_factor * max(rd.read_threads, 1) if loader == "pytorch" else rd.prefetch_factor
    out: dict[str, Any] = {
        "data_loader": loader, "batch_size": rd.batch_size, "batch_size_eval": rd.batch_size_eval,
        "read_threads": rd.read_threads, "computation_threads": rd.computation_threads,
        "prefetch_size": prefetch, "file_shuffle": rd.file_shuffle, "sample_shuffle": rd.sample_shuffle,
    }
    if rd.shuffle_size is not None:
        out["shuffle_size"] = rd.shuffle_size
    if rd.multiprocessing_context != "fork":
        out["multiprocessing_context"] = rd.multiprocessing_context
    ts = rd.transfer_size
    if ts.is_known:
        size = ts.value if ts.type == "fixed" else ts.mean
        if ts.type != "fixed":
            warnings.append(f"reader.transfer_size: {ts.type} exported as its mean ({size:g} bytes)")
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
    if tr.steps_per_epoch is not None:
        warnings.append(f"train.steps_per_epoch={tr.steps_per_epoch} has no DLIO key: DLIO derives steps from "
                        f"files x samples / (batch_size x ranks)")
    if model.reader.shuffle_seed is not None:
        out["seed"] = model.reader.shuffle_seed
    return out


def _export_evaluation(model: WorkloadModel, warnings: list[str]) -> dict[str, Any]:
    ev = model.train.evaluation
    assert ev is not None
    out: dict[str, Any] = {"epochs_between_evals": ev.every_n_epochs, "eval_after_epoch": ev.after_epoch}
    spec = _dist_to_dlio(ev.computation_time, "train.evaluation.computation_time", warnings)
    if spec is not None:
        out["eval_time"] = spec
    if ev.steps is not None:
        warnings.append("train.evaluation.steps has no DLIO key: DLIO evaluates all num_files_eval files")
    return out


def _export_checkpoint(model: WorkloadModel, warnings: list[str]) -> dict[str, Any] | None:
    ck = model.checkpoint
    if not ck.enabled and ck == type(ck)():
        return None
    out: dict[str, Any] = {}
    if ck.checkpoint_folder is not None:
        out["checkpoint_folder"] = ck.checkpoint_folder
    out["checkpoint_after_epoch"] = ck.checkpoint_after_epoch
    for key in ("epochs_between_checkpoints", "steps_between_checkpoints", "time_between_checkpoints",
                "num_checkpoints_write", "num_checkpoints_read"):
        if getattr(ck, key) is not None:
            out[key] = getattr(ck, key)
    out["fsync"] = ck.fsync
    if ck.enabled:
        _warn_checkpoint_size(model, warnings)
        if not model.model.num_layers:
            size = model.model.model_size if model.model.model_size is not None else ck.bytes_per_checkpoint
            warnings.append(
                f"checkpoint: written for DLIO releases after 2.0.0 (model.model_size_bytes); DLIO 2.0.0 "
                f"reads checkpoint.model_size and adds its default {sum(DLIO_2_0_LAYER_PARAMETERS)}-byte layer "
                f"file: for it, set checkpoint.model_size: {size} and checkpoint.num_layers: 0")
    return out


def _warn_checkpoint_size(model: WorkloadModel, warnings: list[str]) -> None:
    ck, info = model.checkpoint, model.model
    estimate = dlio_checkpoint_estimate(info)
    if estimate is None:
        size = info.model_size if info.model_size is not None else ck.bytes_per_checkpoint
        estimate = (size, 1)
    if estimate != (ck.bytes_per_checkpoint, ck.files_per_checkpoint):
        warnings.append(f"checkpoint: DLIO will write about {estimate[0]} bytes in {estimate[1]} file(s) per "
                        f"checkpoint; the model says {ck.bytes_per_checkpoint} bytes in "
                        f"{ck.files_per_checkpoint} file(s)")


def _inexpressible(model: WorkloadModel) -> list[str]:
    """Model facts DLIO has no key for (they are lost on export)."""
    rd, ck, pr = model.reader, model.checkpoint, model.processes
    lost = []
    expected_kind = "process" if rd.data_loader == "pytorch" else "thread"
    if rd.worker_kind != expected_kind:
        lost.append(f"reader.worker_kind={rd.worker_kind}")
    if not rd.open_per_sample:
        lost.append("reader.open_per_sample=false")
    if rd.file_buffering != "buffered":
        lost.append(f"reader.file_buffering={rd.file_buffering}")
    if rd.access_pattern != AccessPattern():
        lost.append("reader.access_pattern")
    if rd.metadata_per_sample != MetadataPerSample():
        lost.append("reader.metadata_per_sample")
    if ck.write_transfer_size.is_known:
        lost.append("checkpoint.write_transfer_size")
    if ck.read_at_start:
        lost.append("checkpoint.read_at_start=true")
    if pr.workers_per_rank != rd.read_threads:
        lost.append(f"processes.workers_per_rank={pr.workers_per_rank}")
    tr = model.train
    if tr.warmup_computation_time:
        lost.append("train.warmup_computation_time")
    if tr.epoch_warmup_computation_time:
        lost.append("train.epoch_warmup_computation_time")
    if tr.epoch_end_time.is_known and (tr.epoch_end_time.mean or 0) > 0:
        lost.append("train.epoch_end_time")
    pc = model.reader.preprocess_host_cpu
    if pc.is_known and (pc.mean or 0) > 0:
        lost.append("reader.preprocess_host_cpu (DLIO's preprocessing is a sleep)")
    if tr.computation_host_cpu.is_known and (tr.computation_host_cpu.mean or 0) > 0:
        lost.append("train.computation_host_cpu (DLIO's compute is a sleep)")
    if model.reader.batch_tensors != 1:
        lost.append(f"reader.batch_tensors={model.reader.batch_tensors} (DLIO's batch is one tensor)")
    if ck.serialization_time.is_known and (ck.serialization_time.mean or 0) > 0:
        lost.append("checkpoint.serialization_time")
    if rd.data_loader == "pytorch":
        dlio_way = {"reader.persistent_workers": rd.persistent_workers or rd.read_threads == 0,
                    "reader.pin_memory": rd.pin_memory, "reader.drop_last": rd.drop_last,
                    "reader.sample_order": rd.sample_order == "dlio"}
        lost.extend(f"{k}={getattr(rd, k.split('.')[1])} (DLIO's PyTorch loader differs)"
                    for k, same in dlio_way.items() if not same)
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
    cfg["workflow"] = {"generate_data": False, "train": tr.enabled,
                       "evaluation": tr.enabled and tr.evaluation is not None,
                       "checkpoint": model.checkpoint.enabled}
    if tr.enabled:
        cfg["dataset"] = _export_dataset(model, warnings)
        cfg["reader"] = _export_reader(model, warnings)
        cfg["train"] = _export_train(model, warnings)
        if tr.evaluation is not None:
            cfg["evaluation"] = _export_evaluation(model, warnings)
    else:
        warnings.append("training is off: dataset, reader and train sections left out "
                        "(DLIO reads no data in a checkpoint-only run)")
        if tr.evaluation is not None:
            warnings.append("train.evaluation left out: DLIO evaluates only while training")
    ck = _export_checkpoint(model, warnings)
    if ck is not None:
        cfg["checkpoint"] = ck
    warnings.extend(_inexpressible(model))
    problems = dlio_key_problems(cfg)
    if problems:  # a bug in this module, not in the model
        raise AssertionError(f"export produced keys DLIO does not read: {problems}")
    return cfg, warnings


def export_dlio(model: WorkloadModel, path: str | os.PathLike[str]) -> list[str]:
    """Write *model* as a DLIO workload YAML (atomically); returns the lossy steps taken."""
    cfg, warnings = model_to_dlio(model)
    source = model.provenance.source_trace or model.provenance.source_config or "a dlreplay workload model"
    header = [f"# DLIO workload exported by dlreplay {__version__} from {source}",
              "# units: bytes, seconds"]
    header += [f"# lossy: {w}" for w in warnings]
    try:
        atomic_write_text(path, "\n".join(header) + "\n" + dump_yaml(cfg))
    except OSError as exc:
        raise ModelError(f"{path}: cannot write the DLIO config ({exc.strerror or exc})") from None
    return warnings


def dlio_key_problems(config: Mapping[str, Any]) -> list[str]:
    """Keys or values of a DLIO config that DLIO does not read (empty: all accepted)."""
    problems: list[str] = []
    for section, body in config.items():
        if section not in DLIO_ALLOWED_KEYS:
            problems.append(f"{section}: not a DLIO section")
        elif section == "framework":
            if body not in DLIO_FRAMEWORKS:
                problems.append(f"framework: {body!r} not one of {DLIO_FRAMEWORKS}")
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
                problems.append(f"{dotted}.type: {kind!r} not one of {sorted(DLIO_DISTRIBUTION_KEYS)}")
            elif set(value) != DLIO_DISTRIBUTION_KEYS[kind]:
                problems.append(f"{dotted}: keys {sorted(value)} != {sorted(DLIO_DISTRIBUTION_KEYS[kind])}")
        elif dotted in DLIO_ENUM_VALUES and value not in DLIO_ENUM_VALUES[dotted]:
            problems.append(f"{dotted}: {value!r} not one of {DLIO_ENUM_VALUES[dotted]}")
    return problems
