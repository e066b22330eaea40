"""Paired bootstrap confidence intervals and the gate's rules.

Shape legend: T = scored tokens of a text, D = documents, Bs = bootstrap resamples.

Every figure compares two models on the same tokens, so the uncertainty is paired: resample documents with
replacement (the same resamples for every arm of a text: seeded), recompute the figure on each resample, and
take the 2.5th / 97.5th percentiles. Documents, not tokens, are the unit: tokens of one document are
correlated (same speaker, same chapter), and resampling tokens would make the interval too narrow.

Figures (arm a against reference r, over the tokens of one text):
    rel    = exp(mean(nll_a - nll_r)) - 1 = ppl_a / ppl_r - 1     (relative perplexity change)
    kl     = mean KL(source ‖ a);  kl_p99 = its 99th percentile;  top1 = mean agreement of arg-max tokens
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
    """The 99th percentile of v on each resample (a token counts as often as its document was drawn)."""
    order = np.argsort(v, kind="stable")
    vs, ds = v[order], d[order]
    out = np.empty(C.shape[0])
    for i, c in enumerate(C):
        w = np.cumsum(c[ds])
        out[i] = vs[min(np.searchsorted(w, 0.99 * w[-1]), len(vs) - 1)]
    return out


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
    Returns {"verdict", "reasons": [...], "tokens_needed": {text: int}}.
    """
    if not isinstance(budget, (int, float)) or isinstance(budget, bool) or not budget > 0:
        raise ValueError(f"budget must be a positive relative change (0.01 = 1%), got {budget!r}")
    if not cis:
        raise ValueError("cis must hold at least one text")
    for t, c in cis.items():
        r = c["rel"]
        if not all(math.isfinite(r[k]) for k in ("value", "lo", "hi")) or not r["lo"] <= r["value"] <= r["hi"]:
            raise ValueError(f"cis[{t!r}]['rel'] must be finite with lo <= value <= hi, got {r!r}")
    fail = {t: c["rel"] for t, c in cis.items() if c["rel"]["lo"] > budget}
    if fail:
        return {"verdict": "FAIL", "tokens_needed": {},
                "reasons": [f"{t}: {r['value']:+.3%} [{r['lo']:+.3%}, {r['hi']:+.3%}], all of it past the budget "
                            f"{budget:.2%}" for t, r in fail.items()]}
    open_ = {t: c for t, c in cis.items() if c["rel"]["hi"] >= budget}
    if not open_:
        worst = max(cis, key=lambda t: cis[t]["rel"]["hi"])
        return {"verdict": "PASS", "tokens_needed": {},
                "reasons": [f"every text's 95% CI is under the budget {budget:.2%} (highest upper bound: {worst} "
                            f"{cis[worst]['rel']['hi']:+.3%})"]}
    need = {t: tokens_to_decide(c["rel"], c["tokens"], budget) for t, c in open_.items()}
    return {"verdict": "UNDECIDED", "tokens_needed": need,
            "reasons": [f"{t}: {c['rel']['value']:+.3%} [{c['rel']['lo']:+.3%}, {c['rel']['hi']:+.3%}] straddles the "
                        f"budget {budget:.2%}; about {need[t] or 'an unbounded number of'} tokens would decide it"
                        for t, c in open_.items()]}


def lottery_spread(rels: list[float]) -> float:
    """Range (max - min) of the relative changes of round-to-nearest and its dithered re-packs on one text:
    how far perplexity moves under roundings that are equally good by construction."""
    if len(rels) < 2:
        raise ValueError(f"the lottery needs at least two packs (round-to-nearest and a dithered one), got {len(rels)}")
    return float(max(rels) - min(rels))


def calibration_judgement(gains: list[dict], spread: dict) -> dict:
    """Does calibration beat round-to-nearest? gains: one {text: {value, lo, hi}} per calibration draw (the
    calibrated arm's rel against its round-to-nearest twin; negative = better); spread: {text: lottery spread}.

    ACCEPTED  every draw's CI lies below -spread on every text (clears zero and the lottery);
    WORSE     some draw's CI lies above +spread on some text;
    NOT SHOWN otherwise. Needs >= 3 draws.
    """
    if len(gains) < 3:
        raise ValueError(f"calibration is judged over at least 3 calibration draws, got {len(gains)}")
    for g in gains:
        if set(g) != set(spread):
            raise ValueError(f"every draw needs a gain on the texts of the lottery {sorted(spread)}, got {sorted(g)}")
    worse = [(i, t) for i, g in enumerate(gains) for t, c in g.items() if c["lo"] > spread[t]]
    if worse:
        return {"verdict": "WORSE", "reasons": [f"draw {i}, {t}: the gain's CI lies above the lottery spread "
                                                f"+{spread[t]:.3%}" for i, t in worse]}
    short = [(i, t) for i, g in enumerate(gains) for t, c in g.items() if not c["hi"] < -spread[t]]
    if not short:
        return {"verdict": "ACCEPTED",
                "reasons": [f"all {len(gains)} draws beat round-to-nearest beyond the lottery spread on every text"]}
    return {"verdict": "NOT SHOWN",
            "reasons": [f"draw {i}, {t}: CI [{gains[i][t]['lo']:+.3%}, {gains[i][t]['hi']:+.3%}] does not clear "
                        f"-{spread[t]:.3%} (zero and the lottery)" for i, t in short]}
