"""The roads not taken: alternatives to int4-b32's design choices, for chapter 01 to measure against it.

Shape legend: N = rows (out features), K = in features, B = block size (weights per scale).

None of these is a format the kernels read. Each answers one "why this choice?" of int4-b32:
  * `rtn_dequant(w, block)`         block size: amax/7 round-to-nearest with an fp16 scale per `block` weights;
  * `q4_0_codes(w)`                 llama.cpp Q4_0's scale rule: d = (signed value of the largest |w|) / -8, so the
                                    largest weight lands on code -8 (a level amax/7 never uses); same bytes;
  * `int4lab.clip.clip_scales`      a per-block clip search (reused from the library, not repeated here);
  * `nf4_levels`, `nf4_dequant`     QLoRA's NormalFloat4 codebook with an absmax per block (`nf4_codes` gives
                                    the indices; `nf4_int8_levels` the table rounded to int8).
`mean_ci` turns per-seed measurements into a mean and a 95 % confidence half-width.
"""
from __future__ import annotations

import math

import torch

from int4lab.format import BLOCK, QMAX, QMIN, _check_weight, rtn_codes, true_div
from int4lab.clip import clip_scales


def _check_block(w: torch.Tensor, block: int) -> None:
    if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
        raise ValueError(f"block must be a positive int, got {block!r}")
    if w.shape[-1] % block:
        raise ValueError(f"w.shape[-1] (K) must be a multiple of block={block}, got {w.shape[-1]}")


