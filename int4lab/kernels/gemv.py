"""The int4-b32 GEMV launchers: one public entry per use, dispatching on the plan to a kernel variant.

Shape legend: E = experts, N = out features, K = in features, R = activation rows (tokens x top-k),
T = output rows, A = rows combined into one output row (MoE top-k, else 1).

    gemv_int4_b32(xq, xs, packed, scales, eids, N, K)   routed W4A8 on int8 codes      -> bf16 [R, N]
    int4_linear(x, packed, scales, act)                  dense W4A8 / W4A16 on float x  -> bf16 [..., N]

W4A8 runs gemv_dp4a.py (every plan-table row); act="bf16" runs gemv_w4a16.py. Every W4A8 call is ONE
launch: the activation is quantised inside the GEMV (quant.quant_blocks, the codes of quant_x_rows) and
split-K partials are finished by the last-arriving program (epilogue.finish_rows).

Split-K workspace: float32 partials [SK, R, N] and int32 arrival counters [T * N tiles], cached per
(device, stream) and grown on demand, like a BLAS workspace. The counters are zero before and after every
launch (the kernels reset them), so a captured CUDA graph replays with no memset. Warm up (one eager call)
before capturing, so the workspace is not first allocated inside the capture.
"""
from __future__ import annotations

import torch
import triton

from .._checks import (FLOAT_DTYPES, check_contiguous, check_devices, check_ids, check_k, check_out,
                       check_packed, check_rows_contiguous, check_shape, check_tensor, interpreting)
from . import plan as _plan
from .gemv_dp4a import PDL_TILES, X_CODES, X_FLOAT, X_SWIGLU, gemv_dp4a_kernel
from .gemv_w4a16 import W4A16_BLOCK_K, W4A16_BLOCK_N, gemv_w4a16_kernel

__all__ = ["gemv_int4_b32", "int4_linear", "gemv_ref", "X_CODES", "X_FLOAT", "X_SWIGLU"]

MAX_GRID_ROWS = 65535           # CUDA's limit on the grid's y and z dimensions, where rows go
_WORKSPACES: dict = {}          # (device, stream) -> (float32 partials, int32 counters); module doc


def _workspace(dev: torch.device, n_part: int, n_cnt: int):
    """Views of at least n_part float32 and n_cnt zeroed int32 elements for this device and stream."""
    stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0
    key = (str(dev), stream)
    part, cnt = _WORKSPACES.get(key, (None, None))
    if part is None or part.numel() < n_part:
        part = torch.empty(max(n_part, 1 << 16), dtype=torch.float32, device=dev)
    if cnt is None or cnt.numel() < n_cnt:
        cnt = torch.zeros(max(n_cnt, 1 << 12), dtype=torch.int32, device=dev)
    _WORKSPACES[key] = (part, cnt)
    return part[:n_part], cnt[:n_cnt]


