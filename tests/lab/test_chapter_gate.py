"""lab.chapters.gate_study: chapter 04's comparison of a live re-run with a receipt, at a stated tolerance, run
here at a small setting (the chapter runs it in full only), and its re-derivations of the receipt's rules."""
import pytest

from int4lab import gate
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
