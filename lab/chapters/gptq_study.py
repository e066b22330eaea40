"""When does GPTQ beat round-to-nearest? The measurements of chapter 02: a correlation x skew map, in-sample
against held-out error, ablations of calibration size and damping, and the real layers placed on the map.

Shape legend: N = out features, K = in features, R = calibration (or held-out) rows.

Two numbers place any layer on the map, both read from its Hessian H = 2/R · XᵀX [K, K]:
  * `effective_rank_frac(H)`: the participation ratio of the channel *correlation* matrix C = D^-1/2 H D^-1/2,
    (tr C)² / tr(C²) = K² / ‖C‖²_F, divided by K. 1 = uncorrelated channels; 1/K = one shared direction.
    Scale-free, so channel skew does not move it. Computed on the rows at hand: R rows of independent channels
    give about 1 / (1 + K/R), not 1 (sampling noise is correlation too — the point of this chapter). For correlated
    channels it also falls with K (a fixed number of shared directions is a smaller fraction of a larger K), so
    compare it between layers of one K.
  * `channel_skew(H)`: the standard deviation of log(channel RMS) = ½ log diag(H) over channels.
The GPTQ gain is output MSE(GPTQ) / output MSE(RTN), measured through H: in sample on the calibration Hessian
(what GPTQ minimised) and held out on a Hessian of fresh rows (what a model would see).
"""
from __future__ import annotations

import inspect

import torch

from lab.chapters.calib import PACKERS, h_objective, paired_hessians, synthetic_activations
from int4lab.format import dequant_int4_ref, pack_int4_b32
from int4lab.gptq import HessianAccumulator, gptq_pack_int4_b32


def effective_rank_frac(H: torch.Tensor) -> float:
    """Participation ratio of the correlation matrix of H [K, K], over K, in (0, 1]; dead channels (H_kk = 0)
    are left out."""
    d = H.double().diagonal()
    live = d > 0
    if not bool(live.any()):
        raise ValueError("H has no channel with a positive diagonal")
    Hl = H.double()[live][:, live]
    s = d[live].rsqrt()
    C = Hl * s[:, None] * s[None, :]
    k = C.shape[0]
    return float(k / (C ** 2).sum())          # (tr C)^2 / tr(C^2) / k with tr C = k


def channel_skew(H: torch.Tensor) -> float:
    """std over live channels of ½ log diag(H) (the log of each channel's RMS activation)."""
    d = H.double().diagonal()
    d = d[d > 0]
    return float(0.5 * d.log().std()) if d.numel() > 1 else 0.0


def hessian(x: torch.Tensor) -> torch.Tensor:
    """H = 2/R · xᵀx, float32 [K, K], for x [R, K] (via `HessianAccumulator`)."""
    acc = HessianAccumulator(x.shape[-1])
    acc.add(x)
    return acc.H


def packer_errors(w: torch.Tensor, H_cal: torch.Tensor, H_eval: torch.Tensor, methods=("rtn", "gptq"),
                  packers=None) -> dict:
    """{method: {"in": output MSE on H_cal, "out": output MSE on H_eval}} for w [N, K]; packers see H_cal only.
    `packers` (default `calib.PACKERS`) maps a name to packer(w, H) -> (packed, scales)."""
    packers = PACKERS if packers is None else packers
    N, K = w.shape
    res = {}
    for m in methods:
        wq = dequant_int4_ref(*packers[m](w, H_cal), N, K)
        res[m] = {"in": h_objective(w, wq, H_cal), "out": h_objective(w, wq, H_eval)}
    return res


def gain(res: dict, method: str = "gptq") -> tuple[float, float]:
    """(in-sample, held-out) output MSE of `method` / RTN from a `packer_errors` result."""
    return res[method]["in"] / res["rtn"]["in"], res[method]["out"] / res["rtn"]["out"]


def synthetic_map(shared_levels, skews, seeds, N: int, K: int, R: int, paired: bool = False) -> list[dict]:
    """The map: for each correlation level (`synthetic_activations`' `shared`: 0 = independent channels), skew
    and seed, a fresh w [N, K] (std 0.02), R calibration and R held-out rows; GPTQ's gain in and out of sample.
    paired=True: one seed draws the same w and the same normal draws at every skew (only the channel scales'
    exponent changes), so ratios between skews can be taken seed by seed.
    Rows: {"shared", "skew", "seed", "erank", "skew_H", "gain_in", "gain_out"} (erank and skew_H from H_cal)."""
    rows = []
    for shared in shared_levels:
        for skew in skews:
            for seed in seeds:
                g = torch.Generator().manual_seed(int(seed) * 7919 + int(100 * shared) * 31
                                                  + (0 if paired else int(100 * skew)))
                w = torch.randn(N, K, generator=g) * 0.02
                x = synthetic_activations(2 * R, K, skew=skew, shared=shared, generator=g)
                Hc, He = hessian(x[:R]), hessian(x[R:])
                gi, go = gain(packer_errors(w, Hc, He))
                rows.append({"shared": shared, "skew": skew, "seed": int(seed), "erank": effective_rank_frac(Hc),
                             "skew_H": channel_skew(Hc), "gain_in": gi, "gain_out": go})
    return rows


