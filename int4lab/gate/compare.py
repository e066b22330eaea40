"""From per-token arrays to the gate's figures: every arm against the source on all, development and held-out
documents, tickets and GPTQ draws against their round-to-nearest twin, the rounding band, the calibration test
and the pack chosen on development documents.

Every arm scored every document, so each comparison is paired on the same tokens and the same bootstrap
resamples of documents (one seed per text): the variance the two arms share cancels, and a paired
difference's interval estimates the text-sampling noise of that difference over documents, treating documents as
independent (`stats`: too narrow where neighbouring documents are correlated).
"""
from __future__ import annotations

from . import stats
from .score import PerToken
from .split import SPLIT_RULE, SPLITS, choose, restrict
from .texts import IN_DOMAIN


def against(x: PerToken, ref: PerToken, n_boot: int, seed: int, kl: bool = True, p99: bool = True) -> dict:
    """stats.paired_ci of x against ref on the same tokens (kl, kl_p99 unless not p99, and top1 of x when kl),
    with x's ppl."""
    if x.nll.shape != ref.nll.shape or (x.doc != ref.doc).any():
        raise ValueError("x and ref must be scored on the same tokens of the same documents")
    ci = stats.paired_ci(x.nll, ref.nll, ref.doc, kl=x.kl if kl else None, top1=x.top1 if kl else None,
                         n_boot=n_boot, seed=seed, p99=p99)
    ci["ppl"] = x.ppl
    return ci


def assemble(arms, info: dict, per: dict, per_floor: dict, wins: dict, budget: float, n_boot: int,
             seed: int, parts: dict, split_seed: int) -> dict:
    """{"texts", "arms", "split", "lottery", "calibration", "choice"[, "floor"]} of the payload (see `run_gate`).

    per: {text: {"source" | arm name: PerToken}}; per_floor: {text: {"source", "floor": PerToken}} or {};
    parts: {text: `split.split_documents`}; info: {arm name: what the build recorded}, completed here with
    "texts" (all documents), "dev" and "held_out" ({text: CI}), "verdict" (on held-out documents) and "vs_twin".
    """
    texts = list(per)
    out_texts = {t: {"docs": w.docs, "windows": len(w), "tokens": w.tokens, "tokens_sha": w.sha,
                     "domain": "in" if t in IN_DOMAIN else "out", "source_ppl": per[t]["source"].ppl}
                 for t, w in wins.items()}
    sub = {s: {t: {n: restrict(p, parts[t][s]) for n, p in per[t].items()} for t in texts} for s in SPLITS}
    names = {a.name for a in arms}
    out_arms = {}
    for a in arms:
        d = info[a.name]
        d["texts"] = {t: against(per[t][a.name], per[t]["source"], n_boot, seed) for t in texts}
        for s in SPLITS:
            d[s] = {t: against(sub[s][t][a.name], sub[s][t]["source"], n_boot, seed, p99=False) for t in texts}
        d["verdict"] = stats.verdict(d["held_out"], budget)
        if a.kind != "rtn" and a.twin in names:
            # (arm - its round-to-nearest twin) on the same documents: what the change of packing did
            d["vs_twin"] = {t: against(per[t][a.name], per[t][a.twin], n_boot, seed, kl=False)["rel"]
                            for t in texts}
        out_arms[a.name] = d
    payload = {"texts": out_texts, "arms": out_arms,
               "split": {"rule": SPLIT_RULE, "seed": split_seed, "verdict_on": "held_out", "choice_on": "dev",
                         "texts": {t: {s: list(parts[t][s]) for s in SPLITS} for t in texts}}}
    if per_floor:
        payload["floor"] = {"note": "same weights in the other precision: arithmetic, not sampling; reported only",
                            "texts": {t: against(p["floor"], p["source"], n_boot, seed) for t, p in per_floor.items()}}
    payload["lottery"] = lottery(arms, out_arms, texts)
    payload["calibration"] = calibration(arms, out_arms, payload["lottery"])
    cand = {a.name: out_arms[a.name]["dev"] for a in arms if a.kind != "lottery"}
    ch = choose(cand)
    payload["choice"] = {**ch, "split": "dev", "held_out": out_arms[ch["chosen"]]["held_out"],
                         "verdict": out_arms[ch["chosen"]]["verdict"]}
    return payload


def lottery(arms, out_arms: dict, texts) -> dict:
    """Per round-to-nearest arm with tickets: each ticket's (ticket - RTN) paired change with its CI, per text,
    and the rounding band of those changes with its edges' CIs (`stats.rounding_band`) when there are enough."""
    out = {}
    for base in [a for a in arms if a.kind == "rtn"]:
        tickets = [a.name for a in arms if a.kind == "lottery" and a.twin == base.name]
        if not tickets:
            continue
        per_text = {}
        for t in texts:
            cis = [out_arms[n]["vs_twin"][t] for n in tickets]
            entry = {"cis": cis, "values": [c["value"] for c in cis]}
            if len(tickets) >= stats.MIN_BAND_TICKETS:
                entry["band"] = stats.rounding_band(entry["values"])
            per_text[t] = entry
        out[base.name] = {"tickets": tickets, "dither": out_arms[tickets[0]]["dither"], "texts": per_text}
    return out


def calibration(arms, out_arms: dict, lot: dict) -> dict:
    """Per calibrated scheme: each draw's (draw - RTN) paired CI per text ("gains"; negative = better) and
    the test of `stats.calibration_judgement` against the twin's lottery tickets, on all documents (it tests
    every draw and chooses none)."""
    out = {}
    for sname in dict.fromkeys(a.scheme.name for a in arms if a.kind == "gptq"):
        draws = [a for a in arms if a.kind == "gptq" and a.scheme.name == sname]
        twin = draws[0].twin
        entry = {"draws": [a.name for a in draws], "twin": twin,
                 "gains": [out_arms[a.name].get("vs_twin") for a in draws]}
        tickets = {t: v["values"] for t, v in lot.get(twin, {}).get("texts", {}).items()}
        n = min((len(v) for v in tickets.values()), default=0)
        if len(draws) >= stats.MIN_DRAWS and all(entry["gains"]) and n >= stats.MIN_TICKETS:
            entry["judgement"] = stats.calibration_judgement(entry["gains"], tickets)
        else:
            entry["judgement"] = {"verdict": "NOT JUDGED", "rule": stats.CALIBRATION_RULE, "reasons": [
                f"needs >= {stats.MIN_DRAWS} calibration draws (got {len(draws)}) and the round-to-nearest twin "
                f"with >= {stats.MIN_TICKETS} lottery tickets (got {n}): with fewer tickets their spread and "
                f"the rank p-value are too coarse for a {stats.ALPHA:.0%} test"]}
        out[sname] = entry
    return out
