"""The perplexity gate: windows, the paired bootstrap and its coverage, the verdict rule on synthetic
per-token arrays, the lottery and calibration rules, the kernel-parity check, a whole run, the CLI."""
import json
import math

import numpy as np
import pytest
import torch

from int4lab import gate
from int4lab.quantize import quantize_model

from test_quantize import tiny_model


@pytest.fixture(scope="module")
def tok():
    from int4lab.models.tokenizer import load_tokenizer
    return load_tokenizer()


def tiny_lm(arch="mixtral", dtype=torch.float32, seed=0):
    return tiny_model(arch, seed=seed, vocab=4096, dtype=dtype)


def synthetic(rng, delta, docs=60, sd_doc=0.02, sd_tok=0.5):
    """Per-token nll of a source and an arm on `docs` documents of 100-300 tokens: the arm's nll is the
    source's + log(1 + delta) + a document effect (sd_doc) + token noise (sd_tok)."""
    n = rng.integers(100, 300, docs)
    doc = np.repeat(np.arange(docs), n)
    src = rng.gamma(2.0, 2.0, doc.size)
    arm = src + math.log1p(delta) + rng.normal(0, sd_doc, docs)[doc] + rng.normal(0, sd_tok, doc.size)
    return arm, src, doc


# ---------------------------------------------------------------------------------------------- texts

def test_windows_score_every_token_after_each_documents_first_once(tok):
    docs = gate.documents("ood")[:3]
    w = gate.Windows(tok, docs, 64)
    lens = [len(tok(d, add_special_tokens=False, verbose=False)["input_ids"]) for d in docs]
    assert w.tokens == sum(n - 1 for n in lens) and w.ids.shape[1] == 65
    assert int(w.scored_mask().sum()) == w.tokens
    for d, n in enumerate(lens):                       # the windows of a document rebuild it
        rows = w.ids[w.doc == d]
        k = w.n[w.doc == d]
        ids = [int(rows[0, 0])] + [int(t) for r, m in zip(rows, k) for t in r[1:m]]
        assert ids == tok(docs[d], add_special_tokens=False, verbose=False)["input_ids"]
    sub = w.subset(2)
    assert set(sub.doc.tolist()) == {0, 2} and sub.docs == 2
    with pytest.raises(ValueError, match="window must be a positive int"):
        gate.Windows(tok, docs, 0)


def test_trained_context_comes_from_the_training_receipt():
    for arch in ("mixtral", "olmoe", "qwen3_moe"):
        assert gate.trained_context(arch) == 256
    cfg = tiny_lm().config
    assert gate.trained_context("no_such_model", cfg) == cfg.max_position_embeddings


def test_calibration_draws_differ_by_seed_and_repeat_by_seed(tok):
    stream = torch.arange(5000)
    a = gate.calibration_ids(tok, 512, 64, seed=0, stream=stream)
    assert a.shape == (8, 64) and a.dtype == torch.int64
    assert (a[:, 1:] - a[:, :-1] == 1).all()                       # consecutive tokens of the split
    assert torch.equal(a, gate.calibration_ids(tok, 512, 64, seed=0, stream=stream))
    assert not torch.equal(a, gate.calibration_ids(tok, 512, 64, seed=1, stream=stream))
    with pytest.raises(ValueError, match="tokens .* must be at least seq_len"):
        gate.calibration_ids(tok, 32, 64, stream=stream)
    with pytest.raises(ValueError, match="fewer than the 8192 asked for"):
        gate.calibration_ids(tok, 8192, 64, stream=stream)


# ---------------------------------------------------------------------------------------------- statistics

