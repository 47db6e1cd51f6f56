"""One event vocabulary: what each annotation event of a trace means to dlreplay.

Traces name the same things in several ways. The loader gives every event a ``role``
(a column of the event table; null for POSIX/STDIO calls and for events with no
meaning to dlreplay), and every stage (passes, findings, distill, compare, export)
selects events by role, never by a spelling. The spellings understood:

* **DFTracer's AI logging conventions** (``dftracer.python.ai``; ``from dftracer.logger
  import ai`` in older pydftracer; DFTracer docs, "AI/DL Logging"): the categories
  ``compute`` (``forward``, ``backward``, ``step``), ``data`` (``preprocess``, ``item``,
  ``io.*``), ``dataloader`` (``fetch``), ``comm`` (``send`` ... ``all_to_all``),
  ``device`` (``transfer``), ``pipeline`` (``epoch``, ``train``, ``evaluate``, ``test``),
  ``checkpoint`` (``capture``, ``restart``, ``io.*``) and ``other``, each as the
  category's own name (``@ai.compute``), a child, a ``derive``\\d child
  (``preprocess.collate``), in the iterator forms (``X.iter``: waiting for the next
  element; ``X.block``: one element's loop body; ``X.yield`` is pydftracer 1.x's name
  for ``.block``), ``X.init`` (constructor hooks), and the start/stop metadata form
  (``CM`` records ``X.start`` / ``X.end`` with a timestamp, see :func:`marker_spans`).
* **DLIO** 2.0.0 as published on PyPI (traced by pydftracer 1.0.x): categories
  ``dlio_benchmark`` (``DLIOBenchmark._train`` per epoch, ``<module>.iter`` /
  ``<module>.yield`` around each batch), ``ai_framework`` (``TorchFramework.compute``),
  ``data_loader`` (``TorchDataset.__getitem__`` in the reader workers), ``reader``
  (``NPZReader.read_index`` with the sample index, ``FormatReader.preprocess``),
  ``checkpoint`` (``PyTorchCheckpointing.checkpoint``), and its internals
  (``config``, ``storage``, ``generator``). DLIO's development branch writes the AI
  conventions above (``pipeline/epoch.block``, ``dataloader/fetch.iter`` and
  ``fetch.block``, ``compute/compute``, ``data/item``) plus the same reader events.
  DLIO's tracer writes the MPI rank as ``pid`` and its forked reader workers into the
  rank's file: :func:`canonicalize` gives each thread id its own process (see there).
* **dlreplay's own capture**: today the AI conventions (``pipeline/epoch``,
  ``dataloader/fetch.iter`` and ``fetch.block``, ``data/item``, ``checkpoint/capture``
  and ``restart``); traces of format_version 1 and replays use ``dataloader/fetch``,
  ``compute/step`` (the whole loop body, not an optimizer step: recognised per process,
  see :func:`~.canonical._legacy_steps`), ``checkpoint/save`` and ``load``.

Events of annotation-like categories (not all upper case like ``POSIX``/``STDIO``/
``MPI``, not ``dftracer``'s own records) that none of these explain are listed by
:func:`unknown_annotations`, and ``analyze`` prints them.

:func:`training_steps` turns the roles into one row per training step of each consumer
(rank): data wait, compute, checkpoint and other time, whichever spelling gave them.
Times are microseconds (as in the event table).

The vocabulary's modules, by job: :mod:`.roles` (the roles, their spellings and
:func:`classify`), :mod:`.canonical` (the loader's hook, :func:`canonicalize`) and
:mod:`.steps` (epochs and training steps); this module is their one public face.
"""

from __future__ import annotations

# the public names of the modules (``X as X``: re-exported beyond ``__all__``, for code that
# reaches them here, as before the split)
from .canonical import RANK_PIDS_BELOW as RANK_PIDS_BELOW
from .canonical import RunThreads as RunThreads
from .canonical import canonicalize, ensure_roles, marker_spans
from .canonical import run_threads as run_threads
from .canonical import thread_firsts as thread_firsts
from .roles import AI_CONVENTIONS as AI_CONVENTIONS
from .roles import BACKWARD as BACKWARD
from .roles import CKPT_IO as CKPT_IO
from .roles import (
    CKPT_LOAD,
    CKPT_SAVE,
    COMPUTE,
    EPOCH,
    FETCH,
    ITEM,
    LOOP_ROLES,
    ROLES,
    STEP,
    classify,
    has_role,
    role_expr,
    unknown_annotations,
)
from .roles import COMM as COMM
from .roles import DATA_IO as DATA_IO
from .roles import DEVICE as DEVICE
from .roles import DLIO_CATEGORIES as DLIO_CATEGORIES
from .roles import EPOCH_GAP as EPOCH_GAP
from .roles import EVALUATE as EVALUATE
from .roles import FORWARD as FORWARD
from .roles import INIT as INIT
from .roles import INTERNAL as INTERNAL
from .roles import ITEMS as ITEMS
from .roles import OPTIMIZER as OPTIMIZER
from .roles import PREPROCESS as PREPROCESS
from .roles import SAMPLE_READ as SAMPLE_READ
from .roles import TEST as TEST
from .roles import TRAIN as TRAIN
from .steps import STEP_SCHEMA as STEP_SCHEMA
from .steps import epoch_spans, training_step_count, training_steps
from .steps import evaluation_phase as evaluation_phase
from .steps import unmeasured_loop_events as unmeasured_loop_events

__all__ = [
    "CKPT_LOAD",
    "CKPT_SAVE",
    "COMPUTE",
    "EPOCH",
    "FETCH",
    "ITEM",
    "LOOP_ROLES",
    "ROLES",
    "STEP",
    "canonicalize",
    "classify",
    "ensure_roles",
    "epoch_spans",
    "has_role",
    "marker_spans",
    "role_expr",
    "training_step_count",
    "training_steps",
    "unknown_annotations",
    "unmeasured_loop_events",
]
