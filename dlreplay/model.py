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

Public API: :class:`WorkloadModel` and its sections, :class:`Distribution`,
:func:`load_model`, :func:`save_model`, :func:`model_to_dict`,
:func:`model_from_dict`, :func:`apply_overrides`, :func:`summarize_model`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import numbers
import os
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar, Union

import numpy as np
import yaml

from dlreplay.errors import ArtifactVersionError, ModelError
from dlreplay.osutil import atomic_write_text
from dlreplay.units import human_bytes

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
    "ModelInfo",
    "ModelVersionError",
    "Parallelism",
    "Processes",
    "Provenance",
    "Reader",
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

MODEL_SCHEMA_NAME = "dlreplay.workload"
MODEL_FORMAT_VERSION = 1

#: Dataset file formats (DLIO's names; ``raw`` = headerless binary records).
FORMATS = ("npz", "npy", "hdf5", "jpeg", "png", "tfrecord", "csv", "indexed_binary", "parquet", "raw")
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
DISTRIBUTION_TYPES = ("fixed", "normal", "uniform", "gamma", "exponential", "poisson", "empirical", "unknown")

#: The parameters that define each distribution family (everything else is descriptive).
_DIST_PARAMS: dict[str, tuple[str, ...]] = {
    "fixed": ("value",),
    "normal": ("mean", "stdev"),
    "uniform": ("min", "max"),
    "gamma": ("shape", "scale"),
    "exponential": ("scale",),
    "poisson": ("lam",),
    "empirical": ("quantiles",),
    "unknown": (),
}
_TYPE_SPECIFIC = {"value": ("fixed",), "shape": ("gamma",), "scale": ("gamma", "exponential"), "lam": ("poisson",)}
_QUANTILE_KEY = re.compile(r"^p(\d+(?:\.\d+)?)$")
#: Quantiles :meth:`Distribution.from_values` records (percent).
DEFAULT_QUANTILES = (25, 50, 75, 90, 99)
#: Slack allowed when access-pattern fractions add up (floating point).
ACCESS_FRACTION_TOLERANCE = 1e-9
_DEFAULT_METHOD = "dlreplay default (not given)"


# --------------------------------------------------------------------------- errors


class ModelVersionError(ModelError, ArtifactVersionError):
    """A model file names another schema or a newer ``format_version``.

    Both a :class:`ModelError` (the model cannot be used) and an
    :class:`ArtifactVersionError` (the artifact is of another kind or version).
    """


class _Invalid(ModelError):
    """A cross-field problem found while constructing a section; ``subpath`` is relative."""

    def __init__(self, subpath: str, message: str) -> None:
        super().__init__(f"{subpath}: {message}")
        self.subpath = subpath
        self.message = message


def _error(source: str, path: str, message: str, cls: type[ModelError] = ModelError) -> ModelError:
    err = cls(f"{source}: {path}: {message}")
    err.source = source  # type: ignore[attr-defined]
    err.field_path = path  # type: ignore[attr-defined]
    return err


