"""``torch.save`` archives (``dataset.format`` pt): a sample's tensors in one file, as a job
that preprocessed its dataset once keeps it, read back by ``torch.load``."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from dlreplay.model import ArrayFile

from ..common import ReplayError

__all__ = ["storage_bytes", "write_pt"]

#: an archive's storage records (``<archive>/data/<key>``), each a tensor's bytes
_STORAGE = re.compile(r"(^|/)data/\d+$")


def storage_bytes(structure: ArrayFile | None, target: int) -> list[int]:
    """The bytes of each tensor storage of a file of *structure* (its ``data/N`` members), else
    one storage of *target* bytes (the archive's small records left out of neither: torch adds
    its own pickle and version records around them)."""
    sizes = [
        int(np.prod(m.shape or [0]))
        for m in (structure.members if structure is not None else [])
        if _STORAGE.search(m.name)
    ]
    return sizes or [max(1, target)]


def write_pt(tmp: Path, sizes: list[int], rng: np.random.Generator) -> str:
    """``torch.save`` of a dict of one uint8 tensor a storage size (random bytes) at *tmp*;
    returns a note on what was written."""
    try:
        import torch
    except ImportError:
        raise ReplayError(
            "dataset.format pt is written by torch.save: install the torch extra "
            "(pip install 'dlreplay[torch]')"
        ) from None
    tensors = {
        f"t{i}": torch.from_numpy(rng.integers(0, 256, n, dtype=np.uint8))
        for i, n in enumerate(sizes)
    }
    torch.save(tensors, tmp)
    return f"torch.save of {len(sizes)} tensor(s), {sum(sizes):,} B of storage"
