"""Round-to-nearest with a per-block clipping search: the stronger round-to-nearest baseline GPTQ is held to.

Shape legend: E = experts, N = out features, K = in features.

Each 32-block's scale is amax/7 shrunk by the factor of `grid` (1.00 ... 0.70) with the least block error,
weighted by the Hessian's diagonal when one is given; the codes are then round-to-nearest on that scale, so the
bytes are int4-b32's (grid=(1.0,) gives exactly `pack_int4_b32`).
"""
from __future__ import annotations

import torch

from ._checks import FLOAT_DTYPES, check_finite, check_tensor
from .format import QMAX, QMIN, _blocks, _check_weight, block_scales, check_scale_range, pack_codes, rtn_codes, true_div

DEFAULT_CLIP_GRID = tuple(round(1.0 - 0.01 * i, 2) for i in range(31))    # shrink factors 1.00 ... 0.70


def clip_scales(w: torch.Tensor, grid=DEFAULT_CLIP_GRID, hessian: torch.Tensor | None = None) -> torch.Tensor:
    """float32 scales [..., K/32] from a per-block clipping search over w [..., N, K].

    For each shrink factor f in `grid` (1.0 is always tried first): s = f · amax(|block|).clamp_min(1e-12) / 7,
    codes = round_half_to_even(w / s) clamped to [-8, 7]; block error Σ_k h_k (w_k - code_k · float(fp16 s))²
    with h_k = diag(hessian)_k (a per-channel activation energy, cross terms ignored) or 1 without a
    hessian. The first f with the smallest error wins, so no block is worse than round-to-nearest.
    hessian: [K, K] or [..., K, K] with w's leading (expert) dims.
    """
    _check_weight(w)
    K = w.shape[-1]
    if isinstance(grid, torch.Tensor):
        grid = grid.tolist()
    try:
        grid = [float(f) for f in grid]
    except (TypeError, ValueError):
        raise TypeError(f"grid must be a sequence of floats in (0, 1], got {grid!r}") from None
    if not grid or not all(0.0 < f <= 1.0 for f in grid):
        raise ValueError(f"grid must be a non-empty sequence of shrink factors in (0, 1], got {grid!r}")
    h = torch.ones(K, dtype=torch.float32, device=w.device)
    if hessian is not None:
        check_tensor("hessian", hessian, FLOAT_DTYPES, (2, 3))
        lead = tuple(w.shape[:-2])
        if tuple(hessian.shape[-2:]) != (K, K) or tuple(hessian.shape[:-2]) not in ((), lead):
            raise ValueError(f"hessian must have shape (K, K) = ({K}, {K}) or {lead + (K, K)} to match w "
                             f"{tuple(w.shape)}, got {tuple(hessian.shape)}")
        check_finite("hessian", hessian)
        h = hessian.to(device=w.device, dtype=torch.float32).diagonal(dim1=-2, dim2=-1)
        if bool((h < 0).any()):
            raise ValueError("hessian must have a non-negative diagonal (H = 2/n Σ x xᵀ)")
        h = h.unsqueeze(-2)                          # [..., 1, K] broadcasts over the N rows
    check_scale_range(block_scales(w))
    wb = _blocks(w.float())                          # [..., N, K/32, 32]
    hb = _blocks(h.expand(w.shape))
    amax = wb.abs().amax(-1).clamp_min(1e-12)
    best_s = best_err = None
    for f in [1.0] + [f for f in grid if f != 1.0]:
        s = true_div(f * amax, 7.0)
        q = torch.round(wb / s.unsqueeze(-1)).clamp_(QMIN, QMAX)
        err = (hb * (wb - q * s.to(torch.float16).float().unsqueeze(-1)) ** 2).sum(-1)
        if best_s is None:
            best_s, best_err = s, err
        else:
            better = err < best_err
            best_s = torch.where(better, s, best_s)
            best_err = torch.where(better, err, best_err)
    return best_s


def rtn_clip_pack_int4_b32(w: torch.Tensor, grid=DEFAULT_CLIP_GRID,
                           hessian: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest with a per-block clipping search (`clip_scales`); w [N, K] or [E, N, K].

    Returns int4-b32 (packed uint8 [..., N, K/2], scales float16 [..., N, K/32]); grid=(1.0,) gives
    exactly the bytes of `pack_int4_b32`.
    """
    s = clip_scales(w, grid=grid, hessian=hessian)
    return pack_codes(rtn_codes(w, s)), s.to(torch.float16)
