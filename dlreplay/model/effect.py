"""Overrides that cannot take effect: a ``--set`` of a field that another field decides.

``generate`` and ``replay`` honour some fields only when others allow: a dataset layout that
lists the files' arrays fixes their bytes whatever the record length; an HDF5 chunk shape wins
over a chunk size; a disabled checkpoint writes nothing however large; DLIO's sample order
ignores the file shuffle; a loader without workers has no prefetching. An override of such a
field would change the model file and nothing that is written or replayed, silently, so it is
an error naming the field that wins (:func:`check_effect`).

What each rule knows of the writers and the replay is stated beside it; it follows
``replay.writers`` (which fields of the layout each format's writer reads), ``replay.checkpoint``
and ``replay.plan``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dlreplay.errors import IneffectiveOverride, shown
from dlreplay.model.base import model_error
from dlreplay.model.layout import Layout
from dlreplay.model.sections import WorkloadModel

ARRAY_FORMATS = ("npz", "npy", "hdf5")
IMAGE_FORMATS = ("jpeg", "png")
#: The formats whose files have each layout field (the writers read it for no other).
_LAYOUT_FORMATS: dict[str, tuple[str, ...]] = {
    "compressed": ("npz",),
    "hdf5_chunk_shape": ("hdf5",),
    "hdf5_chunk_bytes": ("hdf5",),
    "hdf5_compression": ("hdf5",),
    "hdf5": ("hdf5",),
    "arrays": ARRAY_FORMATS,
    "images": IMAGE_FORMATS,
    "tables": ("csv", "parquet"),
    "index": ("indexed_binary",),
    "record_bytes": ("tfrecord",),
    "shard_members": ("tar", "arrow"),
    "rows_per_batch": ("arrow",),
}
#: Layout fields the writers read only for files without ``layout.arrays`` (random bytes of the
#: plan's sizes, shaped (samples, record length)); with arrays, the members' own storage,
#: chunks and compression are written.
_WITHOUT_ARRAYS = ("compressed", "compression_level", "hdf5_chunk_shape", "hdf5_chunk_bytes",
                   "hdf5_compression")  # fmt: skip
#: Bytes per pixel of each Pillow mode.
_MODE_BYTES = {"1": 1, "L": 1, "P": 1, "LA": 2, "I;16": 2, "RGB": 3, "RGBA": 4, "CMYK": 4}


def check_effect(before: WorkloadModel, after: WorkloadModel, touched: Mapping[str, str]) -> None:
    """Raise :class:`~dlreplay.errors.IneffectiveOverride` (a ModelError) for the first override in *touched* (field path -> the
    ``KEY=VALUE`` that set it) that changed *before*'s field but cannot change what is
    generated or replayed from *after*: the message names the field that wins."""
    for path, item in touched.items():
        if _value(before, path) == _value(after, path):
            continue  # set to what it was: nothing is asked of it
        hit = shadowed(after, path)
        if hit is not None:
            winner, why = hit
            raise model_error(
                f"override {shown(item)}",
                path,
                f"cannot take effect: {winner} decides ({why})",
                IneffectiveOverride,
            )


def shadowed(model: WorkloadModel, path: str) -> tuple[str, str] | None:
    """(the field that wins, why) when *path* of *model* cannot change what ``generate``
    writes or ``replay`` does; None when it can (or no rule knows)."""
    section = path.split(".", 1)[0]
    if section == "dataset":
        return _dataset(model, path)
    if section == "checkpoint":
        return _checkpoint(model, path)
    if section == "reader":
        return _reader(model, path)
    return None


def _value(model: WorkloadModel, path: str) -> Any:
    node: Any = model
    for key in path.split("."):
        node = getattr(node, key, None)
    return node


def _dataset(model: WorkloadModel, path: str) -> tuple[str, str] | None:
    ds = model.dataset
    fmt, lay = ds.format, ds.layout
    arrays = fmt in ARRAY_FORMATS and bool(lay.arrays)
    if path.startswith("dataset.layout."):
        return _layout(fmt, lay, path.split(".")[2])
    if path == "dataset.file_size":
        return (
            "dataset.record_length x dataset.num_samples_per_file",
            "generate writes num_samples_per_file samples of record_length bytes a file; "
            "file_size only describes the files",
        )
    if path == "dataset.record_length" and arrays:
        return (
            "dataset.layout.arrays",
            f"each {fmt} file holds the arrays it lists ({_arrays_text(lay)}) whatever the record "
            f"length{', which only picks among them' if len(lay.arrays or ()) > 1 else ''}; "
            f"change their shapes, or set dataset.layout.arrays=null as well for files of the plan's "
            f"sizes",
        )
    if path == "dataset.record_length" and fmt in IMAGE_FORMATS and lay.images:
        return _image_bytes(lay, ds.record_length.mean)
    if path == "dataset.num_samples_per_file" and arrays:
        return _samples(lay, fmt)
    return None


def _layout(fmt: str, lay: Layout, name: str) -> tuple[str, str] | None:
    """A layout field's override (``dataset.layout.<name>``)."""
    formats = _LAYOUT_FORMATS.get(name)
    if formats is not None and fmt not in formats:
        return "dataset.format", f"{fmt} files have no {name}; it is read for {', '.join(formats)}"
    if name in _WITHOUT_ARRAYS and fmt in ARRAY_FORMATS and lay.arrays:
        return (
            "dataset.layout.arrays",
            "its members' storage, chunks and compression are what is written",
        )
    if name == "hdf5" and not lay.arrays:
        return "dataset.layout.arrays", "the file-level HDF5 settings are written with its arrays"
    if name == "hdf5_chunk_bytes" and lay.hdf5_chunk_shape:
        return "dataset.layout.hdf5_chunk_shape", "a chunk shape wins over a chunk size"
    if name == "compression_level" and fmt == "hdf5" and lay.hdf5_compression != "gzip":
        return "dataset.layout.hdf5_compression", "only gzip takes a level"
    if name == "records_per_file":
        return "dataset.num_samples_per_file", "generate writes that many records a file"
    if name == "record_bytes":
        return "dataset.record_length", "generate draws each record's size from it"
    return None