def test_paired_ci_by_hand_and_seeded():
    rng = np.random.default_rng(0)
    arm, src, doc = synthetic(rng, 0.01)
    ci = gate.paired_ci(arm, src, doc, kl=np.abs(arm - src), top1=arm > src, n_boot=500, seed=1)
    assert math.isclose(ci["rel"]["value"], math.expm1((arm - src).mean()), rel_tol=1e-12)
    assert ci["rel"]["lo"] < ci["rel"]["value"] < ci["rel"]["hi"]
    assert math.isclose(ci["kl_p99"]["value"], np.quantile(np.abs(arm - src), 0.99))
    assert ci["tokens"] == arm.size and ci["docs"] == 60
    assert ci == gate.paired_ci(arm, src, doc, kl=np.abs(arm - src), top1=arm > src, n_boot=500, seed=1)
    assert ci["rel"] != gate.paired_ci(arm, src, doc, n_boot=500, seed=2)["rel"]
    with pytest.raises(ValueError, match="n_boot must be an int >= 100"):
        gate.paired_ci(arm, src, doc, n_boot=10)
    with pytest.raises(ValueError, match="equal-length"):
        gate.paired_ci(arm[:5], src, doc)


def test_bootstrap_covers_the_truth():
    # 200 seeded synthetic texts with a known relative change of +0.5%: the 95% CI must cover it in
    # about 95% of them (percentile bootstrap over 60 documents: a little under; >= 90% required).
    covered = 0
    for trial in range(200):
        rng = np.random.default_rng(1000 + trial)
        arm, src, doc = synthetic(rng, 0.005)
        # the truth of this population: document effects and token noise have mean zero
        r = gate.paired_ci(arm, src, doc, n_boot=400, seed=trial)["rel"]
        covered += r["lo"] <= 0.005 <= r["hi"]
    assert 0.90 <= covered / 200 <= 0.99, covered


def _cis(**rels):
    rng = np.random.default_rng(7)
    out = {}
    for t, d in rels.items():
        arm, src, doc = synthetic(rng, d, docs=80, sd_doc=0.01, sd_tok=0.3)
        out[t] = gate.paired_ci(arm, src, doc, n_boot=500, seed=0)
    return out


def test_verdict_pass_fail_undecided_on_synthetic_per_token_arrays():
    v = gate.verdict(_cis(test=0.002, ood=-0.003), 0.01)
    assert v["verdict"] == "PASS" and not v["tokens_needed"]
    v = gate.verdict(_cis(test=0.002, ood=0.03), 0.01)
    assert v["verdict"] == "FAIL" and "ood" in v["reasons"][0]
    cis = _cis(test=0.002, ood=0.0095)
    assert cis["ood"]["rel"]["lo"] < 0.01 < cis["ood"]["rel"]["hi"]
    v = gate.verdict(cis, 0.01)
    assert v["verdict"] == "UNDECIDED" and set(v["tokens_needed"]) == {"ood"}
    need = v["tokens_needed"]["ood"]
    assert need > cis["ood"]["tokens"]                        # it needs more text than it had
    r = cis["ood"]["rel"]
    h, m = (r["hi"] - r["lo"]) / 2, abs(r["value"] - 0.01)
    assert math.isclose(need, cis["ood"]["tokens"] * (h / m) ** 2, rel_tol=1e-6, abs_tol=1)


def test_verdict_and_tokens_to_decide_edges():
    one = {"t": {"rel": {"value": 0.01, "lo": 0.0, "hi": 0.02}, "tokens": 1000}}
    assert gate.verdict(one, 0.01)["verdict"] == "UNDECIDED"
    assert gate.tokens_to_decide(one["t"]["rel"], 1000, 0.01) is None         # sits on the budget
    assert gate.tokens_to_decide({"value": 0.0, "lo": -0.01, "hi": 0.005}, 1000, 0.01) is None
    assert gate.tokens_to_decide({"value": 0.005, "lo": 0.0, "hi": 0.02}, 1000, 0.01) == 4000
    with pytest.raises(ValueError, match="budget must be a positive"):
        gate.verdict(one, 0)
    with pytest.raises(ValueError, match="budget must be a positive"):
        gate.verdict(one, -0.01)
    with pytest.raises(ValueError, match="cis must hold at least one text"):
        gate.verdict({}, 0.01)
    with pytest.raises(ValueError, match="lo <= value <= hi"):
        gate.verdict({"t": {"rel": {"value": 0.0, "lo": 0.1, "hi": 0.2}, "tokens": 1}}, 0.01)


