"""The gate's tables: one row per (arm, text) for the CLI, one row per (model, arm) for the README."""
from __future__ import annotations

from pathlib import Path


def _pct(c: dict) -> str:
    return f"{c['value']:+.2%} [{c['lo']:+.2%}, {c['hi']:+.2%}]"


def rows(payload: dict) -> list[dict]:
    """One dict per (arm, text) of a gate payload/receipt: the source and the floor first, then every arm."""
    out = []
    for t, info in payload["texts"].items():
        out.append({"arm": "source", "text": t, "tokens": info["tokens"], "ppl": info["source_ppl"], "delta": None,
                    "kl": None, "top1": None, "verdict": ""})
    for t, c in payload.get("floor", {}).get("texts", {}).items():
        out.append({"arm": f"source {payload['floor']['dtype']} (floor)", "text": t, "tokens": c["tokens"],
                    "ppl": c["ppl"], "delta": c["rel"], "kl": c["kl"]["value"], "top1": c["top1"]["value"],
                    "verdict": "reported only"})
    for name, a in payload["arms"].items():
        for t, c in a["texts"].items():
            out.append({"arm": name, "text": t, "tokens": c["tokens"], "ppl": c["ppl"], "delta": c["rel"],
                        "kl": c["kl"]["value"], "top1": c["top1"]["value"], "verdict": a["verdict"]["verdict"]})
    return out


def format_table(payload: dict) -> str:
    """The CLI's table: arm, text, tokens, ppl, Δ% [95% CI], KL, top-1, verdict (plain text, aligned)."""
    head = ["arm", "text", "tokens", "ppl", "Δ% [95% CI]", "KL", "top-1", "verdict"]
    body = [[r["arm"], r["text"], str(r["tokens"]), f"{r['ppl']:.3f}", "" if r["delta"] is None else _pct(r["delta"]),
             "" if r["kl"] is None else f"{r['kl']:.2e}", "" if r["top1"] is None else f"{r['top1']:.2%}",
             r["verdict"]] for r in rows(payload)]
    w = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w[i]) for i, c in enumerate(x)).rstrip() for x in [head] + body]
    lines.insert(1, "  ".join("-" * n for n in w))
    extra = [f"budget {payload['budget']:.2%}; window {payload['settings']['window']} tokens; paired bootstrap over "
             f"documents, {payload['settings']['n_boot']} resamples, seed {payload['settings']['seed']}"]
    for base, lot in payload.get("lottery", {}).items():
        extra.append(f"lottery of {base} ({len(lot['draws'])} dithered re-packs): spread " + ", ".join(
            f"{t} {v['spread']:.3%}" for t, v in lot["texts"].items()))
    for sname, cal in payload.get("calibration", {}).items():
        extra.append(f"calibration {sname} over {len(cal['draws'])} draws: {cal['judgement']['verdict']}")
    return "\n".join(lines + [""] + extra)


def render_gate_table(receipts_dir) -> str:
    """README table from data/receipts/gate_*.json: one row per (model, arm) with Δ% [CI] per text, the
    verdict (PASS / FAIL / UNDECIDED), and, per model, the lottery spread and the calibration judgement."""
    from ..receipts import read_receipt
    paths = sorted(Path(receipts_dir).glob("gate_*.json"))
    if not paths:
        raise FileNotFoundError(f"no gate_*.json receipts in {receipts_dir}: run `python -m int4lab.gate`")
    rs = [read_receipt(p) for p in paths]
    texts = list(dict.fromkeys(t for r in rs for t in r["texts"]))
    head = ["model", "arm"] + [f"Δ ppl {t} [95% CI]" for t in texts] + ["verdict", "calibration", "receipt"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p, r in zip(paths, rs):
        cal = {s: c["judgement"]["verdict"] for s, c in r.get("calibration", {}).items()}
        lines.append("| " + " | ".join([r["model"], "source ppl"] + [f"{r['texts'][t]['source_ppl']:.2f} "
                     f"({r['texts'][t]['tokens']} tokens)" if t in r["texts"] else "–" for t in texts]
                     + ["", "", f"`{p.name}`"]) + " |")
        for name, a in r["arms"].items():
            judged = cal.get(name.split(" ")[0], "–") if a["kind"] == "gptq" else "–"
            cells = [_pct(a["texts"][t]["rel"]) if t in a["texts"] else "–" for t in texts]
            shown = name if a["scored"] == "every document" else f"{name} ({a['scored']})"
            lines.append("| " + " | ".join([r["model"], shown] + cells + [a["verdict"]["verdict"], judged,
                                                                        f"`{p.name}`"]) + " |")
        for base, lot in r.get("lottery", {}).items():
            lines.append("| " + " | ".join([r["model"], f"lottery spread of {base} ({len(lot['draws'])} draws)"]
                                          + [f"{lot['texts'][t]['spread']:.2%}" if t in lot["texts"] else "–"
                                             for t in texts] + ["", "", f"`{p.name}`"]) + " |")
    return "\n".join(lines)
