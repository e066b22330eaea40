"""The decode-step receipt's summary: per (batch, context), each state against its floor and the best bf16."""
from __future__ import annotations

import torch

INT4_STATES = ("int4", "int4_fused", "int4_fused2")


def _cuda() -> bool:
    return torch.cuda.is_available()


def summarise(rec: dict) -> dict:
    """Per (batch, context): each state's best graphed layer against its floor, int4 against the best bf16 at
    the published depth, eager int4 against eager bf16 (the default experts implementation and the best).

    The eager fields take each state's eager row with the smallest extrapolated step (`bf16_eager_*` too);
    `*_eager_over_best_bf16_eager` divides by the smallest eager bf16 per layer and `*_eager_over_default_bf16_eager`
    by the default experts implementation's, none checking that the slope's sample range lies above zero: where an
    eager bf16 slope's samples allow zero or less, `bf16_eager_*` and `*_eager_over_best_bf16_eager` can come from
    that undecided slope (a negative or near-zero layer and ratios from it). Chapter 07 does not read them; its
    `eager_ratio` picks among decided slopes."""
    out = {}
    rows = [r for r in rec["rows"] if "per_layer_us" in r]
    for key in sorted({(r["batch"], r["context"]) for r in rows}):
        b, c = key
        here = [r for r in rows if (r["batch"], r["context"]) == key]
        s = {}

        def best(state, runs):
            rs = [r for r in here if r["state"] == state and r["run"] in runs]
            return min(rs, key=lambda r: r["full_step_us"]) if rs else None
        fast = ("graphed", "compiled") if _cuda() or any(r["run"] == "graphed" for r in here) else ("eager",)
        bf = best("bf16", fast)
        for state in INT4_STATES + ("bf16",):
            for run in ("graphed", "eager", "compiled"):
                r = best(state, (run,))
                if r:
                    s[f"{state}_{run}_per_layer_us"] = r["per_layer_us"]
                    s[f"{state}_{run}_tokens_per_s"] = r["tokens_per_s"]
            fl = rec["floors"].get(f"{'bf16' if state == 'bf16' else 'int4'} B{b} C{c}", {})
            g = best(state, ("graphed",))
            if fl.get("us") and g:
                s[f"{state}_floor_us"] = fl["us"]
                s[f"{state}_graphed_over_floor"] = g["per_layer_us"] / fl["us"]
            if bf and state != "bf16":
                q, qg = best(state, fast), best(state, ("graphed",))
                if q:
                    s[f"{state}_over_best_bf16_tokens_per_s"] = q["tokens_per_s"] / bf["tokens_per_s"]
                if qg:
                    s[f"{state}_graphed_over_best_bf16_tokens_per_s"] = qg["tokens_per_s"] / bf["tokens_per_s"]
        if bf:
            s["best_bf16"] = {"impl": bf["impl"], "run": bf["run"], "per_layer_us": bf["per_layer_us"],
                              "tokens_per_s": bf["tokens_per_s"]}
        be = [r for r in here if r["state"] == "bf16" and r["run"] == "eager"]
        dflt = [r for r in be if r["impl"] == rec.get("default_experts_impl")]
        for state in INT4_STATES:
            q = best(state, ("eager",))
            if q and be:
                s[f"{state}_eager_over_best_bf16_eager"] = q["per_layer_us"] / min(r["per_layer_us"] for r in be)
            if q and dflt:
                s[f"{state}_eager_over_default_bf16_eager"] = q["per_layer_us"] / dflt[0]["per_layer_us"]
        out[f"B{b} C{c}"] = s
    return out
