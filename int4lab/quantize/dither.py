"""The rounding lottery's dither: counter-based noise drawn on the weights' own device, the same bytes on every device.

Element i of ticket `seed`'s stream is u_i = (k_i - 2**23) * (dither * 2**-23), with k_i the top 24 bits of
splitmix64's output function applied to key + i * GOLDEN (mod 2**64) and key = mix64(seed * GOLDEN + SALT):
a uniform draw on the 2**24-point grid of [-dither, dither) (torch.rand's float32 resolution), independent
across elements and seeds as far as splitmix64 is (it passes BigCrush). The dithered pack adds u to w / s
before rounding (`dithered_pack`). No generator state: element i of a tensor packed at stream position p
is stream element p + i, so packing a layer a few experts at a time gives the bytes of one whole-tensor pack.

Two implementations of one function: integer torch ops (any device; the reference) and one Triton kernel
(CUDA), bit-identical because the hash is exact integer arithmetic and the float step is one IEEE product of
an integer below 2**23 in magnitude by a float32 scale. tests/lib/test_dither.py checks both against a numpy
uint64 reference, on CUDA as well where a GPU exists.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

GOLDEN = 0x9E3779B97F4A7C15          # splitmix64's increment (2**64 / golden ratio)
M1, M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
SALT = 0x5DEECE66D                   # keeps seed 0's key away from mix64(0) = 0
MASK64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's output function on a Python int (mod 2**64)."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * M1) & MASK64
    x = ((x ^ (x >> 27)) * M2) & MASK64
    return x ^ (x >> 31)


def stream_key(seed: int) -> int:
    """The 64-bit key of ticket `seed`'s stream."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return mix64(seed * GOLDEN + SALT)


def step_scale(dither: float) -> float:
    """dither * 2**-23 rounded once to float32: the noise's grid step."""
    if not isinstance(dither, (int, float)) or isinstance(dither, bool) or not 0 <= dither <= 0.5:
        raise ValueError(f"dither must be a number in [0, 0.5] (units of the scale), got {dither!r}")
    return float(torch.tensor(float(dither), dtype=torch.float32) * 2.0 ** -23)


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


def noise_torch(n: int, seed: int, dither: float, offset: int = 0, device="cpu") -> torch.Tensor:
    """float32 [n]: stream elements offset .. offset + n - 1 of ticket `seed`, by int64 torch ops in place
    (two's complement wrap-around on multiply, as on every device torch runs on; >> is arithmetic, so each
    logical shift is masked)."""
    scale = step_scale(dither)
    z = torch.arange(offset, offset + n, dtype=torch.int64, device=device)
    z.mul_(_signed(GOLDEN)).add_(_signed(stream_key(seed)))
    t = torch.empty_like(z)
    for k, m in ((30, M1), (27, M2), (31, None)):
        torch.bitwise_right_shift(z, k, out=t).bitwise_and_((1 << (64 - k)) - 1)
        z.bitwise_xor_(t)
        if m is not None:
            z.mul_(_signed(m))
    del t
    z.bitwise_right_shift_(40).bitwise_and_((1 << 24) - 1).sub_(1 << 23)
    return z.to(torch.float32).mul_(scale)


@triton.jit
def _noise_kernel(out_ptr, n, offset, key, golden, m1, m2, scale, BLOCK: tl.constexpr):
    # every 64-bit constant arrives as an argument cast to uint64: a Python int's type depends on its value
    # (below 2**63 it is int64), and the hash wants one wrapping unsigned arithmetic throughout
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    z = (i + offset).to(tl.uint64) * golden.to(tl.uint64) + key.to(tl.uint64)
    z = (z ^ (z >> 30)) * m1.to(tl.uint64)
    z = (z ^ (z >> 27)) * m2.to(tl.uint64)
    z = z ^ (z >> 31)
    k = (z >> 40).to(tl.int32) - 8388608
    tl.store(out_ptr + i, k.to(tl.float32) * scale, mask=i < n)


def noise_triton(n: int, seed: int, dither: float, offset: int = 0, device="cuda") -> torch.Tensor:
    """The same stream as `noise_torch` by one Triton launch (CUDA, or Triton's interpreter on a CPU)."""
    scale = step_scale(dither)
    out = torch.empty(n, dtype=torch.float32, device=device)
    if n:
        BLOCK = 1024
        _noise_kernel[(triton.cdiv(n, BLOCK),)](out, n, offset, stream_key(seed), GOLDEN, M1, M2, scale,
                                                 BLOCK=BLOCK)
    return out


def dither_noise(n: int, seed: int, dither: float, offset: int = 0, device="cpu") -> torch.Tensor:
    """float32 [n] on `device`: the Triton kernel on CUDA, integer torch ops elsewhere (module doc)."""
    for name, v in (("n", n), ("offset", offset)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name} must be a non-negative int, got {v!r}")
    if torch.device(device).type == "cuda":
        return noise_triton(n, seed, dither, offset, device)
    return noise_torch(n, seed, dither, offset, device)


class DitherStream:
    """One ticket's stream over a whole model: each `noise` call takes the next n elements, so the tensors
    of a model get disjoint stretches in packing order (module doc)."""

    def __init__(self, seed: int, dither: float):
        stream_key(seed), step_scale(dither)                      # their checks
        self.seed, self.dither, self.position = seed, float(dither), 0

    def noise(self, shape, device) -> torch.Tensor:
        n = 1
        for d in shape:
            n *= int(d)
        u = dither_noise(n, self.seed, self.dither, self.position, device).reshape(shape)
        self.position += n
        return u
