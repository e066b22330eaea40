"""Grouped int4-b32 GEMM for a few decode tokens: rows sorted by expert, cut into M-tiles, one launch.

Shape legend: E = experts, N = out features, K = in features, L = routed rows (tokens x top-k),
T = tiles = ceil(L / BLOCK_M) + E (a static budget: the grid never depends on the routing).

    build_group_tiles(ids, E, block_m)  ->  order [L], counts [E], row0 [T], rows [T], group [T]
    gemm_int4_b32_grouped(aq_sorted, as_sorted, packed, scales, row0, rows, group)  ->  bf16 [L, N]

Everything is computed on the device without reading anything back to the host, so both calls are legal
inside `torch.cuda.graph` capture. Why the budget holds: expert e needs ceil(c_e / BLOCK_M) tiles and
ceil(c / m) < c / m + 1, so the E experts (plus one bucket for invalid ids, see below) need fewer than
L / BLOCK_M + E + 1 tiles, hence at most ceil(L / BLOCK_M) + E. Unused tiles are dead: 0 rows.

Invalid ids: eagerly they raise ValueError. Under capture they cannot be checked; they are sorted into
an extra bucket E, whose tiles carry group E, and the kernel writes NaN for those rows (no expert memory
is read with a bad index).

Bytes per call: the weights of every expert that has a row, 0.5625 bytes per weight, read once per
N-tile column, + L * (K + K/8 + 2N). The tile's rows share one read of their expert's weights, which is
what the grouped GEMM buys over L separate GEMV rows.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._checks import (check_contiguous, check_devices, check_ids, check_out, check_packed, check_rows_contiguous,
                       check_shape, check_tensor)
from . import plan as _plan
from .epilogue import to_bf16_rne


class GroupTiles(NamedTuple):
    """Routing of L rows to experts, as M-tiles. All int32, all on the ids' device."""
    order: torch.Tensor     # [L]  sorted position i holds flat row order[i] (stable: ties keep row order)
    counts: torch.Tensor    # [E]  rows routed to each expert
    row0: torch.Tensor      # [T]  first sorted row of the tile
    rows: torch.Tensor      # [T]  rows in the tile, 0..block_m (0 = dead tile)
    group: torch.Tensor     # [T]  expert of the tile (E for the invalid-id bucket, 0 for dead tiles)