def test_lottery_spread_and_calibration_judgement():
    assert gate.lottery_spread([0.010, 0.012, 0.007]) == pytest.approx(0.005)
    with pytest.raises(ValueError, match="at least two packs"):
        gate.lottery_spread([0.01])
    spread = {"test": 0.002, "ood": 0.003}
    g = lambda lo, hi: {"value": (lo + hi) / 2, "lo": lo, "hi": hi}             # noqa: E731
    better = {"test": g(-0.01, -0.005), "ood": g(-0.012, -0.004)}
    assert gate.calibration_judgement([better] * 3, spread)["verdict"] == "ACCEPTED"
    # clears zero but not the lottery on one text of one draw
    short = {"test": g(-0.01, -0.005), "ood": g(-0.004, -0.001)}
    j = gate.calibration_judgement([better, short, better], spread)
    assert j["verdict"] == "NOT SHOWN" and "draw 1, ood" in j["reasons"][0]
    worse = {"test": g(0.004, 0.01), "ood": g(-0.012, -0.004)}
    assert gate.calibration_judgement([better, better, worse], spread)["verdict"] == "WORSE"
    with pytest.raises(ValueError, match="at least 3 calibration draws"):
        gate.calibration_judgement([better] * 2, spread)
    with pytest.raises(ValueError, match="texts of the lottery"):
        gate.calibration_judgement([{"test": better["test"]}] * 3, spread)


def test_plan_arms():
    arms = gate.plan_arms(["rtn", "gptq"], ["experts"], ["int8"], lottery=2, calib_draws=3)
    assert [a.name for a in arms] == ["rtn/experts/W4A8", "rtn/experts/W4A8 lottery#1", "rtn/experts/W4A8 lottery#2",
                                      "gptq/experts/W4A8 draw#0", "gptq/experts/W4A8 draw#1",
                                      "gptq/experts/W4A8 draw#2"]
    assert {a.twin for a in arms} == {"rtn/experts/W4A8"}
    assert [a.kind for a in arms] == ["rtn", "lottery", "lottery", "gptq", "gptq", "gptq"]
    with pytest.raises(ValueError, match="calib_draws must be an int >= 1"):
        gate.plan_arms(calib_draws=0)


# ---------------------------------------------------------------------------------------------- instruments

@pytest.mark.parametrize("arch", ["olmoe"])
def test_score_models_equals_one_forward_per_window(arch, tok):
    win = gate.Windows(tok, [gate.documents("test")[0][:1500]], 48)
    m = tiny_lm(arch)
    q, _ = quantize_model(tiny_lm(arch), "rtn", "experts+attn", "int8", progress=False)
    per = gate.score_models({"source": m, "q": q}, win, batch=3)
    assert per["source"].nll.size == win.tokens and (per["source"].kl == 0).all()
    with torch.no_grad():                                   # window 1 alone, no batching, no padding
        ids = win.ids[1:2, :win.n[1]]
        lp_s = torch.log_softmax(m(ids[:, :-1]).logits.float(), -1)[0]
        lp_q = torch.log_softmax(q(ids[:, :-1]).logits.float(), -1)[0]
    off = int(win.n[0]) - 1
    k = int(win.n[1]) - 1
    nll = -lp_s.gather(-1, ids[0, 1:, None])[:, 0]
    assert np.allclose(per["source"].nll[off:off + k], nll.double().numpy(), atol=2e-4)
    kl = (lp_s.exp() * (lp_s - lp_q)).sum(-1)
    assert np.allclose(per["q"].kl[off:off + k], kl.double().numpy(), atol=2e-3)
    assert per["q"].kl.mean() > 1e-4


