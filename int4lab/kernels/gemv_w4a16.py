"""W4A16 GEMV on int4-b32: weights decoded to float32 in registers, float32 FMAs, x not quantised.

Shape legend: N = out features, K = in features, R = activation rows.

The numerics path of quantised modules with act="bf16" (int4_linear), not a speed target: one modest
tile everywhere. Bytes per call: N * K * 0.5625 + R * (K + N) * 2.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .epilogue import to_bf16_rne

# One modest tile everywhere (module doc).
W4A16_BLOCK_N, W4A16_BLOCK_K = 32, 128


@triton.jit
def gemv_w4a16_kernel(
    # Pointers
    x_ptr, w_ptr, ws_ptr, out_ptr,
    # Dimensions
    N, K, stride_xr,
    # Meta-parameters
    K_TILES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """W4A16: out [R, N] bf16 = x [R, K] (float) @ dequant(w [N, K/2], ws [N, K/32])^T, float32 FMAs.

    One program owns out[r, n0 : n0 + BLOCK_N]; weights are decoded in registers, never written out.
    """
    pid_n = tl.program_id(0)
    r = tl.program_id(1)
    HALF: tl.constexpr = BLOCK_K // 2
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_p = tl.arange(0, HALF)
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * (K // 2)
    s_rows = ws_ptr + offs_n[:, None].to(tl.int64) * (K // 32)
    x_row = x_ptr + r * stride_xr
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for t in range(0, K_TILES):
        p = t * HALF + offs_p
        p_mask = p < K // 2
        m2 = n_mask[:, None] & p_mask[None, :]
        wb = tl.load(w_rows + p[None, :], mask=m2, other=0)
        s = tl.load(s_rows + (p // 16)[None, :], mask=m2, other=0.0).to(tl.float32)
        lo = ((wb & 15).to(tl.int32) - 8).to(tl.float32) * s
        hi = ((wb >> 4).to(tl.int32) - 8).to(tl.float32) * s
        xe = tl.load(x_row + 2 * p, mask=p_mask, other=0.0).to(tl.float32)
        xo = tl.load(x_row + 2 * p + 1, mask=p_mask, other=0.0).to(tl.float32)
        acc += tl.sum(lo * xe[None, :] + hi * xo[None, :], axis=1)
    tl.store(out_ptr + r.to(tl.int64) * N + offs_n, to_bf16_rne(acc), mask=n_mask)
