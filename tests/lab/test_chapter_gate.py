"""lab.chapters.gate_study: chapter 04's comparison of a live re-run with a receipt, at a stated tolerance, run
here at a small setting (the chapter runs it in full only), and its re-derivations of the receipt's rules."""
import pytest

from int4lab import gate
from int4lab.gate.texts import split_ids
from lab.chapters import gate_study as gs

from test_gate import short_documents, tiny_lm


@pytest.fixture(scope="module")
def tok():
    from int4lab.models.tokenizer import load_tokenizer
    return load_tokenizer()


def test_reproduces_is_a_fraction_of_the_half_width():
    receipt = {"value": 0.013245, "lo": 0.011233, "hi": 0.015279}
    # a re-run on another x86 CPU: float32 sums in another order move each number by ~2e-5
    other_cpu = {"value": 0.013223, "lo": 0.011207, "hi": 0.015249}
    got = gs.reproduces(other_cpu, receipt)
    assert got["ok"] and got["tolerance"] == pytest.approx(0.05 * (0.015279 - 0.011233) / 2)
    assert got["max_diff"] == pytest.approx(3.0e-5)
    assert not gs.reproduces(other_cpu, receipt, fraction=0.01)["ok"]            # 1e-5 would refuse it
    moved = {k: v + 0.2 * (receipt["hi"] - receipt["lo"]) / 2 for k, v in receipt.items()}
    assert not gs.reproduces(moved, receipt)["ok"]                               # a fifth of the half-width: refused
    with pytest.raises(ValueError, match="fraction must be in"):
        gs.reproduces(receipt, receipt, fraction=0)


def test_rerun_ticket_reproduces_a_small_gate_run(tok, monkeypatch):
    short_documents(monkeypatch)
    arms = gate.plan_arms(["rtn"], lottery=1, calib_draws=1)
    p = gate.run_gate("tiny", arms, window=32, max_docs=2 * gate.MIN_DOCS, n_boot=200, parity_steps=0, floor=False,
                      texts=("ood",), progress=False, loader=lambda dt: (tiny_lm("mixtral", dt), tok, "tiny"))
    name = arms[1].name
    docs = [d[:400] for d in gate.documents("ood")[:2 * gate.MIN_DOCS]]
    live = gs.rerun_ticket("mixtral", p["arms"][name]["seed"], p["arms"][name]["dither"], docs, p["settings"], tok,
                           lambda a: tiny_lm(a))
    assert live["sha"] == p["texts"]["ood"]["tokens_sha"] and live["tokens"] == p["texts"]["ood"]["tokens"]
    assert gs.reproduces(live["rel"], p["arms"][name]["texts"]["ood"]["rel"])["ok"]
    # the chapter's re-derivations on the same payload
    r = {"tiny": p}
    assert gs.verdicts_rederived(r) == [] and gs.choice_again(p) == p["choice"]["chosen"] == "rtn/experts/W4A8"
    rows = gs.arm_rows(r)
    assert {x["held-out docs"] for x in rows} == {len(p["split"]["texts"]["ood"]["held_out"])} == {gate.MIN_DOCS}


def test_codes_moved_repacks_the_gate_arms(tok, monkeypatch):
    short_documents(monkeypatch)
    arms = gate.plan_arms(["rtn", "gptq"], lottery=1, calib_draws=1)
    p = gate.run_gate("tiny", arms, window=32, max_docs=2 * gate.MIN_DOCS, n_boot=100, parity_steps=0, floor=False,
                      texts=("ood",), calib_tokens=256, calib_len=32, min_rows=8, progress=False,
                      loader=lambda dt: (tiny_lm("mixtral", dt), tok, "tiny"))
    got = gs.codes_moved("mixtral", p, tok, split_ids(tok), lambda a: tiny_lm(a))
    assert got["fallback as in receipt"]                     # the draw re-packed as the gate packed it
    assert got["codes"] == sum(w.numel() for layer in tiny_lm().model.layers for w in layer.mlp.experts.parameters())
    assert 0.035 < got["ticket"] < 0.065                     # E|u| = 0.05 for u ~ U(-0.1, 0.1)
    assert got["gptq"] > got["ticket"]
    p["settings"]["calib_split"] = "validation"
    with pytest.raises(ValueError, match="train split"):
        gs.codes_moved("mixtral", p, tok, None, lambda a: tiny_lm(a))


