"""Seeded noise that compresses like the real content: a share of incompressible blocks among
constant ones, and the share that gives a codec's compression ratio (calibrated with that codec)."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from functools import lru_cache

import numpy as np


def _block_pattern(n: int, share: float, block: int) -> np.ndarray:
    """Boolean per block of *block* bytes over *n* bytes: True = random, spread evenly, *share* of them."""
    nb = max(1, -(-n // block))
    k = int(round(min(max(share, 0.0), 1.0) * nb))
    mask = np.zeros(nb, dtype=bool)
    if k:
        mask[np.unique(np.floor(np.arange(k) * nb / k).astype(np.int64))] = True
    return mask


def fill_noise(n: int, share: float, rng: np.random.Generator, block: int) -> np.ndarray:
    """*n* bytes (uint8): *share* of blocks random, the rest a constant byte."""
    if share >= 1.0:
        return np.frombuffer(rng.bytes(n), dtype=np.uint8).copy()
    mask = _block_pattern(n, share, block)
    out = np.full(mask.size * block, 0x2A, dtype=np.uint8)
    idx = np.flatnonzero(mask)
    if idx.size:
        rand = np.frombuffer(rng.bytes(idx.size * block), dtype=np.uint8).reshape(idx.size, block)
        out.reshape(-1, block)[idx] = rand
    return out[:n]


def block_for(n: int) -> int:
    """Block size of the random/constant pattern for *n* bytes: small enough to spread evenly."""
    return int(min(4096, max(16, 1 << int(math.log2(max(n // 64, 16))))))


def calibrate(measure: Callable[[float], float], target: float, tol: float = 0.005) -> float:
    """The random share s in [0, 1] with measure(s) ~= target (a ratio), by secant/bisection."""
    lo, hi = 0.0, 1.0
    m_lo, m_hi = measure(lo), measure(hi)
    if target <= m_lo:
        return lo
    if target >= m_hi:
        return hi
    s = (target - m_lo) / (m_hi - m_lo)
    for _ in range(8):
        m = measure(s)
        if abs(m - target) <= tol * max(target, 1e-3):
            return s
        if m < target:
            lo, m_lo = s, m
        else:
            hi, m_hi = s, m
        s = lo + (target - m_lo) * (hi - lo) / max(m_hi - m_lo, 1e-12)
        s = min(max(s, lo + 1e-6), hi - 1e-6)
    return s


@lru_cache(maxsize=256)
def deflate_share(n: int, ratio: float, level: int, header: bytes = b"") -> float:
    """Random share of *n* content bytes giving a raw-deflate ratio of *ratio* at *level* for
    the stream *header* + content (an NPZ member: the NPY header, then the array)."""
    probe = min(n, 4 << 20)
    block = block_for(n)
    rng = np.random.default_rng(12345)

    def measure(share: float) -> float:
        data = header + fill_noise(probe, share, rng, block).tobytes()
        c = zlib.compressobj(level, zlib.DEFLATED, -15)
        return (len(c.compress(data)) + len(c.flush())) / len(data)

    return calibrate(measure, ratio)
