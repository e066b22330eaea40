"""The kernels' internal launch API: bare launches, no argument checks, shared by the public launchers and
the quantised modules' hot path (ops.py).

Shape legend: E = experts, N = out features, K = in features, R = activation rows (tokens x top-k),
T = output rows, A = rows combined into one output row (MoE top-k, else 1), L = routed rows.

    workspace(dev, n_part, n_cnt)   float32 split-K partials + int32 arrival counters per (device, stream)
    launch_gemv(x, xs, packed, ...) one gemv_dp4a launch; the plan resolved here (public callers, sweeps, tests)
    run_gemv(p, x, xs, packed, ...) the same with a resolved GemvPlan: nothing left but the launch
    run_w4a16(x, packed, scales, out)   one W4A16 GEMV launch (gemv_w4a16.py)
    run_grouped(p, xq, xs, ...)     one grouped launch (dp4a or mma) with a resolved GroupedPlan
    run_quant_rows(src, K, q, s)    quant_x_rows / swiglu_quant_rows' launch into given q, s

Who checks what: `gemv.gemv_int4_b32`, `gemv.int4_linear`, `grouped.gemm_int4_b32_grouped` and the MoE steps
check every argument, then call these. Callers of this module promise what those checks establish (dtypes,
shapes, devices, contiguity of the weights, expert ids in [0, E) or the NaN rows of an id outside).

Split-K workspace: float32 partials [SK, R, N] and int32 arrival counters [T * N tiles], cached per
(device, stream) and grown on demand, like a BLAS workspace. The counters are zero before and after every
launch (the kernels reset them), so a captured CUDA graph replays with no memset. Warm up (one eager call)
before capturing, so the workspace is not first allocated inside the capture.
"""
from __future__ import annotations

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from .._checks import check_contiguous, check_out, check_shape, check_tensor, interpreting
from . import plan as _plan
from .gemv_dp4a import PDL_TILES, X_CODES, X_FLOAT, X_SWIGLU, gemv_dp4a_kernel
from .gemv_w4a16 import W4A16_BLOCK_K, W4A16_BLOCK_N, gemv_w4a16_kernel
from .grouped_kernel import grouped_kernel
from .quant import quant_rows_kernel

__all__ = ["WORKSPACES", "workspace", "launch_gemv", "run_gemv", "run_w4a16", "run_grouped", "run_quant_rows",
           "X_CODES", "X_FLOAT", "X_SWIGLU"]

WORKSPACES: dict = {}           # (device, stream) -> (float32 partials, int32 counters); module doc
# Whether kernels run in Triton's interpreter: fixed when they were decorated (importing int4lab decides it).
_INTERP = interpreting()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)                  # triton.cdiv is a jit-callable: several us per call on the host path


def workspace(dev: torch.device, n_part: int, n_cnt: int):
    """Views of at least n_part float32 and n_cnt zeroed int32 elements for this device and stream."""
    stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0
    key = (str(dev), stream)
    part, cnt = WORKSPACES.get(key, (None, None))
    if part is None or part.numel() < n_part:
        part = torch.empty(max(n_part, 1 << 16), dtype=torch.float32, device=dev)
    if cnt is None or cnt.numel() < n_cnt:
        cnt = torch.zeros(max(n_cnt, 1 << 12), dtype=torch.int32, device=dev)
    WORKSPACES[key] = (part, cnt)
    return part[:n_part], cnt[:n_cnt]


