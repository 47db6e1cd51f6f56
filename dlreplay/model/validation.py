"""Plain data (a parsed model file) into a validated model: every value checked against its
field's type and metadata, errors naming the source and the dotted field path."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import numbers
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from dlreplay.errors import ModelError, shown
from dlreplay.model.base import (
    MODEL_FORMAT_VERSION,
    MODEL_SCHEMA_NAME,
    InvalidField,
    ModelVersionError,
    describe_value,
    field_meta,
    is_required,
    join_path,
    model_error,
    strip_optional,
    type_hints,
)
from dlreplay.model.distribution import Distribution
from dlreplay.model.sections import FieldProvenance, WorkloadModel

_DEFAULT_METHOD = "dlreplay default (not given)"


def _expected(tp: Any, md: Mapping[str, Any]) -> str:
    """The phrase after 'expected' for a field of type *tp*."""
    inner, optional = strip_optional(tp)
    check: str = md.get("check") or ""
    choices = md.get("choices")
    if choices:
        text = f"one of {', '.join(choices)}"
    elif inner is bool:
        text = "true or false"
    elif inner is int:
        text = {"positive": "a positive integer", "nonneg": "a non-negative integer"}.get(
            check, "an integer"
        )
    elif inner is float:
        text = {
            "positive": "a positive number",
            "nonneg": "a non-negative number",
            "fraction": "a number between 0 and 1",
        }.get(check, "a number")
    elif inner is str:
        text = "a string"
    elif inner is Distribution:
        text = "a distribution (a number, or a mapping with type: fixed|normal|...)"
    elif typing.get_origin(inner) is list:
        (item,) = typing.get_args(inner)
        text = "a list of " + (
            "positive integers"
            if check == "positive" and item is int
            else "non-negative integers"
            if check == "nonneg" and item is int
            else "integers"
            if item is int
            else "non-negative numbers"
            if check == "nonneg" and item is float
            else "numbers"
            if item is float
            else "lists"
            if typing.get_origin(item) is list
            else "mappings"
            if is_dataclass(item)
            else "strings"
        )
    elif typing.get_origin(inner) is dict or is_dataclass(inner):
        text = "a mapping"
    else:  # pragma: no cover - every field type is covered above
        text = str(inner)
    return text + (" or null" if optional else "")


@dataclass
class _Ctx:
    source: str
    absent: list[str] = field(default_factory=list)


#: The largest integer a model holds (a count or a size; numpy's int64).
INT64_MAX = 2**63 - 1


def _finite(value: numbers.Real) -> bool:
    """Whether *value* is a finite float (an int of thousands of digits is not: float() overflows)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


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
    inner, optional = strip_optional(tp)
    if value is None:
        if optional:
            return None
        raise model_error(ctx.source, path, f"expected {_expected(tp, md)}, got null")
    bad = model_error(
        ctx.source, path, f"expected {_expected(tp, md)}, got {describe_value(value)}"
    )
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
        if abs(value) > INT64_MAX:  # no count or size of a real job, and numpy's plan is int64
            raise model_error(
                ctx.source, path, f"expected at most 2^63 - 1, got {describe_value(value)}"
            )
        return value
    if inner is float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not _finite(value):
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
                raise model_error(ctx.source, join_path(path, str(k)), "expected a string key")
            out[k] = _convert(v, vtp, field_meta(), join_path(path, k), ctx)
        return out
    if isinstance(inner, type) and is_dataclass(inner):
        return _build(inner, value, path, ctx)
    raise AssertionError(f"unsupported field type {inner!r}")  # pragma: no cover


def _convert_str(value: Any, md: Mapping[str, Any], bad: ModelError) -> str:
    choices = md.get("choices")
    if choices and value is False and "off" in choices:
        return "off"  # YAML 1.1 reads a bare `off` as false
    if choices and value is True and "on" in choices:
        return "on"  # and a bare `on` as true
    if isinstance(value, (_dt.datetime, _dt.date)) and not choices:
        return value.isoformat()
    if not isinstance(value, str) or (choices and value not in choices):
        raise bad
    return value


