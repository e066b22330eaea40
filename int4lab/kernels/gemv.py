"""The int4-b32 GEMV launchers: one public entry per use, dispatching on the plan to a kernel variant.

Shape legend: E = experts, N = out features, K = in features, R = activation rows (tokens x top-k),
T = output rows, A = rows combined into one output row (MoE top-k, else 1).

    gemv_int4_b32(xq, xs, packed, scales, eids, N, K)   routed W4A8 on int8 codes      -> bf16 [R, N]
    int4_linear(x, packed, scales, act)                  dense W4A8 / W4A16 on float x  -> bf16 [..., N]

W4A8 runs gemv_dp4a.py (every plan-table row); act="bf16" runs gemv_w4a16.py. A W4A8 call on float
activations (int4_linear, the MoE step's routed GEMVs) is ONE launch: the activation is quantised inside the
GEMV (quant.quant_blocks, the codes of quant_x_rows); gemv_int4_b32 takes codes quantised beforehand. Split-K
partials are finished by the last-arriving program (epilogue.finish_rows).

Both check their arguments, then launch through launch.py (the internal API the modules' hot path shares),
whose docstring describes the split-K workspace. Warm up (one eager call) before capturing a CUDA graph,
so the workspace is not first allocated inside the capture.
"""
from __future__ import annotations

import torch

from .. import _checks
from .._checks import (FLOAT_DTYPES, check_contiguous, check_devices, check_ids, check_k, check_out,
                       check_packed, check_rows_contiguous, check_shape, check_tensor)
from .gemv_dp4a import X_CODES, X_FLOAT, X_SWIGLU
from .launch import launch_gemv, run_w4a16

__all__ = ["gemv_int4_b32", "int4_linear", "check_linear", "gemv_ref", "X_CODES", "X_FLOAT", "X_SWIGLU"]

MAX_GRID_ROWS = 65535           # CUDA's limit on the grid's y and z dimensions, where rows go


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
    return launch_gemv(xq, xs, packed, scales, eids, N, K, xq.shape[0], out=out, part=part, split_k=split_k,
                       plan=plan)


def check_linear(x, packed, scales, act="int8", out=None):
    """int4_linear's argument checks (host metadata only): returns (x as [R, K], packed as [1, N, K/2],
    scales as [1, N, K/32], N, K, device)."""
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
    x2 = x.reshape(-1, K)
    check_rows_contiguous("x", x2)
    dev = check_devices(x=x, packed=packed, scales=scales, out=out)
    return x2, packed, scales, N, K, dev


F32_MAX = torch.finfo(torch.float32).max


def check_x_range(x2, scales, K) -> None:
    """ValueError unless the finite values of x are small enough that no float32 sum of the layer can
    overflow: max|x| * K * 8 * max scale (the largest |y| any output could reach) within float32's range.
    Beyond it partial sums of opposite sign overflow to +inf and -inf and a row of finite inputs comes out
    NaN. NaN and inf in x are not refused: they propagate to their rows, as torch.nn.functional.linear's do.
    Reads x and the scales (two reductions), so it is skipped under CUDA-graph capture and inside
    `ids_unread()`, as check_ids is."""
    if not _checks._ID_VALUES[-1] or _checks.capturing() or x2.numel() == 0:
        return
    a = x2.abs()
    amax = float(a.masked_fill(~torch.isfinite(a), 0).amax())
    bound = amax * K * 8 * float(scales.float().abs().amax())
    if bound > F32_MAX:
        raise ValueError(f"x is out of range for float32 accumulation: max|x| = {amax:.3g} times K * 8 * max "
                         f"scale gives {bound:.3g} > {F32_MAX:.3g} (partial sums could overflow to +-inf and "
                         f"give NaN); scale x down")


def int4_linear(x, packed, scales, act="int8", out=None, *, plan=None):
    """Dense int4-b32 linear layer (E = 1): x [..., K] bf16/fp16/fp32 -> bf16 [..., N].

    act="int8": W4A8 in one launch, x quantised per 32-block inside the GEMV to the codes of
    quant_x_rows (gemv_int4_b32's roundings; the dense kernel folds the block sums with tl.sum, the routed one
    in fold_blocks' order, so the two may differ in the last bf16 bit). act="bf16": W4A16, weights decoded to
    float32 in registers, float32 accumulation, x unquantised. packed uint8 [N, K/2] or [1, N, K/2], scales
    float16 [N, K/32] or [1, N, K/32]. `plan` (a GemvPlan) overrides the launch plan of the W4A8 path.
    """
    x2, packed, scales, N, K, dev = check_linear(x, packed, scales, act, out)
    check_x_range(x2, scales, K)
    lead = x.shape[:-1]
    R = x2.shape[0]
    out2 = check_out("out", out, (*lead, N), torch.bfloat16, dev).reshape(R, N)
    # Rows ride on a grid axis limited to 65535 programs: long prefill-style inputs go in chunks.
    for r0 in range(0, R, MAX_GRID_ROWS):
        xc, oc = x2[r0:r0 + MAX_GRID_ROWS], out2[r0:r0 + MAX_GRID_ROWS]
        rc = xc.shape[0]
        if act == "int8":
            launch_gemv(xc, None, packed, scales, None, N, K, rc, out=oc, x_mode=X_FLOAT, plan=plan)
        else:
            run_w4a16(xc, packed, scales, oc)
    return out2.reshape(*lead, N)


def gemv_ref(xq, xs, packed, scales, eids, N, K) -> torch.Tensor:
    """float32 [R, N] reference of gemv_int4_b32 (CPU, float64 accumulation of the same values)."""
    from ..format import dequant_int4_ref
    w = dequant_int4_ref(packed.cpu(), scales.cpu(), N, K).double()           # [E, N, K]
    x = (xq.cpu().double().reshape(-1, K // 32, 32) * xs.cpu().double()[..., None]).reshape(-1, K)
    e = eids.cpu().long()
    return torch.einsum("rk,rnk->rn", x, w[e]).float()
