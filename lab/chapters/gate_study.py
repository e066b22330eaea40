"""Chapter 04: the gate receipts shaped for reading. Every arm against its source, the draws of one calibration
method side by side, the rounding band of the lottery tickets, and the calibration judgement derived again from
the intervals the receipt stores.

Nothing here measures. Every function reads gate receipts (data/receipts/gate_<model>.json, written by
`python -m int4lab.gate --model <model> --scheme rtn gptq --threads 1 --out data/receipts/gate_<model>.json`)
and reshapes or re-checks them. All figures are relative perplexity changes (ppl_a / ppl_b - 1), paired on the
same documents, with 95 % bootstrap intervals over documents (`int4lab.gate.stats`).

Receipt fields read: texts[t] {docs, tokens, tokens_sha, source_ppl}; arms[name] {kind, texts[t] {rel, kl, kl_p99,
top1: {value, lo, hi}, ppl, tokens}, verdict {verdict, below_source, tokens_needed}, vs_twin[t] {value, lo, hi}};
lottery[base] {tickets, texts[t] {cis, values, band {lo, hi, q}}}; calibration[scheme] {draws, twin, gains
[{t: {value, lo, hi}}], judgement {verdict, reasons, rule, texts}}.
"""
from __future__ import annotations

from int4lab.gate import calibration_judgement, rounding_band, verdict
from int4lab.gate.table import fallback_note
from lab.paths import RECEIPTS
from lab.provenance import read_receipt

RTN = "rtn/experts/W4A8"            # the round-to-nearest arm of the experts-only W4A8 scheme
GPTQ = "gptq/experts/W4A8"          # its calibrated scheme; arms "gptq/experts/W4A8 draw#s"
SCORED = "every arm on every document"


def load(archs) -> dict:
    """{arch: receipt} of data/receipts/gate_<arch>.json. ValueError for a receipt from a gate that scored some
    arms on a subset of documents (it names the command that regenerates it)."""
    out = {}
    for a in archs:
        r = read_receipt(RECEIPTS / f"gate_{a}.json")
        if r.get("settings", {}).get("scored") != SCORED:
            raise ValueError(f"data/receipts/gate_{a}.json scored some arms on a subset of documents (an older "
                             f"gate): regenerate it with `python -m int4lab.gate --model {a} --scheme rtn gptq "
                             f"--threads 1 --out data/receipts/gate_{a}.json`")
        out[a] = r
    return out


def field(receipts: dict, a: str, *keys):
    """receipts[a][k1][k2]...; a KeyError naming the receipt, the missing field and the regenerating command."""
    v = receipts[a]
    for i, k in enumerate(keys):
        if not isinstance(v, (dict, list)) or (isinstance(v, dict) and k not in v):
            raise KeyError(f"data/receipts/gate_{a}.json has no field {'/'.join(map(str, keys[:i + 1]))!r}: "
                           f"regenerate it with `{receipts[a]['provenance']['command']}` from a version of "
                           "int4lab.gate that writes it")
        v = v[k]
    return v


def pct(c: dict, digits: int = 2) -> str:
    """'+0.17% [+0.10%, +0.24%]' from {value, lo, hi}."""
    f = f"{{:+.{digits}%}}"
    return f"{f.format(c['value'])} [{f.format(c['lo'])}, {f.format(c['hi'])}]"


def kl(c: dict) -> str:
    return f"{c['value']:.4f} [{c['lo']:.4f}, {c['hi']:.4f}]"


def arm_rows(receipts: dict) -> list[dict]:
    """One row per (model, arm, text): the change against the source with its CI, KL with its CI, the verdict."""
    rows = []
    for a, r in receipts.items():
        for name, arm in r["arms"].items():
            for t, c in arm["texts"].items():
                rows.append({"model": a, "arm": name, "kind": arm["kind"], "text": t, "tokens": c["tokens"],
                             "docs": c["docs"], "ppl": c["ppl"], "Δ": c["rel"]["value"], "lo": c["rel"]["lo"],
                             "hi": c["rel"]["hi"], "half-width": (c["rel"]["hi"] - c["rel"]["lo"]) / 2,
                             "KL": c["kl"]["value"], "KL lo": c["kl"]["lo"], "KL hi": c["kl"]["hi"],
                             "KL p99": c["kl_p99"]["value"], "top-1": c["top1"]["value"],
                             "scored": arm["scored"], "verdict": arm["verdict"]["verdict"],
                             "tokens to decide": arm["verdict"]["tokens_needed"].get(t),
                             "Δ [95% CI]": pct(c["rel"]), "KL [95% CI]": kl(c["kl"])})
    return rows


