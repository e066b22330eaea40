"""Paired bootstrap confidence intervals and the gate's rules.

Shape legend: T = scored tokens of a text, D = documents, Bs = bootstrap resamples.

Every figure compares two models on the same tokens, so the uncertainty is paired: resample documents with
replacement (the same resamples for every arm of a text: seeded), recompute the figure on each resample, and
take the 2.5th / 97.5th percentiles. Documents, not tokens, are the unit: tokens of one document are
correlated (same speaker, same chapter), and resampling tokens would make the interval too narrow.

Figures (arm a against reference r, over the tokens of one text):
    rel    = exp(mean(nll_a - nll_r)) - 1 = ppl_a / ppl_r - 1     (relative perplexity change)
    kl     = mean KL(source ‖ a);  kl_p99 = its 99th percentile;  top1 = mean agreement of arg-max tokens

The gate is one-sided in rel (an arm may not lose more than the budget); an arm whose CI lies wholly below
zero scores better than its source on that text, which says it moved, not that it is better: KL(source ‖ a)
with its CI, reported beside every verdict, is how far it moved either way.
"""
from __future__ import annotations

import math

import numpy as np

N_BOOT = 2000
LEVEL = 0.95


def _resample_counts(D: int, n_boot: int, seed: int) -> np.ndarray:
    """int [Bs, D]: how often each document appears in each resample (rows sum to D)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, D, size=(n_boot, D))
    C = np.zeros((n_boot, D), dtype=np.int32)
    np.add.at(C, (np.repeat(np.arange(n_boot), D), idx.ravel()), 1)
    return C


def _check(n_boot, level):
    if not isinstance(n_boot, int) or isinstance(n_boot, bool) or n_boot < 100:
        raise ValueError(f"n_boot must be an int >= 100, got {n_boot!r}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")


def _ci(point: float, samples: np.ndarray, level: float) -> dict:
    a = (1 - level) / 2
    lo, hi = np.quantile(samples, [a, 1 - a])
    return {"value": float(point), "lo": float(lo), "hi": float(hi)}


def paired_ci(x: np.ndarray, y: np.ndarray, doc: np.ndarray, *, kl=None, top1=None, n_boot: int = N_BOOT,
              seed: int = 0, level: float = LEVEL) -> dict:
    """Point values and percentile CIs of rel (x against reference y, both per-token nll [T]) and, when
    given, of mean kl [T], its 99th percentile and mean top1 [T]; doc int [T] is each token's document.

    Returns {"rel": {value, lo, hi}, "kl": ..., "kl_p99": ..., "top1": ..., "tokens": T, "docs": D}.
    """
    _check(n_boot, level)
    x, y, doc = np.asarray(x, np.float64), np.asarray(y, np.float64), np.asarray(doc)
    if not (x.shape == y.shape == doc.shape) or x.ndim != 1 or x.size == 0:
        raise ValueError(f"x, y and doc must be equal-length non-empty vectors, got {x.shape}, {y.shape}, {doc.shape}")
    _, d = np.unique(doc, return_inverse=True)
    D = int(d.max()) + 1
    n = np.bincount(d, minlength=D).astype(np.float64)
    C = _resample_counts(D, n_boot, seed).astype(np.float64)
    N = C @ n

    def ratio(v):                                                  # mean of v over each resample's tokens
        s = np.bincount(d, weights=v, minlength=D)
        return v.mean(), (C @ s) / N

    out = {"tokens": int(x.size), "docs": D}
    p, bs = ratio(x - y)
    out["rel"] = _ci(math.expm1(p), np.expm1(bs), level)
    if kl is not None:
        kl = np.asarray(kl, np.float64)
        p, bs = ratio(kl)
        out["kl"] = _ci(p, bs, level)
        out["kl_p99"] = _ci(float(np.quantile(kl, 0.99)), _weighted_p99(kl, d, C[:min(n_boot, 1000)]), level)
    if top1 is not None:
        p, bs = ratio(np.asarray(top1, np.float64))
        out["top1"] = _ci(p, bs, level)
    return out


def _weighted_p99(v: np.ndarray, d: np.ndarray, C: np.ndarray) -> np.ndarray:
    """The 99th percentile of v on each resample (a token counts as often as its document was drawn): the
    first token, in sorted order, at which the resample's cumulative weight reaches 0.99 of its total.

    One bisection over sorted positions for all resamples at once: the weight up to position i is
    Σ_d C[b, d] · (tokens of document d among the first i + 1), counted by a search in each document's
    sorted positions, so memory stays O(T + Bs·D)."""
    order = np.argsort(v, kind="stable")
    vs, ds = v[order], d[order]
    D = C.shape[1]
    by_doc = np.argsort(ds, kind="stable")                       # sorted positions, grouped by document
    pos = np.split(by_doc, np.cumsum(np.bincount(ds, minlength=D))[:-1])
    target = 0.99 * (C @ np.bincount(ds, minlength=D).astype(np.float64))
    lo = np.zeros(C.shape[0], dtype=np.int64)
    hi = np.full(C.shape[0], len(vs) - 1, dtype=np.int64)
    while (lo < hi).any():
        mid = (lo + hi) // 2
        w = sum(C[:, k] * np.searchsorted(pos[k], mid, side="right") for k in range(D) if C[:, k].any())
        ge = w >= target
        hi, lo = np.where(ge, mid, hi), np.where(ge, lo, mid + 1)
    return vs[lo]


def tokens_to_decide(ci: dict, tokens: int, budget: float) -> int | None:
    """Scored tokens the CI would need to exclude the budget, if the change stays what it is and the
    half-width shrinks as 1/√tokens; None when it already does, or when the change sits on the budget."""
    if ci["hi"] < budget or ci["lo"] > budget:
        return None
    margin = abs(ci["value"] - budget)
    if margin == 0:
        return None
    h = (ci["hi"] - ci["lo"]) / 2
    return int(math.ceil(tokens * (h / margin) ** 2))


def verdict(cis: dict, budget: float) -> dict:
    """The gate's rule for one arm, from {text: {"rel": {value, lo, hi}, "tokens": T}}:

    PASS      the CI's upper bound is under the budget on every text;
    FAIL      some text's lower bound is over the budget;
    UNDECIDED otherwise; tokens_needed[text] estimates how many scored tokens would decide each open text.
    Returns {"verdict", "reasons": [...], "tokens_needed": {text: int}, "below_source": [texts whose CI
    lies wholly below zero: the arm scored better than its source there; see KL for how far it moved]}.
    """
    if not isinstance(budget, (int, float)) or isinstance(budget, bool) or not budget > 0:
        raise ValueError(f"budget must be a positive relative change (0.01 = 1%), got {budget!r}")
    if not cis:
        raise ValueError("cis must hold at least one text")
    for t, c in cis.items():
        r = c["rel"]
        if not all(math.isfinite(r[k]) for k in ("value", "lo", "hi")) or not r["lo"] <= r["value"] <= r["hi"]:
            raise ValueError(f"cis[{t!r}]['rel'] must be finite with lo <= value <= hi, got {r!r}")
    below = [t for t, c in cis.items() if c["rel"]["hi"] < 0]
    fail = {t: c["rel"] for t, c in cis.items() if c["rel"]["lo"] > budget}
    if fail:
        return {"verdict": "FAIL", "tokens_needed": {}, "below_source": below,
                "reasons": [f"{t}: {r['value']:+.3%} [{r['lo']:+.3%}, {r['hi']:+.3%}], all of it past the budget "
                            f"{budget:.2%}" for t, r in fail.items()]}
    open_ = {t: c for t, c in cis.items() if c["rel"]["hi"] >= budget}
    if not open_:
        worst = max(cis, key=lambda t: cis[t]["rel"]["hi"])
        return {"verdict": "PASS", "tokens_needed": {}, "below_source": below,
                "reasons": [f"every text's 95% CI is under the budget {budget:.2%} (highest upper bound: {worst} "
                            f"{cis[worst]['rel']['hi']:+.3%})"]}
    need = {t: tokens_to_decide(c["rel"], c["tokens"], budget) for t, c in open_.items()}
    return {"verdict": "UNDECIDED", "tokens_needed": need, "below_source": below,
            "reasons": [f"{t}: {c['rel']['value']:+.3%} [{c['rel']['lo']:+.3%}, {c['rel']['hi']:+.3%}] straddles the "
                        f"budget {budget:.2%}; about {need[t] or 'an unbounded number of'} tokens would decide it"
                        for t, c in open_.items()]}


MIN_DRAWS = 3           # calibration is judged over at least this many calibration draws
MIN_TICKETS = 2         # and against the rounding band of at least this many lottery tickets
ROUNDING_Q = 0.05       # the rounding band: quantiles ROUNDING_Q and 1 - ROUNDING_Q of ticket - RTN

CALIBRATION_RULE = (
    "Per text, every figure is a paired relative change against the round-to-nearest twin on the same documents. "
    "The rounding band is the distribution of (lottery ticket - RTN) over the tickets: how far perplexity moves "
    "when only the rounding changes; its lower / upper edges are the 5th / 95th percentiles (linear interpolation). "
    "A calibration draw HELPS on a text when the upper bound of its (draw - RTN) 95% CI is below zero and below "
    "the band's lower edge; it HURTS when the CI's lower bound is above zero and above the band's upper edge. "
    "ACCEPTED: every draw helps on every text. WORSE: some draw hurts on some text. NOT SHOWN: otherwise. "
    f"Judged with at least {MIN_DRAWS} draws and {MIN_TICKETS} tickets.")


def rounding_band(ticket_rels: list[float], q: float = ROUNDING_Q) -> dict:
    """The (lottery ticket - round-to-nearest) paired relative changes of one text, each on every document:
    {"values": [...], "lo": their q quantile, "hi": their 1 - q quantile, "q": q}. How far perplexity moves
    under a rounding change alone; unlike a range of point estimates it does not widen with more tickets."""
    v = [float(x) for x in ticket_rels]
    if len(v) < MIN_TICKETS or not all(math.isfinite(x) for x in v):
        raise ValueError(f"the rounding band needs at least {MIN_TICKETS} finite ticket - RTN changes, got {v}")
    if not 0 < q < 0.5:
        raise ValueError(f"q must be in (0, 0.5), got {q!r}")
    lo, hi = np.quantile(v, [q, 1 - q])
    return {"values": v, "lo": float(lo), "hi": float(hi), "q": q}


def calibration_judgement(draws: list[dict], bands: dict) -> dict:
    """Does calibration beat round-to-nearest? draws: one {text: {value, lo, hi}} per calibration draw, the
    paired CI of (calibrated - its round-to-nearest twin) on the same documents (negative = better); bands:
    {text: rounding_band}. The rule is CALIBRATION_RULE (stated before any run):

    a draw HELPS on a text when its CI's hi < min(0, band lo); it HURTS when its CI's lo > max(0, band hi);
    ACCEPTED  every draw helps on every text;
    WORSE     some draw hurts on some text;
    NOT SHOWN otherwise.
    Returns {"verdict", "reasons", "rule", "texts": {text: {"helps_below", "hurts_above", "helps": [bool per
    draw], "hurts": [...]}}}. ValueError for fewer than MIN_DRAWS draws or texts that do not match.
    """
    if len(draws) < MIN_DRAWS:
        raise ValueError(f"calibration is judged over at least {MIN_DRAWS} calibration draws, got {len(draws)}")
    for g in draws:
        if set(g) != set(bands):
            raise ValueError(f"every draw needs a change on the texts of the rounding band {sorted(bands)}, "
                             f"got {sorted(g)}")
    texts = {}
    for t, b in bands.items():
        below, above = min(0.0, b["lo"]), max(0.0, b["hi"])
        texts[t] = {"helps_below": below, "hurts_above": above,
                    "helps": [g[t]["hi"] < below for g in draws], "hurts": [g[t]["lo"] > above for g in draws]}
    out = {"rule": CALIBRATION_RULE, "texts": texts}
    hurt = [(i, t) for t, v in texts.items() for i, h in enumerate(v["hurts"]) if h]
    if hurt:
        return {"verdict": "WORSE", **out, "reasons": [
            f"draw {i}, {t}: (draw - RTN) {_pct(draws[i][t])} lies above zero and the rounding band's upper edge "
            f"{bands[t]['hi']:+.3%}" for i, t in hurt]}
    short = [(i, t) for t, v in texts.items() for i, h in enumerate(v["helps"]) if not h]
    if not short:
        return {"verdict": "ACCEPTED", **out, "reasons": [
            f"all {len(draws)} draws beat round-to-nearest beyond zero and the rounding band on every text"]}
    return {"verdict": "NOT SHOWN", **out, "reasons": [
        f"draw {i}, {t}: (draw - RTN) {_pct(draws[i][t])} does not lie below {texts[t]['helps_below']:+.3%} "
        f"(zero and the rounding band's lower edge)" for i, t in short]}


def _pct(c: dict) -> str:
    return f"{c['value']:+.3%} [{c['lo']:+.3%}, {c['hi']:+.3%}]"
