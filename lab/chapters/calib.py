"""Calibration for notebook 02: synthetic activation regimes, per-layer Hessians of a MoE model, and the
output error of each packer measured through H.

Shape legend: E = experts, N = out features, K = in features, R = activation rows, I = expert width.

The measure used throughout: for activations X [R, K] with H = 2/R · XᵀX,

    mean((X (Ŵ - W)ᵀ)²)  =  tr((Ŵ - W) H (Ŵ - W)ᵀ) / (2N)          (`output_mse` == `h_objective`),

so a Hessian collected on held-out text measures every packer's output error without keeping X.
The production calibration driver lives in `int4lab.quantize`, and both collect Hessians through its one
hook (`int4lab.quantize.hessian_hooks`); this module stays small and notebook-facing.
"""
from __future__ import annotations

import math

import torch

from int4lab.format import BLOCK, dequant_int4_ref, pack_int4_b32
from int4lab.clip import rtn_clip_pack_int4_b32
from int4lab.gptq import gptq_pack_int4_b32
from int4lab.quantize.hessian import StopForward, hessian_hooks, stop_after
from int4lab.quantize.layout import attention, decoder_layers, experts_of, model_arch

# name -> packer(w [N, K], H [K, K]) -> (packed, scales); all emit int4-b32 bytes
PACKERS = {
    "rtn": lambda w, H: pack_int4_b32(w),
    "rtn_clip": lambda w, H: rtn_clip_pack_int4_b32(w, hessian=H),
    "gptq": lambda w, H: gptq_pack_int4_b32(w, H),
    "gptq_act_order": lambda w, H: gptq_pack_int4_b32(w, H, act_order=True),
}


def synthetic_activations(R: int, K: int, skew: float = 1.0, rank: int = 16, shared: float = 1.0,
                          noise: float = 0.3, outliers: int = 0, outlier_scale: float = 20.0,
                          generator=None) -> torch.Tensor:
    """float32 [R, K] activations with the structure that makes calibration matter.

    x = (shared · g B / √rank + noise · z) ⊙ c: a rank-`rank` shared component (LLM activations are strongly
    correlated across channels; shared = 0 makes them independent and H diagonal) plus isotropic noise,
    times per-channel scales c_k = exp(skew · n_k), n_k ~ N(0, 1) (skew = 0: equal channels).
    `outliers` channels (chosen at random) are multiplied by `outlier_scale`.
    g, B, z, n ~ N(0, 1) drawn from `generator`; R rows from one call share B and c.
    """
    if R <= 0 or K <= 0 or rank <= 0:
        raise ValueError(f"R, K and rank must be positive, got R={R}, K={K}, rank={rank}")
    if skew < 0 or shared < 0 or noise < 0 or not 0 <= outliers <= K:
        raise ValueError(f"need skew, shared, noise >= 0 and 0 <= outliers <= K, "
                         f"got {skew}, {shared}, {noise}, {outliers}")
    g = torch.randn(R, rank, generator=generator)
    B = torch.randn(rank, K, generator=generator)
    z = torch.randn(R, K, generator=generator)
    c = torch.exp(skew * torch.randn(K, generator=generator))
    if outliers:
        c[torch.randperm(K, generator=generator)[:outliers]] *= outlier_scale
    return (shared * (g @ B) / math.sqrt(rank) + noise * z) * c


def output_mse(x: torch.Tensor, w: torch.Tensor, wq: torch.Tensor) -> float:
    """mean((x (wq - w)ᵀ)²) over R rows and N outputs, in float64; x [R, K], w and wq [N, K]."""
    return float(((x.double() @ (wq.double() - w.double()).t()) ** 2).mean())


def h_objective(w: torch.Tensor, wq: torch.Tensor, H: torch.Tensor) -> float:
    """tr((wq - w) H (wq - w)ᵀ) / (2N) in float64: `output_mse` on the rows that built H."""
    dW = wq.double() - w.double()
    return float(((dW @ H.double()) * dW).sum() / (2 * dW.shape[0]))


def h_objective_split(w: torch.Tensor, wq: torch.Tensor, H: torch.Tensor) -> tuple[float, float]:
    """`h_objective` split into its diagonal part Σ_k H_kk ‖ΔW_:,k‖² / 2N and the cross-channel rest.

    Round-to-nearest errors are nearly independent across channels, so RTN's cross term is near zero;
    GPTQ makes it negative: errors of correlated channels are chosen to cancel in the output.
    """
    dW = wq.double() - w.double()
    Hd = H.double()
    diag = float((dW * dW * Hd.diagonal()).sum() / (2 * dW.shape[0]))
    return diag, h_objective(w, wq, H) - diag


