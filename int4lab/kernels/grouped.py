"""Grouped int4-b32 GEMV for a few decode tokens: rows sorted by expert, cut into tiles, one launch each.

Shape legend: E = experts, N = out features, K = in features, L = routed rows (tokens x top-k),
A = top-k (rows combined into one output row), T = tiles = ceil(L / BM) + E (a static budget: the grid
never depends on the routing), BM = rows per tile.

    build_group_tiles(ids, E, block_m)   -> GroupTiles: order [L], counts [E], row0 [T], rows [T], group [T]
    gemm_int4_b32_grouped(xq, xs, packed, scales, tiles, rows_per_x=1, topk_w=None)
                                         -> bf16 [L, N] in row order, or [L / A, N] combined with topk_w

build_group_tiles is one Triton program (a sort of L keys, a histogram, prefix sums, a scatter), nothing
read back to the host, so both calls are legal inside `torch.cuda.graph` capture. Why the budget holds:
expert e needs ceil(c_e / BM) tiles and ceil(c / m) < c / m + 1, so the E experts (plus one bucket for
invalid ids, see below) need fewer than L / BM + E + 1 tiles, hence at most ceil(L / BM) + E. Unused tiles
are dead: 0 rows, and their programs return at once.

Invalid ids: eagerly they raise ValueError. Under capture they cannot be checked; they are sorted into
an extra bucket E, whose tiles carry group E, and the kernels write NaN for those rows (no expert memory
is read with a bad index).

Kernels (plan.kind): "dp4a" (grouped_dp4a.py) and "mma" (grouped_mma.py, tensor cores, BM >= 4). The plan table
(plan.GROUPED_TABLE, keyed by mean rows per routed expert and weights N * K per expert of the GEMM) picks dp4a
below 4 mean rows and mma from 4, except on sm90 for experts of under 32 Mi weights per GEMM, where mma (with
TMA loads) starts at 2; the interpreter's row is dp4a only. Grid order (plan.tile_major): N tiles
first, or tiles first so that every tile of one N range runs at once and an expert's bytes come from DRAM
about once whatever its number of tiles (the table's choice on the H200). Both kernels read activations as
int8 codes in row order (row r uses x row r // rows_per_x, so the gate_up projection reads each token's
codes without a gather copy) and finish split-K and the MoE combine in the same launch
(epilogue.finish_rows).

Bytes per call: the weights of every expert with a row, 0.5625 bytes per weight, read once per tile from
L2 (an expert with more than BM rows has several tiles; tile-major, DRAM serves it about once), + L * (K +
K/8) codes and scales + the output.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._checks import (check_contiguous, check_devices, check_ids, check_out, check_packed, check_rows_contiguous,
                       check_shape, check_tensor)
from . import plan as _plan
from .launch import run_grouped

MAX_ROUTED_ROWS = 8192          # one program sorts the rows: decode batches, not prefill


class GroupTiles(NamedTuple):
    """Routing of L rows to experts, as tiles of at most block_m rows. Tensors int32, on the ids' device."""
    order: torch.Tensor     # [L]  sorted position i holds flat row order[i] (stable: ties keep row order)
    counts: torch.Tensor    # [E]  rows routed to each expert
    row0: torch.Tensor      # [T]  first sorted position of the tile
    rows: torch.Tensor      # [T]  rows in the tile, 0..block_m (0 = dead tile)
    group: torch.Tensor     # [T]  expert of the tile (E for the invalid-id bucket, 0 for dead tiles)
    block_m: int = 16


def _check_block_m(block_m):
    if not isinstance(block_m, int) or isinstance(block_m, bool) or block_m < 1 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two >= 1, got {block_m!r}")


