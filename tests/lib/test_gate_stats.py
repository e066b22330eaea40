"""The gate's calibration test, the rounding band's own uncertainty and the development / held-out split, on
synthetic data with known answers: under the null (calibration draws exchangeable with the lottery tickets)
the test says "helps" about alpha of the time; a draw well beyond the tickets is found."""
import math

import numpy as np
import pytest

from int4lab import gate
from int4lab.gate import stats
from int4lab.gate.split import choose, restrict, split_documents
from int4lab.gate.score import PerToken


def arms_per_document(rng, arms, docs=40, sd_arm=0.003, sd_doc=0.002, shift=None, per_doc=False):
    """(arm - RTN) relative changes over the tokens of `docs` documents for `arms` arms: each arm's nll
    difference is its own rounding luck (sd_arm, shared by all its documents) + a per-(arm, document) part
    (sd_doc) + a per-document part all arms share; documents weighted by 100-300 tokens. shift [arms]:
    added to the arm's luck (a calibration gain: negative)."""
    n = rng.integers(100, 300, docs)
    luck = rng.normal(0, sd_arm, arms) + (0 if shift is None else np.asarray(shift))
    d = luck[:, None] + rng.normal(0, sd_doc, (arms, docs)) + rng.normal(0, sd_doc, docs)[None, :]
    return (d, n) if per_doc else np.expm1((d * n).sum(1) / n.sum())


def judge(rng, draws=3, tickets=16, shift=0.0, texts=("test", "ood"), **kw):
    g = [{} for _ in range(draws)]
    tk = {}
    for t in texts:
        v = arms_per_document(rng, draws + tickets, shift=[shift] * draws + [0.0] * tickets, **kw)
        for i in range(draws):
            g[i][t] = {"value": float(v[i])}
        tk[t] = v[draws:].tolist()
    return stats.calibration_judgement(g, tk)


def test_t_cdf_matches_scipy():
    sp = pytest.importorskip("scipy.stats")
    x = np.linspace(-8, 8, 161)
    for nu in (1, 2, 3, 7, 15, 16, 40):
        assert np.abs(stats.t_cdf(x, nu) - sp.t.cdf(x, nu)).max() < 1e-12


def test_prediction_test_false_positive_rate_is_alpha_under_the_null():
    # 6000 draws, each with its own 16 tickets, all from one distribution: P(p_helps <= 0.05) = 0.05
    rng = np.random.default_rng(11)
    x = rng.normal(0.01, 0.004, (6000, 17))
    ph, pu = stats.prediction_p(x[:, 0], x[:, 1:])
    for p in (ph, pu):
        rate = float((p <= stats.ALPHA).mean())
        assert abs(rate - stats.ALPHA) < 4 * math.sqrt(0.05 * 0.95 / 6000), rate
    assert np.allclose(ph + pu, 1)


def test_judgement_under_the_null_errs_at_most_alpha_and_finds_a_real_gain():
    rng = np.random.default_rng(5)
    runs = [judge(rng) for _ in range(800)]
    helps = np.mean([h for j in runs for v in j["texts"].values() for h in v["helps"]])
    assert abs(helps - stats.ALPHA) < 0.02                         # each single test: about alpha
    accepted = np.mean([j["verdict"] == "ACCEPTED" for j in runs])
    worse = np.mean([j["verdict"] == "WORSE" for j in runs])
    assert accepted <= stats.ALPHA and worse <= stats.ALPHA + 0.02  # the decisions: at most alpha (Holm, IUT)
    # a gain of 4 ticket standard deviations on every draw and text: found nearly always
    found = [judge(rng, shift=-0.012)["verdict"] for _ in range(200)]
    assert np.mean([v == "ACCEPTED" for v in found]) > 0.8
    assert np.mean([judge(rng, shift=+0.012)["verdict"] == "WORSE" for _ in range(100)]) > 0.9


def test_permuting_documents_between_arms_would_be_too_eager():
    # why the test's unit is the whole arm: a per-document permutation (each document's draw value swapped with a
    # random ticket's) ignores the luck an arm shares over its documents, and under the null says "helps" far
    # more often than alpha
    rng = np.random.default_rng(4)
    false = 0
    for _ in range(300):
        d, n = arms_per_document(rng, 17, per_doc=True)
        w = n / n.sum()
        x = d[0] @ w
        pick = rng.integers(0, 17, (500, d.shape[1]))
        null = (d[pick, np.arange(d.shape[1])] * w).sum(1)
        false += (1 + (null <= x).sum()) / 501 <= stats.ALPHA
    assert false / 300 > 3 * stats.ALPHA