def compare_packers(w: torch.Tensor, H_calib: torch.Tensor, H_eval: torch.Tensor, methods=tuple(PACKERS)) -> dict:
    """Output MSE (via `h_objective` on H_eval) and weight MSE of each packer; w [N, K], H_* [K, K].

    Packers see H_calib only; measuring on H_eval (other rows) keeps GPTQ from being graded on its own data.
    """
    N, K = w.shape
    out = {}
    for m in methods:
        wq = dequant_int4_ref(*PACKERS[m](w, H_calib), N, K)
        out[m] = {"output_mse": h_objective(w, wq, H_eval),
                  "weight_mse": float(((wq.double() - w.double()) ** 2).mean())}
    return out


# ---- Hessians of a transformers MoE model (Mixtral / OLMoE / Qwen3-MoE, transformers 5 fused experts) ----

def collect_hessians(model, batches, layers=None, device="cpu") -> dict:
    """Run `model` on `batches` (iterable of input_ids [B, T]) and accumulate a Hessian per weight.

    Keys: "layers.{l}.self_attn.{q,k,v,o}_proj" (input of the projection) and
    "layers.{l}.experts.{e}.gate_up" / ".down": expert e's gate_up input is the hidden rows the router sent
    to e (top-k ids from the experts module's call), its down input is act(gate) ⊙ up of those rows.
    `layers`: decoder layer indices to hook (default all). Values: HessianAccumulator on `device`.
    The hook is `int4lab.quantize.hessian_hooks`, the one GPTQ calibration uses.
    """
    last = len(decoder_layers(model)) - 1 if layers is None else max(layers)
    with hessian_hooks(model, layers, device=device) as accs, stop_after(model, last), torch.no_grad():
        for ids in batches:
            try:
                model(input_ids=ids, use_cache=False)
            except StopForward:                  # the hooked layers have run; the rest adds nothing
                pass
    return dict(accs)


def model_weight(model, name: str) -> torch.Tensor:
    """The [N, K] weight a `collect_hessians` key refers to (expert gate_up is [2I, H], down [H, I])."""
    arch = model_arch(model)
    parts = name.split(".")
    layer = decoder_layers(model)[int(parts[1])]
    if parts[2] == "self_attn":
        return getattr(attention(layer, arch), parts[3]).weight
    experts = experts_of(layer, arch)
    e = int(parts[3])
    return experts.gate_up_proj[e] if parts[4] == "gate_up" else experts.down_proj[e]


def paired_hessians(model, calib_batches, eval_batches, layers=None, min_rows: int = 64, skipped: list | None = None):
    """Yield (name, w [N, K] float32, H_calib, H_eval, calibration rows) for every weight of `model` that has
    at least `min_rows` calibration and evaluation rows and K a multiple of 32 (rarely routed experts skip).
    If `skipped` is a list, (name, calibration rows, evaluation rows) of each skipped weight is appended to it
    (an expert routed no calibration row has no Hessian, so it is neither yielded nor listed)."""
    calib = collect_hessians(model, calib_batches, layers)
    evals = collect_hessians(model, eval_batches, layers)
    for name, a in calib.items():
        b = evals.get(name)
        if b is None or a.nsamples < min_rows or b.nsamples < min_rows or a.in_features % BLOCK:
            if skipped is not None:
                skipped.append((name, a.nsamples, 0 if b is None else b.nsamples))
            continue
        yield name, model_weight(model, name).detach().float().cpu(), a.H.cpu(), b.H.cpu(), a.nsamples


def layer_error_table(model, calib_batches, eval_batches, layers=None, methods=tuple(PACKERS),
                      min_rows: int = 64) -> list[dict]:
    """One row per weight of `model`: output MSE of every packer on held-out rows, relative to RTN.

    Hessians from `calib_batches` feed the packers, Hessians from `eval_batches` measure them
    (`paired_hessians` says which weights are skipped).
    Row: {"name", "N", "K", "rows", "<method>": output MSE, "<method>/rtn": ratio}.
    """
    table = []
    for name, w, Hc, He, rows in paired_hessians(model, calib_batches, eval_batches, layers, min_rows):
        res = compare_packers(w, Hc, He, methods)
        row = {"name": name, "N": w.shape[0], "K": w.shape[1], "rows": rows}
        for m in methods:
            row[m] = res[m]["output_mse"]
            row[f"{m}/rtn"] = res[m]["output_mse"] / res["rtn"]["output_mse"] if "rtn" in res else float("nan")
        table.append(row)
    return table


def weight_kind(name: str) -> str:
    """"attention", "expert gate_up" or "expert down" for a `collect_hessians` key."""
    if ".self_attn." in name:
        return "attention"
    return "expert " + name.rsplit(".", 1)[1]