def _describe(value: Any) -> str:
    """How a bad value is shown in an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return repr(value)
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"


def _meta(check: str | None = None, choices: tuple[str, ...] | None = None, doc: str = "") -> dict[str, Any]:
    return {"check": check, "choices": choices, "doc": doc}


def _f(default: Any = MISSING, *, factory: Any = None, check: str | None = None,
       choices: tuple[str, ...] | None = None, doc: str = "") -> Any:
    """A dataclass field with validation metadata (``check``: positive | nonneg | fraction)."""
    md = _meta(check, choices, doc)
    if factory is not None:
        return field(default_factory=factory, metadata=md)
    if default is MISSING:
        return field(metadata=md)
    return field(default=default, metadata=md)


def _finite(x: float | None) -> bool:
    return x is None or math.isfinite(x)


# --------------------------------------------------------------------------- Distribution


def _quantile_percent(key: str) -> float | None:
    m = _QUANTILE_KEY.match(key)
    if not m:
        return None
    q = float(m.group(1))
    return q if 0.0 < q < 100.0 else None


def _quantile_key(q: float) -> str:
    return f"p{q:g}"


@dataclass(frozen=True, kw_only=True)
class Distribution:
    """A quantity that varies: sizes in bytes or durations in seconds (the field says which).

    ``type`` picks the family and which parameters define it:

    * ``fixed``: ``value``;
    * ``normal``: ``mean``, ``stdev``;
    * ``uniform``: ``min``, ``max``;
    * ``gamma``: ``shape`` (k), ``scale`` (theta), mean = k * theta;
    * ``exponential``: ``scale`` (= mean);
    * ``poisson``: ``lam`` (= mean);
    * ``empirical``: ``quantiles`` (e.g. ``{"p25": .., "p50": .., "p99": ..}``) between
      ``min`` and ``max``; sampled by interpolating the quantile function;
    * ``unknown``: nothing is known; :meth:`sample` refuses.

    ``mean`` and ``stdev`` of the parametric families are derived from their
    parameters (filled in when omitted, checked when given). For ``normal``,
    ``gamma``, ``exponential`` and ``poisson``, ``min``/``max`` are optional bounds
    that :meth:`sample` clips to; ``quantiles`` may describe the data a family was
    fitted to.
    """

    type: str = _f("unknown", choices=DISTRIBUTION_TYPES, doc="distribution family")
    value: float | None = _f(None, doc="the value of a fixed distribution")
    shape: float | None = _f(None, check="positive", doc="gamma shape k")
    scale: float | None = _f(None, check="positive", doc="gamma/exponential scale theta")
    lam: float | None = _f(None, check="nonneg", doc="poisson rate (= mean)")
    mean: float | None = _f(None, doc="mean (same unit as the quantity)")
    stdev: float | None = _f(None, check="nonneg", doc="standard deviation")
    min: float | None = _f(None, doc="smallest value / lower bound")
    max: float | None = _f(None, doc="largest value / upper bound")
    quantiles: dict[str, float] | None = _f(None, doc="percentiles, keys p<percent> (p50 = median)")

    _track_defaults: ClassVar[bool] = False
    _omit_none: ClassVar[bool] = True

    def __post_init__(self) -> None:
        for name in ("mean", "stdev", "min", "max", "value", "shape", "scale", "lam"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, float):
                object.__setattr__(self, name, float(v))
        if self.quantiles is not None:
            ordered = sorted(self.quantiles.items(), key=lambda kv: _quantile_percent(kv[0]) or 0.0)
            object.__setattr__(self, "quantiles", {k: float(v) for k, v in ordered})
        self._fill_derived()
        problems = self.problems()
        if problems:
            raise _Invalid(*problems[0])

    # -- construction helpers -------------------------------------------------

    @classmethod
    def fixed(cls, v: float) -> Distribution:
        """Always *v*."""
        return cls(type="fixed", value=float(v))

    @classmethod
    def unknown(cls) -> Distribution:
        """Nothing is known about the quantity."""
        return cls(type="unknown")

    @classmethod
    def from_values(cls, values: Iterable[float] | np.ndarray,
                    quantiles: Iterable[float] = DEFAULT_QUANTILES) -> Distribution:
        """An ``empirical`` distribution of observed *values*.

        Records mean, population stdev (ddof 0), min, max and the given
        percentiles (linear interpolation). Raises :class:`ModelError` for no
        values or non-finite ones.
        """
        arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float).ravel()
        if arr.size == 0:
            raise ModelError("Distribution.from_values: no values given")
        if not np.all(np.isfinite(arr)):
            raise ModelError("Distribution.from_values: values must be finite numbers")
        qs = sorted(float(q) for q in quantiles)
        points = np.percentile(arr, qs) if qs else []
        return cls(
            type="empirical",
            mean=float(arr.mean()),
            stdev=float(arr.std()),
            min=float(arr.min()),
            max=float(arr.max()),
            quantiles={_quantile_key(q): float(p) for q, p in zip(qs, points, strict=True)},
        )

    # -- queries --------------------------------------------------------------

    @property
    def is_known(self) -> bool:
        """False for ``unknown`` (nothing to sample from)."""
        return self.type != "unknown"

    def sample(self, rng: np.random.Generator, n: int, stratified: bool = False) -> np.ndarray:
        """*n* draws as a float64 array. ``unknown`` raises :class:`ModelError`.

        *stratified* (``empirical`` only): one draw from each of *n* equal-probability strata,
        in random order (Latin hypercube sampling): the same distribution, but the sum of the
        *n* draws stays close to *n* times the mean, as an epoch of a job spends its steps'
        mean, where independent draws of a wide distribution would move it by several %."""
        if n < 0:
            raise ModelError(f"Distribution.sample: n must be >= 0, got {n}")
        t = self.type
        if t == "unknown":
            raise ModelError("cannot sample an unknown distribution; measure it or set it (e.g. with an override)")
        if t == "empirical":
            return self._sample_empirical(rng, n, stratified)
        p = _Params(self)  # validated: the parameters of this family are set
        if t == "fixed":
            return np.full(n, p.value, dtype=float)
        if t == "uniform":
            return rng.uniform(p.min, p.max, n)
        if t == "normal":
            out = rng.normal(p.mean, p.stdev, n)
        elif t == "gamma":
            out = rng.gamma(p.shape, p.scale, n)
        elif t == "exponential":
            out = rng.exponential(p.scale, n)
        else:  # poisson
            out = rng.poisson(p.lam, n).astype(float)
        if self.min is not None or self.max is not None:
            out = np.clip(out, self.min, self.max)
        return out

    def quantile(self, probs: np.ndarray | Sequence[float]) -> np.ndarray:
        """The values at probabilities *probs* (0..1) of an ``empirical`` distribution (its
        piecewise-linear quantile function, as :meth:`sample` draws from it)."""
        if self.type != "empirical":
            raise ModelError(f"Distribution.quantile: defined for empirical distributions, not {self.type}")
        knots, vals = self._quantile_function()
        return np.interp(np.asarray(probs, dtype=float), knots, vals)

    def _sample_empirical(self, rng: np.random.Generator, n: int, stratified: bool = False) -> np.ndarray:
        probs, vals = self._quantile_function()
        u = (rng.permutation(n) + rng.uniform(0.0, 1.0, n)) / max(n, 1) if stratified else rng.uniform(0.0, 1.0, n)
        gamma = self._segment_exponent(probs, vals)
        if gamma is None:
            return np.interp(u, probs, vals)
        p, v = np.asarray(probs), np.asarray(vals)
        i = np.clip(np.searchsorted(p, u, side="right") - 1, 0, len(p) - 2)
        width = p[i + 1] - p[i]
        t = np.divide(u - p[i], width, out=np.zeros_like(u), where=width > 0)
        return v[i] + (v[i + 1] - v[i]) * np.clip(t, 0.0, 1.0) ** gamma

    def _segment_exponent(self, probs: list[float], vals: list[float]) -> float | None:
        """The shape of the quantile function between its knots (``min``, the quantiles, ``max``):
        ``Q = v_i + (v_i+1 - v_i) t^g`` over each segment's probabilities t in [0, 1], one g for all,
        such that the distribution's mean is the recorded ``mean`` (the knots stay where they are).
        Straight lines (g = 1) give each segment the midpoint of its values: with a long tail, such
        as times stretched by preemption, the sampled mean came out tens of percent high. Any mean
        of data with these quantiles lies between the segments' lower and upper ends, where g
        exists. None: straight lines (no mean recorded, or they already give it)."""
        mean = self.mean
        if mean is None or len(probs) < 2:
            return None
        dp, v = np.diff(np.asarray(probs)), np.asarray(vals)
        low = float(np.sum(dp * v[:-1]))  # the mean with every segment at its lower end
        rise = float(np.sum(dp * np.diff(v)))  # ... plus this at its upper end
        if rise <= 0:
            return None
        frac = min(max((mean - low) / rise, 1.0 / 1001.0), 1000.0 / 1001.0)  # g in [1/1000, 1000]
        gamma = 1.0 / frac - 1.0
        return None if abs(gamma - 1.0) < 1e-9 else gamma

    def _quantile_function(self) -> tuple[list[float], list[float]]:
        """Knots (probability, value) of the piecewise-linear quantile function."""
        qs = [(_quantile_percent(k) or 0.0, v) for k, v in (self.quantiles or {}).items()]
        probs = [q / 100.0 for q, _ in qs]
        vals = [v for _, v in qs]
        lo = self.min if self.min is not None else vals[0]
        hi = self.max if self.max is not None else vals[-1]
        return [0.0, *probs, 1.0], [lo, *vals, hi]

    # -- validation -------------------------------------------------------------

    def _fill_derived(self) -> None:
        """Fill mean/stdev of parametric families from their parameters when omitted."""
        derived = self._derived()
        if derived is None:
            return
        if self.type == "fixed" and self.value is None and self.mean is not None:
            object.__setattr__(self, "value", self.mean)
            derived = self._derived()
        for name, v in zip(("mean", "stdev"), derived or (None, None), strict=True):
            if getattr(self, name) is None and v is not None and math.isfinite(v):
                object.__setattr__(self, name, float(v))

    def _derived(self) -> tuple[float | None, float | None] | None:
        t = self.type
        try:
            if t == "fixed":
                return (self.value, 0.0 if self.value is not None else None)
            if t == "uniform" and self.min is not None and self.max is not None and self.min <= self.max:
                return ((self.min + self.max) / 2.0, (self.max - self.min) / math.sqrt(12.0))
            if t == "gamma" and self.shape is not None and self.scale is not None and self.shape > 0:
                return (self.shape * self.scale, math.sqrt(self.shape) * self.scale)
            if t == "exponential" and self.scale is not None:
                return (self.scale, self.scale)
            if t == "poisson" and self.lam is not None and self.lam >= 0:
                return (self.lam, math.sqrt(self.lam))
        except (OverflowError, ValueError):
            return None
        return None

    def problems(self) -> list[tuple[str, str]]:
        """(sub-field, message) for everything wrong with this distribution."""
        out: list[tuple[str, str]] = []
        t = self.type
        if t not in DISTRIBUTION_TYPES:
            return [("type", f"expected one of {', '.join(DISTRIBUTION_TYPES)}, got {_describe(t)}")]
        for name in ("mean", "stdev", "min", "max", "value", "shape", "scale", "lam"):
            if not _finite(getattr(self, name)):
                out.append((name, f"expected a finite number, got {getattr(self, name)!r}"))
        if out:
            return out
        for name, allowed in _TYPE_SPECIFIC.items():
            if getattr(self, name) is not None and t not in allowed:
                out.append((name, f"only applies to type {' or '.join(allowed)}, not {t}"))
        for name in _DIST_PARAMS[t]:
            if getattr(self, name) is None:
                out.append((name, f"missing required field for a {t} distribution"))
        if out:
            return out
        if self.stdev is not None and self.stdev < 0:
            out.append(("stdev", f"expected a non-negative number, got {self.stdev!r}"))
        if self.min is not None and self.max is not None and self.min > self.max:
            out.append(("max", f"expected max >= min ({self.min!r}), got {self.max!r}"))
        if t == "gamma" and (self.shape <= 0 or self.scale <= 0):  # type: ignore[operator]
            out.append(("shape" if self.shape <= 0 else "scale", "expected a positive number"))  # type: ignore[operator]
        if t == "exponential" and self.scale <= 0:  # type: ignore[operator]
            out.append(("scale", f"expected a positive number, got {self.scale!r}"))
        if t == "poisson" and self.lam < 0:  # type: ignore[operator]
            out.append(("lam", f"expected a non-negative number, got {self.lam!r}"))
        out.extend(self._quantile_problems())
        out.extend(self._derived_problems())
        return out

    def _quantile_problems(self) -> list[tuple[str, str]]:
        if self.quantiles is None:
            return []
        out: list[tuple[str, str]] = []
        if self.type == "empirical" and not self.quantiles:
            out.append(("quantiles", "expected at least one quantile for an empirical distribution"))
        prev: float | None = None
        for key, v in self.quantiles.items():
            if _quantile_percent(key) is None:
                out.append((f"quantiles.{key}", "expected a key p<percent> with 0 < percent < 100, e.g. p50"))
                continue
            if not math.isfinite(v):
                out.append((f"quantiles.{key}", f"expected a finite number, got {v!r}"))
            elif prev is not None and v < prev:
                out.append((f"quantiles.{key}", f"expected quantiles that do not decrease, got {v!r} after {prev!r}"))
            elif self.type == "empirical" and ((self.min is not None and v < self.min)
                                               or (self.max is not None and v > self.max)):
                out.append((f"quantiles.{key}", f"expected a value between min and max, got {v!r}"))
            prev = v
        return out

    def _derived_problems(self) -> list[tuple[str, str]]:
        derived = self._derived()
        if derived is None:
            return []
        params = " and ".join(_DIST_PARAMS[self.type])
        out = []
        for name, expected in zip(("mean", "stdev"), derived, strict=True):
            given = getattr(self, name)
            if expected is None or given is None:
                continue
            if not math.isclose(given, expected, rel_tol=1e-9, abs_tol=1e-12):
                out.append((name, f"is derived from {params} for a {self.type} distribution "
                                  f"(expected {expected!r}, got {given!r}); set {params} instead"))
        return out

    def nonneg_problems(self) -> list[tuple[str, str]]:
        """Problems if this distribution is of a quantity that cannot be negative."""
        out = []
        for name in ("value", "mean", "min"):
            v = getattr(self, name)
            if v is not None and v < 0:
                out.append((name, f"expected a non-negative number, got {v!r}"))
        for key, v in (self.quantiles or {}).items():
            if v < 0:
                out.append((f"quantiles.{key}", f"expected a non-negative number, got {v!r}"))
        return out


class _Params:
    """A distribution's parameters as plain floats (for sampling a validated distribution)."""

    def __init__(self, d: Distribution) -> None:
        for name in ("value", "mean", "stdev", "min", "max", "shape", "scale", "lam"):
            v = getattr(d, name)
            setattr(self, name, float(v) if v is not None else math.nan)

    value: float
    mean: float
    stdev: float
    min: float
    max: float
    shape: float
    scale: float
    lam: float


