"""The split-K reduce as its own launch: float32 partials [SK, R, N] -> bf16 [R, N], fixed order.

Shape legend: SK = K splits, R = rows, N = out features.

The GEMV kernels finish split-K in their own launch (epilogue.finish_rows); this kernel is kept for
callers that hold partials of their own and for tests, which check the one-launch finish against it bit
for bit: both sum slot 0, then 1, ... in float32 from zero.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._checks import check_contiguous, check_devices, check_out, check_shape, check_tensor
from . import plan as _plan
from .epilogue import to_bf16_rne


@triton.jit
def reduce_partials_kernel(
    # Pointers
    part_ptr, out_ptr,
    # Dimensions
    R, N,
    # Meta-parameters
    SK: tl.constexpr, BLOCK: tl.constexpr,
):
    """out[r, n] (bf16) = sum_s part[s, r, n], s = 0..SK-1 in order; one program owns BLOCK columns of a row."""
    r = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    y = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, SK):
        y += tl.load(part_ptr + (s * R + r).to(tl.int64) * N + offs, mask=mask, other=0.0)
    tl.store(out_ptr + r.to(tl.int64) * N + offs, to_bf16_rne(y), mask=mask)


def reduce_partials(part, sk, R, N, out=None):
    """part float32 [sk, R, N] -> bf16 [R, N]: slots summed in the order 0..sk-1 in one launch, so the
    same partials always give the same bits."""
    check_tensor("part", part, (torch.float32,), (3,))
    for name, v in (("sk", sk), ("R", R), ("N", N)):
        if not isinstance(v, int) or isinstance(v, bool) or v < (1 if name != "R" else 0):
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    check_shape("part", part, (sk, R, N))
    check_contiguous(part=part)
    dev = check_devices(part=part, out=out)
    out = check_out("out", out, (R, N), torch.bfloat16, dev)
    if R:
        blk = _plan.row_block(dev)
        reduce_partials_kernel[(R, triton.cdiv(N, blk))](part, out, R, N, SK=sk, BLOCK=blk)
    return out