def summarise(table: list[dict], methods=tuple(PACKERS)) -> list[dict]:
    """Per weight kind: how many weights, the median output-MSE ratio to RTN of each method, and the
    fraction of weights where each method beats RTN. Medians of an even count are the mean of the two middle
    values (torch's `median` would return the lower one)."""
    out = []
    for kind in sorted({weight_kind(r["name"]) for r in table}):
        rows = [r for r in table if weight_kind(r["name"]) == kind]
        s = {"kind": kind, "weights": len(rows)}
        for m in methods:
            ratios = torch.tensor([r[f"{m}/rtn"] for r in rows], dtype=torch.float64)
            s[f"{m}/rtn median"] = float(ratios.quantile(0.5))
            s[f"{m} beats rtn"] = float((ratios < 1).double().mean())
        out.append(s)
    return out


def token_batches(tok, text: str, seq_len: int, n_seqs: int) -> torch.Tensor:
    """int64 [n_seqs, seq_len]: the first seq_len · n_seqs tokens of `text`, as consecutive windows.

    Encodes a growing prefix of the text, not all of it: a calibration set is a few thousand tokens.
    """
    need = seq_len * n_seqs
    chars = 8 * need
    while True:
        # verbose=False: the length warning is about model inputs; these ids are cut into windows below
        ids = tok(text[:chars], add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) > need + 64 or chars >= len(text):      # margin: the prefix cut may split a word
            break
        chars *= 2
    if len(ids) < need:
        raise ValueError(f"text has {len(ids)} tokens, need seq_len * n_seqs = {need}")
    return torch.tensor(ids[:need], dtype=torch.long).reshape(n_seqs, seq_len)


def calibration_ablation(model, calib_ids: torch.Tensor, eval_ids: torch.Tensor, sizes, damps=(0.01,),
                         layers=(0,), min_rows=None) -> list[dict]:
    """Held-out output error of GPTQ against round-to-nearest for each calibration size and damping.

    calib_ids int64 [B, T]: the first `size // T` sequences calibrate; eval_ids [B', T] (other text) measure,
    through `h_objective` on its Hessians. Experts with fewer than min_rows calibration rows (default: K of
    their widest input, as `quantize_model`) fall back to round-to-nearest (ratio 1). One row per
    (size, damp): {"tokens", "damp", "weights", "fallback", "min_rows_seen", "median gptq/rtn",
    "gate_up median", "down median", "gptq beats rtn"} over the expert weights of `layers`: "median
    gptq/rtn" is the median over those projections (each expert's gate_up and down) of each one's held-out
    output-MSE ratio, fallbacks counted as 1, not the ratio of the layers' summed error; the two kind
    medians take one projection kind each. Medians of an even count are the mean of the two middle values
    (torch's `median` would return the lower one, and the ratios cluster by kind).
    """
    evals = collect_hessians(model, [eval_ids], layers)
    T = calib_ids.shape[1]
    out = []
    for size in sizes:
        cal = collect_hessians(model, [calib_ids[:max(size // T, 1)]], layers)
        for damp in damps:
            ratios, kinds, fallback, seen = [], [], 0, []
            for name, b in evals.items():
                if ".experts." not in name:
                    continue
                w = model_weight(model, name).detach().float().cpu()
                layer, e = name.split(".")[1], name.split(".")[3]
                rows = cal.get(f"layers.{layer}.experts.{e}.gate_up")
                n = 0 if rows is None else rows.nsamples
                gu = model_weight(model, f"layers.{layer}.experts.{e}.gate_up")
                need = min_rows or max(gu.shape[1], model_weight(model, f"layers.{layer}.experts.{e}.down").shape[1])
                seen.append(n)
                kinds.append(name.rsplit(".", 1)[1])
                rtn = h_objective(w, dequant_int4_ref(*pack_int4_b32(w), *w.shape), b.H)
                if n < need:
                    fallback += 1
                    ratios.append(1.0)
                    continue
                g = dequant_int4_ref(*gptq_pack_int4_b32(w, cal[name].H, damp=damp), *w.shape)
                ratios.append(h_objective(w, g, b.H) / rtn)
            r = torch.tensor(ratios, dtype=torch.float64)
            by_kind = {k: float(r[[i for i, x in enumerate(kinds) if x == k]].quantile(0.5))
                       for k in ("gate_up", "down")}
            out.append({"tokens": min(size, calib_ids.numel()), "damp": damp, "weights": len(ratios),
                        "fallback": fallback // 2, "min_rows_seen": min(seen),
                        "median gptq/rtn": float(r.quantile(0.5)), "gate_up median": by_kind["gate_up"],
                        "down median": by_kind["down"], "gptq beats rtn": float((r < 1).double().mean())})
    return out
