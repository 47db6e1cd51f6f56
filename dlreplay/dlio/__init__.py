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

The package's modules: :mod:`~dlreplay.dlio.keys` (DLIO's vocabulary and defaults, and a check
of a config against them), :mod:`~dlreplay.dlio.reading` (reading a config's keys),
:mod:`~dlreplay.dlio.importing`, :mod:`~dlreplay.dlio.exporting`,
:mod:`~dlreplay.dlio.checkpoint` (DLIO's checkpoint sizing) and
:mod:`~dlreplay.dlio.generator` (the files DLIO's data generators write).
"""

from __future__ import annotations

from dlreplay.dlio.checkpoint import (
    DLIO_2_0_LAYER_PARAMETERS,  # noqa: F401 (importable from here, not in __all__)
    DLIO_VERSIONS,  # noqa: F401 (importable from here, not in __all__)
    dlio_2_0_checkpoint,  # noqa: F401 (importable from here, not in __all__)
    dlio_checkpoint_estimate,
)
from dlreplay.dlio.exporting import export_dlio, model_to_dlio
from dlreplay.dlio.importing import dlio_to_model, import_dlio
from dlreplay.dlio.keys import (
    DLIO_ALLOWED_KEYS,
    DLIO_COMPRESSIONS,
    DLIO_DATA_LOADERS,
    DLIO_DISTRIBUTION_FIELDS,
    DLIO_DISTRIBUTION_KEYS,
    DLIO_ENUM_VALUES,
    DLIO_FORMATS,
    DLIO_FRAMEWORKS,
    DLIO_NESTED_KEYS,
    DLIO_SHUFFLES,
    dlio_key_problems,
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