def _convert_list(
    value: Any, tp: Any, md: Mapping[str, Any], path: str, ctx: _Ctx, bad: ModelError
) -> list:
    if not isinstance(value, (list, tuple)):
        raise bad
    (item,) = typing.get_args(tp)
    return [_convert(v, item, md, f"{path}[{i}]", ctx) for i, v in enumerate(value)]


def _convert_distribution(value: Any, md: Mapping[str, Any], path: str, ctx: _Ctx) -> Distribution:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = {"type": "fixed", "value": value}
    if not isinstance(value, Mapping):
        raise model_error(
            ctx.source, path, f"expected {_expected(Distribution, md)}, got {describe_value(value)}"
        )
    dist = _build(Distribution, value, path, ctx)
    if md.get("check") == "nonneg":
        problems = dist.nonneg_problems()
        if problems:
            sub, msg = problems[0]
            raise model_error(ctx.source, join_path(path, sub), msg)
    return dist


def _build(cls: type, data: Any, path: str, ctx: _Ctx) -> Any:
    """Build dataclass *cls* from mapping *data*, naming *path* in every error."""
    if not isinstance(data, Mapping):
        raise model_error(
            ctx.source, path or "(top level)", f"expected a mapping, got {describe_value(data)}"
        )
    hints = type_hints(cls)
    known = [f.name for f in fields(cls)]
    for key in data:
        if key not in known:
            raise model_error(
                ctx.source,
                join_path(path, str(key)),
                f"unknown field; expected one of: {', '.join(known)}",
            )
    kwargs: dict[str, Any] = {}
    track = getattr(cls, "_track_defaults", True)
    for f in fields(cls):
        sub = join_path(path, f.name)
        if f.name in data:
            kwargs[f.name] = _convert(data[f.name], hints[f.name], f.metadata, sub, ctx)
        elif is_required(f):
            raise model_error(
                ctx.source, sub, f"missing required field ({_expected(hints[f.name], f.metadata)})"
            )
        elif track and f.name != "provenance":
            ctx.absent.append(sub)
    try:
        return cls(**kwargs)
    except InvalidField as exc:
        raise model_error(ctx.source, join_path(path, exc.subpath), exc.message) from None


def _check_header(data: Mapping[str, Any], source: str) -> None:
    if "schema" not in data:
        raise model_error(
            source,
            "schema",
            f"missing required field (expected {MODEL_SCHEMA_NAME!r}); "
            f"is this a dlreplay workload model?",
        )
    if data["schema"] != MODEL_SCHEMA_NAME:
        raise model_error(
            source,
            "schema",
            f"{source} is not a dlreplay workload model (schema is "
            f"{shown(data['schema'])}, expected {MODEL_SCHEMA_NAME!r}).",
            ModelVersionError,
        )
    version = data.get("format_version")
    if version is None:
        raise model_error(source, "format_version", "missing required field (a positive integer)")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise model_error(
            source, "format_version", f"expected a positive integer, got {describe_value(version)}"
        )
    if version > MODEL_FORMAT_VERSION:
        raise model_error(
            source,
            "format_version",
            f"{source} was written by a newer dlreplay (format_version {version}; this version "
            f"reads up to {MODEL_FORMAT_VERSION}). Upgrade dlreplay to read it.",
            ModelVersionError,
        )


def model_from_dict(
    d: Any, source: str = "<dict>", default_method: str = _DEFAULT_METHOD
) -> WorkloadModel:
    """Validate plain data *d* (as :func:`model_to_dict` gives) and build the model.

    Errors are :class:`ModelError` naming *source* and the dotted field path.
    Fields left out are filled with defaults and recorded in
    ``provenance.fields`` as confidence ``default`` with *default_method*
    (unless already recorded).
    """
    if not isinstance(d, Mapping):
        raise model_error(
            source, "(top level)", f"expected a mapping of sections, got {describe_value(d)}"
        )
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
