"""The workload model: the one artifact that replay consumes.

A workload model describes *what a training job asks of storage*, not what it
computes: the dataset's shape, how the data loader reads it, how long each
training step computes, and how often checkpoints are written. It is saved as a
YAML file::

    schema: dlreplay.workload
    format_version: 1
    dataset: {format: npz, num_files: 168, num_samples_per_file: 1, record_length: ...}
    reader: {...}
    ...

Sections and fields carry DLIO's names wherever DLIO has one (``dataset``,
``reader``, ``train``, ``checkpoint``, ``model``, ``framework``, ``batch_size``,
``read_threads``, ``file_shuffle``, ``computation_time``, ...), so a reader who
knows DLIO can read a model file, and :mod:`dlreplay.dlio` maps between them.

Units, everywhere: sizes and offsets are **bytes**, durations **seconds**,
fractions are **0..1**.

Every value may be uncertain. :class:`Distribution` describes a quantity that
varies (record sizes, transfer sizes, compute time per step), and
``provenance.fields`` records for each dotted field path how its value was
obtained and with what confidence (``measured``, ``inferred`` or ``default``).
Fields missing from a model file are filled with dlreplay's defaults and recorded
there as ``default``.

The package's modules: :mod:`~dlreplay.model.base` (names, vocabularies, errors, field
metadata), :mod:`~dlreplay.model.distribution`, :mod:`~dlreplay.model.layout` (the files'
inside), :mod:`~dlreplay.model.sections` (the dataclasses), :mod:`~dlreplay.model.validation`
(plain data into a model), :mod:`~dlreplay.model.plain` (a model into plain data),
:mod:`~dlreplay.model.files` (YAML), :mod:`~dlreplay.model.overrides` (``--set``),
:mod:`~dlreplay.model.effect` (overrides that another field decides), :mod:`~dlreplay.model.summary`
(text).

Public API: :class:`WorkloadModel` and its sections, :class:`Distribution`,
:func:`load_model`, :func:`save_model`, :func:`model_to_dict`,
:func:`model_from_dict`, :func:`apply_overrides`, :func:`summarize_model`.
"""

from __future__ import annotations

from dlreplay.model.base import (
    ACCESS_FRACTION_TOLERANCE,
    AU_FIRST_STEPS,
    CONFIDENCES,
    DATA_LOADERS,
    DISTRIBUTION_TYPES,
    FILE_BUFFERINGS,
    FORMATS,
    FRAMEWORKS,
    MODEL_FORMAT_VERSION,
    MODEL_SCHEMA_NAME,
    MP_CONTEXTS,  # noqa: F401 (importable from here, not in __all__)
    SAMPLE_ORDERS,
    SHUFFLE_MODES,
    WORKER_KINDS,
    ModelVersionError,
)
from dlreplay.model.distribution import (
    DEFAULT_QUANTILES,  # noqa: F401 (importable from here, not in __all__)
    Distribution,
)
from dlreplay.model.files import (
    dump_yaml,  # noqa: F401 (importable from here, not in __all__)
    load_model,
    load_yaml_file,
    parse_yaml,  # noqa: F401 (importable from here, not in __all__)
    read_bounded,  # noqa: F401 (importable from here, not in __all__)
    save_model,
)
from dlreplay.model.layout import (
    ARRAY_STORAGE,  # noqa: F401 (importable from here, not in __all__)
    CHUNK_ORDERS,  # noqa: F401 (importable from here, not in __all__)
    INDEX_STYLES,  # noqa: F401 (importable from here, not in __all__)
    LAYOUT_SOURCES,  # noqa: F401 (importable from here, not in __all__)
    SUBSAMPLINGS,  # noqa: F401 (importable from here, not in __all__)
    ArrayFile,
    ArrayMember,
    Hdf5File,
    ImageFile,
    Layout,
    ShardMember,
    TableColumn,
    TableFile,
)
from dlreplay.model.overrides import apply_overrides
from dlreplay.model.plain import (
    model_to_dict,
    to_plain,  # noqa: F401 (importable from here, not in __all__)
)
from dlreplay.model.sections import (
    AccessPattern,
    Checkpoint,
    Dataset,
    Evaluation,
    FieldProvenance,
    MetadataPerSample,
    ModelInfo,
    Parallelism,
    Processes,
    Provenance,
    Reader,
    SideFile,
    Storage,
    Streaming,
    Train,
    Transformer,
    WorkloadModel,
    default_fields,
    field_paths,
)
from dlreplay.model.summary import summarize_model
from dlreplay.model.validation import (
    as_int,  # noqa: F401 (importable from here, not in __all__)
    model_from_dict,
)
from dlreplay.osutil import atomic_write_text

__all__ = [
    "ACCESS_FRACTION_TOLERANCE",
    "CONFIDENCES",
    "DATA_LOADERS",
    "AU_FIRST_STEPS",
    "DISTRIBUTION_TYPES",
    "FILE_BUFFERINGS",
    "FORMATS",
    "FRAMEWORKS",
    "MODEL_FORMAT_VERSION",
    "MODEL_SCHEMA_NAME",
    "SAMPLE_ORDERS",
    "SHUFFLE_MODES",
    "WORKER_KINDS",
    "AccessPattern",
    "ArrayFile",
    "ArrayMember",
    "Checkpoint",
    "Dataset",
    "Distribution",
    "Evaluation",
    "FieldProvenance",
    "Hdf5File",
    "ImageFile",
    "Layout",
    "MetadataPerSample",
    "SideFile",
    "ModelInfo",
    "ModelVersionError",
    "Parallelism",
    "Processes",
    "Provenance",
    "Reader",
    "Storage",
    "ShardMember",
    "Streaming",
    "TableColumn",
    "TableFile",
    "Train",
    "Transformer",
    "WorkloadModel",
    "apply_overrides",
    "atomic_write_text",
    "default_fields",
    "field_paths",
    "load_model",
    "load_yaml_file",
    "model_from_dict",
    "model_to_dict",
    "save_model",
    "summarize_model",
]
