"""Checksums of the formats dlreplay writes and reads: CRC-32C (Castagnoli) and TFRecord's
masked CRC-32C. Shared by capture (recognising TFRecord files) and replay (writing them)."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["crc32c", "masked_crc32c"]

_POLY = 0x82F63B78


def _make_table() -> np.ndarray:
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table[i] = c
    return table


_TABLE = _make_table()
_TABLE_LIST = [int(x) for x in _TABLE]


def _gf2_times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, mat[i]) for i in range(32)]


def _zeros_operator(nbytes: int) -> list[int]:
    """The GF(2) matrix (32 columns) advancing a raw CRC register over *nbytes* zero bytes."""
    one_bit = [_POLY] + [1 << i for i in range(31)]  # one zero bit
    op = one_bit
    for _ in range(3):  # 8 bits
        op = _gf2_square(op)
    result = [1 << i for i in range(32)]  # identity
    n = nbytes
    while n:
        if n & 1:
            result = [_gf2_times(op, c) for c in result]
        n >>= 1
        if n:
            op = _gf2_square(op)
    return result


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli) of *data*, as TFRecord uses it (numpy, lane-parallel).

    The data is split into equal lanes whose raw CRCs are computed in parallel with a
    byte table, then combined with the zero-advance operator over GF(2).
    """
    buf = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    n = buf.size
    if n < 4096:
        c = 0xFFFFFFFF
        for b in buf.tobytes():
            c = _TABLE_LIST[(c ^ b) & 0xFF] ^ (c >> 8)
        return c ^ 0xFFFFFFFF
    m = max(256, int(math.sqrt(n)))
    lanes = -(-n // m)
    padded = np.zeros(lanes * m, dtype=np.uint8)
    padded[lanes * m - n :] = buf  # leading zeros do not change a raw CRC that starts at 0
    cols = padded.reshape(lanes, m).T.copy()
    reg = np.zeros(lanes, dtype=np.uint32)
    for j in range(m):
        reg = _TABLE[(reg ^ cols[j]) & 0xFF] ^ (reg >> np.uint32(8))
    shift = _zeros_operator(m)
    raw = 0
    for g in reg.tolist():
        raw = _gf2_times(shift, raw) ^ g
    init = _gf2_times(_zeros_operator(n), 0xFFFFFFFF)
    return (raw ^ init) ^ 0xFFFFFFFF


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """TFRecord's masked CRC-32C."""
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
