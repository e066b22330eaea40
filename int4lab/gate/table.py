"""The gate's tables: one row per (arm, text) for the CLI, one row per (model, arm) for the README."""
from __future__ import annotations

import json
from pathlib import Path


def _pct(c: dict) -> str:
    return f"{c['value']:+.2%} [{c['lo']:+.2%}, {c['hi']:+.2%}]"


def fallback_note(arm: dict) -> str:
    """" (GPTQ→RTN fallback: n of m experts)" for a GPTQ arm some of whose experts had too few calibration rows
    and were packed round-to-nearest (its quant_report's `fallback`); "" otherwise. Shown beside the verdict:
    the verdict judges that mix, not GPTQ alone."""
    q = arm.get("quant_report") or {}
    fb = q.get("fallback") or []
    if arm.get("kind") != "gptq" or not fb:
        return ""
    return f" (GPTQ→RTN fallback: {len(fb)} of {len(fb) + int(q.get('gptq_experts') or 0)} experts)"


def rows(payload: dict) -> list[dict]:
    """One dict per (arm, text) of a gate payload/receipt: the source and the floor first, then every arm."""
    out = []
    for t, info in payload["texts"].items():
        out.append({"arm": "source", "text": t, "tokens": info["tokens"], "ppl": info["source_ppl"], "delta": None,
                    "kl": None, "top1": None, "verdict": ""})
    for t, c in payload.get("floor", {}).get("texts", {}).items():
        out.append({"arm": f"source {payload['floor']['dtype']} (floor)", "text": t, "tokens": c["tokens"],
                    "ppl": c["ppl"], "delta": c["rel"], "kl": c["kl"], "top1": c["top1"]["value"],
                    "verdict": "reported only"})
    for name, a in payload["arms"].items():
        for t, c in a["texts"].items():
            out.append({"arm": name, "text": t, "tokens": c["tokens"], "ppl": c["ppl"], "delta": c["rel"],
                        "kl": c["kl"], "top1": c["top1"]["value"],
                        "verdict": a["verdict"]["verdict"] + fallback_note(a)})
    return out


def _kl(c: dict) -> str:
    return f"{c['value']:.2e} [{c['lo']:.2e}, {c['hi']:.2e}]"


def format_table(payload: dict) -> str:
    """The CLI's table: arm, text, tokens, ppl, Δ% [95% CI], KL [95% CI], top-1, verdict (plain text, aligned);
    then the rounding band of each lottery and each GPTQ draw's paired change against round-to-nearest."""
    head = ["arm", "text", "tokens", "ppl", "Δ% [95% CI]", "KL [95% CI]", "top-1", "verdict"]
    body = [[r["arm"], r["text"], str(r["tokens"]), f"{r['ppl']:.3f}", "" if r["delta"] is None else _pct(r["delta"]),
             "" if r["kl"] is None else _kl(r["kl"]), "" if r["top1"] is None else f"{r['top1']:.2%}",
             r["verdict"]] for r in rows(payload)]
    w = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w[i]) for i, c in enumerate(x)).rstrip() for x in [head] + body]
    lines.insert(1, "  ".join("-" * n for n in w))
    extra = [f"budget {payload['budget']:.2%}; window {payload['settings']['window']} tokens; paired bootstrap over "
             f"documents, {payload['settings']['n_boot']} resamples, seed {payload['settings']['seed']}"]
    for base, lot in payload.get("lottery", {}).items():
        extra.append(f"lottery of {base} ({len(lot['tickets'])} dithered re-packs), ticket - RTN per text: " + "; ".join(
            f"{t} " + ", ".join(f"{x:+.3%}" for x in v["values"])
            + (f" (band {v['band']['lo']:+.3%} .. {v['band']['hi']:+.3%})" if "band" in v else "")
            for t, v in lot["texts"].items()))
    for sname, cal in payload.get("calibration", {}).items():
        extra.append(f"calibration {sname} over {len(cal['draws'])} draws: {cal['judgement']['verdict']}")
        for name, g in zip(cal["draws"], cal["gains"]):
            if g:
                extra.append(f"  {name} - {cal['twin']}: " + "; ".join(f"{t} {_pct(c)}" for t, c in g.items()))
    return "\n".join(lines + [""] + extra)


def render_gate_table(receipts_dir) -> str:
    """Markdown table of the gate results (gate_*.json) in a folder: one row per (model, arm) with Δ% [CI] per
    text, the verdict (PASS / FAIL / UNDECIDED) with KL [CI] per text beside it, the calibration judgement, and, per
    model, the rounding band (ticket - RTN) and each GPTQ draw's paired change against round-to-nearest."""
    paths = sorted(Path(receipts_dir).glob("gate_*.json"))
    if not paths:
        raise FileNotFoundError(f"no gate_*.json receipts in {receipts_dir}: run `python -m int4lab.gate`")
    rs = [json.loads(p.read_text()) for p in paths]
    for p, r in zip(paths, rs):
        if r.get("settings", {}).get("scored") != "every arm on every document":
            raise ValueError(f"{p.name} scored some arms on a subset of documents (an older gate): regenerate it "
                             f"with `{r.get('provenance', {}).get('command') or 'python -m int4lab.gate'}` "
                             "without --subset-stride")
    texts = list(dict.fromkeys(t for r in rs for t in r["texts"]))
    head = (["model", "arm"] + [f"Δ ppl {t} [95% CI]" for t in texts] + ["verdict"]
            + [f"KL {t} [95% CI]" for t in texts] + ["calibration", "receipt"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p, r in zip(paths, rs):
        cal = {s: c["judgement"]["verdict"] for s, c in r.get("calibration", {}).items()}
        lines.append("| " + " | ".join([r["model"], "source ppl"] + [f"{r['texts'][t]['source_ppl']:.2f} "
                     f"({r['texts'][t]['tokens']} tokens)" if t in r["texts"] else "–" for t in texts]
                     + [""] * (1 + len(texts)) + ["", f"`{p.name}`"]) + " |")
        for name, a in r["arms"].items():
            judged = cal.get(name.split(" ")[0], "–") if a["kind"] == "gptq" else "–"
            cells = [_pct(a["texts"][t]["rel"]) if t in a["texts"] else "–" for t in texts]
            kls = [_kl(a["texts"][t]["kl"]) if t in a["texts"] else "–" for t in texts]
            verdict = a["verdict"]["verdict"] + fallback_note(a)
            lines.append("| " + " | ".join([r["model"], name] + cells + [verdict] + kls
                                          + [judged, f"`{p.name}`"]) + " |")
        blank = [""] * (1 + len(texts))
        for base, lot in r.get("lottery", {}).items():
            lines.append("| " + " | ".join(
                [r["model"], f"rounding band of {base}: ticket − RTN, {len(lot['tickets'])} tickets"]
                + [(f"{lot['texts'][t]['band']['lo']:+.2%} .. {lot['texts'][t]['band']['hi']:+.2%}"
                    if "band" in lot["texts"][t] else ", ".join(f"{x:+.2%}" for x in lot["texts"][t]["values"]))
                   if t in lot["texts"] else "–" for t in texts] + blank + ["", f"`{p.name}`"]) + " |")
        for sname, c in r.get("calibration", {}).items():
            for name, g in zip(c["draws"], c["gains"]):
                if g:
                    lines.append("| " + " | ".join([r["model"], f"{name} − {c['twin']} (paired)"]
                                                  + [_pct(g[t]) if t in g else "–" for t in texts] + blank
                                                  + [c["judgement"]["verdict"], f"`{p.name}`"]) + " |")
    return "\n".join(lines)