def verdicts_rederived(receipts: dict) -> list[tuple[str, str]]:
    """(model, arm) whose stored verdict differs from `gate.verdict` applied again to its stored CIs (want [])."""
    return [(a, n) for a, r in receipts.items() for n, arm in r["arms"].items()
            if arm["verdict"] != verdict(arm["texts"], r["budget"])]


def below_source(receipts: dict) -> list[dict]:
    """Every (model, arm, text) whose Δ CI lies wholly below zero, with its KL, and the same arm on the other texts."""
    out = []
    for a, r in receipts.items():
        for name, arm in r["arms"].items():
            for t, c in arm["texts"].items():
                if c["rel"]["hi"] < 0:
                    out.append({"model": a, "arm": name, "text": t, "rel": c["rel"], "kl": c["kl"],
                                "flagged": t in arm["verdict"]["below_source"],
                                "other texts": {u: d for u, d in arm["texts"].items() if u != t}})
    return out


def draw_rows(receipts: dict, scheme: str = GPTQ) -> list[dict]:
    """One row per (model, draw, text): the draw against the source [CI] and its verdict; the draw against its
    round-to-nearest twin on the same documents [CI] (negative = better than RTN); the twin's rounding band;
    whether the judgement counts the draw as helping or hurting on that text."""
    rows = []
    for a, r in receipts.items():
        c = field(receipts, a, "calibration", scheme)
        lot = field(receipts, a, "lottery", c["twin"], "texts")
        jt = c["judgement"].get("texts", {})
        for i, (name, g) in enumerate(zip(c["draws"], c["gains"])):
            arm = r["arms"][name]
            for t, d in g.items():
                s = arm["texts"][t]
                rows.append({"model": a, "draw": name, "text": t, "vs source": s["rel"]["value"],
                             "vs source lo": s["rel"]["lo"], "vs source hi": s["rel"]["hi"],
                             "Δ vs source [CI]": pct(s["rel"]), "verdict": arm["verdict"]["verdict"],
                             "RTN fallback": fallback_note(arm).strip(" ()") or "none",
                             "KL": s["kl"]["value"], "KL [CI]": kl(s["kl"]),
                             "RTN KL": r["arms"][c["twin"]]["texts"][t]["kl"]["value"],
                             "GPTQ − RTN": d["value"], "lo": d["lo"], "hi": d["hi"], "GPTQ − RTN [CI]": pct(d),
                             "band lo": lot[t]["band"]["lo"], "band hi": lot[t]["band"]["hi"],
                             "band": f"{lot[t]['band']['lo']:+.2%} .. {lot[t]['band']['hi']:+.2%}",
                             "helps": jt[t]["helps"][i] if t in jt else None,
                             "hurts": jt[t]["hurts"][i] if t in jt else None})
    return rows


def _overlap(x: dict, y: dict) -> bool:
    return x["lo"] <= y["hi"] and y["lo"] <= x["hi"]


def draw_spread(receipts: dict, scheme: str = GPTQ) -> list[dict]:
    """Per (model, text): where the draws of one method land against the source. "lowest" / "highest" are the
    draws' point values, "range" their difference, "widest half-width" the largest of the draws' own CI
    half-widths, "disjoint pairs" the pairs of draws whose CIs do not overlap (they differ beyond their CIs)."""
    out = []
    for a, r in receipts.items():
        names = field(receipts, a, "calibration", scheme, "draws")
        for t in r["texts"]:
            cis = {n: r["arms"][n]["texts"][t]["rel"] for n in names}
            v = {n: c["value"] for n, c in cis.items()}
            lo, hi = min(v, key=v.get), max(v, key=v.get)
            pairs = [(m, n) for i, m in enumerate(names) for n in names[i + 1:] if not _overlap(cis[m], cis[n])]
            out.append({"model": a, "text": t, "draws": len(names), "lowest": v[lo], "lowest draw": lo,
                        "highest": v[hi], "highest draw": hi, "range": v[hi] - v[lo],
                        "widest half-width": max((c["hi"] - c["lo"]) / 2 for c in cis.values()),
                        "disjoint pairs": len(pairs),
                        "verdicts": [r["arms"][n]["verdict"]["verdict"] for n in names]})
    return out