# --------------------------------------------------------------------------- sections


#: Where a dataset layout came from: a fingerprint of the real files, inference from a
#: trace's reads, a DLIO config, or a user's edit.
LAYOUT_SOURCES = ("fingerprint", "inferred", "dlio", "user")
#: Where an indexed_binary file's record offsets and sizes are (:attr:`Layout.index`).
INDEX_STYLES = ("dlreplay", "dlio")
#: How an array is stored: NPZ members (``stored`` | ``deflated``), HDF5 datasets
#: (``contiguous`` | ``chunked`` | ``compact``).
ARRAY_STORAGE = ("stored", "deflated", "contiguous", "chunked", "compact")
#: File order of an HDF5 dataset's chunks relative to their logical (row-major) order.
CHUNK_ORDERS = ("sequential", "scattered")
#: JPEG chroma subsampling (Pillow's names).
SUBSAMPLINGS = ("4:4:4", "4:2:2", "4:2:0")


@dataclass(frozen=True, kw_only=True)
class ArrayMember:
    """One array inside a dataset file: an NPZ member, an HDF5 dataset, an NPY file's array.

    Sizes are in elements (``shape``, ``chunks``) or bytes; ``compression_ratio`` is
    stored bytes / logical bytes (how well the content compressed, e.g. 0.12).
    """

    name: str = _f(doc="NPZ member name (x.npy), HDF5 dataset path (/group/x); NPY: empty")
    dtype: str = _f(doc="numpy dtype string (<f4, |u1, |S16); HDF5 variable-length strings: vlen-str")
    shape: list[int] = _f(check="nonneg", doc="shape in elements; the sample axis first when there is one")
    fortran_order: bool = _f(False, doc="NPY/NPZ: column-major data")
    storage: str | None = _f(None, choices=ARRAY_STORAGE, doc="stored | deflated (NPZ); contiguous | chunked | "
                                                              "compact (HDF5)")
    chunks: list[int] | None = _f(None, check="positive", doc="HDF5 chunk shape in elements")
    compression: str | None = _f(None, doc="deflate (NPZ); HDF5 filter gzip | lzf | szip | ...; null = none")
    compression_level: int | None = _f(None, check="nonneg", doc="deflate/gzip level 0..9 (estimated for NPZ)")
    compression_ratio: float | None = _f(None, check="positive", doc="stored bytes / logical bytes")
    shuffle: bool = _f(False, doc="HDF5 byte-shuffle filter")
    fletcher32: bool = _f(False, doc="HDF5 checksum filter")
    scaleoffset: int | None = _f(None, doc="HDF5 scale-offset filter parameter")
    fill_value: float | None = _f(None, doc="HDF5 fill value (numbers only)")
    chunk_order: str | None = _f(None, choices=CHUNK_ORDERS, doc="HDF5: chunks in the file in logical order or "
                                                                 "scattered (written out of order)")
    chunks_allocated: float | None = _f(None, check="fraction", doc="HDF5: fraction of chunks written (sparse)")
    track_times: bool = _f(False, doc="HDF5: object modification times in the header")
    zip64: bool = _f(False, doc="NPZ: the local header carries a zip64 extra field (numpy always writes one)")
    attributes: int = _f(0, check="nonneg", doc="HDF5 attributes on the dataset")
    attribute_bytes: int = _f(0, check="nonneg", doc="bytes of those attributes' values")
    vlen_attributes: int = _f(0, check="nonneg", doc="of those, variable-length (strings: a global heap)")

    _track_defaults: ClassVar[bool] = False
    _omit_defaults: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class ArrayFile:
    """One structure of an array file (NPZ, NPY, HDF5) and the share of files that have it."""

    weight: float = _f(1.0, check="fraction", doc="share of the sampled files with this structure")
    bytes: int | None = _f(None, check="nonneg", doc="file size (median of those files)")
    file_bytes: list[int] | None = _f(None, check="nonneg", doc="sizes of the sampled files with this structure")
    samples: int | None = _f(None, check="positive", doc="samples in such a file (the sample axis' length)")
    members: list[ArrayMember] = _f(factory=list, doc="arrays in file order")
    groups: list[str] = _f(factory=list, doc="HDF5 groups other than the root")

    _track_defaults: ClassVar[bool] = False
    _omit_defaults: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class Hdf5File:
    """File-level HDF5 settings that move metadata and data in the file."""

    superblock_version: int | None = _f(None, check="nonneg", doc="0/1: libver earliest; 2: v108; 3: v110+")
    userblock_size: int = _f(0, check="nonneg", doc="bytes before the superblock")
    alignment_interval: int | None = _f(None, check="positive",
                                        doc="data addresses are multiples of this (H5Pset_alignment), bytes")
    alignment_threshold: int | None = _f(None, check="nonneg", doc="objects at least this large are aligned, bytes")
    meta_block_size: int | None = _f(None, check="positive",
                                     doc="metadata block size (H5Pset_meta_block_size), bytes; None: HDF5's 2048")
    file_space_strategy: str | None = _f(None, doc="fsm_aggr | page | aggr | none (H5Pset_file_space_strategy)")
    file_space_page_size: int | None = _f(None, check="positive", doc="page size of paged aggregation, bytes")
    root_attributes: int = _f(0, check="nonneg")
    root_attribute_bytes: int = _f(0, check="nonneg")
    root_vlen_attributes: int = _f(0, check="nonneg", doc="variable-length (string) root attributes")

    _track_defaults: ClassVar[bool] = False
    _omit_defaults: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class ImageFile:
    """One kind of image file (JPEG, PNG) and the share of files that look like it."""

    weight: float = _f(1.0, check="fraction", doc="share of the sampled files")
    bytes: int | None = _f(None, check="nonneg", doc="file size (median)")
    file_bytes: list[int] | None = _f(None, check="nonneg", doc="sizes of the sampled files of this kind")
    width: int = _f(check="positive", doc="pixels")
    height: int = _f(check="positive", doc="pixels")
    mode: str = _f("RGB", doc="Pillow mode: L, LA, RGB, RGBA, P, CMYK, I;16")
    bits: int | None = _f(None, check="positive", doc="PNG bit depth per channel (palette images: 1, 2, 4 or 8)")
    quality: int | None = _f(None, check="positive", doc="JPEG quality 1..100 (estimated from the tables)")
    qtables: list[list[int]] | None = _f(None, check="positive", doc="JPEG quantization tables (64 each)")
    subsampling: str | None = _f(None, choices=SUBSAMPLINGS, doc="JPEG chroma subsampling")
    progressive: bool = _f(False, doc="JPEG progressive scans")
    optimize: bool = _f(False, doc="JPEG optimized (non-standard) Huffman tables")
    restart_interval: int = _f(0, check="nonneg", doc="JPEG restart interval (MCUs; 0 = none)")
    interlaced: bool = _f(False, doc="PNG Adam7 interlacing")
    chunk_bytes: int | None = _f(None, check="positive", doc="PNG: bytes per IDAT chunk (the largest)")
    compression_ratio: float | None = _f(None, check="positive", doc="PNG: IDAT bytes / raw pixel bytes")
    extra_bytes: int = _f(0, check="nonneg", doc="metadata segments/chunks (EXIF, ICC, text), bytes")

    _track_defaults: ClassVar[bool] = False
    _omit_defaults: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class TableColumn:
    """One column of a Parquet/CSV file."""

    name: str = _f()
    type: str = _f(doc="Parquet physical/logical type (e.g. double, int64, binary); CSV: str")
    compression: str | None = _f(None, doc="Parquet codec (snappy, zstd, gzip, ...); null = uncompressed")
    dictionary: bool = _f(False, doc="Parquet dictionary encoding")
    row_bytes: float | None = _f(None, check="nonneg", doc="Parquet: uncompressed bytes per row of this column")

    _track_defaults: ClassVar[bool] = False
    _omit_defaults: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class TableFile:
    """One structure of a table file (Parquet row groups and columns; CSV lines)."""

    weight: float = _f(1.0, check="fraction")
    bytes: int | None = _f(None, check="nonneg")
    file_bytes: list[int] | None = _f(None, check="nonneg", doc="sizes of the sampled files with this structure")
    rows: int | None = _f(None, check="nonneg")
    row_groups: int | None = _f(None, check="positive", doc="Parquet row groups per file")
    data_page_size: int | None = _f(None, check="positive",
                                    doc="Parquet data page size, uncompressed bytes: where the writer cut pages (the "
                                        "smallest pages of a column with several per chunk)")
    data_page_values: int | None = _f(None, check="positive",
                                      doc="Parquet values per data page of that column (a wide column's page holds at "
                                          "least the writer's batch of values)")
    data_page_batch: int | None = _f(None, check="positive",
                                     doc="Parquet values the writer added at a time (it checks the page size "
                                         "after each batch)")
    data_page_version: int | None = _f(None, check="positive", doc="Parquet data page format, 1 or 2")
    compression_ratio: float | None = _f(None, check="positive", doc="Parquet compressed / uncompressed bytes")
    columns: list[TableColumn] = _f(factory=list)
    header: bool = _f(False, doc="CSV: the first line names the columns")
    delimiter: str | None = _f(None, doc="CSV field delimiter")
    line_bytes: Distribution | None = _f(None, check="nonneg", doc="CSV bytes per line, newline included")

    _track_defaults: ClassVar[bool] = False
    _omit_defaults: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Per-format facts about how samples sit in files, that shape the I/O.

    The first six fields are the summary DLIO can express. The rest describe the
    files' inside as a dataset fingerprint saw it (``source: fingerprint``), as a trace's
    reads suggest (``inferred``) or as a config states: the structures observed, each
    with its share of files (``weight``) when files differ. ``generate`` reproduces them
    with the formats' own libraries; null = unknown (the generator's defaults).
    """

    compressed: bool = _f(False, doc="npz: members deflate-compressed (np.savez_compressed)")
    compression_level: int | None = _f(None, check="nonneg", doc="compressor level (gzip 0..9)")
    hdf5_chunk_shape: list[int] | None = _f(None, check="positive", doc="HDF5 chunk shape in elements; null = contiguous")
    hdf5_chunk_bytes: int | None = _f(None, check="positive", doc="HDF5 chunk size in bytes (DLIO chunk_size)")
    hdf5_compression: str | None = _f(None, doc="HDF5 filter (gzip, lzf, ...); null = none")
    records_per_file: int | None = _f(None, check="positive",
                                      doc="physical records per file when not num_samples_per_file")
    source: str | None = _f(None, choices=LAYOUT_SOURCES, doc="where the fields below come from")
    files_sampled: int | None = _f(None, check="nonneg", doc="dataset files the fingerprint read")
    arrays: list[ArrayFile] | None = _f(None, doc="npz/npy/hdf5: file structures, most common first")
    hdf5: Hdf5File | None = _f(None, doc="HDF5 file-level settings")
    images: list[ImageFile] | None = _f(None, doc="jpeg/png: kinds of images, most common first")
    tables: list[TableFile] | None = _f(None, doc="parquet/csv: file structures")
    record_bytes: Distribution | None = _f(None, check="nonneg", doc="tfrecord: payload bytes per record")
    index: str | None = _f(None, choices=INDEX_STYLES,
                           doc="indexed_binary: the record index; dlreplay: <file>.idx of (offset, length) "
                               "pairs, read per sample; dlio: DLIO 2.0's <file>.off.idx and <file>.sz.idx "
                               "(8-byte offsets and sizes), each read whole by every reader when it starts; "
                               "null = dlreplay")

    # Unset fields are not written; their provenance is the one distill records for the
    # layout (``dataset.layout``), not one default per absent field.
    _omit_none: ClassVar[bool] = True
    _track_defaults: ClassVar[bool] = False


@dataclass(frozen=True, kw_only=True)
class Dataset:
    """The training dataset's shape (DLIO ``dataset``)."""

    format: str = _f(choices=FORMATS, doc="file format")
    num_files: int = _f(check="positive", doc="training files (DLIO num_files_train)")
    num_samples_per_file: int = _f(check="positive", doc="samples per file")
    record_length: Distribution = _f(check="nonneg", doc="bytes per sample")
    file_size: Distribution = _f(factory=Distribution.unknown, check="nonneg", doc="bytes per file")
    num_files_eval: int = _f(0, check="nonneg", doc="evaluation files")
    num_subfolders: int = _f(0, check="nonneg", doc="subfolders the training files are spread over")
    data_folder: str | None = _f(None, doc="where the dataset lives")
    record_length_resize: int | None = _f(None, check="nonneg",
                                          doc="bytes per sample after the reader's resize (memory, not I/O)")
    layout: Layout = _f(factory=Layout, doc="format-specific layout")