def _launch_gemv(x, xs, packed, scales, eids, N, K, R, *, out=None, part=None, split_k=None, plan=None,
                 x_mode=X_CODES, rows_per_x=1, topk_w=None, pdl=0, row_major=False):
    """One launch, inputs already validated by the public callers. Returns bf16 out [R // A, N].

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
    sk = p.split_k
    A = 1 if topk_w is None else topk_w.shape[1]
    out = check_out("out", out, (R // A, N), torch.bfloat16, dev)
    if R == 0:
        return out
    n_tiles = triton.cdiv(N, p.block_n)
    if sk * A > 1:
        ws_part, cnt = _workspace(dev, sk * R * N, (R // A) * n_tiles)
        if part is None:
            part = ws_part
        else:
            check_shape("part", part, (sk, R, N))
            check_contiguous(part=part)
    else:
        part = cnt = out
    grid = (R, sk, n_tiles) if row_major else (n_tiles, sk, R)
    common = dict(X_MODE=x_mode, ROWS_PER_X=rows_per_x, TILES_PER_SPLIT=triton.cdiv(triton.cdiv(K, p.block_k), sk),
                  SPLIT_K=sk, TOPK=A, BLOCK_N=p.block_n, BLOCK_K=p.block_k, HAS_EIDS=eids is not None,
                  HAS_W=topk_w is not None, USE_ASM=not interpreting(), num_warps=p.num_warps,
                  num_stages=p.num_stages)
    ids = eids if eids is not None else out
    tw = topk_w if topk_w is not None else out
    words = x_mode == X_CODES          # codes are read 4 to a word; floats as they are
    gemv_dp4a_kernel[grid](
        x.view(torch.int32) if words else x, xs if xs is not None else x, packed.view(torch.int32), scales,
        ids, out, part, cnt, tw, R, N, K, packed.shape[0], x.stride(0) // 4 if words else x.stride(0),
        xs.stride(0) if xs is not None else 0, N * K // 8, K // 8, N * K // 32, K // 32,
        PREFETCH=p.prefetch, PDL=0 if interpreting() else pdl, ROW_MAJOR=row_major,
        PF_TILES=min(common["TILES_PER_SPLIT"], PDL_TILES) if pdl == 2 else 0, **common,
        **({"launch_pdl": True} if pdl == 2 and not interpreting() else {}))
    return out


def _check_x_codes(xq, xs, K):
    check_tensor("xq", xq, (torch.int8,), (2,))
    check_tensor("xs", xs, (torch.float32,), (2,))
    check_rows_contiguous("xq", xq)
    check_rows_contiguous("xs", xs)
    if xq.shape[1] != K:
        raise ValueError(f"xq must have shape (R, K) with K = {K}, got {tuple(xq.shape)}")
    check_shape("xs", xs, (xq.shape[0], K // 32))
    if xq.stride(0) % 4:
        raise ValueError(f"xq's row stride must be a multiple of 4 bytes (rows are read as int32 words), "
                         f"got {xq.stride(0)}")


def gemv_int4_b32(xq, xs, packed, scales, eids, N, K, part=None, out=None, *, split_k=None, plan=None):
    """Routed W4A8 GEMV, one launch: row i of xq/xs times expert eids[i] -> bf16 [R, N].

    xq int8 [R, K], xs float32 [R, K/32] (from quant_x_rows; rows may be strided, e.g. a stride-0
    expand of one token); packed uint8 [E, N, K/2], scales float16 [E, N, K/32], contiguous; eids
    int32/int64 [R] with values in [0, E) (_checks.check_ids says what is checked under capture).
    Exact int32 dot per 32-block, float32 accumulation across blocks, one bf16 rounding at the end.
    Split-K (`split_k`, else part.shape[0], else the plan) is finished inside the launch (module doc);
    `part` [split_k, R, N] float32 optionally names the partials buffer.
    """
    check_packed(packed, scales, N, K)
    if packed.dim() != 3:
        raise ValueError(f"packed must have rank 3 ([E, N, K/2]), got shape {tuple(packed.shape)}")
    _check_x_codes(xq, xs, K)
    check_tensor("eids", eids, (torch.int32, torch.int64), (1,))
    check_shape("eids", eids, (xq.shape[0],))
    check_contiguous(packed=packed, scales=scales, eids=eids)
    check_devices(xq=xq, xs=xs, packed=packed, scales=scales, eids=eids, part=part, out=out)
    check_ids("eids", eids, packed.shape[0])
    return _launch_gemv(xq, xs, packed, scales, eids, N, K, xq.shape[0], out=out, part=part, split_k=split_k,
                        plan=plan)


def int4_linear(x, packed, scales, act="int8", out=None, *, plan=None):
    """Dense int4-b32 linear layer (E = 1): x [..., K] bf16/fp16/fp32 -> bf16 [..., N].

    act="int8": W4A8 in one launch, x quantised per 32-block inside the GEMV to the codes of
    quant_x_rows (gemv_int4_b32's numerics). act="bf16": W4A16, weights decoded to float32 in registers,
    float32 accumulation, x unquantised. packed uint8 [N, K/2] or [1, N, K/2], scales float16 [N, K/32]
    or [1, N, K/32]. `plan` (a GemvPlan) overrides the launch plan of the W4A8 path.
    """
    if act not in ("int8", "bf16"):
        raise ValueError(f"act must be 'int8' or 'bf16', got {act!r}")
    check_tensor("x", x, FLOAT_DTYPES)
    if x.dim() < 1:
        raise ValueError(f"x must have rank >= 1, got shape {tuple(x.shape)}")
    check_tensor("packed", packed, (torch.uint8,), (2, 3))
    if packed.dim() == 3 and packed.shape[0] != 1:
        raise ValueError(f"packed must be [N, K/2] or [1, N, K/2] for a dense layer, got {tuple(packed.shape)}")
    K = x.shape[-1]
    check_k("x.shape[-1] (K)", K)
    N = packed.shape[-2]
    check_packed(packed, scales, N, K)
    packed = packed.reshape(1, N, K // 2)
    scales = scales.reshape(1, N, K // 32)
    check_contiguous(packed=packed, scales=scales)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    check_rows_contiguous("x", x2)
    dev = check_devices(x=x, packed=packed, scales=scales, out=out)
    R = x2.shape[0]
    out2 = check_out("out", out, (*lead, N), torch.bfloat16, dev).reshape(R, N)
    # Rows ride on a grid axis limited to 65535 programs: long prefill-style inputs go in chunks.
    for r0 in range(0, R, MAX_GRID_ROWS):
        xc, oc = x2[r0:r0 + MAX_GRID_ROWS], out2[r0:r0 + MAX_GRID_ROWS]
        rc = xc.shape[0]
        if act == "int8":
            _launch_gemv(xc, None, packed, scales, None, N, K, rc, out=oc, x_mode=X_FLOAT, plan=plan)
        else:
            gemv_w4a16_kernel[(triton.cdiv(N, W4A16_BLOCK_N), rc)](
                xc, packed, scales, oc, N, K, xc.stride(0),
                K_TILES=triton.cdiv(K, W4A16_BLOCK_K), BLOCK_N=W4A16_BLOCK_N, BLOCK_K=W4A16_BLOCK_K)
    return out2.reshape(*lead, N)


def gemv_ref(xq, xs, packed, scales, eids, N, K) -> torch.Tensor:
    """float32 [R, N] reference of gemv_int4_b32 (CPU, float64 accumulation of the same values)."""
    from ..format import dequant_int4_ref
    w = dequant_int4_ref(packed.cpu(), scales.cpu(), N, K).double()           # [E, N, K]
    x = (xq.cpu().double().reshape(-1, K // 32, 32) * xs.cpu().double()[..., None]).reshape(-1, K)
    e = eids.cpu().long()
    return torch.einsum("rk,rnk->rn", x, w[e]).float()