def gnf4_page_example(seed: int, N: int = 64, K: int = 256, R: int = 1024) -> dict:
    """The recipe of the calibration example of the int4-decode-gemv solution page of grouped-nf4-gemm (its
    shapes, w = randn(N, K) · 0.1 and x = randn(R, K) · logspace(-1, 1, K): independent, skewed input channels),
    packed with this repository's packers (pack_int4_b32, gptq_pack_int4_b32 on H of x), not the page's own;
    its error read on x (in sample, as the page does) and on a second, fresh x of the same law (held out).
    Returns {"rtn_in", "gptq_in", "rtn_out", "gptq_out"}: mean((x (ŵ - w)ᵀ)²)."""
    torch.manual_seed(seed)
    w = torch.randn(N, K) * 0.1
    x = torch.randn(R, K) * torch.logspace(-1, 1, K)
    x_new = torch.randn(R, K) * torch.logspace(-1, 1, K)
    deq = dequant_int4_ref(*pack_int4_b32(w), N, K)
    d_cal = dequant_int4_ref(*gptq_pack_int4_b32(w, hessian(x)), N, K)
    err = lambda xx, wq: float((xx.double() @ (wq.double() - w.double()).t()).pow(2).mean())  # noqa: E731
    return {"rtn_in": err(x, deq), "gptq_in": err(x, d_cal), "rtn_out": err(x_new, deq), "gptq_out": err(x_new, d_cal)}


def ablation(N: int, K: int, rows_list, damps, seeds, skew: float, shared: float, R_eval: int) -> list[dict]:
    """GPTQ's gain against calibration rows R (at damp 0.01) and against damping (at the smallest R), on one
    activation law. Rows: {"kind": "rows" | "damp", "R", "damp", "seed", "gain_in", "gain_out"}."""
    out = []
    for seed in seeds:
        g = torch.Generator().manual_seed(int(seed) + 12345)
        w = torch.randn(N, K, generator=g) * 0.02
        x = synthetic_activations(max(rows_list) + R_eval, K, skew=skew, shared=shared, generator=g)
        He = hessian(x[-R_eval:])
        for R in rows_list:
            gi, go = gain(packer_errors(w, hessian(x[:R]), He))
            out.append({"kind": "rows", "R": R, "damp": 0.01, "seed": int(seed), "gain_in": gi, "gain_out": go})
        Hc = hessian(x[:min(rows_list)])
        for damp in damps:
            packers = {"rtn": PACKERS["rtn"], "gptq": lambda w_, H_, d=damp: gptq_pack_int4_b32(w_, H_, damp=d)}
            gi, go = gain(packer_errors(w, Hc, He, packers=packers))
            out.append({"kind": "damp", "R": min(rows_list), "damp": damp, "seed": int(seed), "gain_in": gi,
                        "gain_out": go})
    return out


def layer_map(model, calib_batches, eval_batches, layers=None, methods=tuple(PACKERS), min_rows: int = 64,
              skipped: list | None = None) -> list[dict]:
    """`calib.layer_error_table`'s rows (so `calib.summarise` reads them), plus where each weight sits on the map
    and its in-sample ratios: extra keys "erank", "skew", "in:<method>/rtn". Hessians from `calib.paired_hessians`
    (which appends the weights it skips to `skipped`, if given)."""
    table = []
    for name, w, Hc, He, rows in paired_hessians(model, calib_batches, eval_batches, layers, min_rows, skipped):
        res = packer_errors(w, Hc, He, methods)
        row = {"name": name, "N": w.shape[0], "K": w.shape[1], "rows": rows,
               "erank": effective_rank_frac(Hc), "skew": channel_skew(Hc)}
        for m in methods:
            row[m] = res[m]["out"]
            row[f"{m}/rtn"] = res[m]["out"] / res["rtn"]["out"]
            row[f"in:{m}/rtn"] = res[m]["in"] / res["rtn"]["in"]
        table.append(row)
    return table


def obs_update(Hinv: torch.Tensor, k: int, err: torch.Tensor) -> torch.Tensor:
    """Optimal-brain-surgeon step: fixing weight k of each row with error err [N] (= w_k - q_k) is best
    compensated by δ = -err / Hinv_kk · Hinv[k, :] on the row (δ_k = -err). Returns δ [N, K]."""
    return -(err / Hinv[k, k]).unsqueeze(1) * Hinv[k].unsqueeze(0)


def source_lines(func, needles) -> list[tuple[int, str]]:
    """(line number in its file, line) of each line of `func`'s source holding one of `needles`, in order."""
    lines, start = inspect.getsourcelines(func)
    return [(start + i, ln.rstrip()) for i, ln in enumerate(lines) if any(n in ln for n in needles)]