def _by_block(w: torch.Tensor, block: int) -> torch.Tensor:
    return w.float().reshape(*w.shape[:-1], w.shape[-1] // block, block)


def rtn_dequant(w: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """int4-b32's rule with another block size: s = amax / 7 (fp32), q = round_half_even(w / s) in [-8, 7],
    decoded q * fp16(s). float32, w's shape. block=32 decodes exactly what `pack_int4_b32` stores."""
    _check_block(w, block)
    wb = _by_block(w, block)
    s = true_div(wb.abs().amax(-1).clamp_min(1e-12), 7.0)
    q = torch.round(wb / s.unsqueeze(-1)).clamp_(QMIN, QMAX)
    return (q * s.to(torch.float16).float().unsqueeze(-1)).reshape(w.shape)


def q4_0_codes(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's reference Q4_0 quantiser on w [..., K] (K % 32 == 0), expressed in int4-b32 terms.

    Per 32-block: m = the block's value of largest magnitude (sign kept), d = m / -8 (fp32), q = min(15,
    trunc(w / d · 1 + 8.5)) computed as w * (1/d) like the C code, code = q - 8. d is negative when m > 0.
    Returns (codes int8 [..., K] in [-8, 7], scales float16 [..., K/32]): `pack_codes(codes), scales` are
    int4-b32 bytes whose decode (code · d) equals llama.cpp's, and `int4lab.q4_0` transcodes them to the very
    Q4_0 blocks llama.cpp would write.
    """
    _check_weight(w)
    wb = _by_block(w, BLOCK)
    idx = wb.abs().argmax(-1, keepdim=True)
    m = torch.gather(wb, -1, idx)
    d = m / -8.0
    inv = torch.where(d == 0, torch.zeros_like(d), 1.0 / torch.where(d == 0, torch.ones_like(d), d))
    q = torch.trunc(wb * inv + 8.5).clamp_(0, 15)
    codes = (q - 8).to(torch.int8).reshape(w.shape)
    return codes, d.squeeze(-1).to(torch.float16)


def q4_0_clipped(w: torch.Tensor) -> torch.Tensor:
    """bool [..., K]: the weights `q4_0_codes` clips. d = m / -8 puts the block's signed largest value m on code -8,
    so the codes run to +7 only on the other side: a weight of the opposite sign with |w| >= 7.5 |d| (within
    1/16 of amax) would round to +8 and is clamped to +7, an error of up to one step |d| instead of half a step,
    each plus the float16 rounding of the scale the decode uses, |q|·|d - d16| (under 2^-8 |d| while d16 is a
    normal float16)."""
    _check_weight(w)
    wb = _by_block(w, BLOCK)
    m = torch.gather(wb, -1, wb.abs().argmax(-1, keepdim=True))
    d = m / -8.0
    inv = torch.where(d == 0, torch.zeros_like(d), 1.0 / torch.where(d == 0, torch.ones_like(d), d))
    return (torch.trunc(wb * inv + 8.5) > 15).reshape(w.shape)


def codes_dequant(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 code · float(scale) for codes int8 [..., K] and scales float16 [..., K/32]."""
    return (_by_block(codes, BLOCK) * scales.float().unsqueeze(-1)).reshape(codes.shape)


def nf4_levels(offset: float = 0.9677083) -> torch.Tensor:
    """float64 [16]: QLoRA's NormalFloat4 levels (arXiv:2305.14314, section 3), built from normal quantiles.

    8 positive levels at the N(0, 1) quantiles of linspace(offset, 0.5, 9)[:-1], 7 negative at those of
    linspace(offset, 0.5, 8)[:-1] (mirrored), and an exact 0; all divided by the largest, so the ends are ±1.
    An asymmetric split gives 0 its own code. `offset` is the paper's 0.9677083 (the mean of the two
    quantiles 1 - 1/(2·15) and 1 - 1/(2·16) the paper uses for its 15 and 16 slots).
    """
    ndtri = torch.special.ndtri
    pos = ndtri(torch.linspace(offset, 0.5, 9, dtype=torch.float64)[:-1])
    neg = -ndtri(torch.linspace(offset, 0.5, 8, dtype=torch.float64)[:-1])
    v = torch.cat((pos, torch.zeros(1, dtype=torch.float64), neg)).sort().values
    return v / v.abs().max()


def nf4_int8_levels() -> torch.Tensor:
    """int8 [16]: the NF4 levels rounded to integers over 127, round(127 · level) (ties to even), the ends ±127.
    A table of this kind lets a codebook keep an integer dot product: each decoded weight is then an int8 level
    times one float scale per block (absmax / 127), as in llama.cpp's IQ4_NL, whose own 16 int8 levels differ."""
    return torch.round(nf4_levels() * 127).to(torch.int8)


def nf4_codes(w: torch.Tensor, block: int = 64, absmax_dtype: torch.dtype = torch.float32,
              levels: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """NF4 encoding of w [..., K]: per block, absmax stored in `absmax_dtype` (returned as float32 [..., K/block, 1])
    and each w / absmax's index (int64 [..., K/block, block]) of the nearest of `levels` (ties to the lower level).
    `levels`: 16 ascending values in [-1, 1], float64; default `nf4_levels()`."""
    _check_block(w, block)
    if absmax_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"absmax_dtype must be float32, float16 or bfloat16, got {absmax_dtype}")
    lv = nf4_levels() if levels is None else levels
    if lv.shape != (16,) or not bool((lv[1:] > lv[:-1]).all()) or float(lv.abs().max()) > 1:
        raise ValueError(f"levels must be 16 strictly ascending values in [-1, 1], got shape {tuple(lv.shape)}")
    wb = _by_block(w, block)
    amax = wb.abs().amax(-1, keepdim=True).to(absmax_dtype).float()
    lv = lv.float()
    safe = torch.where(amax == 0, torch.ones_like(amax), amax)
    # nearest level without a [..., 16] distance tensor: count the midpoints below (a tie goes to the lower level)
    return torch.bucketize((wb / safe).contiguous(), (lv[1:] + lv[:-1]) / 2), amax


def nf4_dequant(w: torch.Tensor, block: int = 64, absmax_dtype: torch.dtype = torch.float32,
                levels: torch.Tensor | None = None) -> torch.Tensor:
    """NF4 round trip of w [..., K]: per block, absmax stored in `absmax_dtype`, each w / absmax replaced by the
    nearest of `levels` (default `nf4_levels()`; ties to the lower level), decoded level · absmax. float32, w's shape.
    block=64 with float32 absmax is bitsandbytes' default (4.5 bits/weight); block=32 with float16 absmax
    costs the same 4.5 bits as int4-b32."""
    idx, amax = nf4_codes(w, block, absmax_dtype, levels)
    lv = (nf4_levels() if levels is None else levels).float()
    return (lv[idx] * amax).reshape(w.shape)


def rel_weight_err(w: torch.Tensor, w_hat: torch.Tensor) -> float:
    """||w - ŵ||² / ||w||² in float64."""
    w64 = w.double()
    return float(((w_hat.double() - w64) ** 2).sum() / (w64 ** 2).sum())


def rel_output_err(x: torch.Tensor, w: torch.Tensor, w_hat: torch.Tensor) -> float:
    """||x (ŵ - w)ᵀ||² / ||x wᵀ||² in float64; x [R, K], w and ŵ [N, K]."""
    x64 = x.double()
    return float(((x64 @ (w_hat.double() - w.double()).t()) ** 2).sum() / ((x64 @ w.double().t()) ** 2).sum())


# 0.975 quantiles of Student's t (the half-width of a two-sided 95 % interval), by degrees of freedom (1..10);
# beyond 10, 1.96 + 2.4/df + 2.9/df² is within 0.0015 of the exact quantile
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def mean_ci(values) -> tuple[float, float]:
    """(mean, half-width of the 95 % t-interval) of a sequence of per-seed measurements (n >= 2)."""
    v = torch.as_tensor(list(values), dtype=torch.float64)
    n = v.numel()
    if n < 2:
        raise ValueError(f"mean_ci needs at least 2 values (seeds), got {n}")
    t = _T975[n - 2] if n - 1 <= len(_T975) else 1.96 + 2.4 / (n - 1) + 2.9 / (n - 1) ** 2
    return float(v.mean()), t * float(v.std(unbiased=True)) / math.sqrt(n)



# ------------------------------------------------------------------------------ the chapter-01 experiment
def _clip_dequant(w: torch.Tensor) -> torch.Tensor:
    s = clip_scales(w)                                   # the per-block search of int4lab.clip (no Hessian)
    return codes_dequant(rtn_codes(w, s), s.to(torch.float16))


# name -> (bits per weight, w [N, K] -> ŵ float32). The first four differ only in block size.
DESIGNS = {
    "amax/7, B=16": (4 + 16 / 16, lambda w: rtn_dequant(w, 16)),
    "amax/7, B=32 (int4-b32)": (4 + 16 / 32, lambda w: rtn_dequant(w, 32)),
    "amax/7, B=64": (4 + 16 / 64, lambda w: rtn_dequant(w, 64)),
    "amax/7, B=128": (4 + 16 / 128, lambda w: rtn_dequant(w, 128)),
    "max/-8, B=32 (llama.cpp Q4_0)": (4.5, lambda w: codes_dequant(*q4_0_codes(w))),
    "amax/7 + clip search, B=32": (4.5, _clip_dequant),
    "NF4, fp32 absmax / 64": (4 + 32 / 64, lambda w: nf4_dequant(w, 64, torch.float32)),
    "NF4, fp16 absmax / 32": (4 + 16 / 32, lambda w: nf4_dequant(w, 32, torch.float16)),
}
BASELINE = "amax/7, B=32 (int4-b32)"


def weight_draw(dist: str, N: int, K: int, generator: torch.Generator) -> torch.Tensor:
    """float32 [N, K]: "gaussian" (std 0.02) or "student-t" (3 degrees of freedom, scale 0.01: heavy tails)."""
    if dist == "gaussian":
        return torch.randn(N, K, generator=generator) * 0.02
    if dist == "student-t":
        z = torch.randn(N, K, generator=generator)
        chi2 = (torch.randn(N, K, 3, generator=generator) ** 2).sum(-1)
        return z / torch.sqrt(chi2 / 3) * 0.01
    raise ValueError(f"dist must be 'gaussian' or 'student-t', got {dist!r}")


def design_sweep(seeds, N: int, K: int, R: int, dists=("gaussian", "student-t"), designs=None) -> list[dict]:
    """For each seed and weight distribution, one fresh w [N, K] and activations x [R, K]
    (`lab.chapters.calib.synthetic_activations`, skew 1); every design's relative weight and output error.
    Rows: {"seed", "dist", "design", "bits", "weight_err", "output_err"}."""
    from lab.chapters.calib import synthetic_activations
    designs = DESIGNS if designs is None else designs
    rows = []
    for seed in seeds:
        for dist in dists:
            g = torch.Generator().manual_seed(1000 * int(seed) + len(dist))
            w = weight_draw(dist, N, K, g)
            x = synthetic_activations(R, K, skew=1.0, generator=g)
            for name, (bits, fn) in designs.items():
                wh = fn(w)
                rows.append({"seed": int(seed), "dist": dist, "design": name, "bits": bits,
                             "weight_err": rel_weight_err(w, wh), "output_err": rel_output_err(x, w, wh)})
    return rows


def paired_ratio(rows: list[dict], design: str, dist: str, metric: str, baseline: str = BASELINE) -> tuple[float, float]:
    """mean_ci over seeds of metric(design) / metric(baseline), paired by seed (same w and x)."""
    by = {(r["seed"], r["design"]): r[metric] for r in rows if r["dist"] == dist}
    seeds = sorted({s for s, d in by if d == design})
    return mean_ci([by[(s, design)] / by[(s, baseline)] for s in seeds])


def verdict(mean: float, half: float) -> str:
    """"lower" / "higher" when the 95 % interval of a ratio excludes 1, else "UNDECIDED"."""
    if mean + half < 1:
        return "lower"
    if mean - half > 1:
        return "higher"
    return "UNDECIDED"