def band_rows(receipts: dict, base: str = RTN) -> list[dict]:
    """Per (model, text): each ticket's (ticket - RTN) paired change with its CI, the stored rounding band and
    the band computed again from the stored ticket values by `gate.rounding_band`."""
    rows = []
    for a in receipts:
        lot = field(receipts, a, "lottery", base)
        for t, v in lot["texts"].items():
            again = rounding_band(v["values"], v["band"]["q"])
            rows.append({"model": a, "text": t, "tickets": len(lot["tickets"]),
                         "ticket − RTN [CI]": "; ".join(pct(c) for c in v["cis"]),
                         "values": v["values"], "band lo": v["band"]["lo"], "band hi": v["band"]["hi"],
                         "band": f"{v['band']['lo']:+.2%} .. {v['band']['hi']:+.2%}", "q": v["band"]["q"],
                         "band again": (again["lo"], again["hi"])})
    return rows


def judgement_again(receipt: dict, scheme: str = GPTQ) -> dict:
    """`gate.calibration_judgement` applied again to the receipt's stored draws (gains) and to rounding bands
    recomputed from its stored ticket values: it must equal the stored judgement."""
    c = receipt["calibration"][scheme]
    lot = receipt["lottery"][c["twin"]]["texts"]
    bands = {t: rounding_band(v["values"], v["band"]["q"]) for t, v in lot.items()}
    return calibration_judgement(c["gains"], bands)


def plot(receipts: dict, budget: float, fig, scheme: str = GPTQ, base: str = RTN) -> None:
    """Two rows of panels, one column per model. Top: every arm against the source, Δ ppl % with its 95 % CI per
    text, the budget dashed. Bottom: each lottery ticket and each GPTQ draw against round-to-nearest (paired, on
    the same documents) with its CI, per text, the rounding band shaded and zero drawn."""
    import numpy as np
    colors = {"test": "tab:blue", "ood": "tab:orange"}
    axes = fig.subplots(2, len(receipts), squeeze=False)
    for k, (a, r) in enumerate(receipts.items()):
        ax = axes[0][k]
        arms = list(r["arms"])
        for j, t in enumerate(r["texts"]):
            cs = [r["arms"][n]["texts"][t]["rel"] for n in arms]
            y = np.arange(len(arms)) + (j - 0.5) * 0.3
            v = np.array([c["value"] for c in cs]) * 100
            ax.errorbar(v, y, xerr=[v - [100 * c["lo"] for c in cs], [100 * c["hi"] for c in cs] - v], fmt="o",
                        ms=3, color=colors.get(t), label=t, capsize=2)
        ax.axvline(100 * budget, color="red", ls="--", lw=1, label="budget")
        ax.axvline(0, color="k", lw=0.6)
        ax.set_yticks(range(len(arms)), [n.replace(base, "rtn").replace(scheme, "gptq") for n in arms], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"{a}: arm vs source", fontsize=10)
        ax.set_xlabel("Δ perplexity vs source, % (95% CI)", fontsize=8)

        ax = axes[1][k]
        c = r["calibration"][scheme]
        lot = r["lottery"][c["twin"]]
        labels, y0 = [], 0
        for t in r["texts"]:
            cis = lot["texts"][t]["cis"] + [g[t] for g in c["gains"]]
            names = [n.split(" ")[-1] for n in lot["tickets"]] + [n.split(" ")[-1] for n in c["draws"]]
            y = y0 + np.arange(len(cis))
            band = lot["texts"][t]["band"]
            ax.fill_betweenx([y[0] - 0.4, y[-1] + 0.4], 100 * band["lo"], 100 * band["hi"], color=colors.get(t),
                             alpha=0.15, lw=0, label=f"rounding band, {t}")
            v = np.array([x["value"] for x in cis]) * 100
            ax.errorbar(v, y, xerr=[v - [100 * x["lo"] for x in cis], [100 * x["hi"] for x in cis] - v], fmt="none",
                        ecolor=colors.get(t), capsize=2)
            nt = len(lot["tickets"])
            ax.plot(v[:nt], y[:nt], "o", ms=3, color=colors.get(t), mfc="white")
            ax.plot(v[nt:], y[nt:], "s", ms=4, color=colors.get(t))
            labels += [f"{t} {n}" for n in names]
            y0 += len(cis) + 1
        ax.axvline(0, color="k", lw=0.6)
        pos = [i + (len(lot["tickets"]) + len(c["draws"]) + 1) * j for j, _ in enumerate(r["texts"])
               for i in range(len(lot["tickets"]) + len(c["draws"]))]
        ax.set_yticks(pos, labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"{a}: vs round-to-nearest; calibration {c['judgement']['verdict']}", fontsize=10)
        ax.set_xlabel("Δ perplexity vs RTN on the same documents, % (95% CI)", fontsize=8)
    axes[0][0].legend(fontsize=7)
    axes[1][0].legend(fontsize=7, loc="lower right")