def test_judgement_fields_rank_p_and_refusals():
    rng = np.random.default_rng(0)
    tk = {"test": list(rng.normal(0.002, 0.001, 16)), "ood": list(rng.normal(0.0, 0.001, 16))}
    below = {"test": {"value": -0.01}, "ood": {"value": -0.01}}
    j = stats.calibration_judgement([below] * 3, tk)
    assert j["verdict"] == "ACCEPTED" and j["rule"] == gate.CALIBRATION_RULE and j["alpha"] == 0.05
    assert j["texts"]["test"]["rank_p_helps"] == [1 / 17] * 3 and j["tickets"] == 16
    above = {"test": {"value": 0.01}, "ood": {"value": -0.01}}
    j = stats.calibration_judgement([below, below, above], tk)
    assert j["verdict"] == "WORSE" and j["texts"]["test"]["hurts"] == [False, False, True]
    assert j["texts"]["test"]["p_hurts_holm"][2] >= j["texts"]["test"]["p_hurts"][2]
    middle = {t: {"value": float(np.mean(v))} for t, v in tk.items()}
    j = stats.calibration_judgement([below, middle, below], tk)
    assert j["verdict"] == "NOT SHOWN" and "draw 1" in j["reasons"][0]
    with pytest.raises(ValueError, match="at least 16 lottery tickets, got 4 on 'test'"):
        stats.calibration_judgement([below] * 3, {"test": tk["test"][:4], "ood": tk["ood"]})
    with pytest.raises(ValueError, match="at least 3 calibration draws"):
        stats.calibration_judgement([below] * 2, tk)
    with pytest.raises(ValueError, match="texts of the tickets"):
        stats.calibration_judgement([{"test": below["test"]}] * 3, tk)
    with pytest.raises(ValueError, match="must spread"):
        stats.calibration_judgement([below] * 3, {"test": [0.001] * 16, "ood": tk["ood"]})


def test_holm():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5]) == [0.5]


def test_rounding_band_and_its_edges_uncertainty():
    b = gate.rounding_band([0.004, 0.001, 0.002, 0.003])
    assert (b["lo"], b["hi"]) == pytest.approx(tuple(np.quantile([0.001, 0.002, 0.003, 0.004], [0.05, 0.95])))
    assert b["lo"] > 0.001 and b["hi"] < 0.004                  # quantiles, not the range of point values
    assert b["lo_ci"] == [None, 0.002] and b["hi_ci"] == [0.003, None]   # four tickets bound one side only
    v = list(range(1, 17))
    b = gate.rounding_band(v)
    assert b["lo_ci"] == [None, 4.0] and b["hi_ci"] == [13.0, None]
    # coverage of the order-statistic interval, on fresh normal samples: at least the level
    rng = np.random.default_rng(2)
    z05 = -1.6448536269514722
    hits = 0
    for _ in range(2000):
        lo, hi = stats.quantile_ci(rng.normal(0, 1, 100), 0.05)
        hits += (lo is None or lo <= z05) and (hi is None or z05 <= hi)
    assert hits / 2000 >= 0.94
    with pytest.raises(ValueError, match="at least 2 finite"):
        gate.rounding_band([0.01])


def test_split_is_deterministic_balanced_and_refuses_small_texts():
    docs = [f"document {i}" for i in range(25)]
    s = split_documents(docs, "test")
    assert s == split_documents(docs, "test") and len(s["dev"]) == 12 and len(s["held_out"]) == 13
    assert sorted(s["dev"] + s["held_out"]) == list(range(25))
    assert split_documents(docs, "test", seed=1) != s and split_documents(docs, "ood") != s
    # a document keeps its key: removing others never moves it from held-out to development by its own hash
    assert split_documents(docs[::-1], "test")["dev"] == sorted(24 - i for i in s["dev"])
    with pytest.raises(ValueError, match="has 19 documents: a development / held-out split needs at least 20"):
        split_documents(docs[:19], "ood")
    with pytest.raises(TypeError, match="seed must be an int"):
        split_documents(docs, "test", seed="0")


def test_restrict_and_choose():
    p = PerToken(np.arange(6.0), np.zeros(6), np.ones(6, bool), np.array([0, 0, 1, 2, 2, 2]))
    r = restrict(p, [0, 2])
    assert r.doc.tolist() == [0, 0, 2, 2, 2] and r.nll.tolist() == [0, 1, 3, 4, 5]
    ci = lambda hi: {"rel": {"value": hi - 0.001, "lo": hi - 0.002, "hi": hi}}   # noqa: E731
    c = choose({"rtn": {"test": ci(0.012), "ood": ci(0.004)}, "d0": {"test": ci(0.009), "ood": ci(0.011)},
                "d1": {"test": ci(0.008), "ood": ci(0.009)}})
    assert c["chosen"] == "d1" and c["score"]["d0"] == 0.011 and c["rule"] == gate.CHOICE_RULE
