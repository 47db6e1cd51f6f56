"""Reading a DLIO config: its sections (block strings parsed), its keys checked by kind and
counted as used, the provenance of each model field, DLIO's sleep specs as distributions."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dlreplay.dlio.keys import DLIO_DISTRIBUTION_KEYS
from dlreplay.errors import ModelError, clipped, shown
from dlreplay.model import Distribution, as_int, parse_yaml

# --------------------------------------------------------------------------- import


@dataclass
class Importer:
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
        return check_kind(value, kind, lambda msg: self.fail(dotted, msg)), True

    def first(
        self, keys: tuple[str, ...], kind: str, default: Any = None
    ) -> tuple[Any, str | None]:
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
    "int>0": "a positive integer",
    "int>=0": "a non-negative integer",
    "int": "an integer",
    "num>0": "a positive number",
    "num>=0": "a non-negative number",
    "num": "a number",
    "bool": "true or false",
    "str": "a string",
    "ints": "a list of positive integers",
    "ints>=0": "a list of non-negative integers",
}


def check_kind(value: Any, kind: str, fail: Any) -> Any:
    """Check one DLIO value; *fail(message)* builds the error."""
    bad = fail(f"expected {_KIND_TEXT[kind]}, got {shown(value)}")
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
            isinstance(v, int) and not isinstance(v, bool) and v >= least for v in value
        ):
            raise bad
        return [int(v) for v in value]
    return _check_number(value, kind, bad)


def _check_number(value: Any, kind: str, bad: ModelError) -> Any:
    """:func:`check_kind` of the number kinds (``int>0``, ``num>=0``, ...); raises *bad*."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise bad
    if not isinstance(value, numbers.Integral) and not math.isfinite(value):
        raise bad  # (an int is finite: math.isfinite overflows on one of thousands of digits)
    if kind.startswith("int"):
        value = as_int(value)
        if value is None:
            raise bad
    else:
        value = float(value)
    if (kind.endswith(">0") and value <= 0) or (kind.endswith(">=0") and value < 0):
        raise bad
    return value


def parse_sections(config: Any, source: str) -> dict[str, Any]:
    """Top-level mapping of a DLIO config with block-string sections parsed."""
    if (
        isinstance(config, Mapping)
        and set(config) == {"workload"}
        and isinstance(config["workload"], Mapping)
    ):
        config = config["workload"]  # a config nested as hydra's `workload` group
    if not isinstance(config, Mapping):
        raise ModelError(
            f"{source}: (top level): expected a DLIO workload mapping, got {type(config).__name__}"
        )
    out: dict[str, Any] = {}
    for name, value in config.items():
        if isinstance(value, str) and name != "framework":
            parsed = parse_yaml(
                value,
                f"{source}: {clipped(str(name))}",
                what="not valid YAML inside the block string",
            )
            value = {"name": parsed} if name == "model" and isinstance(parsed, str) else parsed
        if value is None:
            value = {}
        if name != "framework" and not isinstance(value, Mapping):
            raise ModelError(
                f"{source}: {clipped(str(name))}: expected a mapping, got {shown(value)}"
            )
        out[str(name)] = value
    return out


def dlio_distribution(
    imp: Importer, key: str, stdev_key: str | None, default: float
) -> tuple[Distribution, bool]:
    """A DLIO sleep spec (number, or mapping with optional type) as a Distribution."""
    value, present = imp.raw(key)
    stdev, has_stdev = imp.get(stdev_key, "num>=0") if stdev_key else (None, False)
    if not present or value is None:
        return Distribution.fixed(default), False
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = {"mean": value}
    if not isinstance(value, Mapping):
        raise imp.fail(
            key, f"expected a number of seconds or a mapping with type, got {shown(value)}"
        )
    spec = dict(value)
    if has_stdev and "type" not in spec:
        spec["stdev"] = stdev
    return _distribution_from_spec(
        spec, lambda sub, msg: imp.fail(f"{key}.{sub}" if sub else key, msg)
    ), True


def _distribution_from_spec(spec: dict[str, Any], fail: Any) -> Distribution:
    kind = spec.get("type")

    def num(name: str, check: str = "num>=0", default: Any = None) -> float:
        if spec.get(name) is None:
            if default is not None:
                return default
            raise fail(name, f"missing required key for type {kind or 'normal'}")
        return check_kind(spec[name], check, lambda msg: fail(name, msg))

    if kind is None:
        mean = num("mean", "num>=0", 0.0)
        stdev = num("stdev", "num>=0", 0.0)
        return (
            Distribution(type="normal", mean=mean, stdev=stdev)
            if stdev > 0
            else Distribution.fixed(mean)
        )
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
        return Distribution(
            type="poisson", lam=num("lambda" if "lam" not in spec and "lambda" in spec else "lam")
        )
    types_ = ", ".join((*DLIO_DISTRIBUTION_KEYS, "fixed"))
    raise fail("type", f"expected one of {types_} (or a plain number), got {shown(kind)}")