def _arrays_text(lay: Layout) -> str:
    structures = lay.arrays or []
    first = structures[0]
    members = ", ".join(f"{m.name or 'array'} {m.shape} {m.dtype}" for m in first.members[:3])
    more = f", and {len(structures) - 1} other structure(s)" if len(structures) > 1 else ""
    size = f": {first.bytes:,} bytes a file" if first.bytes else ""
    return f"{members}{size}{more}"


def _image_bytes(lay: Layout, mean: float | None) -> tuple[str, str] | None:
    """A record length no image of the layout's kinds can code to: its pixels fixed, its
    content only moves the size between a flat image and noise (JPEG at quality 100 codes
    noise to 1.6 times its raw pixels' bytes; three times, and the extra segments and 4 KiB of
    headers, leave room for any codec's overhead)."""
    if mean is None or not math.isfinite(mean):
        return None
    images = lay.images or []
    most = max(
        3 * im.width * im.height * _MODE_BYTES.get(im.mode, 4) * (2 if (im.bits or 8) > 8 else 1)
        + im.extra_bytes
        + 4096
        for im in images
    )
    if mean <= most:
        return None
    im = images[0]
    return (
        "dataset.layout.images",
        f"a {im.width} x {im.height} {im.mode} image codes to at most ~{most:,} bytes, not "
        f"{mean:,.0f}; set dataset.layout.images=null as well for images of the plan's sizes",
    )


def _samples(lay: Layout, fmt: str) -> tuple[str, str] | None:
    """A samples-per-file override of arrays whose sample axis is not first: the writer
    resizes only the arrays whose first axis is the structure's sample count (DLIO's npz and
    npy files hold their samples on the last axis)."""
    for i, s in enumerate(lay.arrays or ()):
        if not s.samples:
            continue  # unknown: which axis holds samples is not known either
        for j, m in enumerate(s.members):
            if m.shape and m.shape[0] != s.samples and s.samples in m.shape[1:]:
                return (
                    f"dataset.layout.arrays[{i}].members[{j}].shape",
                    f"{fmt} member {m.name or 'array'} {m.shape} holds its {s.samples} samples on "
                    f"another axis than the first, which is the one generate resizes",
                )
    return None


def _checkpoint(model: WorkloadModel, path: str) -> tuple[str, str] | None:
    """Checkpoint intervals, as replay.checkpoint takes them: steps, else time, else epochs."""
    ck = model.checkpoint
    if path != "checkpoint.enabled" and not ck.enabled:
        return "checkpoint.enabled", "false: no checkpoint is written"
    epoch_fields = ("checkpoint.epochs_between_checkpoints", "checkpoint.checkpoint_after_epoch")
    if path in epoch_fields and ck.steps_between_checkpoints:
        return "checkpoint.steps_between_checkpoints", "checkpoints follow steps when it is set"
    if path in epoch_fields and ck.time_between_checkpoints:
        return "checkpoint.time_between_checkpoints", "checkpoints follow time when it is set"
    if path == "checkpoint.time_between_checkpoints" and ck.steps_between_checkpoints:
        return "checkpoint.steps_between_checkpoints", "steps win over time"
    return None


def _reader(model: WorkloadModel, path: str) -> tuple[str, str] | None:
    rd = model.reader
    if path == "reader.file_shuffle" and rd.sample_order == "dlio":
        return "reader.sample_order", "dlio: DLIO's sampler orders samples, files unshuffled"
    shuffles = [rd.sample_shuffle] + ([rd.file_shuffle] if rd.sample_order != "dlio" else [])
    if path == "reader.shuffle_seed" and all(s == "off" for s in shuffles):
        return "reader.sample_shuffle", "off (and the file shuffle): nothing is shuffled"
    workers_only = ("reader.prefetch_factor", "reader.persistent_workers",
                    "reader.multiprocessing_context")  # fmt: skip
    if path in workers_only and rd.read_threads == 0:
        return "reader.read_threads", "0: samples are read in the training process, no workers"
    return None