def launch_gemv(x, xs, packed, scales, eids, N, K, R, *, out=None, part=None, split_k=None, plan=None,
                x_mode=X_CODES, rows_per_x=1, topk_w=None, pdl=0, row_major=False):
    """One launch, inputs already validated by the caller. Returns bf16 out [R // A, N].

    x: int8 codes [*, K] with float32 xs [*, K/32] (X_CODES), float [*, K] (X_FLOAT) or float [*, 2K]
    gate | up rows (X_SWIGLU); row r reads x row r // rows_per_x. topk_w [T, A]: out row t is the
    router-weighted sum of rows t*A .. t*A + A - 1 (the MoE combine, finished in the same launch).
    `part` [SK, R, N] float32 may be given (its first dim then sets split-K); else the cached workspace.
    pdl: 1 = the next launch may overlap this one's tail, 2 = this launch is that next launch
    (gemv_dp4a_kernel's PDL); 0 = neither. Ignored in the interpreter. row_major: the grid runs
    every row of one N range together (gemv_dp4a_kernel's ROW_MAJOR); same bits either way.
    """
    dev = x.device
    if part is not None:
        check_tensor("part", part, (torch.float32,), (3,))
        split_k = part.shape[0]
    p = _plan.resolve(plan, N, K, R, dev, split_k)
    A = 1 if topk_w is None else topk_w.shape[1]
    out = check_out("out", out, (R // A, N), torch.bfloat16, dev)
    if part is not None and p.split_k * A > 1:
        check_shape("part", part, (p.split_k, R, N))
        check_contiguous(part=part)
    return run_gemv(p, x, xs, packed, scales, eids, N, K, R, out, part=part, x_mode=x_mode, rows_per_x=rows_per_x,
                    topk_w=topk_w, pdl=pdl, row_major=row_major)


def run_gemv(p, x, xs, packed, scales, eids, N, K, R, out, *, part=None, x_mode=X_CODES, rows_per_x=1, topk_w=None,
             pdl=0, row_major=False):
    """launch_gemv with `p` a resolved GemvPlan (split_k set) and `out` bf16 [R // A, N] given: the launch alone."""
    if R == 0:
        return out
    sk = p.split_k
    A = 1 if topk_w is None else topk_w.shape[1]
    n_tiles = _cdiv(N, p.block_n)
    if sk * A > 1:
        ws_part, cnt = workspace(x.device, sk * R * N, (R // A) * n_tiles)
        if part is None:
            part = ws_part
    else:
        part = cnt = out
    interp = _INTERP
    grid = (R, sk, n_tiles) if row_major else (n_tiles, sk, R)
    tiles_per_split = _cdiv(_cdiv(K, p.block_k), sk)
    words = x_mode == X_CODES          # codes are read 4 to a word; floats as they are
    gemv_dp4a_kernel[grid](
        x.view(torch.int32) if words else x, xs if xs is not None else x, packed.view(torch.int32), scales,
        eids if eids is not None else out, out, part, cnt, topk_w if topk_w is not None else out, R, N, K,
        packed.shape[0], x.stride(0) // 4 if words else x.stride(0), xs.stride(0) if xs is not None else 0,
        N * K // 8, K // 8, N * K // 32, K // 32,
        X_MODE=x_mode, ROWS_PER_X=rows_per_x, TILES_PER_SPLIT=tiles_per_split, SPLIT_K=sk, TOPK=A,
        BLOCK_N=p.block_n, BLOCK_K=p.block_k, HAS_EIDS=eids is not None, HAS_W=topk_w is not None,
        PREFETCH=p.prefetch, USE_ASM=not interp, PDL=0 if interp else pdl, PF_TILES=min(tiles_per_split, PDL_TILES)
        if pdl == 2 else 0, ROW_MAJOR=row_major, num_warps=p.num_warps, num_stages=p.num_stages,
        **({"launch_pdl": True} if pdl == 2 and not interp else {}))
    return out


def run_w4a16(x, packed, scales, out):
    """W4A16 GEMV: x [R, K] float (rows may be strided) times packed [1, N, K/2] -> out bf16 [R, N]."""
    R, K = x.shape
    N = packed.shape[-2]
    if R:
        gemv_w4a16_kernel[(_cdiv(N, W4A16_BLOCK_N), R)](
            x, packed, scales, out, N, K, x.stride(0),
            K_TILES=_cdiv(K, W4A16_BLOCK_K), BLOCK_N=W4A16_BLOCK_N, BLOCK_K=W4A16_BLOCK_K)
    return out


def run_grouped(p, xq, xs, packed, scales, tiles, out, *, rows_per_x=1, topk_w=None):
    """One grouped launch over `tiles` (grouped.GroupTiles) with `p` a resolved GroupedPlan whose block_m equals
    tiles.block_m; out bf16 [L / A, N] given. grouped.gemm_int4_b32_grouped's contract, unchecked."""
    E, N, K = packed.shape[0], packed.shape[1], packed.shape[2] * 2
    L, T = tiles.order.shape[0], tiles.row0.shape[0]
    if L == 0 or T == 0:
        return out
    A = 1 if topk_w is None else topk_w.shape[1]
    sk = p.split_k
    n_tiles = _cdiv(N, p.block_n)
    if sk * A > 1:
        part, cnt = workspace(xq.device, sk * L * N, (L // A) * n_tiles)
    else:
        part = cnt = out
    tw = topk_w if topk_w is not None else out
    grid = (T, sk, n_tiles) if p.tile_major else (n_tiles, sk, T)
    common = dict(SPLIT_K=sk, TOPK=A, BLOCK_M=p.block_m, BLOCK_N=p.block_n, BLOCK_K=p.block_k,
                  HAS_W=topk_w is not None, ROWS_PER_X=rows_per_x, TILE_MAJOR=p.tile_major,
                  TILES_PER_SPLIT=_cdiv(_cdiv(K, p.block_k), sk), num_warps=p.num_warps,
                  num_stages=p.num_stages)
    if p.kind == "dp4a":
        grouped_kernel[grid](
            xq.view(torch.int32), xs, packed.view(torch.int32), scales, tiles.order, tiles.row0, tiles.rows,
            tiles.group, out, part, cnt, tw, L, N, E, xq.stride(0) // 4, xs.stride(0), N * K // 8, K // 8,
            N * K // 32, K // 32, USE_ASM=not _INTERP, MMA=False, **common)
    else:
        # TMA wants a 16-byte aligned base (K / 2 is a multiple of 16 by the format); a view that is not falls back
        # to the threads' loads, which give the same bits
        tma = p.tma and packed.data_ptr() % 16 == 0
        w = TensorDescriptor.from_tensor(packed.view(E * N, K // 2), [p.block_n, p.block_k // 2]) if tma else packed
        grouped_kernel[grid](
            xq, xs, w, scales, tiles.order, tiles.row0, tiles.rows, tiles.group, out, part, cnt, tw,
            L, N, E, xq.stride(0), xs.stride(0), N * K // 2, K // 2, N * K // 32, K // 32, USE_ASM=not _INTERP,
            MMA=True, HALF_TILES=p.half_tiles, W_TMA=tma, **common)
    return out


def run_quant_rows(src, K: int, q, s, swiglu: bool = False):
    """int8 codes q [R, K] and float32 scales s [R, K/32] of src [R, K] (or of silu(gate) * up of src [R, 2K]),
    the codes of quant.quant_x_rows / swiglu_quant_rows; src rows may be strided, the last dim dense."""
    R = src.shape[0]
    if R:
        bk = _plan.row_block(src.device)
        quant_rows_kernel[(R, _cdiv(K, bk))](src, q, s, K, src.stride(0), BLOCK_K=bk, SWIGLU=swiglu,
                                            USE_ASM=not _INTERP)
    return q, s