@pytest.mark.parametrize("arch", ["qwen3_moe"])
def test_decode_parity_through_the_kernels(arch, tok):
    # The decode instrument (KV cache, the int4 kernels in Triton's interpreter) against the full forward
    # of the same quantised model, within the stated tolerance; and the source's cache path to fp32 rounding.
    wins = gate.decode_windows(tok, gate.documents("ood")[2], windows=1, prompt=4, steps=2)
    m = tiny_lm(arch)
    assert (gate.decode_logprobs(m, wins, 4) - gate.full_forward_logprobs(m, wins, 4)).abs().max() < 1e-4
    q, _ = quantize_model(m, "rtn", "experts+attn", "int8", progress=False)
    p = gate.parity(q, wins, 4)
    assert p["kernels"] and p["steps"] == 2 and p["max_abs_logprob"] <= gate.PARITY_TOL
    assert all(mod.kernels is None for mod in q.modules() if hasattr(mod, "kernels"))      # switch restored


# ---------------------------------------------------------------------------------------------- a whole run

def short_documents(mp, chars=400):
    """Score only the first `chars` characters of each document: the gate needs MIN_DOCS documents per text,
    and ten short ones cost what one whole document did."""
    import int4lab.gate.run as gate_run
    mp.setattr(gate_run, "documents", lambda split: [d[:chars] for d in gate.documents(split)])


@pytest.fixture(scope="module")
def payload(tok):
    arms = gate.plan_arms(["rtn", "gptq"], lottery=1, calib_draws=3)
    with pytest.MonkeyPatch.context() as mp:
        short_documents(mp)
        return gate.run_gate("tiny", arms, window=32, max_docs=gate.MIN_DOCS, n_boot=200, calib_tokens=256,
                             calib_len=32, calib_split="validation", min_rows=8, subset_stride=1, floor_stride=1,
                             parity_steps=0, progress=False, loader=lambda dt: (tiny_lm("mixtral", dt), tok, "tiny"))


def test_run_gate_payload(payload):
    assert set(payload["arms"]) == {a.name for a in gate.plan_arms(["rtn", "gptq"], lottery=1, calib_draws=3)}
    for name, a in payload["arms"].items():
        assert set(a["texts"]) == {"test", "ood"}
        for t, c in a["texts"].items():
            assert c["rel"]["lo"] <= c["rel"]["value"] <= c["rel"]["hi"]
            full = a["scored"] == "every document"
            assert c["tokens"] == (payload["texts"][t]["tokens"] if full else payload["texts"][t]["subset_tokens"])
        assert a["verdict"] == gate.verdict(a["texts"], payload["budget"])
    assert payload["arms"]["gptq/experts/W4A8 draw#0"]["scored"] == "every document"
    assert payload["settings"]["subset_stride"] == 1 and payload["texts"]["test"]["subset_tokens"] == \
        payload["texts"]["test"]["tokens"]
    rep = payload["arms"]["gptq/experts/W4A8 draw#0"]["quant_report"]
    assert rep["gptq_experts"] + len(rep["fallback"]) == 2 * 8 and len(rep["rows"]) == 2
    lot = payload["lottery"]["rtn/experts/W4A8"]
    for t, v in lot["texts"].items():
        assert len(v["rel"]) == 2 and v["spread"] == pytest.approx(max(v["rel"]) - min(v["rel"]))
    cal = payload["calibration"]["gptq/experts/W4A8"]
    assert cal["judgement"]["verdict"] in ("ACCEPTED", "NOT SHOWN", "WORSE") and len(cal["gains"]) == 3
    assert payload["floor"]["texts"]["test"]["rel"]["value"] != 0


