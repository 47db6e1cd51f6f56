"""Overrides: ``KEY=VALUE`` settings (``--set``) applied to a model and validated."""

from __future__ import annotations

import numbers
import re
import typing
from collections.abc import Iterable
from dataclasses import fields, is_dataclass
from typing import Any

import yaml

from dlreplay.errors import ModelError, shown
from dlreplay.model.base import model_error, strip_optional, type_hints
from dlreplay.model.distribution import DISTRIBUTION_PARAMS, Distribution
from dlreplay.model.effect import check_effect
from dlreplay.model.plain import model_to_dict
from dlreplay.model.sections import WorkloadModel
from dlreplay.model.validation import model_from_dict


def _dist_set_mean(node: dict[str, Any], new: Any) -> None:
    """Set a distribution's mean, keeping its shape (see :func:`apply_overrides`)."""
    if isinstance(new, bool) or not isinstance(new, numbers.Real):
        node["mean"] = new  # let validation report it
        return
    try:
        new = float(new)
    except OverflowError:  # an integer of hundreds of digits: validation reports it
        node["mean"] = new
        return
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
    if new not in DISTRIBUTION_PARAMS:
        node["type"] = new
        return
    keep = set(DISTRIBUTION_PARAMS[new]) | {"min", "max"}
    if new in ("empirical", "unknown"):
        keep |= {"mean", "stdev", "quantiles"}
    if new == "fixed" and "value" not in node and node.get("mean") is not None:
        node["value"] = node["mean"]
    for key in list(node):
        if key not in keep:
            del node[key]
    node["type"] = new


def _override_error(item: str, path: str, message: str) -> ModelError:
    return model_error(f"override {shown(item)}", path, message)


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
        tp, _ = strip_optional(type_hints(cls)[key])
        if last:
            if cls is Distribution and (
                key == "mean" or (key == "value" and node.get("type") == "fixed")
            ):  # a fixed distribution's mean is its value: both move together
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


_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available: faster

#: A number in exponent notation without a dot (``1e9``, ``4E-3``), which YAML 1.1 leaves a string.
#: (``\d+(\.\d*)?``, not ``\d+\.?\d*``: the latter backtracks quadratically on a long row of digits)
_EXP_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)[eE][+-]?\d+$")


def apply_overrides(model: WorkloadModel, overrides: Iterable[str]) -> WorkloadModel:
    """A copy of *model* with ``KEY=VALUE`` overrides applied and validated.

    KEY is a dotted field path (``reader.read_threads``); VALUE is read with YAML
    scalar rules (``4``, ``0.2``, ``true``, ``null``, ``hdf5``, ``[1, 128]``).
    Setting a distribution's ``mean`` keeps its shape: ``fixed`` moves its value,
    ``uniform`` shifts, ``gamma`` rescales ``scale``, ``exponential``/``poisson``
    set their parameter, ``empirical`` scales every quantile, ``unknown`` becomes
    ``fixed``. Setting ``type`` drops parameters the new family does not take.
    Each overridden field is recorded in provenance (method ``override``,
    confidence ``measured``: stated explicitly). Errors name the key. An override that
    cannot take effect, because another field decides (the dataset layout's arrays fix the
    record length, a disabled checkpoint its size, ...), is an error naming that field
    (:func:`~dlreplay.model.effect.check_effect`).
    """
    d = model_to_dict(model)
    touched: dict[str, str] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ModelError(
                f"override {shown(item)}: expected KEY=VALUE, e.g. reader.read_threads=4"
            )
        try:  # libyaml when available: its nesting limit keeps a deep value from recursing
            value = yaml.load(raw, Loader=_SafeLoader) if raw.strip() else None
        except (yaml.YAMLError, RecursionError, ValueError):
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
        result = model_from_dict(d, source="overrides")
    except ModelError as exc:
        path = getattr(exc, "field_path", "")
        culprit = next(
            (
                item
                for unit, item in touched.items()
                if path == unit or path.startswith(unit + ".") or unit.startswith(path + ".")
            ),
            None,
        )
        hint = (
            f"from override {shown(culprit)}"
            if culprit
            else f"after overrides {', '.join(map(shown, touched.values()))}"
            if touched
            else "after the overrides"
        )
        err = ModelError(f"{exc} ({hint})")
        err.field_path = path  # type: ignore[attr-defined]
        raise err from None
    check_effect(model, result, touched)  # an override nothing would honour is an error
    return result