@dataclass(frozen=True, kw_only=True)
class AccessPattern:
    """Read access pattern on dataset files, as fractions (0..1) of read calls, as Darshan counts them.

    ``sequential``: offset after the previous read's; ``consecutive`` (a subset of
    sequential): offset exactly at the previous read's end; ``random``: neither.
    ``null`` = unknown.
    """

    sequential: float | None = _f(None, check="fraction")
    consecutive: float | None = _f(None, check="fraction")
    random: float | None = _f(None, check="fraction")

    def __post_init__(self) -> None:
        tol = ACCESS_FRACTION_TOLERANCE
        if self.sequential is not None and self.consecutive is not None and self.consecutive > self.sequential + tol:
            raise _Invalid("consecutive", f"expected at most sequential ({self.sequential!r}), "
                                          f"got {self.consecutive!r} (consecutive reads are sequential)")
        if self.sequential is not None and self.random is not None and self.sequential + self.random > 1 + tol:
            raise _Invalid("random", f"expected sequential + random <= 1, got {self.sequential!r} + {self.random!r}")


@dataclass(frozen=True, kw_only=True)
class MetadataPerSample:
    """Metadata calls on dataset files per sample read (averages; ``null`` = unknown)."""

    opens: float | None = _f(None, check="nonneg")
    closes: float | None = _f(None, check="nonneg")
    stats: float | None = _f(None, check="nonneg")
    lseeks: float | None = _f(None, check="nonneg")


@dataclass(frozen=True, kw_only=True)
class Reader:
    """How the data loader reads the dataset (DLIO ``reader``)."""

    data_loader: str = _f("pytorch", choices=DATA_LOADERS)
    worker_kind: str = _f("process", choices=WORKER_KINDS)
    batch_size: int = _f(1, check="positive", doc="samples per training batch")
    batch_size_eval: int = _f(1, check="positive", doc="samples per evaluation batch")
    read_threads: int = _f(1, check="nonneg", doc="loader workers per rank (0 = the main process reads)")
    computation_threads: int = _f(1, check="positive", doc="preprocessing threads per rank")
    prefetch_factor: int = _f(2, check="nonneg", doc="batches prefetched per worker (PyTorch); tf.data buffer")
    file_shuffle: str = _f("off", choices=SHUFFLE_MODES)
    sample_shuffle: str = _f("off", choices=SHUFFLE_MODES)
    shuffle_seed: int | None = _f(None, doc="seed of seeded shuffling")
    shuffle_size: int | None = _f(None, check="positive", doc="shuffle buffer in samples (tf.data)")
    open_per_sample: bool = _f(True, doc="open/close the file for every sample (else keep files open)")
    multiprocessing_context: str = _f("fork", choices=MP_CONTEXTS,
                                      doc="how loader worker processes start (PyTorch multiprocessing_context, "
                                          "DLIO reader.multiprocessing_context): fork, spawn (a new interpreter "
                                          "per worker, importing the job's modules again at every start) or "
                                          "forkserver")
    persistent_workers: bool = _f(False, doc="keep loader workers across epochs (PyTorch persistent_workers); "
                                             "false: new workers every epoch, as PyTorch's default")
    memory_map: bool = _f(False, doc="indexed_binary: the job's reader maps each file (mmap) and takes its "
                                      "records from the mapping, without read calls (DLIO's "
                                      "mmap_indexed_binary reader, whose samples are views it never touches)")
    file_buffering: str = _f("buffered", choices=FILE_BUFFERINGS,
                             doc="how the job's Dataset handed files to the format's library (npz, npy, jpeg, "
                                 "png): buffered = by path or a default Python file (a few large reads), "
                                 "unbuffered = an unbuffered file object (every library read is one read call)")
    batch_tensors: int = _f(1, check="positive",
                            doc="tensors in each batch the loader hands over (image, label, mask, ...: PyTorch "
                                "moves each one from a worker to the training process through shared memory, "
                                "one file-descriptor handover per tensor); measured by dlreplay capture")
    pin_memory: bool = _f(False, doc="copy batches into page-locked memory (PyTorch pin_memory; only with a GPU)")
    drop_last: bool = _f(False, doc="drop each epoch's last batch when it is smaller than batch_size")
    sample_order: str = _f("pytorch", choices=SAMPLE_ORDERS,
                           doc="pytorch: rank r reads files r::N, shuffled anew every epoch as file_shuffle and "
                               "sample_shuffle say (PyTorch's RandomSampler); dlio: DLIO 2.0's PyTorch sampler "
                               "(rank r reads a contiguous block of samples, file_shuffle ignored, the seeded "
                               "sample shuffle re-applied to the previous epoch's order, whole batches only)")
    transfer_size: Distribution = _f(factory=Distribution.unknown, check="nonneg",
                                     doc="bytes per read call on dataset files")
    preprocess_time: Distribution = _f(factory=lambda: Distribution.fixed(0.0), check="nonneg",
                                       doc="seconds of preprocessing per sample")
    preprocess_host_cpu: Distribution = _f(factory=lambda: Distribution.fixed(0.0), check="nonneg",
                                           doc="CPU seconds a loader worker spends per sample, the library's "
                                               "read and decode included (measured by dlreplay capture): the "
                                               "replay's worker spends what its own read and decode did not, "
                                               "inside preprocess_time, which is slept for the rest. 0 = the "
                                               "preprocessing is a sleep (DLIO)")
    access_pattern: AccessPattern = _f(factory=AccessPattern)
    metadata_per_sample: MetadataPerSample = _f(factory=MetadataPerSample)


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """Periodic evaluation passes (DLIO ``evaluation``)."""

    every_n_epochs: int = _f(1, check="positive", doc="DLIO epochs_between_evals")
    after_epoch: int = _f(1, check="nonneg", doc="first epoch (1-based) after which to evaluate")
    steps: int | None = _f(None, check="positive", doc="steps per evaluation; null = the whole eval set")
    computation_time: Distribution = _f(factory=lambda: Distribution.fixed(0.0), check="nonneg",
                                        doc="seconds per evaluation step (DLIO eval_time)")


