"""The distribution of a quantity that varies (sizes in bytes, durations in seconds)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dlreplay.errors import ModelError
from dlreplay.model.base import DISTRIBUTION_TYPES, InvalidField, describe_value, model_field

#: The parameters that define each distribution family (everything else is descriptive).
DISTRIBUTION_PARAMS: dict[str, tuple[str, ...]] = {
    "fixed": ("value",),
    "normal": ("mean", "stdev"),
    "uniform": ("min", "max"),
    "gamma": ("shape", "scale"),
    "exponential": ("scale",),
    "poisson": ("lam",),
    "empirical": ("quantiles",),
    "unknown": (),
}
_TYPE_SPECIFIC = {
    "value": ("fixed",),
    "shape": ("gamma",),
    "scale": ("gamma", "exponential"),
    "lam": ("poisson",),
}
_QUANTILE_KEY = re.compile(r"^p(\d+(?:\.\d+)?)$")
#: Quantiles :meth:`Distribution.from_values` records (percent).
DEFAULT_QUANTILES = (25, 50, 75, 90, 99)


def _finite(x: float | None) -> bool:
    return x is None or math.isfinite(x)


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

    type: str = model_field("unknown", choices=DISTRIBUTION_TYPES, doc="distribution family")
    value: float | None = model_field(None, doc="the value of a fixed distribution")
    shape: float | None = model_field(None, check="positive", doc="gamma shape k")
    scale: float | None = model_field(None, check="positive", doc="gamma/exponential scale theta")
    lam: float | None = model_field(None, check="nonneg", doc="poisson rate (= mean)")
    mean: float | None = model_field(None, doc="mean (same unit as the quantity)")
    stdev: float | None = model_field(None, check="nonneg", doc="standard deviation")
    min: float | None = model_field(None, doc="smallest value / lower bound")
    max: float | None = model_field(None, doc="largest value / upper bound")
    quantiles: dict[str, float] | None = model_field(
        None, doc="percentiles, keys p<percent> (p50 = median)"
    )

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
            raise InvalidField(*problems[0])

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
    def from_values(
        cls, values: Iterable[float] | np.ndarray, quantiles: Iterable[float] = DEFAULT_QUANTILES
    ) -> Distribution:
        """An ``empirical`` distribution of observed *values*.

        Records mean, population stdev (ddof 0), min, max and the given
        percentiles (linear interpolation). Raises :class:`ModelError` for no
        values or non-finite ones.
        """
        arr = np.asarray(
            list(values) if not isinstance(values, np.ndarray) else values, dtype=float
        ).ravel()
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
            raise ModelError(
                "cannot sample an unknown distribution; measure it or set it (e.g. with an override)"
            )
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
            raise ModelError(
                f"Distribution.quantile: defined for empirical distributions, not {self.type}"
            )
        knots, vals = self._quantile_function()
        return np.interp(np.asarray(probs, dtype=float), knots, vals)

    def _sample_empirical(
        self, rng: np.random.Generator, n: int, stratified: bool = False
    ) -> np.ndarray:
        probs, vals = self._quantile_function()
        u = (
            (rng.permutation(n) + rng.uniform(0.0, 1.0, n)) / max(n, 1)
            if stratified
            else rng.uniform(0.0, 1.0, n)
        )
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
            if (
                t == "uniform"
                and self.min is not None
                and self.max is not None
                and self.min <= self.max
            ):
                return ((self.min + self.max) / 2.0, (self.max - self.min) / math.sqrt(12.0))
            if (
                t == "gamma"
                and self.shape is not None
                and self.scale is not None
                and self.shape > 0
            ):
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
            return [
                (
                    "type",
                    f"expected one of {', '.join(DISTRIBUTION_TYPES)}, got {describe_value(t)}",
                )
            ]
        for name in ("mean", "stdev", "min", "max", "value", "shape", "scale", "lam"):
            if not _finite(getattr(self, name)):
                out.append((name, f"expected a finite number, got {getattr(self, name)!r}"))
        if out:
            return out
        for name, allowed in _TYPE_SPECIFIC.items():
            if getattr(self, name) is not None and t not in allowed:
                out.append((name, f"only applies to type {' or '.join(allowed)}, not {t}"))
        for name in DISTRIBUTION_PARAMS[t]:
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
            out.append(
                ("quantiles", "expected at least one quantile for an empirical distribution")
            )
        prev: float | None = None
        for key, v in self.quantiles.items():
            if _quantile_percent(key) is None:
                out.append(
                    (
                        f"quantiles.{key}",
                        "expected a key p<percent> with 0 < percent < 100, e.g. p50",
                    )
                )
                continue
            if not math.isfinite(v):
                out.append((f"quantiles.{key}", f"expected a finite number, got {v!r}"))
            elif prev is not None and v < prev:
                out.append(
                    (
                        f"quantiles.{key}",
                        f"expected quantiles that do not decrease, got {v!r} after {prev!r}",
                    )
                )
            elif self.type == "empirical" and (
                (self.min is not None and v < self.min) or (self.max is not None and v > self.max)
            ):
                out.append((f"quantiles.{key}", f"expected a value between min and max, got {v!r}"))
            prev = v
        return out

    def _derived_problems(self) -> list[tuple[str, str]]:
        derived = self._derived()
        if derived is None:
            return []
        params = " and ".join(DISTRIBUTION_PARAMS[self.type])
        out = []
        for name, expected in zip(("mean", "stdev"), derived, strict=True):
            given = getattr(self, name)
            if expected is None or given is None:
                continue
            if not math.isclose(given, expected, rel_tol=1e-9, abs_tol=1e-12):
                out.append(
                    (
                        name,
                        f"is derived from {params} for a {self.type} distribution "
                        f"(expected {expected!r}, got {given!r}); set {params} instead",
                    )
                )
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
