"""The gate's tables: one row per (arm, text) for the CLI, one row per (model, arm) for the README; every verdict
shown is the one on held-out documents (`split.py`)."""
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
    """One dict per (arm, text) of a gate payload/receipt: the source and the floor first, then every arm with
    its figures on the held-out documents (where its verdict is read) and its all-document perplexity. The source
    row's tokens are all documents'; the floor row's figures are over its own subset (every floor_stride-th
    document of the whole text, both halves), not held-out, whatever the printed column headers say."""
    out = []
    for t, info in payload["texts"].items():
        out.append({"arm": "source", "text": t, "tokens": info["tokens"], "ppl": info["source_ppl"], "delta": None,
                    "kl": None, "top1": None, "verdict": ""})
    for t, c in payload.get("floor", {}).get("texts", {}).items():
        out.append({"arm": f"source {payload['floor']['dtype']} (floor)", "text": t, "tokens": c["tokens"],
                    "ppl": c["ppl"], "delta": c["rel"], "kl": c["kl"], "top1": c["top1"]["value"],
                    "verdict": "reported only"})
    for name, a in payload["arms"].items():
        for t, c in a["held_out"].items():
            out.append({"arm": name, "text": t, "tokens": c["tokens"], "ppl": a["texts"][t]["ppl"], "delta": c["rel"],
                        "kl": c["kl"], "top1": c["top1"]["value"],
                        "verdict": a["verdict"]["verdict"] + fallback_note(a)})
    return out


def _kl(c: dict) -> str:
    return f"{c['value']:.2e} [{c['lo']:.2e}, {c['hi']:.2e}]"


def _edge(v) -> str:
    return "beyond the tickets" if v is None else f"{v:+.3%}"


def band_text(b: dict) -> str:
    """'-0.413% .. +0.080% (lower edge 95% CI [beyond the tickets, -0.361%], upper [-0.142%, beyond the tickets])'."""
    return (f"{b['lo']:+.3%} .. {b['hi']:+.3%} (lower edge {b['level']:.0%} CI [{_edge(b['lo_ci'][0])}, "
            f"{_edge(b['lo_ci'][1])}], upper [{_edge(b['hi_ci'][0])}, {_edge(b['hi_ci'][1])}])")


def extra_lines(payload: dict) -> list[str]:
    """The lottery (each ticket - RTN, the band with its edges' CIs), each calibration test with its p-values,
    and the arm chosen on development documents with its held-out verdict."""
    extra = []
    for base, lot in payload.get("lottery", {}).items():
        extra.append(f"lottery of {base} ({len(lot['tickets'])} dithered re-packs), ticket - RTN per text, all documents:")
        for t, v in lot["texts"].items():
            extra.append(f"  {t} " + ", ".join(f"{x:+.3%}" for x in v["values"])
                         + (f"; band {band_text(v['band'])}" if "band" in v else ""))
    for sname, cal in payload.get("calibration", {}).items():
        j = cal["judgement"]
        extra.append(f"calibration {sname} over {len(cal['draws'])} draws: {j['verdict']}"
                     + (f" (alpha {j['alpha']}, against {j['tickets']} tickets)" if "alpha" in j else ""))
        for i, (name, g) in enumerate(zip(cal["draws"], cal["gains"])):
            if g:
                extra.append(f"  {name} - {cal['twin']}: " + "; ".join(
                    f"{t} {_pct(c)}" + (f" p_helps {j['texts'][t]['p_helps'][i]:.3g} p_hurts (Holm) "
                                        f"{j['texts'][t]['p_hurts_holm'][i]:.3g}" if "texts" in j else "")
                    for t, c in g.items()))
        if "texts" not in j:
            extra += [f"  {why}" for why in j["reasons"]]
    ch = payload.get("choice")
    if ch:
        extra.append(f"chosen on development documents: {ch['chosen']} (largest upper bound "
                     f"{ch['score'][ch['chosen']]:+.3%}); held-out verdict {ch['verdict']['verdict']}: "
                     + "; ".join(f"{t} {_pct(c['rel'])}" for t, c in ch["held_out"].items()))
    return extra