@dataclass(frozen=True, kw_only=True)
class Train:
    """The training loop (DLIO ``train``)."""

    enabled: bool = _f(True, doc="false = no training loop (e.g. a checkpoint-only workload)")
    epochs: int = _f(1, check="positive")
    steps_per_epoch: int | None = _f(None, check="positive", doc="null = as many as the dataset gives")
    total_training_steps: int | None = _f(None, check="positive", doc="stop after this many steps in all")
    computation_time: Distribution = _f(factory=lambda: Distribution.fixed(0.0), check="nonneg",
                                        doc="seconds of compute per training step (steady state)")
    computation_host_cpu: Distribution = _f(factory=lambda: Distribution.fixed(0.0), check="nonneg",
                                            doc="CPU seconds the training process spends on the host per "
                                                "training step, all its threads (steady state; warm-up steps "
                                                "spend the same share of their compute time): spent inside the "
                                                "step's computation_time, which is slept for the rest. 0 = the "
                                                "compute runs on an accelerator and the step is a pure sleep "
                                                "(DLIO)")
    computation_host_threads: int = _f(1, check="positive",
                                       doc="threads that share computation_host_cpu (torch's intra-op "
                                           "threads of a CPU-trained model)")
    warmup_computation_time: list[float] = _f(factory=list, check="nonneg",
                                              doc="seconds of compute of the run's first steps, one per step "
                                                  "(framework warm-up: kernel selection, allocator, CUDA "
                                                  "context); they replace computation_time for those steps")
    epoch_warmup_computation_time: list[float] = _f(factory=list, check="nonneg",
                                                    doc="seconds of compute of the first steps of every later "
                                                        "epoch, one per step, where they differ from "
                                                        "computation_time")
    epoch_end_time: Distribution = _f(factory=lambda: Distribution.fixed(0.0), check="nonneg",
                                      doc="seconds the training process spends after an epoch's last batch "
                                          "before the next epoch, beyond checkpoints and evaluation (logging, "
                                          "metrics, learning-rate schedules)")
    au_first_steps: str = _f("run", choices=AU_FIRST_STEPS,
                             doc="first steps AU leaves out: run = the run's first step (MLPerf Storage), "
                                 "epoch = every epoch's first step (DLIO)")
    evaluation: Evaluation | None = _f(None, doc="null = no evaluation")


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """Checkpoint writes (DLIO ``checkpoint``). At most one ``*_between_checkpoints`` is set;
    none means once per epoch."""

    enabled: bool = _f(False)
    checkpoint_folder: str | None = _f(None)
    checkpoint_after_epoch: int = _f(1, check="nonneg", doc="first epoch (1-based) of epoch-based checkpoints")
    steps_between_checkpoints: int | None = _f(None, check="positive")
    epochs_between_checkpoints: int | None = _f(None, check="positive")
    time_between_checkpoints: float | None = _f(None, check="positive", doc="seconds")
    files_per_checkpoint: int = _f(1, check="positive")
    bytes_per_checkpoint: int = _f(0, check="nonneg", doc="bytes written per checkpoint, all files")
    write_transfer_size: Distribution = _f(factory=Distribution.unknown, check="nonneg",
                                           doc="bytes per write call")
    file_writes: list[list[list[int]]] | None = _f(
        None, check="nonneg",
        doc="the write calls of each file of one checkpoint, in file order: runs of [bytes per call, calls] "
            "(torch.save: header, each tensor's storage, trailer); used when they add up to "
            "files_per_checkpoint and bytes_per_checkpoint, else write_transfer_size")
    fsync: bool = _f(False, doc="fsync each checkpoint file")
    serialization_time: Distribution = _f(factory=lambda: Distribution.fixed(0.0), check="nonneg",
                                          doc="seconds per checkpoint outside write calls (serialisation, "
                                              "device-to-host copies), spent before the writes")
    read_at_start: bool = _f(False, doc="read the latest checkpoint before training")
    num_checkpoints_write: int | None = _f(None, check="positive", doc="stop writing after this many")
    num_checkpoints_read: int | None = _f(None, check="nonneg", doc="checkpoints read back (DLIO)")

    def __post_init__(self) -> None:
        given = [n for n in ("steps_between_checkpoints", "epochs_between_checkpoints", "time_between_checkpoints")
                 if getattr(self, n) is not None]
        if len(given) > 1:
            raise _Invalid(given[1], f"expected at most one of steps/epochs/time_between_checkpoints, "
                                     f"but {given[0]} is also set")
        for i, runs in enumerate(self.file_writes or []):
            for j, run in enumerate(runs):
                if len(run) != 2 or run[1] < 1:
                    raise _Invalid(f"file_writes.{i}.{j}", f"expected [bytes per call, calls >= 1], got {run!r}")

    def file_write_plan(self) -> list[list[int]] | None:
        """Each checkpoint file's write calls (bytes), expanded from :attr:`file_writes`, when
        they agree with ``files_per_checkpoint`` and ``bytes_per_checkpoint``; else None."""
        fw = self.file_writes
        if not fw or len(fw) != self.files_per_checkpoint:
            return None
        if sum(size * calls for runs in fw for size, calls in runs) != self.bytes_per_checkpoint:
            return None
        return [[size for size, calls in runs for _ in range(calls)] for runs in fw]


@dataclass(frozen=True, kw_only=True)
class Processes:
    """How many processes read."""

    ranks: int = _f(1, check="positive", doc="training processes (MPI/torchrun ranks)")
    workers_per_rank: int = _f(1, check="nonneg", doc="data-loader workers observed per rank")


@dataclass(frozen=True, kw_only=True)
class Parallelism:
    """Model parallelism (DLIO ``model.parallelism``); shapes checkpoint files."""

    tensor: int = _f(1, check="positive")
    pipeline: int = _f(1, check="positive")
    data: int | None = _f(None, check="positive")
    zero_stage: int = _f(0, doc="DeepSpeed ZeRO stage (-1..3)")

    def __post_init__(self) -> None:
        if not -1 <= self.zero_stage <= 3:
            raise _Invalid("zero_stage", f"expected an integer from -1 to 3, got {self.zero_stage!r}")


@dataclass(frozen=True, kw_only=True)
class Transformer:
    """Transformer dimensions (DLIO ``model.transformer``); DLIO sizes checkpoints from them."""

    vocab_size: int | None = _f(None, check="positive")
    hidden_size: int | None = _f(None, check="positive")
    ffn_hidden_size: int | None = _f(None, check="positive")
    num_attention_heads: int | None = _f(None, check="positive")
    num_kv_heads: int | None = _f(None, check="positive")


@dataclass(frozen=True, kw_only=True)
class ModelInfo:
    """The trained model, as far as I/O cares (DLIO ``model``)."""

    name: str | None = _f(None)
    type: str | None = _f(None, doc="e.g. cnn, transformer")
    model_size: int | None = _f(None, check="nonneg", doc="bytes of model state")
    num_layers: int | None = _f(None, check="positive")
    model_datatype: str | None = _f(None, doc="e.g. fp16")
    optimizer_datatype: str | None = _f(None, doc="e.g. fp32")
    parallelism: Parallelism | None = _f(None)
    transformer: Transformer | None = _f(None)


