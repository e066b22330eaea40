"""Grouped W4A8 kernel on the tensor cores: per 32-block an int8 x int8 -> int32 `tl.dot` of a tile.

Shape legend: E = experts, N = out features, K = in features, L = routed rows, BM = rows per tile,
NB = 32-blocks per loop step (BLOCK_K / 32).

Same contract as grouped_dp4a.py (tiles from grouped.build_group_tiles, rows gathered through `order`,
epilogue.finish_rows for split-K and the MoE combine); only the block dot differs. Each loop step loads
NB blocks of the tile's BM rows (BM >= 4) and of the expert's [BLOCK_N, 32 * NB] codes and multiplies
them as one batched dot with the weights on the MMA's M side, [NB, BLOCK_N, 32] x [NB, 32, BM] ->
[NB, BLOCK_N, BM], exact in int32 per block. Why batched: the W4A8 format scales every 32-block on both
sides, so the block sums cannot share one int32 accumulator; a batch of NB blocks per step puts NB times
more bytes in flight than one block per step (the first version, latency-bound;
measured at commit 2e9630c). Why the weights on the M side (mma.sync m16n8k32): the tile's
few rows then fill the N side (8 wide) instead of a padded M of 16, and the compiler stops copying the
activation fragment before every MMA (the MMA's output took its registers): at bm16 bn64 bk128 the loop is 271
SASS instructions per step instead of 292, at bm8 204 instead of 232 (compiler report;
measured at commit cf7e687).

Half-height tiles (plan.half_tiles): the scaling per row, column and block is most of the loop and runs for
every row of the tile, live or not, so a tile with at most BLOCK_M / 2 live rows runs the same loop at half the
height (both heights are compiled in; the choice is per program, at run time). An expert's rows still share
one tile and read its bytes once. Dead rows are masked out of every load: reading them (from x row 0, every
program the same lines) made the tile 1.5-1.8x slower (measured at commit 5e98f8e).

Scales a step ahead: the scales of step i + 1 are loaded during step i. Triton's pipeliner stages the
dot's operands (x and the weights) through shared memory a few steps ahead, but not the scale loads, whose
latency each step waited out: -2 to -7 % on the 16- and 32-row tiles and on OLMoE's 8-row tiles, 0 % on
Qwen3's, same registers (measured at commit 54a27bf).

Weights through the Tensor Memory Accelerator (plan.tma, sm_90): each step's [BLOCK_N, BLOCK_K / 2] bytes
arrive as one bulk copy of a TensorDescriptor box into shared memory, issued by one thread and waited on through
an mbarrier, instead of 128 threads' cp.async copies of 8-16 bytes with their addresses. Same bits, same
registers and shared memory; the MoE step taking 20-31 % less time on every tensor-core row
(measured on an H100 at commit 813d570). A box that runs past K or past the tensor reads zeros, as the masked loads
did; rows past an expert's N are the next expert's and are never stored.

Numerics: each block sum is scaled as d * (ws * xs) and accumulated per block column across the K steps,
and the NB columns are folded once at the end by epilogue.fold_blocks: the grouped dp4a kernel's order,
so with the same block_k and split_k the two kernels (and the routed GEMV) give the same bits.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .epilogue import finish_rows, fold_blocks


@triton.jit
def _codes(wb, SHIFT: tl.constexpr, USE_ASM: tl.constexpr):
    """uint8 packed bytes -> int8 codes nibble - 8 of the low (SHIFT 0) or high (SHIFT 4) nibbles. On the GPU
    four bytes per 32-bit instruction: (n + 0x78) ^ 0x80 = n - 8 as a byte, with no carry between bytes."""
    if USE_ASM:
        return tl.inline_asm_elementwise(
            f"{{ .reg .b32 t; shr.u32 t, $1, {SHIFT}; and.b32 t, t, 0x0F0F0F0F; add.u32 t, t, 0x78787878; "
            "xor.b32 $0, t, 0x80808080; }", "=r,r", [wb], dtype=tl.int8, is_pure=True, pack=4)
    else:
        return ((wb >> SHIFT) & 15).to(tl.int8, bitcast=True) - 8


@triton.jit
def mma_tile(x_ptr, xs_ptr, w_ptr, ws_ptr, order_ptr, out_ptr, part_ptr, cnt_ptr, tw_ptr, pid_n, split, row0, n_rows,
             e, valid, L, N, stride_x, stride_xs, stride_we, KH, stride_se, KB,
             ROWS_PER_X: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr, TOPK: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_W: tl.constexpr,
             USE_ASM: tl.constexpr, W_TMA: tl.constexpr):
    """The tile body of grouped_kernel.grouped_kernel on the tensor cores: rows row0 .. row0 + n_rows - 1 of
    `order` (n_rows <= BLOCK_M) against expert e's BLOCK_N columns at pid_n, K split `split`: the loop, the fold
    and epilogue.finish_rows.

    x int8 [*, K], xs float32 [*, K/32]; w uint8 [E, N, K/2] (even k low nibble), ws float16 [E, N, K/32];
    KH = K / 2 bytes per weight row, KB = K / 32; BLOCK_K a power of two >= 32. W_TMA: w_ptr is instead a
    TensorDescriptor over w viewed as [E * N, KH] with a [BLOCK_N, BLOCK_K / 2] box (the launcher's)."""
    NB: tl.constexpr = BLOCK_K // 32
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < n_rows
    r = tl.load(order_ptr + row0 + offs_m, mask=m_mask, other=0)
    xr = (r // ROWS_PER_X).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_b = tl.arange(0, NB)
    offs_c = tl.arange(0, 32)
    offs_h = tl.arange(0, 16)
    a_rows = x_ptr + xr[None, :, None] * stride_x + offs_c[None, None, :]                    # [1, BM, 32]
    as_rows = xs_ptr + xr[None, :] * stride_xs                                                # [1, BM]
    if W_TMA:                              # w_ptr is a TensorDescriptor of [E * N, KH] bytes, box [BN, BLOCK_K / 2]
        w_row0 = (e * N + pid_n * BLOCK_N).to(tl.int32)
    else:
        w_rows = w_ptr + e * stride_we + offs_n[None, :, None].to(tl.int64) * KH + offs_h[None, None, :]
    s_rows = ws_ptr + e * stride_se + offs_n[None, :].to(tl.int64) * KB                       # [1, BN]
    acc = tl.zeros([NB, BLOCK_N, BLOCK_M], dtype=tl.float32)   # per block column, folded after the loop
    # The scales of step i + 1 are loaded during step i: the pipeliner stages only the dot's operands (x, the
    # weights) through shared memory, so a scale load in its own step was one exposed latency per step.
    kb = split * TILES_PER_SPLIT * NB + offs_b                                                # [NB]
    asc = tl.load(as_rows + kb[:, None], mask=(kb < KB)[:, None] & m_mask[None, :], other=0.0)
    wsc = tl.load(s_rows + kb[:, None], mask=(kb < KB)[:, None] & n_mask[None, :], other=0.0)
    for i in range(0, TILES_PER_SPLIT):
        kb = (split * TILES_PER_SPLIT + i) * NB + offs_b
        live = kb < KB
        ahead = (kb + NB < KB) & (i + 1 < TILES_PER_SPLIT)
        asc_next = tl.load(as_rows + (kb + NB)[:, None], mask=ahead[:, None] & m_mask[None, :], other=0.0)
        wsc_next = tl.load(s_rows + (kb + NB)[:, None], mask=ahead[:, None] & n_mask[None, :], other=0.0)
        a = tl.load(a_rows + kb[:, None, None] * 32, mask=live[:, None, None] & m_mask[None, :, None], other=0)
        if W_TMA:    # rows past N are the next expert's (never stored), a box past the tensor or K reads zeros
            wb = tl.permute(tl.reshape(w_ptr.load([w_row0, (split * TILES_PER_SPLIT + i) * (BLOCK_K // 2)]),
                                       [BLOCK_N, NB, 16]), (1, 0, 2))
        else:
            wb = tl.load(w_rows + kb[:, None, None] * 16, mask=live[:, None, None] & n_mask[None, :, None], other=0)
        lo = _codes(wb, 0, USE_ASM)                                     # [NB, BN, 16] codes of even k
        hi = _codes(wb, 4, USE_ASM)                                     # [NB, BN, 16] codes of odd k
        w = tl.interleave(lo, hi)                                       # [NB, BN, 32] codes in k order
        d = tl.dot(w, tl.permute(a, (0, 2, 1)), out_dtype=tl.int32)     # exact block sums [NB, BN, BM]
        acc += d.to(tl.float32) * (wsc.to(tl.float32)[:, :, None] * asc[:, None, :])
        asc, wsc = asc_next, wsc_next
    y = fold_blocks(tl.reshape(tl.permute(acc, (2, 1, 0)), [BLOCK_M * BLOCK_N, NB]), BLOCK_M * BLOCK_N, NB)
    finish_rows(tl.reshape(y, [BLOCK_M, BLOCK_N]), valid, r, m_mask, out_ptr, part_ptr, cnt_ptr, tw_ptr,
                split, L, N, pid_n, tl.cdiv(N, BLOCK_N), offs_n, n_mask, SPLIT_K, TOPK, HAS_W)
