"""Chapter 04: the gate receipts shaped for reading. Every arm against its source (its verdict on held-out
documents), the draws of one calibration method side by side, the rounding band of the lottery tickets with its
edges' uncertainty, the calibration test, the arm chosen on development documents, each derived again from what
the receipt stores; and the comparison of a live re-run with the receipt at a stated tolerance.

Nothing here measures, except `rerun_ticket` (the live re-run) and `codes_moved` (live re-packs);
`normal_ticket_facts` simulates what 16 normally spread tickets can say about their own spread (a property of
the estimators). Every other function reads gate receipts
(data/receipts/gate_<model>.json, written by `regenerate(model)`) and reshapes or re-checks them. All figures
are relative perplexity changes (ppl_a / ppl_b - 1), paired on the same documents, with 95 % bootstrap intervals
over documents (`int4lab.gate.stats`): pairing removes the variance the two arms share, and the interval of a
paired change estimates the text-sampling noise of that change, treating documents as independent (too narrow
where neighbouring documents are correlated).

Receipt fields read: texts[t] {docs, tokens, tokens_sha, source_ppl}; split {seed, rule, texts[t] {dev,
held_out}}; arms[name] {kind, texts[t] / dev[t] / held_out[t] {rel, kl, top1: {value, lo, hi}, ppl, tokens, docs},
verdict {verdict, below_source, tokens_needed}, vs_twin[t] {value, lo, hi}}; lottery[base] {tickets, texts[t]
{cis, values, band {lo, hi, q, level, lo_ci, hi_ci}}}; calibration[scheme] {draws, twin, gains [{t: {value, lo,
hi}}], judgement {verdict, reasons, rule, alpha, tickets, texts[t] {p_helps, p_hurts, p_hurts_holm, rank_p_helps,
rank_p_hurts, helps, hurts}}}; choice {chosen, score, rule, held_out, verdict}.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import torch

from int4lab.gate import calibration_judgement, choose, rounding_band, verdict
from lab.paths import RECEIPTS
from lab.provenance import read_receipt

RTN = "rtn/experts/W4A8"            # the round-to-nearest arm of the experts-only W4A8 scheme
GPTQ = "gptq/experts/W4A8"          # its calibrated scheme; arms "gptq/experts/W4A8 draw#s"
SCORED = "every arm on every document"
RERUN_FRACTION = 0.05               # a live re-run reproduces an interval within this fraction of its half-width


def regenerate(a: str) -> str:
    """The command that writes data/receipts/gate_<a>.json, on the CPU as the published receipts were made (there
    the arms' scoring forwards take the torch reference path, whatever --prefill-rows says). Without --device the
    gate picks CUDA where there is one, scores the source in bfloat16 and the arms through the prefill path
    (weights decoded to bf16, a bf16 GEMM on the dequantised int8 activations) from `gate.SCORE_PREFILL_ROWS`
    routed rows per weight, the decode kernels below that (--prefill-rows off: the decode kernels only); its
    parity check then compares cached decode with the full forward, both through the decode kernels, not the
    kernels with the torch reference."""
    return (f"python -m lab.gate --model {a} --scheme rtn gptq --lottery 16 --threads 1 --device cpu "
            f"--out data/receipts/gate_{a}.json")


def present(archs) -> dict:
    """{arch: whether data/receipts/gate_<arch>.json exists}. An absent receipt is not measured: the chapter
    says so with the command that writes it and reads only the receipts present."""
    return {a: (RECEIPTS / f"gate_{a}.json").is_file() for a in archs}


def not_measured(a: str) -> str:
    return f"{a}: not measured: run `{regenerate(a)}`"


def load(archs) -> dict:
    """{arch: receipt} of data/receipts/gate_<arch>.json. ValueError, naming the command that regenerates it, for
    a receipt whose `settings.scored` is not "every arm on every document" or that has no development / held-out
    split or no choice."""
    out = {}
    for a in archs:
        r = read_receipt(RECEIPTS / f"gate_{a}.json")
        if r.get("settings", {}).get("scored") != SCORED:
            raise ValueError(f"data/receipts/gate_{a}.json does not record every arm scored on every document "
                             f"(settings.scored is not {SCORED!r}): regenerate it with `{regenerate(a)}`")
        if "split" not in r or "choice" not in r:
            raise ValueError(f"data/receipts/gate_{a}.json has no development / held-out split or no choice: "
                             f"regenerate it with `{regenerate(a)}`")
        out[a] = r
    return out


def field(receipts: dict, a: str, *keys):
    """receipts[a][k1][k2]...; a KeyError naming the receipt, the missing field and the regenerating command."""
    v = receipts[a]
    for i, k in enumerate(keys):
        if not isinstance(v, (dict, list)) or (isinstance(v, dict) and k not in v):
            raise KeyError(f"data/receipts/gate_{a}.json has no field {'/'.join(map(str, keys[:i + 1]))!r}: "
                           f"regenerate it with `{receipts[a]['provenance']['command']}`")
        v = v[k]
    return v


def pct(c: dict, digits: int = 2) -> str:
    """'+0.17% [+0.10%, +0.24%]' from {value, lo, hi}."""
    f = f"{{:+.{digits}%}}"
    return f"{f.format(c['value'])} [{f.format(c['lo'])}, {f.format(c['hi'])}]"


def kl(c: dict) -> str:
    return f"{c['value']:.4f} [{c['lo']:.4f}, {c['hi']:.4f}]"


def edge(v) -> str:
    """A band edge's CI bound: None is 'beyond the tickets' (too few tickets to bound that side)."""
    return "beyond the tickets" if v is None else f"{v:+.2%}"


def arm_rows(receipts: dict) -> list[dict]:
    """One row per (model, arm, text): the change against the source with its CI on all documents and on the
    held-out documents, KL with its CI (held-out), the verdict (held-out)."""
    rows = []
    for a, r in receipts.items():
        for name, arm in r["arms"].items():
            for t, c in arm["texts"].items():
                h = arm["held_out"][t]
                rows.append({"model": a, "arm": name, "kind": arm["kind"], "text": t, "tokens": c["tokens"],
                             "docs": c["docs"], "held-out docs": h["docs"], "ppl (all docs)": c["ppl"],
                             "Δ all": c["rel"]["value"], "Δ": h["rel"]["value"], "lo": h["rel"]["lo"],
                             "hi": h["rel"]["hi"], "half-width": (h["rel"]["hi"] - h["rel"]["lo"]) / 2,
                             "held-out / all-docs CI width": (h["rel"]["hi"] - h["rel"]["lo"]) / (c["rel"]["hi"] - c["rel"]["lo"]),
                             "KL": h["kl"]["value"], "KL lo": h["kl"]["lo"], "KL hi": h["kl"]["hi"],
                             "KL p99 (all docs)": c["kl_p99"]["value"], "top-1": h["top1"]["value"],
                             "scored": arm["scored"], "verdict": arm["verdict"]["verdict"],
                             "tokens to decide": arm["verdict"]["tokens_needed"].get(t),
                             "Δ all docs [95% CI]": pct(c["rel"]), "Δ held-out [95% CI]": pct(h["rel"]),
                             "KL held-out [95% CI]": kl(h["kl"])})
    return rows


def verdicts_rederived(receipts: dict) -> list[tuple[str, str]]:
    """(model, arm) whose stored verdict differs from `gate.verdict` applied again to its stored held-out CIs
    (want [])."""
    return [(a, n) for a, r in receipts.items() for n, arm in r["arms"].items()
            if arm["verdict"] != verdict(arm["held_out"], r["budget"])]


def below_source(receipts: dict) -> list[dict]:
    """Every (model, arm, text) whose held-out Δ CI lies wholly below zero, with its KL, whether the verdict
    flags it, and the same arm on the other texts."""
    out = []
    for a, r in receipts.items():
        for name, arm in r["arms"].items():
            for t, c in arm["held_out"].items():
                if c["rel"]["hi"] < 0:
                    out.append({"model": a, "arm": name, "text": t, "rel": c["rel"], "kl": c["kl"],
                                "flagged": t in arm["verdict"]["below_source"],
                                "other texts": {u: d for u, d in arm["held_out"].items() if u != t}})
    return out


def fallback(arm: dict) -> tuple[int, int]:
    """(experts packed round-to-nearest, experts in all) of a GPTQ arm: its quant_report's `fallback`, the experts
    that had fewer calibration rows than the gate's `min_rows` (default K). (0, m) for an arm with none; (0, 0)
    without a report."""
    q = arm.get("quant_report") or {}
    fb = len(q.get("fallback") or [])
    return fb, fb + int(q.get("gptq_experts") or 0)


def draw_rows(receipts: dict, scheme: str = GPTQ) -> list[dict]:
    """One row per (model, draw, text): the draw against the source [CI] on held-out documents and its verdict;
    how many of its experts were packed round-to-nearest ("RTN fallback": the arm is that mix, not GPTQ alone);
    the draw against its round-to-nearest twin on all documents [CI] (negative = better than RTN); the twin's
    rounding band; the calibration test's p-values (p_helps and p_hurts per (draw, text), unadjusted, each with
    its exact rank p-value rank_p_helps / rank_p_hurts = (1 + tickets at or beyond the draw) / (K + 1);
    p_hurts_holm Holm-adjusted over all draws x texts) and whether it counts the draw as helping (unadjusted
    p_helps <= alpha) or hurting (Holm-adjusted p_hurts <= alpha)."""
    rows = []
    for a, r in receipts.items():
        c = field(receipts, a, "calibration", scheme)
        lot = field(receipts, a, "lottery", c["twin"], "texts")
        jt = c["judgement"].get("texts", {})
        for i, (name, g) in enumerate(zip(c["draws"], c["gains"])):
            arm = r["arms"][name]
            for t, d in g.items():
                s, b, (fb, m) = arm["held_out"][t], lot[t].get("band"), fallback(arm)
                rows.append({"model": a, "draw": name, "text": t, "vs source": s["rel"]["value"],
                             "vs source lo": s["rel"]["lo"], "vs source hi": s["rel"]["hi"],
                             "Δ held-out [CI]": pct(s["rel"]), "verdict": arm["verdict"]["verdict"],
                             "RTN fallback": f"{fb} of {m} experts", "fallback experts": fb,
                             "KL": arm["texts"][t]["kl"]["value"], "KL all docs [CI]": kl(arm["texts"][t]["kl"]),
                             "RTN KL": r["arms"][c["twin"]]["texts"][t]["kl"]["value"],
                             "GPTQ − RTN": d["value"], "lo": d["lo"], "hi": d["hi"], "GPTQ − RTN [CI]": pct(d),
                             "band lo": b["lo"] if b else None, "band hi": b["hi"] if b else None,
                             "band": f"{b['lo']:+.2%} .. {b['hi']:+.2%}" if b else "–",
                             **{k: jt[t][k][i] if t in jt else None
                                for k in ("p_helps", "p_hurts", "p_hurts_holm", "rank_p_helps", "rank_p_hurts",
                                          "helps", "hurts")}})
    return rows


def _overlap(x: dict, y: dict) -> bool:
    return x["lo"] <= y["hi"] and y["lo"] <= x["hi"]


def draw_spread(receipts: dict, scheme: str = GPTQ) -> list[dict]:
    """Per (model, text): where the draws of one method land against the source on all documents. "lowest" /
    "highest" are the draws' point values, "range" their difference, "widest half-width" the largest of the
    draws' own CI half-widths, "disjoint pairs" the pairs of draws whose CIs do not overlap."""
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
    """Per (model, text): the tickets' (ticket - RTN) paired changes, how many lie above and below zero ("above
    RTN", "below RTN": tickets with a higher / lower perplexity than round-to-nearest, by point estimate), the
    stored rounding band with the CIs of its edges, and the band computed again from the stored ticket values by
    `gate.rounding_band`."""
    rows = []
    for a in receipts:
        lot = field(receipts, a, "lottery", base)
        for t, v in lot["texts"].items():
            b = v["band"]
            again = rounding_band(v["values"], b["q"], b["level"])
            rows.append({"model": a, "text": t, "tickets": len(lot["tickets"]), "values": v["values"],
                         "smallest": min(v["values"]), "largest": max(v["values"]),
                         "above RTN": sum(x > 0 for x in v["values"]), "below RTN": sum(x < 0 for x in v["values"]),
                         "band lo": b["lo"], "band hi": b["hi"], "q": b["q"],
                         "band": f"{b['lo']:+.2%} .. {b['hi']:+.2%}",
                         "lower edge CI": f"[{edge(b['lo_ci'][0])}, {edge(b['lo_ci'][1])}]",
                         "upper edge CI": f"[{edge(b['hi_ci'][0])}, {edge(b['hi_ci'][1])}]",
                         "same again": again == b})
    return rows


def ticket_kl(receipts: dict, base: str = RTN) -> list[dict]:
    """Per (model, ticket, text): the ticket's mean KL to the source over all documents ("KL"), its ratio to the
    round-to-nearest twin's ("ratio"), and whether the ticket's KL CI lies wholly above the twin's ("CI above")."""
    rows = []
    for a, r in receipts.items():
        for n in field(receipts, a, "lottery", base, "tickets"):
            for t in r["texts"]:
                k, k0 = r["arms"][n]["texts"][t]["kl"], r["arms"][base]["texts"][t]["kl"]
                rows.append({"model": a, "ticket": n, "text": t, "KL": k["value"], "RTN KL": k0["value"],
                             "ratio": k["value"] / k0["value"], "CI above": k["lo"] > k0["hi"]})
    return rows


def normal_ticket_facts(k: int, q: float, samples: int = 200_000, seed: int = 0) -> dict:
    """What k normally spread tickets say about their own spread, simulated (seeded, `samples` sets of k
    standard normal values): "mean edge", the mean of the linearly interpolated 1 - q quantile minus the q
    quantile, halved (np.quantile, as `gate.rounding_band`), in units of the true sd, against "true edge" z_(1-q);
    "width ratio", the band's mean width over the true one; "lower beyond" / "upper beyond", the share of sets
    whose edge lies beyond the true percentile; "sd rse", the sample sd's relative standard error 1/sqrt(2 (k - 1));
    "sd 95% lo" / "sd 95% hi", the 2.5 % and 97.5 % quantiles of true sd / sample sd (ddof 1): the range a 95 %
    interval for the true sd spans, in units of the sample sd. Properties of the estimators, not of a receipt."""
    if k < 2 or not 0 < q < 0.5:
        raise ValueError(f"k must be at least 2 and q in (0, 0.5), got k={k!r}, q={q!r}")
    x = np.random.default_rng(seed).standard_normal((samples, k))
    lo, hi = np.quantile(x, [q, 1 - q], axis=1)
    z = NormalDist().inv_cdf(1 - q)
    sd_lo, sd_hi = np.quantile(1 / x.std(axis=1, ddof=1), [0.025, 0.975])
    return {"tickets": k, "q": q, "true edge": z, "mean edge": float((hi - lo).mean() / 2),
            "width ratio": float((hi - lo).mean() / (2 * z)),
            "lower beyond": float((lo < -z).mean()), "upper beyond": float((hi > z).mean()),
            "sd rse": 1 / math.sqrt(2 * (k - 1)), "sd 95% lo": float(sd_lo), "sd 95% hi": float(sd_hi)}


def judgement_again(receipt: dict, scheme: str = GPTQ) -> dict:
    """`gate.calibration_judgement` applied again to the receipt's stored draws (gains) and ticket values, at
    its stored alpha: it must equal the stored judgement."""
    c = receipt["calibration"][scheme]
    lot = receipt["lottery"][c["twin"]]["texts"]
    return calibration_judgement(c["gains"], {t: v["values"] for t, v in lot.items()}, c["judgement"]["alpha"])


def choice_again(receipt: dict) -> str:
    """`gate.choose` applied again to the stored development CIs of every arm but the lottery tickets."""
    return choose({n: a["dev"] for n, a in receipt["arms"].items() if a["kind"] != "lottery"})["chosen"]


def choice_halves(receipt: dict) -> dict:
    """The chosen pack's verdict, by `gate.verdict` with the receipt's budget, on each document set:
    {"held-out", "development", "all documents"} -> verdict string. The held-out one is the gate's; the other two
    show whether it holds across the split (the development one is read on the documents it was chosen on)."""
    arm = receipt["arms"][receipt["choice"]["chosen"]]
    sets = {"held-out": arm["held_out"], "development": arm["dev"], "all documents": arm["texts"]}
    return {k: verdict(v, receipt["budget"])["verdict"] for k, v in sets.items()}


def reproduces(live: dict, stored: dict, fraction: float = RERUN_FRACTION) -> dict:
    """Does a live re-run's {value, lo, hi} reproduce a stored one? Within `fraction` of the stored interval's
    half-width on each of value, lo and hi: a re-run on another CPU or thread count sums float32 in another
    order and moves these numbers by a few 1e-5 (2-3e-5 in the re-run tests/lab/test_chapter_gate.py records),
    and what the chapter reads from an interval is its position to a small part of its width. {"ok", "tolerance", "max_diff"}."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
    tol = fraction * (stored["hi"] - stored["lo"]) / 2
    diff = max(abs(live[k] - stored[k]) for k in ("value", "lo", "hi"))
    return {"ok": diff <= tol, "tolerance": tol, "max_diff": diff}


def rerun_ticket(arch: str, seed: int, dither: float, docs: list[str], settings: dict, tok, loader) -> dict:
    """A lottery ticket of `arch` re-packed live from its seed and scored with the source on `docs` with the
    receipt's window, batch, batch_tokens, n_boot and bootstrap seed (`settings`): {"rel": paired CI,
    "tokens", "sha"}. loader(arch) -> a fresh float32 source model."""
    import int4lab as il
    from int4lab import gate
    win = gate.Windows(tok, docs, settings["window"])
    q, _ = il.quantize_model(loader(arch), dither=dither, dither_seed=seed, progress=False)
    per = gate.score_models({"source": loader(arch), "ticket": q}, win, batch=settings["batch"],
                            batch_tokens=settings["batch_tokens"])
    rel = gate.paired_ci(per["ticket"].nll, per["source"].nll, per["source"].doc, n_boot=settings["n_boot"],
                         seed=settings["seed"])["rel"]
    return {"rel": rel, "tokens": win.tokens, "sha": win.sha}


def codes_moved(arch: str, receipt: dict, tok, train, loader) -> dict:
    """How many of the experts' int4 codes the first lottery ticket and the first GPTQ draw of `arch`'s receipt change
    against round-to-nearest, each re-packed live as the gate packed it (the ticket's seed and dither; the draw's
    calibration seed and the receipt's calib_tokens, calib_len, damp, min_rows). train: the calibration split
    tokenised (`gate.split_ids`); loader(arch) -> a fresh float32 source model. Returns {"codes" (expert codes in
    the model), "ticket", "gptq" (fractions of them that differ from round-to-nearest's), "fallback as in receipt"
    (the re-packed draw packs the receipt's experts round-to-nearest: the same layers and experts; their row counts
    may differ by float rounding)}. GPTQ chooses each block's scale from its
    compensated weights, so some of its codes move with their block's scale, not by re-rounding alone."""
    import int4lab as il
    from int4lab import gate
    from int4lab.format import unpack_codes
    from int4lab.quantize.modules import Int4Experts
    s = receipt["settings"]
    if s.get("calib_text") or s.get("calib_split") != "train":
        raise ValueError(f"codes_moved re-packs from the train split; this receipt calibrated on "
                         f"{s.get('calib_text') or s.get('calib_split')!r}")
    ticket, draw = receipt["arms"][f"{RTN} lottery#1"], receipt["arms"][receipt["calibration"][GPTQ]["draws"][0]]
    calib = gate.calibration_ids(tok, s["calib_tokens"], s["calib_len"], seed=draw["seed"], stream=train)
    min_rows = s["min_rows"] if isinstance(s["min_rows"], int) else None      # the receipt's "K (max(H, I))"
    rtn, _ = il.quantize_model(loader(arch), progress=False)
    tkt, _ = il.quantize_model(loader(arch), dither=ticket["dither"], dither_seed=ticket["seed"], progress=False)
    gq, rep = il.quantize_model(loader(arch), "gptq", calib_ids=calib, min_rows=min_rows, damp=s["damp"],
                                progress=False)

    def codes(m):
        return torch.cat([unpack_codes(getattr(x, p)).flatten() for x in m.modules() if isinstance(x, Int4Experts)
                          for p in ("gate_up_packed", "down_packed")])
    c = codes(rtn)
    return {"codes": c.numel(), "ticket": float((codes(tkt) != c).double().mean()),
            "gptq": float((codes(gq) != c).double().mean()),
            "fallback as in receipt": _experts(rep.to_dict()["fallback"]) == _experts(draw["quant_report"]["fallback"])}


def _experts(fallback: list) -> list:
    """The (layer, expert) pairs of a fallback list. Their row counts are left out: past the first quantised layer
    the routing depends on float rounding, so a count can differ between CPUs, a fallback expert's included (how
    far is not bounded here); an expert whose count lies near `min_rows` could then change sides, which the
    comparison of pairs would show."""
    return [(f["layer"], f["expert"]) for f in fallback]


def plot(receipts: dict, budget: float, fig, scheme: str = GPTQ, base: str = RTN) -> None:
    """Two rows of panels, one column per model. Top: every arm against the source on held-out documents, Δ ppl
    % with its 95 % CI per text, the budget dashed. Bottom: each lottery ticket and each GPTQ draw against
    round-to-nearest (paired, on all documents) with its CI, per text, the rounding band shaded, the outer
    bounds of its edges' CIs dotted where the tickets bound them, and zero drawn."""
    import numpy as np
    colors = {"test": "tab:blue", "ood": "tab:orange"}
    axes = fig.subplots(2, len(receipts), squeeze=False)
    for k, (a, r) in enumerate(receipts.items()):
        ax = axes[0][k]
        arms = list(r["arms"])
        for j, t in enumerate(r["texts"]):
            cs = [r["arms"][n]["held_out"][t]["rel"] for n in arms]
            y = np.arange(len(arms)) + (j - 0.5) * 0.3
            v = np.array([c["value"] for c in cs]) * 100
            ax.errorbar(v, y, xerr=[v - [100 * c["lo"] for c in cs], [100 * c["hi"] for c in cs] - v], fmt="o",
                        ms=3, color=colors.get(t), label=t, capsize=2)
        ax.axvline(100 * budget, color="red", ls="--", lw=1, label="budget")
        ax.axvline(0, color="k", lw=0.6)
        ax.set_yticks(range(len(arms)), [n.replace(base, "rtn").replace(scheme, "gptq") for n in arms], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"{a}: arm vs source, held-out documents", fontsize=10)
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
            for x in (band["lo_ci"][0], band["hi_ci"][1]):
                if x is not None:
                    ax.plot([100 * x] * 2, [y[0] - 0.4, y[-1] + 0.4], ls=":", lw=0.8, color=colors.get(t))
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
