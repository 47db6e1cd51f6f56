"""Model files: reading YAML safely, writing it readably, loading and saving a model."""

from __future__ import annotations

import os
import typing
from typing import Any

import yaml

from dlreplay.errors import SHOWN_CHARS, ModelError, clipped, shown
from dlreplay.model.base import MODEL_FORMAT_VERSION, MODEL_SCHEMA_NAME
from dlreplay.model.plain import model_to_dict
from dlreplay.model.sections import WorkloadModel
from dlreplay.model.validation import model_from_dict
from dlreplay.osutil import atomic_write_text

_SafeLoader = getattr(
    yaml, "CSafeLoader", yaml.SafeLoader
)  # libyaml when available: same rules, faster
_SafeDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _StrictLoader(_SafeLoader):  # type: ignore[misc, valid-type]
    """Safe loader (no python tags) that refuses duplicate mapping keys."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, typing.Hashable) and key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {shown(key)}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


#: The most bytes of a model or config file read: real ones are kilobytes (a few hundred with
#: a fingerprinted layout); a file larger than this is not one, and parsing it whole would need
#: many times its size in memory (``model show /dev/zero`` would read forever).
MAX_YAML_BYTES = 16 * 2**20


def read_bounded(
    path: str | os.PathLike[str],
    limit: int = MAX_YAML_BYTES,
    error: type[ModelError] = ModelError,
    what: str = "a model or config file",
) -> bytes:
    """The bytes of *path*, refused (an *error* naming the file and the limit) past *limit*."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read the file ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise error(
            f"{path}: larger than {limit // 2**20} MiB, the most dlreplay reads of {what}; "
            f"is it the right file?"
        )
    return data


def parse_yaml(
    text: str, source: str, error: type[ModelError] = ModelError, what: str = "not valid YAML"
) -> Any:
    """Parse YAML *text* safely (no python tags, no duplicate keys, nesting bounded);
    errors (``{source}: {what}: ...``) name *source*, the line and the column."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a safe loader: no python tags
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        if isinstance(exc, yaml.reader.ReaderError):  # e.g. binary data: no line/column, a position
            where = f" (character {exc.position + 1})"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]  # one line
        raise error(f"{source}: {what}: {clipped(problem)}{where}") from None
    except RecursionError:  # the pure-Python loader (no libyaml) has no nesting limit of its own
        raise error(f"{source}: {what}: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits (int() refuses it)
        raise error(f"{source}: {what}: {clipped(str(exc), 2 * SHOWN_CHARS)}") from None


def load_yaml_file(path: str | os.PathLike[str], error: type[ModelError] = ModelError) -> Any:
    """Parse a YAML file safely (no python tags, no duplicate keys, at most
    :data:`MAX_YAML_BYTES`); errors name the file."""
    source = str(path)
    try:
        text = read_bounded(path, error=error).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{source}: cannot read the file ({exc})") from None
    return parse_yaml(text, source, error)


def load_model(path: str | os.PathLike[str]) -> WorkloadModel:
    """Read and validate a workload model file. Raises :class:`ModelError` naming the file."""
    return model_from_dict(load_yaml_file(path), source=str(path))


class _Dumper(_SafeDumper):  # type: ignore[misc, valid-type]
    """Safe dumper writing short lists of numbers inline (``[1, 128, 128]``)."""


def _represent_list(dumper: Any, data: list) -> yaml.Node:
    flow = 0 < len(data) <= 64 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in data
    )
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


def dump_yaml(data: Any) -> str:
    """Readable YAML (block style, key order kept, no python tags)."""
    return yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=100,
    )


def save_model(model: WorkloadModel, path: str | os.PathLike[str]) -> None:
    """Write *model* as YAML to *path*, atomically, in a stable key order."""
    header = (
        f"# dlreplay workload model ({MODEL_SCHEMA_NAME} v{MODEL_FORMAT_VERSION}). "
        f"Units: bytes, seconds; fractions 0..1.\n"
    )
    try:
        atomic_write_text(path, header + dump_yaml(model_to_dict(model)))
    except OSError as exc:
        raise ModelError(f"{path}: cannot write the model ({exc.strerror or exc})") from None
