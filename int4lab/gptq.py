"""GPTQ onto int4-b32: calibrated codes, the same bytes as `pack_int4_b32`.

Shape legend: N = out features (rows), K = in features (columns), R = activation rows.

Round-to-nearest minimises each weight's error. GPTQ (Frantar et al., 2022, arXiv:2210.17323) minimises
the layer's output error on calibration activations X [R, K],

    ||X (W - Ŵ)ᵀ||²  =  (R / 2) · tr((W - Ŵ) H (W - Ŵ)ᵀ),      H = 2/R · Σ_r x_r x_rᵀ   [K, K],

one column at a time: after column k is rounded, its residual is pushed into the columns not yet rounded
through the upper Cholesky factor U of H⁻¹ (H⁻¹ = UᵀU). The algorithm below follows the reference
implementation (https://github.com/IST-DASLab/gptq/blob/main/gptq.py, `fasterquant`) with its names:
`H`, `Hinv`, `W1`, `Q1`, `Err1`, lazy batches `i1:i2`. What is specific to int4-b32:

* the scale of each 32-column group is chosen when the sweep enters the group, from the *compensated*
  weights `W1` (the reference reads the stale `W` there when a group starts inside a lazy batch);
  s = amax(|group|).clamp_min(1e-12) / 7 in float32, codes round_half_to_even(w / s) clamped to [-8, 7]
  (compensation can push a weight past 7·s, so -8 does occur), stored scale s.to(float16);
* the error fed back is that of the value the kernels will decode, code · float(fp16 scale), not of
  code · fp32 scale: `dequant_int4_ref` of the packed bytes equals `GPTQResult.wq` exactly;
* `act_order=True` sweeps columns by decreasing diag(H) but keeps the groups static (AutoGPTQ's
  `static_groups`): every group's scale is fixed from the source weights in the original column order
  before the sweep, so the bytes keep the int4-b32 layout and no g_idx is needed.

Bit packing is `int4lab.format.pack_codes`: GPTQ chooses codes, it never touches byte order.
`clip.rtn_clip_pack_int4_b32` is the stronger round-to-nearest baseline: a per-block clipping search.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from ._checks import FLOAT_DTYPES, check_finite, check_tensor
from .format import (BLOCK, FP16_MAX, QMAX, QMIN, _check_weight, block_scales, check_scale_range, pack_codes,
                     scale_from_amax)

_MAX_DAMP_RETRIES = 12


class HessianAccumulator:
    """Running mean H = 2/n Σ x xᵀ (float32 [K, K]) over every row x added so far.

    `add(x)` takes activations [..., K] in any float dtype; each batch's Gram xᵀx is computed on x's
    device (fast on the GPU), then added into H on `device` (default: the first batch's device).
    `device="cpu"` keeps H off the GPU, which is what lets eight experts' Hessians coexist on a small card.
    """

    def __init__(self, in_features: int, device=None):
        if not isinstance(in_features, int) or isinstance(in_features, bool) or in_features <= 0:
            raise ValueError(f"in_features must be a positive int, got {in_features!r}")
        self.in_features = in_features
        self.device = None if device is None else torch.device(device)
        self.nsamples = 0
        self._H = None

    def add(self, x: torch.Tensor) -> None:
        check_tensor("x", x, FLOAT_DTYPES)
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"x must have shape [..., in_features={self.in_features}], got {tuple(x.shape)}")
        check_finite("x", x)
        x = x.reshape(-1, self.in_features).float()
        n = x.shape[0]
        if n == 0:                      # an expert that no row was routed to this batch
            return
        gram = x.t() @ x
        if self._H is None:
            self._H = torch.zeros(self.in_features, self.in_features, dtype=torch.float32,
                                  device=self.device or x.device)
        total = self.nsamples + n
        # rescale the old mean instead of summing raw Grams: H stays O(|x|²) however many rows arrive
        self._H.mul_(self.nsamples / total).add_(gram.to(self._H.device), alpha=2.0 / total)
        self.nsamples = total

    @property
    def H(self) -> torch.Tensor:
        if self._H is None:
            raise ValueError("HessianAccumulator has no rows yet: call add(x) with calibration activations "
                             "first (an expert no calibration row reached has no Hessian; pack it with RTN)")
        return self._H


@dataclass
class GPTQResult:
    """What the sweep emitted, in the original column order.

    codes int8 [N, K] in [-8, 7]; scales float16 [N, K/32]; wq float32 [N, K] = codes · float(scales), the
    decoded weight the algorithm compensated for; loss float32 [K]: column k's Σ_n (w - ŵ)² / Hinv_kk²
    (Hinv_kk the diagonal of the Cholesky factor of the damped H⁻¹), so loss.sum() = tr(ΔW H_d ΔWᵀ) with
    ΔW = wq - W and H_d the damped H; damp: the damping λ added to diag(H) (absolute, after any retry).
    """
    codes: torch.Tensor
    scales: torch.Tensor
    wq: torch.Tensor
    loss: torch.Tensor
    damp: float


def _check_hessian(hessian, K: int) -> None:
    check_tensor("hessian", hessian, FLOAT_DTYPES, (2,))
    if tuple(hessian.shape) != (K, K):
        raise ValueError(f"hessian must have shape (K, K) = ({K}, {K}) to match w [N, K], got {tuple(hessian.shape)}")
    check_finite("hessian", hessian)
    H = hessian.float()
    if bool((H.diagonal() < 0).any()):
        raise ValueError("hessian must have a non-negative diagonal (H = 2/n Σ x xᵀ)")
    tol = 1e-4 * float(H.abs().max())
    if float((H - H.t()).abs().max()) > tol:
        raise ValueError("hessian must be symmetric (H = 2/n Σ x xᵀ)")
    if not bool((H.diagonal() > 0).any()):
        raise ValueError("hessian is all zero: no calibration activation reached this layer; pack it with "
                         "pack_int4_b32 (round-to-nearest) instead of zeroing every weight")


def _check_options(damp, blocksize) -> None:
    if isinstance(damp, bool) or not isinstance(damp, (int, float)) or not damp >= 0 or damp == float("inf"):
        raise ValueError(f"damp must be a finite float >= 0 (fraction of mean diag(H)), got {damp!r}")
    if isinstance(blocksize, bool) or not isinstance(blocksize, int) or blocksize <= 0 or blocksize % BLOCK:
        raise ValueError(f"blocksize must be a positive int multiple of {BLOCK} (a scale group must not "
                         f"straddle two lazy batches), got {blocksize!r}")


def _inverse_factor(H: torch.Tensor, damp: float) -> tuple[torch.Tensor, float]:
    """Upper U with (H + λI)⁻¹ = UᵀU, λ = damp · mean(diag H); λ grows tenfold until H + λI factors.

    U is the reference's cholesky(cholesky_inverse(cholesky(H)), upper=True), computed with one
    factorisation: with J the reversal permutation and J H J = L Lᵀ, U = J L⁻¹ J (upper, positive diagonal,
    UᵀU = J (J H J)⁻¹ J = H⁻¹). It skips forming H⁻¹, which costs 5-20x the factorisation on a CPU.
    """
    mean_diag = float(H.diagonal().mean())
    lam = damp * mean_diag
    eye = torch.eye(H.shape[0], dtype=H.dtype, device=H.device)
    for attempt in range(_MAX_DAMP_RETRIES):
        Hd = H.flip(0, 1)
        Hd.diagonal().add_(lam)
        L, info = torch.linalg.cholesky_ex(Hd)
        if int(info) == 0:
            Hinv = torch.linalg.solve_triangular(L, eye, upper=False).flip(0, 1)
            if bool(torch.isfinite(Hinv).all()):
                if attempt:
                    warnings.warn(f"hessian is not positive definite with damp={damp}; factored it with damping "
                                  f"{lam / mean_diag:.3g} x mean(diag H) after {attempt} retries",
                                  RuntimeWarning, stacklevel=3)
                return Hinv, lam
        lam = lam * 10 if lam > 0 else 0.01 * mean_diag
    raise ValueError(f"hessian could not be factored even with damping {lam / 10 / mean_diag:.3g} x mean(diag H)")


def gptq_quantize(w: torch.Tensor, hessian: torch.Tensor, damp: float = 0.01, blocksize: int = 128,
                  act_order: bool = False) -> GPTQResult:
    """GPTQ codes and scales for w [N, K] (fp32/fp16/bf16, K % 32 == 0) under hessian [K, K].

    Runs on w's device in float32 (H is moved there). Input channels with diag(H) == 0 never carry
    signal: their diagonal is set to 1 and their weights to 0 (code 0). damp: fraction of mean(diag H)
    added to the diagonal; an H that still is not positive definite is retried with 10x the damping and
    a RuntimeWarning. blocksize: lazy-batch width, a multiple of 32. See the module docstring for the
    scale rule and act_order.
    """
    _check_weight(w)
    if w.dim() != 2:
        raise ValueError(f"w must have rank 2 ([N, K], one layer or one expert), got shape {tuple(w.shape)}")
    N, K = w.shape
    _check_hessian(hessian, K)
    _check_options(damp, blocksize)
    if not isinstance(act_order, bool):
        raise TypeError(f"act_order must be a bool, got {type(act_order).__name__}")
    check_scale_range(block_scales(w))
    dev = w.device

    W = w.detach().to(torch.float32).clone()
    H = hessian.detach().to(device=dev, dtype=torch.float32).clone()
    dead = H.diagonal() == 0
    H[dead, :] = 0
    H[:, dead] = 0
    H[dead, dead] = 1
    W[:, dead] = 0

    S = torch.zeros(N, K // BLOCK, dtype=torch.float32, device=dev)       # fp32 scale per group
    if act_order:
        S = block_scales(W)                  # static groups: fixed from the source, original order
        perm = torch.argsort(H.diagonal(), descending=True)
        W, H = W[:, perm], H[perm][:, perm]
        group_of = (perm // BLOCK).tolist()  # group (original order) of the column swept at position k
    S16 = S.to(torch.float16).float()

    Hinv, lam = _inverse_factor(H, damp)
    Q = torch.zeros(N, K, dtype=torch.int8, device=dev)
    Wq = torch.zeros(N, K, dtype=torch.float32, device=dev)
    loss = torch.zeros(K, dtype=torch.float32, device=dev)

    for i1 in range(0, K, blocksize):
        i2 = min(i1 + blocksize, K)
        W1 = W[:, i1:i2].clone()
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            k = i1 + i
            if act_order:
                g = group_of[k]
            else:
                g = k // BLOCK
                if k % BLOCK == 0:           # entering a group: scale from the compensated weights
                    # clamp: compensation may lift amax a little past what the source check allowed
                    S[:, g] = scale_from_amax(W1[:, i:i + BLOCK].abs().amax(1)).clamp_max(FP16_MAX)
                    S16[:, g] = S[:, g].to(torch.float16).float()
            w_col = W1[:, i]
            d = Hinv1[i, i]
            q = torch.round(w_col / S[:, g]).clamp_(QMIN, QMAX)     # half-to-even, fp32 scale
            Q1[:, i] = q
            wq = q * S16[:, g]                                      # what the kernels will decode
            Wq[:, k] = wq
            err1 = (w_col - wq) / d
            # W1 -= err1 ⊗ Hinv1[i, i:]; elementwise addcmul_ measured ~2x faster than addr_ (BLAS ger) on this CPU
            W1[:, i:].addcmul_(err1.unsqueeze(1), Hinv1[i, i:].unsqueeze(0), value=-1)
            Err1[:, i] = err1
        Q[:, i1:i2] = Q1.to(torch.int8)
        loss[i1:i2] = (Err1 * Err1).sum(0)
        W[:, i2:].addmm_(Err1, Hinv[i1:i2, i2:], alpha=-1)        # lazy batch: W -= Err1 Hinv

    if act_order:
        invperm = torch.argsort(perm)
        Q, Wq, loss = Q[:, invperm], Wq[:, invperm], loss[invperm]
    return GPTQResult(codes=Q.contiguous(), scales=S.to(torch.float16), wq=Wq.contiguous(), loss=loss, damp=lam)


def gptq_pack_int4_b32(w: torch.Tensor, hessian: torch.Tensor, damp: float = 0.01, blocksize: int = 128,
                       act_order: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ-calibrated pack of w [N, K] under hessian [K, K] (see `HessianAccumulator`).

    Returns (packed uint8 [N, K/2], scales float16 [N, K/32]): the int4-b32 bytes of `pack_int4_b32`,
    decodable by `dequant_int4_ref` and served by the same kernels. For [E, N, K] experts call it per
    expert with that expert's H (from the rows routed to it).
    """
    r = gptq_quantize(w, hessian, damp=damp, blocksize=blocksize, act_order=act_order)
    return pack_codes(r.codes), r.scales


def _inverse_factor_batched(H: torch.Tensor, damp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`_inverse_factor` for a stack H [E, K, K]: (U [E, K, K], λ [E]). Each expert's damping grows tenfold
    on its own until its H + λI factors; the others are not refactored."""
    E, K, _ = H.shape
    mean_diag = H.diagonal(dim1=-2, dim2=-1).mean(-1)                   # [E]
    lam = damp * mean_diag
    U = torch.empty_like(H)
    eye = torch.eye(K, dtype=H.dtype, device=H.device)
    todo = torch.arange(E, device=H.device)
    for attempt in range(_MAX_DAMP_RETRIES):
        Hd = H[todo].flip(-2, -1)
        Hd.diagonal(dim1=-2, dim2=-1).add_(lam[todo].unsqueeze(-1))
        L, info = torch.linalg.cholesky_ex(Hd)
        del Hd
        Ut = torch.linalg.solve_triangular(L, eye, upper=False).flip(-2, -1)
        del L
        ok = (info == 0) & torch.isfinite(Ut).flatten(1).all(1)
        U[todo[ok]] = Ut[ok]
        del Ut
        if bool(ok.all()):
            if attempt:
                warnings.warn(f"{E} hessians: some were not positive definite with damp={damp}; factored them "
                              f"after up to {attempt} tenfold damping retries", RuntimeWarning, stacklevel=3)
            return U, lam
        todo = todo[~ok]
        lam[todo] = torch.where(lam[todo] > 0, lam[todo] * 10, 0.01 * mean_diag[todo])
    raise ValueError(f"{todo.numel()} of {E} hessians could not be factored even with damping "
                     f"{_MAX_DAMP_RETRIES} tenfold retries past damp={damp}")


def gptq_quantize_experts(w: torch.Tensor, hessian: torch.Tensor, damp: float = 0.01,
                          blocksize: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`gptq_quantize` of E experts at once: w [E, N, K], hessian [E, K, K] (expert e's own H).

    The same sweep, scale rule and dead-channel rule as `gptq_quantize` (act_order off), every column step
    one batched operation over the experts instead of a Python loop per expert: on a GPU a layer of 128
    small experts costs about what one expert does. Returns (codes int8 [E, N, K], scales float16
    [E, N, K/32], damping λ [E]). Batched matrix products may sum in another order than the 2-D ones, so
    an occasional code differs from `gptq_quantize`'s by one step where a value sits on a rounding edge.
    """
    _check_weight(w)
    if w.dim() != 3:
        raise ValueError(f"w must have rank 3 ([E, N, K], a layer's experts), got shape {tuple(w.shape)}")
    E, N, K = w.shape
    check_tensor("hessian", hessian, FLOAT_DTYPES, (3,))
    if tuple(hessian.shape) != (E, K, K):
        raise ValueError(f"hessian must have shape (E, K, K) = ({E}, {K}, {K}) to match w [E, N, K], "
                         f"got {tuple(hessian.shape)}")
    check_finite("hessian", hessian)
    _check_options(damp, blocksize)
    check_scale_range(block_scales(w))
    dev = w.device

    W = w.detach().to(torch.float32).clone()
    H = hessian.detach().to(device=dev, dtype=torch.float32).clone()
    diag = H.diagonal(dim1=-2, dim2=-1)
    if bool((diag < 0).any()):
        raise ValueError("hessian must have a non-negative diagonal (H = 2/n Σ x xᵀ)")
    tol = 1e-4 * H.abs().amax(dim=(-2, -1))                              # per expert, as `_check_hessian`
    asym = ((H - H.transpose(-2, -1)).abs().amax(dim=(-2, -1)) > tol).nonzero().flatten().tolist()
    if asym:
        raise ValueError(f"hessian must be symmetric (H = 2/n Σ x xᵀ): experts {asym[:8]} are not")
    dead = diag == 0                                                     # [E, K]
    if bool(dead.all(-1).any()):
        raise ValueError("a hessian is all zero: no calibration activation reached that expert; pack it with "
                         "pack_int4_b32 (round-to-nearest) instead")
    live = (~dead).to(H.dtype)
    H.mul_(live.unsqueeze(-1)).mul_(live.unsqueeze(-2))
    H.diagonal(dim1=-2, dim2=-1).masked_fill_(dead, 1.0)
    W.masked_fill_(dead.unsqueeze(1), 0.0)

    S = torch.zeros(E, N, K // BLOCK, dtype=torch.float32, device=dev)
    S16 = S.clone()
    Hinv, lam = _inverse_factor_batched(H, damp)
    del H
    Q = torch.zeros(E, N, K, dtype=torch.int8, device=dev)
    for i1 in range(0, K, blocksize):
        i2 = min(i1 + blocksize, K)
        W1 = W[:, :, i1:i2].clone()
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[:, i1:i2, i1:i2]
        for i in range(i2 - i1):
            k = i1 + i
            g = k // BLOCK
            if k % BLOCK == 0:               # entering a group: scale from the compensated weights
                S[:, :, g] = scale_from_amax(W1[:, :, i:i + BLOCK].abs().amax(-1)).clamp_max(FP16_MAX)
                S16[:, :, g] = S[:, :, g].to(torch.float16).float()
            w_col = W1[:, :, i]                                          # [E, N]
            q = torch.round(w_col / S[:, :, g]).clamp_(QMIN, QMAX)
            Q1[:, :, i] = q
            err1 = (w_col - q * S16[:, :, g]) / Hinv1[:, i, i].unsqueeze(1)
            W1[:, :, i:].addcmul_(err1.unsqueeze(2), Hinv1[:, i, i:].unsqueeze(1), value=-1)
            Err1[:, :, i] = err1
        Q[:, :, i1:i2] = Q1.to(torch.int8)
        if i2 < K:
            W[:, :, i2:].baddbmm_(Err1, Hinv[:, i1:i2, i2:], alpha=-1)   # lazy batch: W -= Err1 Hinv
    return Q, S.to(torch.float16), lam


def gptq_pack_int4_b32_experts(w: torch.Tensor, hessian: torch.Tensor, damp: float = 0.01,
                               blocksize: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ-calibrated int4-b32 pack of E experts at once (`gptq_quantize_experts`): w [E, N, K], hessian
    [E, K, K] -> (packed uint8 [E, N, K/2], scales float16 [E, N, K/32])."""
    q, s, _ = gptq_quantize_experts(w, hessian, damp=damp, blocksize=blocksize)
    return pack_codes(q), s
