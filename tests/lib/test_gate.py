"""The perplexity gate: windows and their batches, the on-device statistics against the one-shot formula,
the paired bootstrap and its coverage, the verdict rule on synthetic per-token arrays (the calibration test,
the band and the split: test_gate_stats.py), the kernel-parity check, a whole run (arms in groups equal to all at once), the CLI."""
import json
import math

import numpy as np
import pytest
import torch

from int4lab import gate
from int4lab.gate.table import fallback_note
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


@pytest.mark.parametrize("L,batch,batch_tokens", [(64, 4, None), (64, 16, 100), (1000, 3, 700), (7, 5, 1)])
def test_windows_fit_the_text_and_batches_bound_the_padding(tok, L, batch, batch_tokens):
    docs = [d[:n] for d, n in zip(gate.documents("test")[:6], (4000, 900, 150, 2500, 40, 4000))]
    w = gate.Windows(tok, docs, L)
    lens = [len(tok(d, add_special_tokens=False, verbose=False)["input_ids"]) for d in docs]
    # no window crosses a document, none is longer than L inputs, a short document is one short window
    assert (w.n >= 2).all() and (w.n <= L + 1).all()
    for d, n in enumerate(lens):
        k = w.n[w.doc == d]
        assert int((k - 1).sum()) == n - 1 and len(k) == -(-(n - 1) // L)
        assert (w.ids[w.doc == d][:, 0] == torch.tensor(
            tok(docs[d], add_special_tokens=False, verbose=False)["input_ids"][0:(n - 1):L])).all()
    # every window in exactly one batch; each batch within batch and batch_tokens (a lone window may exceed it)
    bs = w.batches(batch, batch_tokens)
    assert sorted(torch.cat(bs).tolist()) == list(range(len(w)))
    for b in bs:
        longest = int(w.n[b].max()) - 1
        assert len(b) <= batch and (batch_tokens is None or len(b) * longest <= batch_tokens or len(b) == 1)
    # the offsets lay every window's predictions end to end, each token once
    off = w.offsets
    assert off[0] == 0 and (off[1:] == off[:-1] + w.n[:-1] - 1).all() and int(off[-1] + w.n[-1] - 1) == w.tokens
    pad = w.padding(bs)
    assert pad["tokens"] == w.tokens and pad["inputs"] >= w.tokens and pad["batches"] == len(bs)
    assert pad["fraction"] == pytest.approx(1 - w.tokens / pad["inputs"])
    # sorting by length never computes more than padding every window to L
    assert pad["inputs"] <= len(w) * L
    if L == 1000:                               # documents of very different lengths: padding to L wastes a third
        assert pad["fraction"] < 0.25 < 1 - w.tokens / (len(w) * L)
    with pytest.raises(ValueError, match="batch_tokens must be a positive int"):
        w.batches(4, 0)


def test_trained_context_comes_from_the_model_config():
    """The tiny checkpoints' config.json records the training sequence length; other models fall back to
    max_position_embeddings; a config with neither is refused."""
    from int4lab.gate.cli import model_name_and_context
    for arch in ("mixtral", "olmoe", "qwen3_moe"):
        assert model_name_and_context(arch) == (arch, 256)
    cfg = tiny_lm().config
    assert not hasattr(cfg, "trained_context")
    assert gate.trained_context("no_such_model", cfg) == cfg.max_position_embeddings
    cfg.trained_context = 64
    assert gate.trained_context("no_such_model", cfg) == 64
    with pytest.raises(ValueError, match="pass --window"):
        gate.trained_context("no_such_model", object())


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


def test_kl_p99_bisection_equals_the_cumulative_weights():
    # the 99th percentile per resample by bisection equals the direct reading of each resample's cumulative
    # weights (the first sorted token where it reaches 0.99 of the total), ties and one-document texts included
    from int4lab.gate.stats import _resample_counts, _weighted_p99
    for seed in range(4):
        rng = np.random.default_rng(seed)
        D = int(rng.integers(1, 30))
        d = np.repeat(np.arange(D), rng.integers(1, 200, D))
        v = np.round(rng.exponential(1.0, d.size), 2 if seed % 2 else 9)
        C = _resample_counts(D, 150, seed).astype(np.float64)
        vs, ds = v[np.argsort(v, kind="stable")], d[np.argsort(v, kind="stable")]
        direct = [vs[np.searchsorted(np.cumsum(c[ds]), 0.99 * c[ds].sum())] for c in C]
        assert np.array_equal(_weighted_p99(v, d, C), direct), seed


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


def test_verdict_says_when_an_arm_scores_better_than_its_source():
    cis = _cis(test=-0.02, ood=0.001)
    assert cis["test"]["rel"]["hi"] < 0
    assert gate.verdict(cis, 0.01)["below_source"] == ["test"]


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

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_stats_in_chunks_equal_the_one_shot_formula(device, dtype):
    # A small vocabulary: chunked (1, 2, 7 tokens at a time) equals unchunked to float64 rounding, and both
    # equal the host formula the gate used before (log_softmax in float32, KL summed in float32) to fp32's.
    R, V = 53, 97
    src = (torch.randn(R, V) * 3).to(dtype).to(device)
    arm = (src.float() + 0.3 * torch.randn(R, V, device=device)).to(dtype)
    rows = torch.randperm(R)[:41].sort().values
    tgt = torch.randint(0, V, (41,))
    whole = gate.token_stats(src, rows, tgt)
    ref = gate.token_stats(arm, rows, tgt, src, whole["top"])
    for c in (1, 2, 7):
        part = gate.token_stats(arm, rows, tgt, src, whole["top"], stat_bytes=16 * V * c)
        for k in ("nll", "kl"):
            assert torch.allclose(part[k], ref[k], rtol=1e-12, atol=1e-15), (c, k)
        assert torch.equal(part["top1"], ref["top1"]) and torch.equal(part["top"], ref["top"])
    lp_s = torch.log_softmax(src.float().cpu()[rows], -1)
    lp_a = torch.log_softmax(arm.float().cpu()[rows], -1)
    assert ref["nll"].dtype == ref["kl"].dtype == torch.float64 and ref["nll"].device.type == src.device.type
    assert np.allclose(ref["nll"].cpu(), -lp_a.gather(-1, tgt[:, None])[:, 0].double(), rtol=1e-6, atol=1e-6)
    assert np.allclose(ref["kl"].cpu(), (lp_s.exp() * (lp_s - lp_a)).sum(-1).double(), rtol=1e-5, atol=1e-7)
    assert torch.equal(ref["top1"].cpu(), lp_a.argmax(-1) == lp_s.argmax(-1))
    # the KL's float64 sum: exact for the source against itself
    assert (gate.token_stats(src, rows, tgt, src, whole["top"])["kl"] == 0).all()
    with pytest.raises(ValueError, match="ref and ref_top go together"):
        gate.token_stats(arm, rows, tgt, src)
    with pytest.raises(ValueError, match="stat_bytes must be a positive int"):
        gate.token_stats(arm, rows, tgt, stat_bytes=0)


@pytest.mark.parametrize("arch", ["olmoe"])
def test_score_models_equals_one_forward_per_window(arch, tok):
    win = gate.Windows(tok, [gate.documents("test")[0][:1500], gate.documents("test")[1][:200]], 48)
    m = tiny_lm(arch)
    q, _ = quantize_model(tiny_lm(arch), "rtn", "experts+attn", "int8", progress=False)
    per = gate.score_models({"source": m, "q": q}, win, batch=3)
    assert per["source"].nll.size == win.tokens and (per["source"].kl == 0).all()
    assert (per["q"].doc == win.doc.repeat_interleave(win.n - 1).numpy()).all()      # window order
    with torch.no_grad():                                   # window 1 alone, no batching, no padding
        ids = win.ids[1:2, :win.n[1]]
        lp_s = torch.log_softmax(m(ids[:, :-1]).logits.float(), -1)[0]
        lp_q = torch.log_softmax(q(ids[:, :-1]).logits.float(), -1)[0]
    off = int(win.offsets[1])
    k = int(win.n[1]) - 1
    nll = -lp_s.gather(-1, ids[0, 1:, None])[:, 0]
    assert np.allclose(per["source"].nll[off:off + k], nll.double().numpy(), atol=2e-4)
    kl = (lp_s.exp() * (lp_s - lp_q)).sum(-1)
    assert np.allclose(per["q"].kl[off:off + k], kl.double().numpy(), atol=2e-3)
    assert per["q"].kl.mean() > 1e-4
    # arms scored in groups (the source re-run with each) give the same per-token numbers as all at once
    q2, _ = quantize_model(tiny_lm(arch), "rtn", "experts", "int8", progress=False)
    kw = dict(batch=2, batch_tokens=100)
    both = gate.score_models({"source": m, "q": q, "q2": q2}, win, **kw)
    one, two = gate.score_models({"source": m, "q": q}, win, **kw), gate.score_models({"source": m, "q2": q2}, win, **kw)
    for name, p in (("q", one["q"]), ("q2", two["q2"]), ("source", one["source"]), ("source", two["source"])):
        for f in ("nll", "kl", "top1", "doc"):
            assert np.array_equal(getattr(both[name], f), getattr(p, f)), (name, f)


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


def test_parity_limit_follows_the_unquantised_models_own_gap(monkeypatch):
    # With a reference the limit is max(tol, PARITY_REF_FACTOR x the reference's own gap): a gap the unquantised
    # model shares passes, one past it fails naming both numbers; without one the fixed tol holds.
    import int4lab.gate.decode as dec
    gaps = {"q": 0.09, "ref": 0.06}
    monkeypatch.setattr(dec, "_gap", lambda m, w, p, k: (gaps[m], 1.0, 4))
    p = dec.parity("q", None, 8, reference="ref")
    assert p["limit"] == pytest.approx(dec.PARITY_REF_FACTOR * 0.06) and p["reference_max_abs_logprob"] == 0.06
    with pytest.raises(AssertionError, match="0.09 nats > 0.05"):
        dec.parity("q", None, 8)
    gaps["ref"] = 0.01
    with pytest.raises(AssertionError, match=r"> 0\.05 \(the unquantised model's own gap: 0\.01\)"):
        dec.parity("q", None, 8, reference="ref")


# ---------------------------------------------------------------------------------------------- a whole run

def short_documents(mp, chars=400):
    """Score only the first `chars` characters of each document: the gate needs 2 * MIN_DOCS documents per text,
    and twenty short ones cost what two whole documents did."""
    import int4lab.gate.sources as gate_sources
    mp.setattr(gate_sources, "documents", lambda split: [d[:chars] for d in gate.documents(split)])


PLAN = dict(schemes=["rtn", "gptq"], lottery=2, calib_draws=3)
RUN = dict(window=32, max_docs=2 * gate.MIN_DOCS, n_boot=200, calib_tokens=256, calib_len=32, calib_split="validation",
           min_rows=8, parity_steps=0, progress=False)


@pytest.fixture(scope="module")
def payload(tok):
    with pytest.MonkeyPatch.context() as mp:
        short_documents(mp)
        return gate.run_gate("tiny", gate.plan_arms(**PLAN), floor_stride=1, **RUN,
                             loader=lambda dt: (tiny_lm("mixtral", dt), tok, "tiny"))


def test_run_gate_payload(payload):
    assert set(payload["arms"]) == {a.name for a in gate.plan_arms(**PLAN)}
    for name, a in payload["arms"].items():
        assert set(a["texts"]) == {"test", "ood"} and a["scored"] == "every document"
        for t, c in a["texts"].items():
            assert c["rel"]["lo"] <= c["rel"]["value"] <= c["rel"]["hi"]
            assert c["kl"]["lo"] <= c["kl"]["value"] <= c["kl"]["hi"]
            assert c["tokens"] == payload["texts"][t]["tokens"] and c["docs"] == payload["texts"][t]["docs"] == 2 * gate.MIN_DOCS
            sp = payload["split"]["texts"][t]
            assert a["dev"][t]["docs"] == len(sp["dev"]) == gate.MIN_DOCS == a["held_out"][t]["docs"]
            assert a["dev"][t]["tokens"] + a["held_out"][t]["tokens"] == c["tokens"]
        assert a["verdict"] == gate.verdict(a["held_out"], payload["budget"])
        assert (a["kind"] == "rtn") != ("vs_twin" in a)
    assert payload["settings"]["scored"] == "every arm on every document"
    pad = payload["texts"]["test"]["padding"]
    assert pad["tokens"] == payload["texts"]["test"]["tokens"] and 0 <= pad["fraction"] < 0.2
    rep = payload["arms"]["gptq/experts/W4A8 draw#0"]["quant_report"]
    assert rep["gptq_experts"] + len(rep["fallback"]) == 2 * 8 and len(rep["rows"]) == 2
    lot = payload["lottery"]["rtn/experts/W4A8"]
    for t, v in lot["texts"].items():
        assert v["values"] == [payload["arms"][n]["vs_twin"][t]["value"] for n in lot["tickets"]]
        assert v["band"] == gate.rounding_band(v["values"])
    cal = payload["calibration"]["gptq/experts/W4A8"]
    assert cal["gains"] == [payload["arms"][n]["vs_twin"] for n in cal["draws"]] and len(cal["gains"]) == 3
    # two tickets: the band is drawn, the calibration test refuses to judge
    assert cal["judgement"]["verdict"] == "NOT JUDGED" and "16 lottery tickets (got 2)" in cal["judgement"]["reasons"][0]
    sp = payload["split"]
    assert sp["seed"] == payload["settings"]["split_seed"] == 0 and sp["rule"] == gate.SPLIT_RULE
    assert sp["texts"]["ood"] == gate.split_documents([d[:400] for d in gate.documents("ood")[:20]], "ood")
    ch = payload["choice"]
    assert ch["chosen"] == gate.choose({n: a["dev"] for n, a in payload["arms"].items() if a["kind"] != "lottery"})[
        "chosen"] and ch["verdict"] == payload["arms"][ch["chosen"]]["verdict"]
    assert payload["floor"]["texts"]["test"]["rel"]["value"] != 0
    assert len(payload["groups"]) == 1 and payload["source_rerun"]["max_abs_nll"] == 0
    tm = payload["timing"]
    assert 0 < tm["forward_s"] <= tm["score_s"] < payload["seconds"] and tm["score_over_forwards"] >= 1


def test_arms_in_groups_of_one_equal_all_at_once(payload, tok, monkeypatch):
    short_documents(monkeypatch)
    kept = []
    p1 = gate.run_gate("tiny", gate.plan_arms(**PLAN), floor=False, arms_per_group=1, texts=("ood",), **RUN,
                       loader=lambda dt: (tiny_lm("mixtral", dt), tok, "tiny"),
                       on_arm=lambda n, m: kept.append(n))
    assert kept == [a.name for a in gate.plan_arms(**PLAN)]
    assert [g["arms"] for g in p1["groups"]] == [[n] for n in kept] and p1["source_rerun"]["max_abs_nll"] == 0
    assert p1["settings"]["arms_per_group"] == 1
    for name, a in payload["arms"].items():             # same per-token numbers, so the same figures
        b = p1["arms"][name]
        assert b["texts"]["ood"] == a["texts"]["ood"] and b.get("vs_twin", {}).get("ood") == a.get("vs_twin", {}).get(
            "ood"), name
    assert p1["lottery"]["rtn/experts/W4A8"]["texts"]["ood"] == payload["lottery"]["rtn/experts/W4A8"]["texts"]["ood"]
    with pytest.raises(ValueError, match="arms_per_group must be a positive int"):
        gate.run_gate("tiny", gate.plan_arms(), arms_per_group=0, **RUN,
                      loader=lambda dt: (tiny_lm("mixtral", dt), tok, "tiny"))


def test_lottery_is_deterministic_by_seed(payload, tok):
    # the same seed re-packs the same bytes, another seed other bytes; and the receipt's ticket is reproduced
    ticket = lambda s: quantize_model(tiny_lm("mixtral"), dither=gate.DITHER, dither_seed=s,  # noqa: E731
                                      progress=False)[0]
    t1 = ticket(1)
    assert torch.equal(t1.model.layers[0].mlp.experts.down_packed, ticket(1).model.layers[0].mlp.experts.down_packed)
    assert not torch.equal(t1.model.layers[0].mlp.experts.down_packed,
                           ticket(2).model.layers[0].mlp.experts.down_packed)
    win = gate.Windows(tok, [d[:400] for d in gate.documents("ood")[:2 * gate.MIN_DOCS]], 32)      # short_documents
    per = gate.score_models({"source": tiny_lm("mixtral"), "t": t1}, win)
    got = gate.paired_ci(per["t"].nll, per["source"].nll, per["source"].doc, n_boot=200)["rel"]["value"]
    assert got == pytest.approx(payload["arms"]["rtn/experts/W4A8 lottery#1"]["texts"]["ood"]["rel"]["value"],
                                abs=1e-6)


def test_tables(payload, tmp_path):
    text = gate.format_table(payload)
    head = text.splitlines()[0].split()
    assert head[:6] == ["arm", "text", "tokens", "ppl", "Δ%", "held-out"] and head[-4:] == ["[95%", "CI]", "top-1",
                                                                                          "verdict"]
    for name, a in payload["arms"].items():
        assert any(line.startswith(name + " ") and line.rstrip().endswith(a["verdict"]["verdict"] + fallback_note(a))
                   for line in text.splitlines())
    assert "lottery of rtn/experts/W4A8 (2 dithered re-packs), ticket - RTN per text, all documents:" in text
    assert "  gptq/experts/W4A8 draw#2 - rtn/experts/W4A8: test " in text
    assert f"chosen on development documents: {payload['choice']['chosen']} " in text
    (tmp_path / "gate_tiny.json").write_text(json.dumps({"provenance": {}, **payload}))
    md = gate.render_gate_table(tmp_path)
    assert md.splitlines()[0].startswith("| model | arm | Δ ppl test, held-out [95% CI] | Δ ppl ood, held-out [95% CI] "
                                         "| verdict (held-out) | KL test")
    # the source, every arm, the rounding band, each GPTQ draw against round-to-nearest, the chosen arm
    assert len([x for x in md.splitlines() if x.startswith("| tiny |")]) == 1 + len(payload["arms"]) + 1 + 3 + 1
    assert all(x.count("|") == md.splitlines()[0].count("|") for x in md.splitlines())
    with pytest.raises(FileNotFoundError, match="no gate_"):
        gate.render_gate_table(tmp_path / "empty")


# ---------------------------------------------------------------------------------------------- the CLI

def test_cli_runs_a_checkpoint_dir_and_prints_one_table(tmp_path, tok, capsys, monkeypatch):
    short_documents(monkeypatch)
    ckpt = tmp_path / "ckpt"
    tiny_lm("olmoe").save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    out = tmp_path / "r.json"
    rc = gate.main(["--model", str(ckpt), "--window", "32", "--max-docs", "20", "--lottery",
                    "1", "--boot", "200", "--parity-steps", "0", "--no-floor", "--quiet", "--texts", "ood", "--out",
                    str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and text.splitlines()[0].startswith("arm")
    assert "rtn/experts/W4A8 lottery#1" in text and f"receipt: {out}" in text
    r = json.loads(out.read_text())
    assert r["provenance"]["command"].startswith("python -m int4lab.gate --model")
    assert r["settings"]["window"] == 32 and list(r["texts"]) == ["ood"]
    assert r["settings"]["prefill_min_rows"] == gate.SCORE_PREFILL_ROWS     # the default, recorded


def test_prefill_rows_flag():
    from int4lab.gate.cli import parser
    for word, want in (("off", None), ("OFF", None), ("0", 0), ("512", 512)):
        assert parser().parse_args(["--model", "x", "--prefill-rows", word]).prefill_rows == want
    for bad in ("-1", "x", "1.5", ""):
        with pytest.raises(SystemExit):
            parser().parse_args(["--model", "x", "--prefill-rows", bad])
    with pytest.raises(ValueError, match="--prefill-rows: prefill_rows must be an int >= 0"):
        gate.check_settings(prefill_rows=-1)


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