def _normal_order_mean(r: int, n: int) -> float:
    """E[X_(r)] of n standard normal values (1-based r), by fp64 quadrature of the order statistic's density."""
    import math

    import numpy as np
    x = np.linspace(-12, 12, 200_001)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    pdf = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    c = math.factorial(n) / (math.factorial(r - 1) * math.factorial(n - r))
    return float(np.trapezoid(x * c * cdf ** (r - 1) * (1 - cdf) ** (n - r) * pdf, x))


@pytest.mark.parametrize("k, q", [(16, 0.05), (11, 0.1)])
def test_normal_ticket_facts_against_order_statistics(k, q):
    """The simulated band edge matches the expectation of np.quantile's linear interpolation between order
    statistics; the sd interval covers the true sd 95 % of the time on fresh sets; bad arguments are refused."""
    import numpy as np
    nf = gs.normal_ticket_facts(k, q, samples=50_000, seed=1)
    h = (k - 1) * q                                  # np.quantile's 0-based position of the q quantile
    j, f = int(h), h - int(h)
    want = -((1 - f) * _normal_order_mean(j + 1, k) + f * _normal_order_mean(j + 2, k))
    assert nf["mean edge"] == pytest.approx(want, abs=0.01)
    assert nf["width ratio"] == pytest.approx(want / nf["true edge"], abs=0.01) and nf["width ratio"] < 1
    assert 0 < nf["lower beyond"] < 0.5 and 0 < nf["upper beyond"] < 0.5
    assert nf["sd rse"] == pytest.approx((2 * (k - 1)) ** -0.5)
    ratio = 1 / np.random.default_rng(2).standard_normal((50_000, k)).std(axis=1, ddof=1)
    covered = ((ratio >= nf["sd 95% lo"]) & (ratio <= nf["sd 95% hi"])).mean()
    assert covered == pytest.approx(0.95, abs=0.005) and nf["sd 95% lo"] < 1 < nf["sd 95% hi"]
    for bad in ({"k": 1, "q": 0.05}, {"k": 16, "q": 0.5}, {"k": 16, "q": 0}):
        with pytest.raises(ValueError, match="k must be at least 2 and q in"):
            gs.normal_ticket_facts(**bad)


def test_regenerate_pins_the_cpu():
    """The regenerating command parses as the gate's flags and runs on the CPU, where the receipts were made."""
    import shlex

    from int4lab.gate.cli import parser
    args = parser().parse_args(shlex.split(gs.regenerate("olmoe"))[3:])
    assert args.device == "cpu" and args.model == "olmoe" and args.lottery == 16 and args.threads == 1
    assert args.out == "data/receipts/gate_olmoe.json"


def test_band_rows_count_the_tickets_on_either_side_of_rtn():
    """A band that contains zero can still have most tickets on one side of round-to-nearest: band_rows counts them
    (a ticket exactly at RTN is on neither side) and recomputes the stored band."""
    import numpy as np
    rng = np.random.default_rng()
    v = list(rng.normal(-0.002, 0.0015, 15)) + [0.0]
    v[:2] = [abs(x) + 1e-4 for x in v[:2]]                  # at least two tickets above RTN
    band = gate.rounding_band(v)
    r = {"lottery": {gs.RTN: {"tickets": [f"{gs.RTN} lottery#{i}" for i in range(len(v))],
                              "texts": {"test": {"values": v, "band": band}}}}}
    (row,) = gs.band_rows({"m": r})
    assert row["above RTN"] == sum(x > 0 for x in v) and row["below RTN"] == sum(x < 0 for x in v)
    assert row["above RTN"] + row["below RTN"] == len(v) - 1 and row["same again"] and row["tickets"] == len(v)
