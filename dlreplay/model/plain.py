"""The model as plain data (mappings, lists, numbers, strings): what a model file holds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, fields, is_dataclass
from typing import Any

import numpy as np

from dlreplay.model.base import MODEL_FORMAT_VERSION, MODEL_SCHEMA_NAME, is_required
from dlreplay.model.sections import WorkloadModel


def _default_of(f: Any) -> Any:
    """The default value of dataclass field *f* (from its factory when it has one)."""
    return f.default if f.default is not MISSING else f.default_factory()


def to_plain(obj: Any) -> Any:
    """Dataclasses/containers → plain YAML-safe Python values, in field order."""
    if is_dataclass(obj) and not isinstance(obj, type):
        omit = getattr(obj, "_omit_none", False)
        omit_defaults = getattr(obj, "_omit_defaults", False)
        out = {}
        for f in fields(obj):
            v = getattr(obj, f.name)
            if v is None and (omit or omit_defaults):
                continue
            if omit_defaults and not is_required(f) and v == _default_of(f):
                continue
            out[f.name] = to_plain(v)
        return out
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def model_to_dict(model: WorkloadModel) -> dict[str, Any]:
    """The model as plain data (what :func:`save_model` writes), header keys first."""
    return {"schema": MODEL_SCHEMA_NAME, "format_version": MODEL_FORMAT_VERSION, **to_plain(model)}