def _check_block_m(block_m):
    if not isinstance(block_m, int) or isinstance(block_m, bool) or block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two >= 16 (the MMA's M), got {block_m!r}")


def build_group_tiles(ids: torch.Tensor, E: int, block_m: int = 16) -> GroupTiles:
    """ids int [L] or [T_tokens, topk] -> GroupTiles with ceil(L / block_m) + E tiles (module doc)."""
    check_tensor("ids", ids, (torch.int32, torch.int64))
    if not isinstance(E, int) or isinstance(E, bool) or E <= 0:
        raise ValueError(f"E must be a positive int, got {E!r}")
    _check_block_m(block_m)
    check_ids("ids", ids, E)
    flat = ids.reshape(-1).long()
    L, dev = flat.numel(), ids.device
    n_tiles = -(-L // block_m) + E
    key = torch.where((flat >= 0) & (flat < E), flat, E)                         # invalid ids -> bucket E
    order = torch.sort(key, stable=True).indices
    counts = torch.zeros(E + 1, dtype=torch.int64, device=dev).scatter_add_(0, key, torch.ones_like(key))
    starts = torch.cumsum(counts, 0) - counts                                    # first sorted row per bucket
    tiles = (counts + block_m - 1) // block_m
    tile_end = torch.cumsum(tiles, 0)
    t = torch.arange(n_tiles, device=dev)
    g = torch.searchsorted(tile_end, t, right=True)                              # bucket of tile t (E+1: dead)
    live = g <= E
    gc = g.clamp(max=E)
    j = t - (tile_end[gc] - tiles[gc])                                           # tile index within bucket
    rows = torch.where(live, (counts[gc] - j * block_m).clamp(0, block_m), 0)
    row0 = torch.where(live, starts[gc] + j * block_m, 0)
    group = torch.where(live, gc, 0)
    i32 = torch.int32
    return GroupTiles(order.to(i32), counts[:E].to(i32), row0.to(i32), rows.to(i32), group.to(i32))


@triton.jit
def gemm_int4_b32_grouped_kernel(
    # Pointers
    a_ptr, as_ptr, w_ptr, ws_ptr, row0_ptr, rows_ptr, group_ptr, out_ptr,
    # Dimensions
    N, K, E, stride_a, stride_as,
    # Meta-parameters
    K_BLOCKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program owns out[row0 : row0 + rows, n0 : n0 + BLOCK_N] of one tile (grid: T, N tiles).

    a int8 [L, K] and as float32 [L, K/32] in sorted order; w uint8 [E, N, K/2] (even k low nibble),
    ws float16 [E, N, K/32]. Per 32-block: int8 x int8 -> int32 tl.dot, then * (a_scale * w_scale).
    """
    tile = tl.program_id(0)
    pid_n = tl.program_id(1)
    row0 = tl.load(row0_ptr + tile)
    rows = tl.load(rows_ptr + tile)
    g = tl.load(group_ptr + tile).to(tl.int64)
    valid = (g >= 0) & (g < E)
    g = tl.where(valid, g, 0)

    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < rows
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_c = tl.arange(0, 32)
    offs_h = tl.arange(0, 16)
    a_rows = a_ptr + (row0 + offs_m)[:, None].to(tl.int64) * stride_a
    as_rows = as_ptr + (row0 + offs_m).to(tl.int64) * stride_as
    w_rows = w_ptr + g * N * (K // 2) + offs_n[:, None].to(tl.int64) * (K // 2)
    s_rows = ws_ptr + g * N * (K // 32) + offs_n.to(tl.int64) * (K // 32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if (rows > 0) & valid:                                       # dead tiles stream nothing
        for kb in range(0, K_BLOCKS):
            a = tl.load(a_rows + kb * 32 + offs_c[None, :], mask=m_mask[:, None], other=0)
            asc = tl.load(as_rows + kb, mask=m_mask, other=0.0)
            wb = tl.load(w_rows + kb * 16 + offs_h[None, :], mask=n_mask[:, None], other=0)
            lo = (wb & 15).to(tl.int8, bitcast=True)
            hi = (wb >> 4).to(tl.int8, bitcast=True)
            w = tl.interleave(lo, hi) - 8                        # [BLOCK_N, 32] codes in k order
            d = tl.dot(a, tl.trans(w), out_dtype=tl.int32)       # exact block sums [BLOCK_M, BLOCK_N]
            wsc = tl.load(s_rows + kb, mask=n_mask, other=0.0).to(tl.float32)
            acc += d.to(tl.float32) * (asc[:, None] * wsc[None, :])
    acc = tl.where(valid, acc, float("nan"))
    out = out_ptr + (row0 + offs_m)[:, None].to(tl.int64) * N + offs_n[None, :]
    tl.store(out, to_bf16_rne(acc), mask=m_mask[:, None] & n_mask[None, :])


def gemm_int4_b32_grouped(aq_sorted, as_sorted, packed, scales, row0, rows, group, out=None, *,
                          block_m=16, plan=None):
    """Grouped W4A8 GEMM: bf16 [L, N], row i = aq_sorted[i] times the expert of the tile holding row i.

    aq_sorted int8 [L, K], as_sorted float32 [L, K/32]: activations already permuted by `order` from
    build_group_tiles (rows may be strided); packed uint8 [E, N, K/2], scales float16 [E, N, K/32];
    row0/rows/group int32 [T] from build_group_tiles with the same block_m. Rows come back in sorted
    order: the caller scatters them with `out_flat[order] = out`. Legal under CUDA-graph capture.
    """
    check_tensor("packed", packed, (torch.uint8,), (3,))
    E, N, K = packed.shape[0], packed.shape[1], packed.shape[2] * 2
    check_packed(packed, scales, N, K)
    check_tensor("aq_sorted", aq_sorted, (torch.int8,), (2,))
    check_tensor("as_sorted", as_sorted, (torch.float32,), (2,))
    check_shape("aq_sorted", aq_sorted, (aq_sorted.shape[0], K))
    L = aq_sorted.shape[0]
    check_shape("as_sorted", as_sorted, (L, K // 32))
    check_rows_contiguous("aq_sorted", aq_sorted)
    check_rows_contiguous("as_sorted", as_sorted)
    for name, t in (("row0", row0), ("rows", rows), ("group", group)):
        check_tensor(name, t, (torch.int32,), (1,))
    check_shape("rows", rows, row0.shape)
    check_shape("group", group, row0.shape)
    _check_block_m(block_m)
    check_contiguous(packed=packed, scales=scales, row0=row0, rows=rows, group=group)
    dev = check_devices(aq_sorted=aq_sorted, as_sorted=as_sorted, packed=packed, scales=scales,
                        row0=row0, rows=rows, group=group, out=out)
    out = check_out("out", out, (L, N), torch.bfloat16, dev)
    p = plan if plan is not None else _plan.grouped_plan(dev)
    T = row0.shape[0]
    if T and L:
        gemm_int4_b32_grouped_kernel[(T, triton.cdiv(N, p.block_n))](
            aq_sorted, as_sorted, packed, scales, row0, rows, group, out,
            N, K, E, aq_sorted.stride(0), as_sorted.stride(0),
            K_BLOCKS=K // 32, BLOCK_M=block_m, BLOCK_N=p.block_n,
            num_warps=p.num_warps, num_stages=p.num_stages)
    return out