@triton.jit
def route_tiles_kernel(
    # Pointers
    ids_ptr, order_ptr, counts_ptr, row0_ptr, rows_ptr, group_ptr, scratch_ptr,
    # Dimensions
    L, E, T,
    # Meta-parameters
    LP: tl.constexpr, EP: tl.constexpr, TP: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """One program: ids [L] -> GroupTiles. LP >= L, EP >= E + 2, TP >= T (powers of two); scratch int32 [2 EP].

    Sorted position p of row r: rows ordered by (bucket, r), bucket = id, or E for an invalid id; tile of p:
    the bucket's first tile + rank // BLOCK_M, where rank = p - the bucket's first position.
    """
    offs = tl.arange(0, LP)
    live = offs < L
    raw = tl.load(ids_ptr + offs, mask=live, other=0)
    key = tl.where((raw >= 0) & (raw < E), raw, E).to(tl.int32)
    key = tl.where(live, key, E + 1)                           # padding sorts last, in a bucket of its own
    srt = tl.sort(key * LP + offs)                             # stable: ties broken by the row index
    order = srt % LP
    skey = srt // LP
    tl.store(order_ptr + offs, order, mask=live)

    b = tl.arange(0, EP)
    real = b <= E
    counts = tl.where(real, tl.histogram(key, EP), 0)
    tl.store(counts_ptr + b, counts, mask=b < E)
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    tile_start = tl.cumsum(tiles, 0) - tiles
    row_start = tl.cumsum(counts, 0) - counts
    tl.store(scratch_ptr + b, tile_start)
    tl.store(scratch_ptr + EP + b, row_start)
    t = tl.arange(0, TP)
    zero = tl.zeros([TP], tl.int32)
    tl.store(row0_ptr + t, zero, mask=t < T)                   # every tile dead until the scatter below
    tl.store(rows_ptr + t, zero, mask=t < T)
    tl.store(group_ptr + t, zero, mask=t < T)
    tl.debug_barrier()                                         # the stores above are seen by every thread

    sb = tl.minimum(skey, E)                                   # padding positions are masked below
    rank = offs - tl.load(scratch_ptr + EP + sb, mask=live, other=0)
    first = live & (rank % BLOCK_M == 0)
    tid = tl.load(scratch_ptr + sb, mask=live, other=0) + rank // BLOCK_M
    # counts of the position's bucket: its row_start of the next bucket minus its own
    cnt = tl.load(scratch_ptr + EP + sb + 1, mask=live, other=0) - tl.load(scratch_ptr + EP + sb, mask=live, other=0)
    tl.store(row0_ptr + tid, offs, mask=first)
    tl.store(rows_ptr + tid, tl.minimum(cnt - rank, BLOCK_M), mask=first)
    tl.store(group_ptr + tid, sb, mask=first)


def _route_args(ids, E, block_m):
    check_tensor("ids", ids, (torch.int32, torch.int64))
    if not isinstance(E, int) or isinstance(E, bool) or E <= 0:
        raise ValueError(f"E must be a positive int, got {E!r}")
    _check_block_m(block_m)
    check_ids("ids", ids, E)
    flat = ids.reshape(-1)
    return flat, flat.numel(), -(-flat.numel() // block_m) + E


def build_group_tiles(ids: torch.Tensor, E: int, block_m: int = 16) -> GroupTiles:
    """ids int [L] or [T_tokens, topk] -> GroupTiles with ceil(L / block_m) + E tiles (module doc); one launch."""
    flat, L, n_tiles = _route_args(ids, E, block_m)
    if L > MAX_ROUTED_ROWS:
        raise ValueError(f"ids must hold at most {MAX_ROUTED_ROWS} routed rows (a decode batch), got {L}")
    return route_tiles(flat.contiguous(), E, block_m)


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()    # triton.next_power_of_2, without its jit-callable's host cost


def route_tiles(flat: torch.Tensor, E: int, block_m: int) -> GroupTiles:
    """build_group_tiles unchecked (the internal API of launch.py): flat int [L] contiguous, L <= MAX_ROUTED_ROWS,
    block_m a power of two; ids outside [0, E) land in the NaN bucket (module doc), never read back."""
    L = flat.numel()
    n_tiles = -(-L // block_m) + E
    dev, i32 = flat.device, torch.int32
    buf = torch.empty(L + E + 3 * n_tiles, dtype=i32, device=dev)
    order, counts, row0, rows, group = torch.split(buf, [L, E, n_tiles, n_tiles, n_tiles])
    EP = _pow2(E + 2)
    scratch = torch.empty(2 * EP, dtype=i32, device=dev)
    if L == 0:
        buf.zero_()
    else:
        route_tiles_kernel[(1,)](flat, order, counts, row0, rows, group, scratch, L, E, n_tiles,
                                 LP=_pow2(L), EP=EP, TP=_pow2(n_tiles),
                                 BLOCK_M=block_m, num_warps=4)
    return GroupTiles(order, counts, row0, rows, group, block_m)


def build_group_tiles_ref(ids: torch.Tensor, E: int, block_m: int = 16) -> GroupTiles:
    """build_group_tiles in torch operations (the contract the kernel is tested against)."""
    flat, L, n_tiles = _route_args(ids, E, block_m)
    flat, dev = flat.long(), ids.device
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
    return GroupTiles(order.to(i32), counts[:E].to(i32), row0.to(i32), rows.to(i32), group.to(i32), block_m)


def gemm_int4_b32_grouped(xq, xs, packed, scales, tiles: GroupTiles, *, rows_per_x: int = 1, topk_w=None,
                          out=None, split_k=None, plan=None):
    """Grouped W4A8 GEMV over the tiles of `build_group_tiles`: bf16 [L, N] (row r = x row r // rows_per_x
    times expert ids[r]), or, with topk_w float [L / A, A], bf16 [L / A, N] = the router-weighted sum of
    each token's A rows (each rounded to bf16 first; fixed order j = 0..A-1).

    xq int8 [*, K] and xs float32 [*, K/32] (quant_x_rows / swiglu_quant_rows; rows may be strided);
    packed uint8 [E, N, K/2], scales float16 [E, N, K/32]. Exact int32 dot per 32-block, float32 across
    blocks, one bf16 rounding (as gemv_int4_b32). `plan` (a GroupedPlan) overrides the table (whose row
    is taken with block_m = tiles.block_m); a plan's block_m must equal tiles.block_m. Legal under CUDA-graph
    capture (warm up once eagerly first: workspace).
    """
    check_tensor("packed", packed, (torch.uint8,), (3,))
    E, N, K = packed.shape[0], packed.shape[1], packed.shape[2] * 2
    check_packed(packed, scales, N, K)
    check_tensor("xq", xq, (torch.int8,), (2,))
    check_tensor("xs", xs, (torch.float32,), (2,))
    if xq.shape[1] != K:
        raise ValueError(f"xq must have shape (rows, K) with K = {K}, got {tuple(xq.shape)}")
    check_shape("xs", xs, (xq.shape[0], K // 32))
    check_rows_contiguous("xq", xq)
    check_rows_contiguous("xs", xs)
    if not isinstance(tiles, GroupTiles):
        raise TypeError(f"tiles must be the GroupTiles of build_group_tiles, got {type(tiles).__name__}")
    for name in ("order", "row0", "rows", "group"):
        check_tensor(f"tiles.{name}", getattr(tiles, name), (torch.int32,), (1,))
    L = tiles.order.shape[0]
    if not isinstance(rows_per_x, int) or isinstance(rows_per_x, bool) or rows_per_x < 1:
        raise ValueError(f"rows_per_x must be a positive int, got {rows_per_x!r}")
    if xq.shape[0] * rows_per_x < L:
        raise ValueError(f"xq must have at least L / rows_per_x = {-(-L // rows_per_x)} rows, got {xq.shape[0]}")
    A = 1
    if topk_w is not None:
        check_tensor("topk_w", topk_w, (torch.float32, torch.float16, torch.bfloat16), (2,))
        A = topk_w.shape[1]
        check_shape("topk_w", topk_w, (L // A, A) if A and L % A == 0 else (-1, -1))
        check_contiguous(topk_w=topk_w)
    check_contiguous(packed=packed, scales=scales, order=tiles.order, row0=tiles.row0, rows=tiles.rows,
                     group=tiles.group)
    dev = check_devices(xq=xq, xs=xs, packed=packed, scales=scales, order=tiles.order, row0=tiles.row0,
                        topk_w=topk_w, out=out)
    out = check_out("out", out, (L // A, N), torch.bfloat16, dev)
    p = (_plan.resolve_grouped(plan, N, K, L, E, dev, split_k) if plan is not None
         else _plan.grouped_plan(N, K, L, E, dev, split_k, block_m=tiles.block_m))
    if p.block_m != tiles.block_m:
        raise ValueError(f"plan.block_m ({p.block_m}) must equal tiles.block_m ({tiles.block_m})")
    return run_grouped(p, xq, xs, packed, scales, tiles, out, rows_per_x=rows_per_x, topk_w=topk_w)


def grouped_ref(xq, xs, packed, scales, ids, N, K, rows_per_x: int = 1) -> torch.Tensor:
    """float32 [L, N] reference of gemm_int4_b32_grouped without topk_w (CPU, float64 sums)."""
    from .gemv import gemv_ref
    r = torch.arange(ids.numel()) // rows_per_x
    return gemv_ref(xq.cpu()[r], xs.cpu()[r], packed, scales, ids.reshape(-1), N, K)


