"""Chapter 01b: what a byte tolerance lets through. Paddle's layout test compares int8 bytes with
`assert_allclose(atol, rtol)`; these helpers enumerate which corrupted bytes that rule admits."""
from __future__ import annotations

import numpy as np


def allclose_passes(actual: np.ndarray, desired: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """numpy.testing.assert_allclose's element rule: |actual - desired| <= atol + rtol * |desired| (bool array)."""
    a = np.asarray(actual, dtype=np.float64)
    d = np.asarray(desired, dtype=np.float64)
    return np.abs(a - d) <= atol + rtol * np.abs(d)


def single_nibble_errors(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every byte of b (int8 values) with one nibble replaced by each of the 15 other values.

    Returns (corrupted int8 [b.size, 2, 15], code error int64 [b.size, 2, 15]): axis 1 is the low, then the high
    nibble; the code error is new nibble - old nibble, i.e. the error in the decoded code (-15..15, never 0).
    """
    u = np.asarray(b).astype(np.int8).view(np.uint8).reshape(-1).astype(np.int64)
    lo, hi = u & 0xF, u >> 4
    shift = np.arange(1, 16)
    new_lo = (lo[:, None] + shift) & 0xF
    new_hi = (hi[:, None] + shift) & 0xF
    out = np.stack([(u[:, None] & 0xF0) | new_lo, (new_hi << 4) | lo[:, None]], axis=1)
    err = np.stack([new_lo - lo[:, None], new_hi - hi[:, None]], axis=1)
    return out.astype(np.uint8).view(np.int8), err


def admitted_fraction(atol: float, rtol: float) -> tuple[np.ndarray, np.ndarray]:
    """For every desired int8 byte d (-128..127): the fraction of the 256 possible actual bytes a that
    `allclose_passes(a, d, atol, rtol)` admits. Returns (d int64 [256], fraction float64 [256])."""
    if not (atol >= 0 and rtol >= 0):
        raise ValueError(f"atol and rtol must be >= 0, got atol={atol!r}, rtol={rtol!r}")
    b = np.arange(-128, 128, dtype=np.int64)
    ok = allclose_passes(b[None, :], b[:, None], atol, rtol)          # [d, a]
    return b, ok.mean(axis=1)