def test_lottery_is_deterministic_by_seed(payload, tok):
    # the same seed re-packs the same bytes, another seed other bytes; and the receipt's ticket is reproduced
    ticket = lambda s: quantize_model(tiny_lm("mixtral"), dither=gate.DITHER, dither_seed=s,  # noqa: E731
                                      progress=False)[0]
    t1 = ticket(1)
    assert torch.equal(t1.model.layers[0].mlp.experts.down_packed, ticket(1).model.layers[0].mlp.experts.down_packed)
    assert not torch.equal(t1.model.layers[0].mlp.experts.down_packed,
                           ticket(2).model.layers[0].mlp.experts.down_packed)
    win = gate.Windows(tok, [d[:400] for d in gate.documents("ood")[:gate.MIN_DOCS]], 32)      # short_documents
    per = gate.score_models({"source": tiny_lm("mixtral"), "t": t1}, win)
    got = gate.paired_ci(per["t"].nll, per["source"].nll, per["source"].doc, n_boot=200)["rel"]["value"]
    assert got == pytest.approx(payload["arms"]["rtn/experts/W4A8 lottery#1"]["texts"]["ood"]["rel"]["value"],
                                abs=1e-6)


def test_tables(payload, tmp_path):
    text = gate.format_table(payload)
    head = text.splitlines()[0].split()
    assert head[:5] == ["arm", "text", "tokens", "ppl", "Δ%"] and head[-3:] == ["KL", "top-1", "verdict"]
    for name, a in payload["arms"].items():
        assert any(line.startswith(name + " ") and line.rstrip().endswith(a["verdict"]["verdict"])
                   for line in text.splitlines())
    assert "lottery of rtn/experts/W4A8 (1 dithered re-packs)" in text
    (tmp_path / "gate_tiny.json").write_text(json.dumps({"provenance": {}, **payload}))
    md = gate.render_gate_table(tmp_path)
    assert md.splitlines()[0].startswith("| model | arm | Δ ppl test [95% CI] | Δ ppl ood [95% CI] | verdict")
    assert len([x for x in md.splitlines() if x.startswith("| tiny |")]) == 1 + len(payload["arms"]) + 1
    with pytest.raises(FileNotFoundError, match="no gate_"):
        gate.render_gate_table(tmp_path / "empty")


# ---------------------------------------------------------------------------------------------- the CLI

def test_cli_runs_a_checkpoint_dir_and_prints_one_table(tmp_path, tok, capsys, monkeypatch):
    short_documents(monkeypatch)
    ckpt = tmp_path / "ckpt"
    tiny_lm("olmoe").save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    out = tmp_path / "r.json"
    rc = gate.main(["--model", str(ckpt), "--window", "32", "--max-docs", "10", "--subset-stride", "1", "--lottery",
                    "1", "--boot", "200", "--parity-steps", "0", "--no-floor", "--quiet", "--texts", "ood", "--out",
                    str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and text.splitlines()[0].startswith("arm")
    assert "rtn/experts/W4A8 lottery#1" in text and f"receipt: {out}" in text
    r = json.loads(out.read_text())
    assert r["provenance"]["command"].startswith("python -m int4lab.gate --model")
    assert r["settings"]["window"] == 32 and list(r["texts"]) == ["ood"]


def test_cli_errors(tmp_path, capsys):
    assert gate.main(["--model", str(tmp_path / "no_such_checkpoint")]) == 2
    assert "neither a tiny model name" in capsys.readouterr().err
    tiny_model("llama").config.save_pretrained(tmp_path / "llama")
    assert gate.main(["--model", str(tmp_path / "llama")]) == 2
    assert "unsupported architecture 'llama'" in capsys.readouterr().err
    for b in ("0", "-0.01"):
        assert gate.main(["--model", "mixtral", "--budget", b]) == 2
        assert "budget must be a positive" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gate.main(["--model", "mixtral", "--scheme", "awq"])
    with pytest.raises(FileNotFoundError, match="neither a tiny model name"):
        gate.load_model(str(tmp_path / "no_such_checkpoint"))


def test_missing_corpus_file(tmp_path, monkeypatch):
    import int4lab.corpus as C
    monkeypatch.setattr(C, "CORPUS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="ood.txt is missing"):
        gate.documents("ood")