@dataclass(frozen=True, kw_only=True)
class FieldProvenance:
    """How one field's value was obtained."""

    method: str = _f(doc="how the value was obtained")
    confidence: str = _f(choices=CONFIDENCES)

    _track_defaults: ClassVar[bool] = False


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """Where the model came from. ``fields`` maps dotted field paths (``reader.batch_size``)
    to how each value was obtained."""

    source_trace: str | None = _f(None, doc="trace directory the model was distilled from")
    source_config: str | None = _f(None, doc="config file the model was imported from")
    capture_host: str | None = _f(None)
    dlreplay_version: str | None = _f(None)
    created: str | None = _f(None, doc="ISO 8601 time")
    fields: dict[str, FieldProvenance] = _f(factory=dict)
    notes: list[str] = _f(factory=list, doc="lossy steps, ignored inputs")

    _track_defaults: ClassVar[bool] = False

    def __post_init__(self) -> None:
        valid = _valid_paths()
        for key in self.fields:
            if key not in valid:
                raise _Invalid(f"fields.{key}", "not a field of the workload model")
        object.__setattr__(self, "fields", dict(sorted(self.fields.items())))


@dataclass(frozen=True, kw_only=True)
class WorkloadModel:
    """A workload: dataset, reader, training loop, checkpoints, processes, provenance."""

    model: ModelInfo = _f(factory=ModelInfo)
    framework: str = _f("pytorch", choices=FRAMEWORKS)
    dataset: Dataset = _f()
    reader: Reader = _f(factory=Reader)
    train: Train = _f(factory=Train)
    checkpoint: Checkpoint = _f(factory=Checkpoint)
    processes: Processes = _f(factory=Processes)
    provenance: Provenance = _f(factory=Provenance)

    def __post_init__(self) -> None:
        if not self.dataset.record_length.is_known:
            raise _Invalid("dataset.record_length", "expected a known distribution (bytes per sample)")
        loader, fw = self.reader.data_loader, self.framework
        if (loader == "pytorch" and fw != "pytorch") or (loader == "tensorflow" and fw != "tensorflow"):
            raise _Invalid("reader.data_loader", f"data loader {loader} does not run under framework {fw}; "
                                                 f"set framework={loader} or another data_loader")


# --------------------------------------------------------------------------- dict <-> dataclass


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    """(inner type, optional?) for ``X | None``."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


def _expected(tp: Any, md: Mapping[str, Any]) -> str:
    """The phrase after 'expected' for a field of type *tp*."""
    inner, optional = _strip_optional(tp)
    check: str = md.get("check") or ""
    choices = md.get("choices")
    if choices:
        text = f"one of {', '.join(choices)}"
    elif inner is bool:
        text = "true or false"
    elif inner is int:
        text = {"positive": "a positive integer", "nonneg": "a non-negative integer"}.get(check, "an integer")
    elif inner is float:
        text = {"positive": "a positive number", "nonneg": "a non-negative number",
                "fraction": "a number between 0 and 1"}.get(check, "a number")
    elif inner is str:
        text = "a string"
    elif inner is Distribution:
        text = "a distribution (a number, or a mapping with type: fixed|normal|...)"
    elif typing.get_origin(inner) is list:
        (item,) = typing.get_args(inner)
        text = "a list of " + ("positive integers" if check == "positive" and item is int else
                               "non-negative integers" if check == "nonneg" and item is int else
                               "integers" if item is int else
                               "non-negative numbers" if check == "nonneg" and item is float else
                               "numbers" if item is float else "lists" if typing.get_origin(item) is list else
                               "mappings" if is_dataclass(item) else "strings")
    elif typing.get_origin(inner) is dict or is_dataclass(inner):
        text = "a mapping"
    else:  # pragma: no cover - every field type is covered above
        text = str(inner)
    return text + (" or null" if optional else "")


@dataclass
class _Ctx:
    source: str
    absent: list[str] = field(default_factory=list)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def as_int(value: numbers.Real) -> int | None:
    """*value* as an int if it is a whole number (ints exactly, floats like 4.0), else None."""
    if isinstance(value, numbers.Integral):
        return int(value)
    number = float(value)
    return int(number) if math.isfinite(number) and number.is_integer() else None


def _check_number(value: float, check: str | None) -> bool:
    if check == "positive":
        return value > 0
    if check == "nonneg":
        return value >= 0
    if check == "fraction":
        return 0 <= value <= 1
    return True


def _convert(value: Any, tp: Any, md: Mapping[str, Any], path: str, ctx: _Ctx) -> Any:
    """Check and convert one raw value for a field of type *tp*."""
    inner, optional = _strip_optional(tp)
    if value is None:
        if optional:
            return None
        raise _error(ctx.source, path, f"expected {_expected(tp, md)}, got null")
    bad = _error(ctx.source, path, f"expected {_expected(tp, md)}, got {_describe(value)}")
    if inner is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if inner is int:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise bad
        value = as_int(value)
        if value is None or not _check_number(value, md.get("check")):
            raise bad
        return value
    if inner is float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise bad
        if not _check_number(float(value), md.get("check")):
            raise bad
        return float(value)
    if inner is str:
        return _convert_str(value, md, bad)
    if inner is Distribution:
        return _convert_distribution(value, md, path, ctx)
    origin = typing.get_origin(inner)
    if origin is list:
        return _convert_list(value, inner, md, path, ctx, bad)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise bad
        _, vtp = typing.get_args(inner)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise _error(ctx.source, _join(path, str(k)), "expected a string key")
            out[k] = _convert(v, vtp, _meta(), _join(path, k), ctx)
        return out
    if isinstance(inner, type) and is_dataclass(inner):
        return _build(inner, value, path, ctx)
    raise AssertionError(f"unsupported field type {inner!r}")  # pragma: no cover


def _convert_str(value: Any, md: Mapping[str, Any], bad: ModelError) -> str:
    choices = md.get("choices")
    if choices and value is False and "off" in choices:
        return "off"  # YAML 1.1 reads a bare `off` as false
    if isinstance(value, (_dt.datetime, _dt.date)) and not choices:
        return value.isoformat()
    if not isinstance(value, str) or (choices and value not in choices):
        raise bad
    return value


def _convert_list(value: Any, tp: Any, md: Mapping[str, Any], path: str, ctx: _Ctx, bad: ModelError) -> list:
    if not isinstance(value, (list, tuple)):
        raise bad
    (item,) = typing.get_args(tp)
    return [_convert(v, item, md, f"{path}[{i}]", ctx) for i, v in enumerate(value)]


def _convert_distribution(value: Any, md: Mapping[str, Any], path: str, ctx: _Ctx) -> Distribution:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = {"type": "fixed", "value": value}
    if not isinstance(value, Mapping):
        raise _error(ctx.source, path, f"expected {_expected(Distribution, md)}, got {_describe(value)}")
    dist = _build(Distribution, value, path, ctx)
    if md.get("check") == "nonneg":
        problems = dist.nonneg_problems()
        if problems:
            sub, msg = problems[0]
            raise _error(ctx.source, _join(path, sub), msg)
    return dist


def _is_required(f: Any) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def _build(cls: type, data: Any, path: str, ctx: _Ctx) -> Any:
    """Build dataclass *cls* from mapping *data*, naming *path* in every error."""
    if not isinstance(data, Mapping):
        raise _error(ctx.source, path or "(top level)", f"expected a mapping, got {_describe(data)}")
    hints = _hints(cls)
    known = [f.name for f in fields(cls)]
    for key in data:
        if key not in known:
            raise _error(ctx.source, _join(path, str(key)),
                         f"unknown field; expected one of: {', '.join(known)}")
    kwargs: dict[str, Any] = {}
    track = getattr(cls, "_track_defaults", True)
    for f in fields(cls):
        sub = _join(path, f.name)
        if f.name in data:
            kwargs[f.name] = _convert(data[f.name], hints[f.name], f.metadata, sub, ctx)
        elif _is_required(f):
            raise _error(ctx.source, sub, f"missing required field ({_expected(hints[f.name], f.metadata)})")
        elif track and f.name != "provenance":
            ctx.absent.append(sub)
    try:
        return cls(**kwargs)
    except _Invalid as exc:
        raise _error(ctx.source, _join(path, exc.subpath), exc.message) from None


def _default_of(f: Any) -> Any:
    """The default value of dataclass field *f* (from its factory when it has one)."""
    return f.default if f.default is not MISSING else f.default_factory()


def _to_plain(obj: Any) -> Any:
    """Dataclasses/containers → plain YAML-safe Python values, in field order."""
    if is_dataclass(obj) and not isinstance(obj, type):
        omit = getattr(obj, "_omit_none", False)
        omit_defaults = getattr(obj, "_omit_defaults", False)
        out = {}
        for f in fields(obj):
            v = getattr(obj, f.name)
            if v is None and (omit or omit_defaults):
                continue
            if omit_defaults and not _is_required(f) and v == _default_of(f):
                continue
            out[f.name] = _to_plain(v)
        return out
    if isinstance(obj, Mapping):
        return {str(k): _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def model_to_dict(model: WorkloadModel) -> dict[str, Any]:
    """The model as plain data (what :func:`save_model` writes), header keys first."""
    return {"schema": MODEL_SCHEMA_NAME, "format_version": MODEL_FORMAT_VERSION, **_to_plain(model)}


def _check_header(data: Mapping[str, Any], source: str) -> None:
    if "schema" not in data:
        raise _error(source, "schema", f"missing required field (expected {MODEL_SCHEMA_NAME!r}); "
                                       f"is this a dlreplay workload model?")
    if data["schema"] != MODEL_SCHEMA_NAME:
        raise _error(source, "schema", f"{source} is not a dlreplay workload model (schema is "
                                       f"{data['schema']!r}, expected {MODEL_SCHEMA_NAME!r}).",
                     ModelVersionError)
    version = data.get("format_version")
    if version is None:
        raise _error(source, "format_version", "missing required field (a positive integer)")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _error(source, "format_version", f"expected a positive integer, got {_describe(version)}")
    if version > MODEL_FORMAT_VERSION:
        raise _error(source, "format_version",
                     f"{source} was written by a newer dlreplay (format_version {version}; this version "
                     f"reads up to {MODEL_FORMAT_VERSION}). Upgrade dlreplay to read it.", ModelVersionError)


def model_from_dict(d: Any, source: str = "<dict>", default_method: str = _DEFAULT_METHOD) -> WorkloadModel:
    """Validate plain data *d* (as :func:`model_to_dict` gives) and build the model.

    Errors are :class:`ModelError` naming *source* and the dotted field path.
    Fields left out are filled with defaults and recorded in
    ``provenance.fields`` as confidence ``default`` with *default_method*
    (unless already recorded).
    """
    if not isinstance(d, Mapping):
        raise _error(source, "(top level)", f"expected a mapping of sections, got {_describe(d)}")
    _check_header(d, source)
    body = {k: v for k, v in d.items() if k not in ("schema", "format_version")}
    ctx = _Ctx(source)
    model = _build(WorkloadModel, body, "", ctx)
    if not ctx.absent:
        return model
    filled = dict(model.provenance.fields)
    for path in ctx.absent:
        filled.setdefault(path, FieldProvenance(method=default_method, confidence="default"))
    prov = dataclasses.replace(model.provenance, fields=filled)
    return dataclasses.replace(model, provenance=prov)


# --------------------------------------------------------------------------- field paths


def field_paths(include_distribution_parts: bool = False) -> list[str]:
    """Every dotted field path of a workload model (outside ``provenance``).

    Distributions count as one field (``train.computation_time``) unless
    *include_distribution_parts*.
    """
    out: list[str] = []

    def walk(cls: type, prefix: str) -> None:
        for f in fields(cls):
            path = _join(prefix, f.name)
            inner, _ = _strip_optional(_hints(cls)[f.name])
            if inner is Provenance:
                continue
            out.append(path)
            if inner is Distribution:
                if include_distribution_parts:
                    out.extend(_join(path, g.name) for g in fields(Distribution))
            elif isinstance(inner, type) and is_dataclass(inner):
                walk(inner, path)

    walk(WorkloadModel, "")
    return out


_VALID_PATHS: frozenset[str] | None = None


def _valid_paths() -> frozenset[str]:
    global _VALID_PATHS
    if _VALID_PATHS is None:
        _VALID_PATHS = frozenset(field_paths(include_distribution_parts=True))
    return _VALID_PATHS


def default_fields(model: WorkloadModel) -> list[str]:
    """Field paths whose provenance confidence is ``default`` (could not be inferred)."""
    return [k for k, v in model.provenance.fields.items() if v.confidence == "default"]


# --------------------------------------------------------------------------- files


_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available: same rules, faster
_SafeDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _StrictLoader(_SafeLoader):  # type: ignore[misc, valid-type]
    """Safe loader (no python tags) that refuses duplicate mapping keys."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, typing.Hashable) and key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml_file(path: str | os.PathLike[str], error: type[ModelError] = ModelError) -> Any:
    """Parse a YAML file safely (no python tags, no duplicate keys); errors name the file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise error(f"{source}: cannot read the file ({reason})") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a safe loader: no python tags
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        if isinstance(exc, yaml.reader.ReaderError):  # e.g. binary data: no line/column, a position
            where = f" (character {exc.position + 1})"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]  # one line
        raise error(f"{source}: not valid YAML: {problem}{where}") from None


def load_model(path: str | os.PathLike[str]) -> WorkloadModel:
    """Read and validate a workload model file. Raises :class:`ModelError` naming the file."""
    return model_from_dict(load_yaml_file(path), source=str(path))


class _Dumper(_SafeDumper):  # type: ignore[misc, valid-type]
    """Safe dumper writing short lists of numbers inline (``[1, 128, 128]``)."""


def _represent_list(dumper: Any, data: list) -> yaml.Node:
    flow = 0 < len(data) <= 64 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


def dump_yaml(data: Any) -> str:
    """Readable YAML (block style, key order kept, no python tags)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=100)


