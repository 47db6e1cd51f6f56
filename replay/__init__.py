"""Replay: dataset generation (``dlreplay generate``) and the replay engine (``dlreplay replay``).

>>> from dlreplay.model import load_model
>>> from dlreplay.replay import GenerateConfig, ReplayConfig, generate_dataset, run_replay
>>> m = load_model("model.yaml")                                     # doctest: +SKIP
>>> generate_dataset(GenerateConfig(model=m, data_dir=Path("data")))  # doctest: +SKIP
>>> run_replay(ReplayConfig(model=m, data_dir=Path("data"), trace=False)).metrics["overall"]  # doctest: +SKIP
"""

from __future__ import annotations

from .common import MANIFEST_NAME, ReplayError, dataset_digest, plan_dataset, read_dataset_manifest
from .engine import ReplayConfig, ReplayResult, find_max_accelerators, render_result, run_replay
from .generate import GenerateConfig, GenerateResult, generate_dataset
from .metrics import render_table
from .writers import crc32c, masked_crc32c

__all__ = [
    "MANIFEST_NAME",
    "GenerateConfig",
    "GenerateResult",
    "ReplayConfig",
    "ReplayError",
    "ReplayResult",
    "crc32c",
    "dataset_digest",
    "find_max_accelerators",
    "generate_dataset",
    "masked_crc32c",
    "plan_dataset",
    "read_dataset_manifest",
    "render_result",
    "render_table",
    "run_replay",
]
