"""Invalid workload models (issue #7, bad-input suite).

Through the CLI (``model show``, ``generate``, ``replay``, ``model export-dlio``): exit 1,
one line ``dlreplay: error: FILE: FIELD.PATH: what was expected``, never a traceback.
Library-level cases (every kind of invalid field, with exact messages) are in
``test_model.test_invalid_model_names_file_and_field``. A hypothesis property mutates
random valid models: the loader either accepts the result or raises ModelError naming a
field path at or next to the mutated one, never another exception.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlreplay.errors import ModelError
from dlreplay.model import WorkloadModel, load_model, model_from_dict, model_to_dict

from .conftest import run_cli
from .test_model import MINIMAL, _models

CASES = [
    (
        "wrong type",
        MINIMAL + "reader:\n  batch_size: two\n",
        "reader.batch_size: expected a positive integer, got 'two'",
    ),
    (
        "wrong type list",
        MINIMAL + "train:\n  epochs: [1, 2]\n",
        "train.epochs: expected a positive integer, got a list",
    ),
    (
        "wrong type mapping",
        MINIMAL + "checkpoint: [1]\n",
        "checkpoint: expected a mapping, got a list",
    ),
    (
        "unknown key",
        MINIMAL + "reader:\n  batch_sise: 4\n",
        "reader.batch_sise: unknown field; expected one of",
    ),
    (
        "missing required",
        MINIMAL.replace("  num_files: 168\n", ""),
        "dataset.num_files: missing required field",
    ),
    (
        "bad distribution",
        MINIMAL.replace("type: normal", "type: zipf"),
        "dataset.record_length.type: expected one of",
    ),
    ("not yaml", "dataset: {format: npz\n", "not valid YAML"),
    ("not a model", "- 1\n", "(top level): expected a mapping of sections, got a list"),
    ("binary garbage", "\x00\x01\x02", "not valid YAML"),
]


# every case with `model show`; three of them with each command that reads a model
RUNS = [("model show", *c) for c in CASES] + [
    (cmd, *c) for cmd in ("generate", "replay", "model export-dlio") for c in CASES[:5:2]
]


@pytest.mark.parametrize(
    ("command", "case", "text", "expected"), RUNS, ids=[f"{r[0]}-{r[1]}" for r in RUNS]
)
def test_invalid_model_through_the_cli(
    tmp_path: Path, command: str, case: str, text: str, expected: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    extra = {
        "model show": [],
        "generate": ["--data-dir", str(tmp_path / "d")],
        "replay": ["--data-dir", str(tmp_path / "d"), "--no-trace", "--out", str(tmp_path / "o")],
        "model export-dlio": ["-o", str(tmp_path / "w.yaml")],
    }[command]
    proc = run_cli(*command.split(), str(path), *extra)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"dlreplay: error: {path}: ") and expected in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert (
        not (tmp_path / "d").exists()
        and not (tmp_path / "o").exists()
        and not (tmp_path / "w.yaml").exists()
    )


def test_invalid_override_names_the_key(tmp_path: Path) -> None:
    """--set with a wrong type (test_replay.test_invalid_set_names_the_key: unknown key, bad value)."""
    path = tmp_path / "m.yaml"
    path.write_text(MINIMAL)
    proc = run_cli(
        "generate", str(path), "--data-dir", str(tmp_path / "d"), "--set", "train.epochs=[1]"
    )
    assert proc.returncode == 1 and "train.epochs" in proc.stderr and "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- property: mutated models

WRONG: list[Any] = [
    "a string",
    [1, 2],
    {"x": 1},
    None,
    True,
    -1,
    1.5,
    0,
    math.nan,
    math.inf,
    "",
    [],
    {},
]


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Key paths of every value (mappings and lists included) below ``node``."""
    out = [path] if path else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _leaves(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _leaves(v, (*path, i))
    return out


def _dotted(path: tuple[Any, ...]) -> str:
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


def _parent(d: dict, path: tuple[Any, ...]) -> Any:
    for k in path[:-1]:
        d = d[k]
    return d


@st.composite
def _mutations(draw: st.DrawFn) -> tuple[dict, str, str]:
    """A valid model's dict with one mutation: (dict, mutated path, kind)."""
    d = model_to_dict(draw(_models()))
    paths = _leaves(d)
    path = draw(st.sampled_from(paths))
    parent = _parent(d, path)
    kind = draw(st.sampled_from(["retype", "retype", "retype", "unknown key", "delete"]))
    if kind == "unknown key":
        mappings = [p for p in paths if isinstance(_parent(d, (*p, "x")), dict)]
        path = draw(st.sampled_from(mappings)) if mappings else path
        target = _parent(d, (*path, "x"))
        if not isinstance(target, dict):
            kind, target = "retype", parent
        else:
            target["bogus_key"] = 1
            return d, _dotted((*path, "bogus_key")), kind
    if kind == "delete" and isinstance(parent, dict):
        del parent[path[-1]]
        return d, _dotted(path), kind
    parent[path[-1]] = draw(st.sampled_from(WRONG))
    return d, _dotted(path), "retype"


def _related(error_path: str, mutated: str) -> bool:
    """The error names the mutated field, a field inside it, or its section (a cross-field
    check, e.g. uniform max < min reported at max, or a distribution reported as a whole)."""
    if error_path == mutated or error_path.startswith((mutated + ".", mutated + "[")):
        return True
    parent = (
        mutated.rsplit(".", 1)[0].split("[", 1)[0] if "." in mutated else mutated.split("[", 1)[0]
    )
    return error_path == parent or error_path.startswith((parent + ".", parent + "["))


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=_mutations())
def test_mutated_models_give_model_error_naming_the_field(
    tmp_path: Path, case: tuple[dict, str, str]
) -> None:
    d, mutated, kind = case
    try:
        model = model_from_dict(d, source="m.yaml")
    except ModelError as exc:
        path = getattr(exc, "field_path", None)
        assert path, f"no field path in {exc!r}"
        assert str(exc).startswith("m.yaml: ") and f": {path}: " in str(exc)
        assert _related(path, mutated), (path, mutated, str(exc))
    else:
        assert isinstance(model, WorkloadModel)  # e.g. null for an optional field, 0 for a count
        assert kind in ("retype", "delete")
    # the same through a YAML file (what a user edits): same outcome, never another exception
    f = tmp_path / "m.yaml"
    try:
        f.write_text(yaml.safe_dump(d, sort_keys=False))
    except yaml.YAMLError:
        return
    try:
        load_model(f)
    except ModelError as exc:
        assert str(exc).startswith(f"{f}: ")
