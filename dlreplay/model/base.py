"""What every part of the workload model shares: the file's names, the vocabularies of its
fields, its errors, and the field metadata the sections declare and validation reads."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, field
from typing import Any, Union

from dlreplay.errors import SHOWN_CHARS, ArtifactVersionError, ModelError, clipped, shown

MODEL_SCHEMA_NAME = "dlreplay.workload"
MODEL_FORMAT_VERSION = 1

#: Dataset file formats (DLIO's names; ``raw`` = headerless binary records; ``tar``/``arrow`` =
#: shards streamed whole by an IterableDataset: WebDataset tar, Arrow IPC stream; ``pt`` = a
#: ``torch.save`` archive a sample, read by ``torch.load``: not DLIO).
FORMATS = (
    "npz",
    "npy",
    "hdf5",
    "jpeg",
    "png",
    "tfrecord",
    "csv",
    "indexed_binary",
    "parquet",
    "raw",
    "tar",
    "arrow",
    "pt",
)
#: Data loaders: the framework's loader, DALI, or ``native`` (the job reads files itself).
DATA_LOADERS = ("pytorch", "tensorflow", "dali", "native")
#: Frameworks DLIO knows (top-level ``framework``).
FRAMEWORKS = ("pytorch", "tensorflow")
#: What a data-loader worker is: a process (PyTorch) or a thread (tf.data, DALI).
WORKER_KINDS = ("process", "thread")
#: How loader worker processes start (Python multiprocessing start methods).
MP_CONTEXTS = ("fork", "spawn", "forkserver")
#: DLIO's shuffle modes: none, seeded (reproducible), or random every run.
SHUFFLE_MODES = ("off", "seed", "random")
#: How a Dataset hands files to the format's library: Python's buffered file (the default) or unbuffered.
FILE_BUFFERINGS = ("buffered", "unbuffered")
#: How samples are sharded over ranks and ordered in each epoch: dlreplay's PyTorch-like plan or DLIO's sampler.
SAMPLE_ORDERS = ("pytorch", "dlio")
#: Which first steps AU leaves out: the run's first (MLPerf Storage) or every epoch's (DLIO).
AU_FIRST_STEPS = ("run", "epoch")
#: How far a value can be trusted.
CONFIDENCES = ("measured", "inferred", "default")
#: Distribution families.
DISTRIBUTION_TYPES = (
    "fixed",
    "normal",
    "uniform",
    "gamma",
    "exponential",
    "poisson",
    "empirical",
    "unknown",
)
#: Slack allowed when access-pattern fractions add up (floating point).
ACCESS_FRACTION_TOLERANCE = 1e-9


# --------------------------------------------------------------------------- errors


class ModelVersionError(ModelError, ArtifactVersionError):
    """A model file names another schema or a newer ``format_version``.

    Both a :class:`ModelError` (the model cannot be used) and an
    :class:`ArtifactVersionError` (the artifact is of another kind or version).
    """


class InvalidField(ModelError):
    """A cross-field problem found while constructing a section; ``subpath`` is relative."""

    def __init__(self, subpath: str, message: str) -> None:
        super().__init__(f"{subpath}: {message}")
        self.subpath = subpath
        self.message = message


def model_error(
    source: str, path: str, message: str, cls: type[ModelError] = ModelError
) -> ModelError:
    path = clipped(path)  # a key of a config can be megabytes long
    err = cls(f"{clipped(source, 4 * SHOWN_CHARS)}: {path}: {message}")
    err.source = source  # type: ignore[attr-defined]
    err.field_path = path  # type: ignore[attr-defined]
    return err


def describe_value(value: Any) -> str:
    """How a bad value is shown in an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return shown(value)
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"


def field_meta(
    check: str | None = None, choices: tuple[str, ...] | None = None, doc: str = ""
) -> dict[str, Any]:
    return {"check": check, "choices": choices, "doc": doc}


def model_field(
    default: Any = MISSING,
    *,
    factory: Any = None,
    check: str | None = None,
    choices: tuple[str, ...] | None = None,
    doc: str = "",
) -> Any:
    """A dataclass field with validation metadata (``check``: positive | nonneg | fraction)."""
    md = field_meta(check, choices, doc)
    if factory is not None:
        return field(default_factory=factory, metadata=md)
    if default is MISSING:
        return field(metadata=md)
    return field(default=default, metadata=md)


# --------------------------------------------------------------------------- field types


_HINTS: dict[type, dict[str, Any]] = {}


def type_hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def strip_optional(tp: Any) -> tuple[Any, bool]:
    """(inner type, optional?) for ``X | None``."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


def join_path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def is_required(f: Any) -> bool:
    return f.default is MISSING and f.default_factory is MISSING