def save_model(model: WorkloadModel, path: str | os.PathLike[str]) -> None:
    """Write *model* as YAML to *path*, atomically, in a stable key order."""
    header = (f"# dlreplay workload model ({MODEL_SCHEMA_NAME} v{MODEL_FORMAT_VERSION}). "
              f"Units: bytes, seconds; fractions 0..1.\n")
    try:
        atomic_write_text(path, header + dump_yaml(model_to_dict(model)))
    except OSError as exc:
        raise ModelError(f"{path}: cannot write the model ({exc.strerror or exc})") from None


# --------------------------------------------------------------------------- overrides


def _dist_set_mean(node: dict[str, Any], new: Any) -> None:
    """Set a distribution's mean, keeping its shape (see :func:`apply_overrides`)."""
    if isinstance(new, bool) or not isinstance(new, numbers.Real):
        node["mean"] = new  # let validation report it
        return
    new = float(new)
    t, old = node.get("type"), node.get("mean")
    if t == "fixed" or t == "unknown":
        node.clear()
        node.update(type="fixed", value=new)
    elif t == "uniform":
        delta = new - (old if old is not None else 0.0)
        node.update(min=node["min"] + delta, max=node["max"] + delta)
        node.pop("mean", None)
        node.pop("stdev", None)
    elif t == "gamma":
        node["scale"] = new / node["shape"]
        node.pop("mean", None)
        node.pop("stdev", None)
    elif t == "exponential" or t == "poisson":
        node["scale" if t == "exponential" else "lam"] = new
        node.pop("mean", None)
        node.pop("stdev", None)
    elif t == "empirical" and old:
        factor = new / old
        for key in ("min", "max", "stdev"):
            if node.get(key) is not None:
                node[key] = node[key] * abs(factor) if key == "stdev" else node[key] * factor
        node["quantiles"] = {k: v * factor for k, v in (node.get("quantiles") or {}).items()}
        node["mean"] = new
    else:
        node["mean"] = new


def _dist_set_type(node: dict[str, Any], new: Any) -> None:
    """Change a distribution's family, dropping parameters the new family does not take."""
    if new not in _DIST_PARAMS:
        node["type"] = new
        return
    keep = set(_DIST_PARAMS[new]) | {"min", "max"}
    if new in ("empirical", "unknown"):
        keep |= {"mean", "stdev", "quantiles"}
    if new == "fixed" and "value" not in node and node.get("mean") is not None:
        node["value"] = node["mean"]
    for key in list(node):
        if key not in keep:
            del node[key]
    node["type"] = new


def _override_error(item: str, path: str, message: str) -> ModelError:
    return _error(f"override {item!r}", path, message)


