"""Paired bootstrap confidence intervals and the gate's rules.

Shape legend: T = scored tokens of a text, D = documents, Bs = bootstrap resamples.

Every figure compares two models on the same tokens, so the uncertainty is paired: resample documents with
replacement (the same resamples for every arm of a text: seeded), recompute the figure on each resample, and
take the 2.5th / 97.5th percentiles. Documents, not tokens, are the unit: tokens of one document are
correlated (same speaker, same chapter), and resampling tokens would make the interval too narrow. Pairing
removes the variance two arms share (which documents are hard for both); the interval of a paired difference
estimates what remains, the text-sampling noise of that difference over documents, as if documents were
independent: resampling is i.i.d. over documents, so where neighbouring documents are correlated (consecutive parts
of one work) or works vary among themselves, the interval is too narrow.

Figures (arm a against reference r, over the tokens of one text):
    rel    = exp(mean(nll_a - nll_r)) - 1 = ppl_a / ppl_r - 1     (relative perplexity change)
    kl     = mean KL(source ‖ a);  kl_p99 = its 99th percentile;  top1 = mean agreement of arg-max tokens

The gate is one-sided in rel (an arm may not lose more than the budget); an arm whose CI lies wholly below
zero scores a lower perplexity than its source on that text, which says it moved, not that it is better: KL(source ‖ a)
with its CI, reported beside every verdict, is how far it moved either way.

Calibration (is GPTQ's paired change against round-to-nearest beyond what a dithered re-rounding, a lottery
ticket, gives?) is a test with a stated error rate: CALIBRATION_RULE, `calibration_judgement`. Its null is that a
draw is exchangeable with the tickets at their dither amplitude, which is narrower than "calibration buys nothing
beyond rounding luck": a draw that gains nothing but moves more codes than the dither may spread wider than a ticket
(not measured: a draw's spread is not estimated), and the test then calls it helpful more often than alpha (the rule
text says so). The rounding band of the lottery tickets is drawn
with the uncertainty of its own edges (`rounding_band`).
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
              seed: int = 0, level: float = LEVEL, p99: bool = True) -> dict:
    """Point values and percentile CIs of rel (x against reference y, both per-token nll [T]) and, when
    given, of mean kl [T], its 99th percentile (unless p99 is False) and mean top1 [T]; doc int [T] is each
    token's document (any ids: a subset of a text's documents is fine).

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
        if p99:
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
    half-width shrinks as 1/√tokens (the extra tokens coming as more independent documents like these); None
    when it already does, or when the change sits on the budget."""
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
    lies wholly below zero: the arm scored a lower perplexity than its source there, not a better model; see KL for
    how far it moved]}.
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
    # The reason names only the point-estimate condition; the plug-in also assumes the half-width shrinks as
    # 1/√tokens, i.e. more independent documents like these (`tokens_to_decide`).
    need = {t: tokens_to_decide(c["rel"], c["tokens"], budget) for t, c in open_.items()}
    return {"verdict": "UNDECIDED", "tokens_needed": need, "below_source": below,
            "reasons": [f"{t}: {c['rel']['value']:+.3%} [{c['rel']['lo']:+.3%}, {c['rel']['hi']:+.3%}] straddles the "
                        f"budget {budget:.2%}; plug-in: at about {need[t] or 'an unbounded number of'} held-out tokens a "
                        "sample would decide it about half the time, if the change stayed at its point estimate"
                        for t, c in open_.items()]}


MIN_DRAWS = 3           # calibration is judged over at least this many calibration draws
MIN_BAND_TICKETS = 2    # the rounding band is drawn from at least this many lottery tickets
MIN_TICKETS = 16        # calibration is judged against at least this many (why: `calibration_judgement`)
ROUNDING_Q = 0.05       # the rounding band: quantiles ROUNDING_Q and 1 - ROUNDING_Q of ticket - RTN
ALPHA = 0.05            # the calibration test's error rate

CALIBRATION_RULE = (
    "Per text, each arm's figure is x = log(ppl_arm / ppl_RTN): the token-weighted mean of its per-document paired "
    "nll differences to the round-to-nearest twin, on the same documents. Null hypothesis for a calibration draw: "
    "it is exchangeable with the lottery tickets (dithered round-to-nearest re-packs). This is narrower than "
    "'calibration buys nothing beyond rounding luck': a draw that gains nothing but moves more codes than the "
    "dither may spread wider than a ticket, and the test then calls it helpful more often than alpha. Test: the prediction t statistic t = (x_draw - mean x_tickets) / "
    "(sd x_tickets * sqrt(1 + 1/K)) over K tickets, Student t with K - 1 degrees of freedom (tickets' x normal); "
    "one-sided p_helps = P(T <= t), p_hurts = P(T >= t). A draw HELPS on a text when p_helps <= alpha. "
    "ACCEPTED: every draw helps on every text (intersection-union test: if any draw on any text is "
    "exchangeable with the tickets and the tickets' x are normal, ACCEPTED comes out with probability at most "
    "alpha; a draw that gains nothing but spreads wider than a ticket passes more often). WORSE: some (draw, text) has a "
    "Holm-adjusted p_hurts <= alpha over all draws x texts (family-wise error at most alpha under the same "
    "null; a draw that gains nothing but spreads wider than a ticket is called WORSE more often too). NOT SHOWN: "
    f"otherwise. alpha = {ALPHA}; at least {MIN_DRAWS} draws and {MIN_TICKETS} tickets. The exact rank "
    "p-value (1 + tickets at or beyond the draw) / (K + 1), free of the normal assumption, is reported beside it.")


def t_cdf(t: np.ndarray, nu: int) -> np.ndarray:
    """Student t CDF with nu (int >= 1) degrees of freedom, float64, elementwise; closed form by the parity of
    nu (Abramowitz & Stegun 26.7.3-4), exact to rounding."""
    t = np.asarray(t, np.float64)
    th = np.arctan(np.abs(t) / math.sqrt(nu))
    c2, s = np.cos(th) ** 2, np.sin(th)
    if nu % 2 == 0:
        term, acc = np.ones_like(th), np.ones_like(th)
        for k in range(1, nu // 2):
            term = term * c2 * (2 * k - 1) / (2 * k)
            acc = acc + term
        a = s * acc
    else:
        acc = np.zeros_like(th)
        if nu > 1:
            term = np.ones_like(th)
            acc = term.copy()
            for k in range(1, (nu - 1) // 2):
                term = term * c2 * (2 * k) / (2 * k + 1)
                acc = acc + term
        a = 2 / math.pi * (th + s * np.cos(th) * acc)
    return 0.5 + 0.5 * np.sign(t) * a


def prediction_p(x_draw, x_tickets) -> tuple[np.ndarray, np.ndarray]:
    """(p_helps, p_hurts) of draws x_draw [...] against tickets x_tickets [..., K] (same leading shape or
    broadcastable): the one-sided prediction t test of CALIBRATION_RULE. ValueError when the tickets do not
    spread (sd 0)."""
    x, tk = np.asarray(x_draw, np.float64), np.asarray(x_tickets, np.float64)
    K = tk.shape[-1]
    sd = tk.std(-1, ddof=1)
    if (sd <= 0).any():
        raise ValueError("the lottery tickets must spread (standard deviation > 0) to judge a draw against them")
    t = (x - tk.mean(-1)) / (sd * math.sqrt(1 + 1 / K))
    return t_cdf(t, K - 1), t_cdf(-t, K - 1)


def holm(p) -> list[float]:
    """Holm step-down adjusted p-values (family-wise error control) of a flat list, in its order."""
    p = np.asarray(p, np.float64)
    m, order = p.size, np.argsort(p, kind="stable")
    adj = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adj
    return out.tolist()


def _binom_cdf(k: int, n: int, q: float) -> float:
    return sum(math.comb(n, j) * q ** j * (1 - q) ** (n - j) for j in range(0, k + 1)) if k >= 0 else 0.0


def quantile_ci(values, q: float, level: float = LEVEL) -> list:
    """Distribution-free CI [lo, hi] of the q quantile from order statistics: with B ~ Binomial(n, q), lo is the
    r-th smallest value for the largest r with P(B < r) <= (1 - level) / 2, hi the s-th for the smallest s with
    P(B >= s) <= (1 - level) / 2; None where no order statistic qualifies (the bound lies beyond the smallest /
    largest value: too few values to bound that side)."""
    v, n, a = sorted(float(x) for x in values), len(values), (1 - level) / 2
    r = max(j for j in range(n + 1) if _binom_cdf(j - 1, n, q) <= a)
    s = min([j for j in range(1, n + 1) if 1 - _binom_cdf(j - 1, n, q) <= a] or [n + 1])
    return [v[r - 1] if r >= 1 else None, v[s - 1] if s <= n else None]


def rounding_band(ticket_rels: list[float], q: float = ROUNDING_Q, level: float = LEVEL) -> dict:
    """The (lottery ticket - round-to-nearest) paired relative changes of one text, each on every document:
    {"values", "lo": their q quantile, "hi": their 1 - q quantile (linear interpolation), "q", "level",
    "lo_ci", "hi_ci": each edge's distribution-free `quantile_ci` (None: unbounded on that side)}. How far
    perplexity moves under a rounding change alone; a picture with its own uncertainty, not a threshold
    (the calibration test is `calibration_judgement`)."""
    v = [float(x) for x in ticket_rels]
    if len(v) < MIN_BAND_TICKETS or not all(math.isfinite(x) for x in v):
        raise ValueError(f"the rounding band needs at least {MIN_BAND_TICKETS} finite ticket - RTN changes, got {v}")
    if not 0 < q < 0.5:
        raise ValueError(f"q must be in (0, 0.5), got {q!r}")
    lo, hi = np.quantile(v, [q, 1 - q])
    return {"values": v, "lo": float(lo), "hi": float(hi), "q": q, "level": level,
            "lo_ci": quantile_ci(v, q, level), "hi_ci": quantile_ci(v, 1 - q, level)}


def calibration_judgement(draws: list[dict], tickets: dict, alpha: float = ALPHA) -> dict:
    """Does a calibration draw lie beyond the lottery tickets (null: exchangeable with them)? draws: one
    {text: {"value": rel, ...}} per calibration draw, its paired relative change against the round-to-nearest
    twin on the same documents (negative = better);
    tickets: {text: [rel per lottery ticket]}, the tickets' changes against the same twin. The rule is
    CALIBRATION_RULE, a test at error rate alpha.

    Why whole arms and not documents: a ticket's rounding luck is shared by every document it scores, so
    the per-document differences of one arm are correlated; permuting documents between arms would make the
    null spread too narrow and the test too eager. Why MIN_TICKETS = 16: the tickets' sd, the test's yardstick,
    then has a relative standard error of about 1/sqrt(2 (K - 1)) = 18 % (a 95 % interval for the true sd still
    spans about 0.74-1.55 times the sample sd; the t distribution with K - 1 degrees of freedom allows for it).
    The exact rank p-value reported beside the test is no reason for 16: its smallest value is 1 / (K + 1), 0.059
    at 16 tickets, so it can reach 5 % only from 19.
    Returns {"verdict", "reasons", "rule", "alpha", "tickets": K, "texts": {text: {"p_helps", "p_hurts",
    "p_hurts_holm", "rank_p_helps", "rank_p_hurts", "helps", "hurts": one per draw}}}. ValueError for fewer
    than MIN_DRAWS draws or MIN_TICKETS tickets, texts that do not match, or tickets that do not spread.
    """
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")
    if len(draws) < MIN_DRAWS:
        raise ValueError(f"calibration is judged over at least {MIN_DRAWS} calibration draws, got {len(draws)}")
    for g in draws:
        if set(g) != set(tickets):
            raise ValueError(f"every draw needs a change on the texts of the tickets {sorted(tickets)}, got {sorted(g)}")
    for t, v in tickets.items():
        if len(v) < MIN_TICKETS:
            raise ValueError(f"calibration is judged against at least {MIN_TICKETS} lottery tickets, got {len(v)} on "
                             f"{t!r}: with fewer the tickets' spread and the rank p-value are too coarse for a "
                             f"{alpha:.0%} test (int4lab.gate.stats.calibration_judgement)")
    texts = {}
    for t, v in tickets.items():
        xk = np.log1p(np.asarray(v, np.float64))
        xd = np.log1p(np.array([g[t]["value"] for g in draws], np.float64))
        ph, pu = prediction_p(xd, xk[None, :])
        K = len(xk)
        texts[t] = {"p_helps": ph.tolist(), "p_hurts": pu.tolist(),
                    "rank_p_helps": [(1 + int((xk <= x).sum())) / (K + 1) for x in xd],
                    "rank_p_hurts": [(1 + int((xk >= x).sum())) / (K + 1) for x in xd],
                    "helps": [bool(p <= alpha) for p in ph]}
    flat = [(t, i) for t in texts for i in range(len(draws))]
    adj = holm([texts[t]["p_hurts"][i] for t, i in flat])
    for t in texts:
        texts[t]["p_hurts_holm"] = [adj[flat.index((t, i))] for i in range(len(draws))]
        texts[t]["hurts"] = [bool(p <= alpha) for p in texts[t]["p_hurts_holm"]]
    out = {"rule": CALIBRATION_RULE, "alpha": alpha, "tickets": min(len(v) for v in tickets.values()), "texts": texts}
    hurt = [(i, t) for t, i in flat if texts[t]["hurts"][i]]
    if hurt:
        return {"verdict": "WORSE", **out, "reasons": [
            f"draw {i}, {t}: (draw - RTN) {draws[i][t]['value']:+.3%} lies above the tickets: Holm-adjusted "
            f"p_hurts {texts[t]['p_hurts_holm'][i]:.3g} <= {alpha}" for i, t in hurt]}
    short = [(i, t) for t, i in flat if not texts[t]["helps"][i]]
    if not short:
        return {"verdict": "ACCEPTED", **out, "reasons": [
            f"all {len(draws)} draws beat the lottery tickets on every text at alpha {alpha} "
            f"(largest p_helps {max(max(v['p_helps']) for v in texts.values()):.3g})"]}
    return {"verdict": "NOT SHOWN", **out, "reasons": [
        f"draw {i}, {t}: (draw - RTN) {draws[i][t]['value']:+.3%}, p_helps {texts[t]['p_helps'][i]:.3g} > {alpha}"
        for i, t in short]}