def format_table(payload: dict) -> str:
    """The CLI's table: arm, text, held-out tokens, ppl (all documents), Δ% [95% CI] and KL [95% CI] on the
    held-out documents, top-1, verdict (held-out; plain text, aligned); then `extra_lines`. The source row's
    tokens are all documents'. The precision-floor row ("source <dtype> (floor)") is printed under the same
    "held-out" headers, but its tokens, Δ%, KL and top-1 are over every floor_stride-th document of the whole text
    (both halves), not over the held-out documents."""
    head = ["arm", "text", "tokens", "ppl", "Δ% held-out [95% CI]", "KL held-out [95% CI]", "top-1", "verdict"]
    body = [[r["arm"], r["text"], str(r["tokens"]), f"{r['ppl']:.3f}", "" if r["delta"] is None else _pct(r["delta"]),
             "" if r["kl"] is None else _kl(r["kl"]), "" if r["top1"] is None else f"{r['top1']:.2%}",
             r["verdict"]] for r in rows(payload)]
    w = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w[i]) for i, c in enumerate(x)).rstrip() for x in [head] + body]
    lines.insert(1, "  ".join("-" * n for n in w))
    st = payload["settings"]
    extra = [f"budget {payload['budget']:.2%}; window {st['window']} tokens; paired bootstrap over documents, "
             f"{st['n_boot']} resamples, seed {st['seed']}; verdicts on held-out documents (split seed "
             f"{payload['split']['seed']}: " + ", ".join(f"{t} {len(v['dev'])} development / {len(v['held_out'])} "
                                                         f"held-out" for t, v in payload["split"]["texts"].items())
             + ")"]
    return "\n".join(lines + [""] + extra + extra_lines(payload))


def render_gate_table(receipts_dir) -> str:
    """Markdown table of the gate results (gate_*.json) in a folder: one row per (model, arm) with Δ% [CI] per
    text on the held-out documents, the verdict there (PASS / FAIL / UNDECIDED) with KL [CI] per text beside it, the
    calibration test's verdict; per model the rounding band (ticket - RTN, its edges' CIs), each GPTQ draw's
    paired change against round-to-nearest with its p-value, and the arm chosen on development documents."""
    paths = sorted(Path(receipts_dir).glob("gate_*.json"))
    if not paths:
        raise FileNotFoundError(f"no gate_*.json receipts in {receipts_dir}: run `python -m int4lab.gate`")
    rs = [json.loads(p.read_text()) for p in paths]
    for p, r in zip(paths, rs):
        cmd = r.get("provenance", {}).get("command") or "python -m int4lab.gate"
        if r.get("settings", {}).get("scored") != "every arm on every document":
            raise ValueError(f"{p.name} scored some arms on a subset of documents (an older gate): regenerate it "
                             f"with `{cmd}` without --subset-stride")
        if "split" not in r:
            raise ValueError(f"{p.name} has no development / held-out split (an older gate): regenerate it with "
                             f"`{cmd}`")
    texts = list(dict.fromkeys(t for r in rs for t in r["texts"]))
    head = (["model", "arm"] + [f"Δ ppl {t}, held-out [95% CI]" for t in texts] + ["verdict (held-out)"]
            + [f"KL {t}, held-out [95% CI]" for t in texts] + ["calibration", "receipt"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    row = lambda cells: lines.append("| " + " | ".join(cells) + " |")      # noqa: E731
    for p, r in zip(paths, rs):
        cal = {s: c["judgement"]["verdict"] for s, c in r.get("calibration", {}).items()}
        blank, rec = [""] * (1 + len(texts)), f"`{p.name}`"
        row([r["model"], "source ppl (all documents)"] + [f"{r['texts'][t]['source_ppl']:.2f} "
            f"({r['texts'][t]['tokens']} tokens)" if t in r["texts"] else "–" for t in texts] + blank + ["", rec])
        for name, a in r["arms"].items():
            judged = cal.get(name.split(" ")[0], "–") if a["kind"] == "gptq" else "–"
            cells = [_pct(a["held_out"][t]["rel"]) if t in a["held_out"] else "–" for t in texts]
            kls = [_kl(a["held_out"][t]["kl"]) if t in a["held_out"] else "–" for t in texts]
            row([r["model"], name] + cells + [a["verdict"]["verdict"] + fallback_note(a)] + kls + [judged, rec])
        for base, lot in r.get("lottery", {}).items():
            row([r["model"], f"rounding band of {base}: ticket − RTN, {len(lot['tickets'])} tickets, all documents"]
                + [(band_text(lot["texts"][t]["band"]) if "band" in lot["texts"][t]
                    else ", ".join(f"{x:+.2%}" for x in lot["texts"][t]["values"])) if t in lot["texts"] else "–"
                   for t in texts] + blank + ["", rec])
        for sname, c in r.get("calibration", {}).items():
            j = c["judgement"]
            for i, (name, g) in enumerate(zip(c["draws"], c["gains"])):
                if g:
                    row([r["model"], f"{name} − {c['twin']} (paired, all documents)"]
                        + [_pct(g[t]) + (f", p_helps {j['texts'][t]['p_helps'][i]:.2g}" if "texts" in j else "")
                           if t in g else "–" for t in texts] + blank + [j["verdict"], rec])
        ch = r["choice"]
        row([r["model"], f"chosen on development documents: {ch['chosen']}"]
            + [_pct(ch["held_out"][t]["rel"]) if t in ch["held_out"] else "–" for t in texts]
            + [ch["verdict"]["verdict"]] + [""] * len(texts) + ["", rec])
    return "\n".join(lines)