def _set_override(d: dict[str, Any], keys: list[str], value: Any, item: str) -> str:
    """Set dotted *keys* in model dict *d*; returns the provenance unit touched."""
    cls: Any = WorkloadModel
    node: dict[str, Any] = d
    unit = ""
    for i, key in enumerate(keys):
        path = ".".join(keys[: i + 1])
        last = i == len(keys) - 1
        if cls is None:  # inside a free mapping (quantiles, provenance.fields)
            if not last:
                raise _override_error(item, path, "is a value, not a section")
            node[key] = value
            return unit
        names = [f.name for f in fields(cls)]
        if key not in names:
            raise _override_error(item, path, f"unknown field; expected one of: {', '.join(names)}")
        if cls is not Distribution:
            unit = path
        tp, _ = _strip_optional(_hints(cls)[key])
        if last:
            if cls is Distribution and key == "mean":
                _dist_set_mean(node, value)
            elif cls is Distribution and key == "type":
                _dist_set_type(node, value)
            else:
                node[key] = value
            return unit
        child = node.get(key)
        if tp is Distribution and isinstance(child, numbers.Real):
            child = {"type": "fixed", "value": child}
        if not (is_dataclass(tp) or typing.get_origin(tp) is dict):
            raise _override_error(item, path, "is a value, not a section")
        if not isinstance(child, dict):
            child = {}
        node[key] = child
        node = child
        cls = tp if is_dataclass(tp) else None
    return unit


#: A number in exponent notation without a dot (``1e9``, ``4E-3``), which YAML 1.1 leaves a string.
_EXP_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def apply_overrides(model: WorkloadModel, overrides: Iterable[str]) -> WorkloadModel:
    """A copy of *model* with ``KEY=VALUE`` overrides applied and validated.

    KEY is a dotted field path (``reader.read_threads``); VALUE is read with YAML
    scalar rules (``4``, ``0.2``, ``true``, ``null``, ``hdf5``, ``[1, 128]``).
    Setting a distribution's ``mean`` keeps its shape: ``fixed`` moves its value,
    ``uniform`` shifts, ``gamma`` rescales ``scale``, ``exponential``/``poisson``
    set their parameter, ``empirical`` scales every quantile, ``unknown`` becomes
    ``fixed``. Setting ``type`` drops parameters the new family does not take.
    Each overridden field is recorded in provenance (method ``override``,
    confidence ``measured``: stated explicitly). Errors name the key.
    """
    d = model_to_dict(model)
    touched: dict[str, str] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ModelError(f"override {item!r}: expected KEY=VALUE, e.g. reader.read_threads=4")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw.strip()
        if isinstance(value, str) and _EXP_NUMBER.match(value):  # YAML 1.1 reads 1e9 as a string
            number = float(value)
            value = int(number) if number.is_integer() and abs(number) < 2**63 else number
        keys = key.split(".")
        if keys[0] in ("schema", "format_version"):
            raise _override_error(item, key, "cannot be overridden")
        unit = _set_override(d, keys, value, item)
        if not unit.startswith("provenance"):
            touched[unit] = item
    fields_ = d.setdefault("provenance", {}).setdefault("fields", {})
    for unit, item in touched.items():
        fields_[unit] = {"method": f"override {item}", "confidence": "measured"}
    try:
        return model_from_dict(d, source="overrides")
    except ModelError as exc:
        path = getattr(exc, "field_path", "")
        culprit = next((item for unit, item in touched.items()
                        if path == unit or path.startswith(unit + ".") or unit.startswith(path + ".")), None)
        hint = f"from override {culprit!r}" if culprit else f"after overrides {', '.join(map(repr, touched.values()))}"
        err = ModelError(f"{exc} ({hint})")
        err.field_path = path  # type: ignore[attr-defined]
        raise err from None


# --------------------------------------------------------------------------- summary


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
    return (f"{when}{limit}: {c.files_per_checkpoint} file(s), {_fmt_bytes(c.bytes_per_checkpoint)}, "
            f"writes {_fmt_dist(c.write_transfer_size, _fmt_bytes)}, fsync {'yes' if c.fsync else 'no'}")


def _summary_layout(lay: Layout) -> str:
    """One line: the files' inside (first structure), where it came from."""
    parts: list[str] = []
    if lay.arrays:
        s = lay.arrays[0]
        for m in s.members[:3]:
            how = m.storage or ""
            if m.chunks:
                how += f" {'x'.join(map(str, m.chunks))}"
            if m.compression and m.storage != "deflated":
                how += f" {m.compression}"
            if m.chunk_order == "scattered":
                how += " scattered"
            parts.append(f"{m.name or 'array'} {m.dtype} {list(m.shape)} {how}".rstrip())
        if len(s.members) > 3:
            parts.append(f"+{len(s.members) - 3} more")
    elif lay.images:
        i = lay.images[0]
        coding = " ".join(x for x in (f"q{i.quality}" if i.quality else "", i.subsampling or "",
                                      "progressive" if i.progressive else "") if x)
        parts.append(f"{i.width}x{i.height} {i.mode} {coding}".rstrip())
    elif lay.tables:
        t = lay.tables[0]
        parts.append(f"{len(t.columns)} column(s)" + (f", {t.row_groups} row group(s)" if t.row_groups else ""))
    elif lay.hdf5_chunk_bytes or lay.hdf5_chunk_shape or lay.compressed:
        parts.append("chunks " + (f"{lay.hdf5_chunk_shape}" if lay.hdf5_chunk_shape else _fmt_bytes(lay.hdf5_chunk_bytes))
                     if lay.hdf5_chunk_bytes or lay.hdf5_chunk_shape else "deflated members")
    if not parts:
        return ""
    kinds = len(lay.arrays or lay.images or lay.tables or [])
    more = f"; {kinds} kinds of files" if kinds > 1 else ""
    return f"{', '.join(parts)}{more} ({lay.source or 'given'})"


def summarize_model(model: WorkloadModel) -> str:
    """A readable multi-line summary, ending with the fields left at defaults."""
    m, ds, rd, tr, pr = model.model, model.dataset, model.reader, model.train, model.processes
    name = m.name or "(unnamed)"
    lines = [f"workload {name}" + (f" ({m.type})" if m.type else "") + f", framework {model.framework}"]
    per_file = f"{ds.num_samples_per_file} sample(s)/file"
    lines.append(f"  dataset     {ds.format}, {ds.num_files} files x {per_file}"
                 + (f", {ds.num_files_eval} eval files" if ds.num_files_eval else "")
                 + (f", in {ds.data_folder}" if ds.data_folder else ""))
    lines.append(f"  record      {_fmt_dist(ds.record_length, _fmt_bytes)}; file {_fmt_dist(ds.file_size, _fmt_bytes)}")
    layout = _summary_layout(ds.layout)
    if layout:
        lines.append(f"  layout      {layout}")
    lines.append(f"  reader      {rd.data_loader}, {rd.read_threads} {rd.worker_kind} worker(s)/rank, "
                 f"batch {rd.batch_size}, prefetch {rd.prefetch_factor}, shuffle files={rd.file_shuffle} "
                 f"samples={rd.sample_shuffle}, {'open per sample' if rd.open_per_sample else 'files kept open'}")
    lines.append(f"  reads       {_fmt_dist(rd.transfer_size, _fmt_bytes)} per call")
    if tr.enabled:
        steps = f", {tr.steps_per_epoch} steps/epoch" if tr.steps_per_epoch else ""
        lines.append(f"  train       {tr.epochs} epoch(s){steps}, compute {_fmt_dist(tr.computation_time, _fmt_seconds)}"
                     "/step")
        cpu = tr.computation_host_cpu
        if cpu.is_known and (cpu.mean or 0) > 0:
            lines.append(f"  host CPU    {_fmt_dist(cpu, _fmt_seconds)}/step in {tr.computation_host_threads} "
                         f"thread(s), spent inside the compute time")
        else:
            lines.append("  host CPU    none: the compute is a pure sleep (an accelerator's)")
        extra = []
        if tr.warmup_computation_time:
            extra.append(f"{len(tr.warmup_computation_time)} warm-up step(s) "
                         f"{_fmt_seconds(sum(tr.warmup_computation_time))}")
        if tr.epoch_warmup_computation_time:
            extra.append(f"{len(tr.epoch_warmup_computation_time)} leading step(s) per later epoch "
                         f"{_fmt_seconds(sum(tr.epoch_warmup_computation_time))}")
        if tr.epoch_end_time.is_known and (tr.epoch_end_time.mean or 0) > 0:
            extra.append(f"epoch end {_fmt_dist(tr.epoch_end_time, _fmt_seconds)}")
        if extra:
            lines.append(f"  timing      {'; '.join(extra)}")
    else:
        lines.append("  train       off")
    if tr.evaluation is not None:
        ev = tr.evaluation
        lines.append(f"  evaluation  every {ev.every_n_epochs} epoch(s), compute "
                     f"{_fmt_dist(ev.computation_time, _fmt_seconds)}/step")
    lines.append(f"  checkpoint  {_summary_checkpoint(model.checkpoint)}")
    lines.append(f"  processes   {pr.ranks} rank(s) x {pr.workers_per_rank} worker(s)")
    source = model.provenance.source_trace or model.provenance.source_config
    if source:
        lines.append(f"  source      {source}")
    defaults = default_fields(model)
    if defaults:
        lines.append(f"  defaults    {len(defaults)} field(s) could not be inferred: {', '.join(defaults)}")
    return "\n".join(lines)
