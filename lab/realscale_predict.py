"""The README gate's time at its defaults from a run with fewer documents and arms (`lab.realscale_gate`).

A depth measured with quick settings (the first --max-docs documents per text, fewer lottery tickets or GPTQ
draws, no precision floor) is taken to the README command's defaults part by part, each part at its measured
unit cost (`default_seconds`):

    build   per arm kind: (measured build seconds of that kind / its arms) x the kind's arms at the defaults
    score   measured scoring seconds / (model passes x scored tokens) x default passes x the texts' tokens,
            passes = arms + one source pass per group; groups at the defaults = ceil(arms / the largest
            measured group)
    floor   measured floor seconds x (all tokens / scored tokens); not measured: 2 passes over every 16th
            document at the measured per-pass, per-token cost (the gate's --floor-stride 16). That estimate is
            the scoring alone at the arms' cost: it leaves out the floor's copy of the source in the other
            precision (float32 beside a bf16 source, twice its bytes), loaded and scored beside the source, and
            the full-depth receipts that measured a floor took many times it for their own runs
            (`lab.report.realscale_fit.measured_floors`; the pages print the ratio)
    boot    measured bootstrap seconds x (default arms / measured arms) x (all documents / scored documents)
    fixed   source load and parity, as measured

GPTQ's share (`gptq_share`): the column sweeps of every GPTQ arm (the quantise report's experts_pack_s and
attn_pack_s, summed over layers) per draw, times the default draws, and the calibration forwards likewise.
Every figure is written beside its formula in the receipt.
"""
from __future__ import annotations

import functools
import math

README_DEFAULT_KINDS = ("rtn", "lottery", "gptq")


def default_arms(readme_flags) -> dict:
    """{kind: arms} the README command makes at the gate's defaults (its parser's lottery and calib_draws)."""
    from int4lab.gate.arms import plan_arms
    from int4lab.gate.cli import parser
    a = parser().parse_args(["--model", "x", *readme_flags])
    arms = plan_arms(a.scheme, a.targets, a.act, a.lottery, a.calib_draws, a.dither)
    return {k: sum(x.kind == k for x in arms) for k in README_DEFAULT_KINDS}


@functools.lru_cache(maxsize=None)
def full_text_size(window: int) -> dict:
    """{"tokens", "docs"} of every default text whole at `window`, with the repository's tokenizer (the
    synthetic checkpoints' own)."""
    from int4lab.gate.texts import TEXTS, Windows, documents
    from int4lab.models import load_tokenizer
    tok = load_tokenizer()
    wins = [Windows(tok, documents(t), window) for t in TEXTS]
    return {"tokens": sum(w.tokens for w in wins), "docs": sum(w.docs for w in wins)}


def default_seconds(g: dict, full: dict, arms: dict) -> dict:
    """The gate's seconds at the defaults from one depth's summary g (`realscale_gate.summarise`); full:
    `full_text_size`; arms: `default_arms`. Returns the parts, their formulas and "total"."""
    tm, kinds, n_kind = g["timing"], g["build_s_by_kind"], g["arms_by_kind"]
    tokens = sum(t["tokens"] for t in g["texts"].values())
    docs = sum(t["docs"] for t in g["texts"].values())
    passes = sum(n + 1 for n in g["groups"])
    n_def = sum(arms.values())
    groups_def = math.ceil(n_def / max(g["groups"]))
    passes_def = n_def + groups_def
    out, why = {}, {}
    build = 0.0
    for k, n in arms.items():
        if n and not n_kind.get(k):
            raise ValueError(f"arms of kind {k!r} were not measured: run at least one (--lottery 1, --calib-draws 1)")
        per = kinds.get(k, 0.0) / n_kind[k] if n else 0.0
        build += per * n
        why[f"build_{k}"] = f"{kinds.get(k, 0.0):.4g} s / {n_kind.get(k, 0)} x {n}"
    out["build_s"] = build
    unit = tm["score_s"] / (passes * tokens)
    out["score_s"] = unit * passes_def * full["tokens"]
    why["score_s"] = (f"{tm['score_s']:.4g} s / ({passes} passes x {tokens} tokens) x {passes_def} passes "
                      f"({n_def} arms, {groups_def} groups) x {full['tokens']} tokens")
    if tm.get("floor_s"):
        out["floor_s"] = tm["floor_s"] * full["tokens"] / tokens
        why["floor_s"] = f"{tm['floor_s']:.4g} s x {full['tokens']} / {tokens} tokens"
    else:
        out["floor_s"] = unit * 2 * full["tokens"] / 16
        why["floor_s"] = f"estimated: {unit:.4g} s per pass-token x 2 passes x {full['tokens']} / 16 tokens"
    out["bootstrap_s"] = tm["bootstrap_s"] * n_def / g["arms"] * full["docs"] / docs
    why["bootstrap_s"] = f"{tm['bootstrap_s']:.4g} s x {n_def} / {g['arms']} arms x {full['docs']} / {docs} docs"
    out["fixed_s"] = tm["load_source_s"] + tm.get("parity_s", 0.0)
    out["total"] = sum(out.values())
    out["formulas"] = why
    return out


def gptq_share(g: dict, arms: dict) -> dict:
    """GPTQ's seconds at the defaults from one depth: the sweeps (packing) and the calibration forwards,
    per measured draw, times the default GPTQ arms."""
    n = g["arms_by_kind"].get("gptq", 0)
    if not n:
        return {}
    sweep, fw = g["gptq_sweep_s"] / n * arms["gptq"], g["gptq_forward_s"] / n * arms["gptq"]
    return {"sweep_s": sweep, "calibration_forward_s": fw, "arms": arms["gptq"],
            "formula": f"({g['gptq_sweep_s']:.4g} s sweeps, {g['gptq_forward_s']:.4g} s forwards) / {n} measured "
                       f"GPTQ arms x {arms['gptq']}"}


def earlier_fit(path, arch: str) -> dict | None:
    """An earlier fit's full-depth prediction for arch, read by field from its receipt (path None: the
    committed data/receipts/realscale_gate_<arch>_h100.json); None where the receipt or the fields are absent."""
    import json
    from pathlib import Path

    from lab.paths import RECEIPTS
    p = Path(path) if path else RECEIPTS / f"realscale_gate_{arch}_h100.json"
    try:
        r = json.loads(p.read_text())
        e = r["archs"][arch]["extrapolation"]
        fits = e["fits"]
    except (OSError, ValueError, KeyError):
        return None
    full = lambda k: (fits.get(k) or {}).get("full_depth")               # noqa: E731
    return {"receipt": p.name, "commit": r.get("provenance", {}).get("commit"),
            "depths": sorted(int(L) for L in fits["gate_s"]["points"]), "gate_s": e.get("gate_s_full_depth"),
            "gpu_peak_bytes": (e.get("memory") or {}).get("peak_bytes") or full("gpu_peak_bytes"),
            "host_peak_bytes": full("host_peak_bytes"), "build_s": full("build_s"), "score_s": full("score_s"),
            "gate_over_forwards": (e.get("gate_over_forwards") or {}).get("value"),
            "arms": r["archs"][arch]["depths"][str(max(int(L) for L in fits["gate_s"]["points"]))]["gate"]["arms"]}
