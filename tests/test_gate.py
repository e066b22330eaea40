"""The perplexity gate: the rule, the token-hash refusal, both instruments, the CLI's errors (CPU, tiny models)."""
import math

import pytest
import torch

from int4lab import gate
from int4lab.gate import check_same_tokens, combine, verdict
from int4lab.quantize import Scheme, quantize_model

from test_quantize import tiny_model


@pytest.fixture(scope="module")
def tok():
    from int4lab.models.tokenizer import load_tokenizer
    return load_tokenizer()


def tiny_lm(arch="mixtral", dtype=torch.float32, seed=0):
    return tiny_model(arch, seed=seed, vocab=4096, dtype=dtype)


# ---------------------------------------------------------------------------------------------- the rule

def test_verdict_uncalibrated_branches():
    v, why = verdict({"test": 0.004, "ood": 0.009}, budget=0.01, noise=0.001)
    assert v == "PASS" and "within the budget" in why[0]
    v, why = verdict({"test": 0.004, "ood": 0.011}, budget=0.01, noise=0.001)
    assert v == "FAIL" and why == ["ood: perplexity +1.100% is past the budget 1.00%"]
    v, _ = verdict({"test": -0.0005, "ood": 0.0008}, budget=0.01, noise=0.001)
    assert v == "PARITY"
    # a noise floor wider than the budget: a change inside the noise is not a failure
    v, _ = verdict({"test": 0.015}, budget=0.01, noise=0.02)
    assert v == "PARITY"


def test_verdict_calibrated_branches():
    rel = {"test": 0.002, "ood": 0.003}
    # improvement beyond noise on two texts, one out of domain -> PASS
    assert verdict(rel, 0.01, 0.001, True, {"test": -0.01, "ood": -0.004})[0] == "PASS"
    # improvement in domain only -> refused
    v, why = verdict(rel, 0.01, 0.001, True, {"test": -0.01, "ood": -0.0002})
    assert v == "FAIL" and "not confirmed" in why[0]
    # improvement on two texts, both in domain -> refused
    rel3 = {"test": 0.0, "int4lab_test": 0.0, "ood": 0.0}
    v, _ = verdict(rel3, 0.01, 0.001, True, {"test": -0.01, "int4lab_test": -0.01, "ood": 0.0})
    assert v == "FAIL"
    # improvement on two texts but worse on a third -> refused
    v, _ = verdict(rel3, 0.01, 0.001, True, {"test": -0.01, "int4lab_test": 0.01, "ood": -0.01})
    assert v == "FAIL"
    # every gain inside the noise -> PARITY
    assert verdict(rel, 0.01, 0.001, True, {"test": 0.0005, "ood": -0.0009})[0] == "PARITY"
    # past the budget fails whatever calibration gained
    assert verdict({"test": 0.02, "ood": 0.0}, 0.01, 0.001, True, {"test": -0.5, "ood": -0.5})[0] == "FAIL"


def test_calibration_verdict_ignores_the_budget():
    # the gain half of the rule on its own: calibration helped even where the arm is past the budget
    gain = {"test": -0.02, "ood": -0.01}
    assert verdict({"test": 0.05, "ood": 0.05}, 0.01, 0.001, True, gain)[0] == "FAIL"
    assert gate.calibration_verdict(gain, 0.001)[0] == "PASS"
    assert gate.calibration_verdict({"test": -0.02, "ood": 0.01}, 0.001)[0] == "FAIL"
    with pytest.raises(ValueError, match="gain must hold at least one text"):
        gate.calibration_verdict({})


def test_verdict_bad_inputs():
    with pytest.raises(ValueError, match="budget must be a positive"):
        verdict({"t": 0.0}, budget=0)
    with pytest.raises(ValueError, match="noise must be a non-negative"):
        verdict({"t": 0.0}, noise=-1e-3)
    with pytest.raises(ValueError, match="rel must hold at least one text"):
        verdict({})
    with pytest.raises(ValueError, match="must be finite"):
        verdict({"t": float("nan")})
    with pytest.raises(ValueError, match="needs gain"):
        verdict({"t": 0.0}, calibrated=True)


def test_combine():
    assert combine({"a": ("PASS", []), "b": ("FAIL", [])}) == "FAIL"
    assert combine({"a": ("PASS", []), "b": ("PARITY", [])}) == "PASS"
    assert combine({"a": ("PARITY", []), "b": ("PARITY", [])}) == "PARITY"


def test_arms_that_scored_different_tokens_are_refused():
    same = {"decode": {"test": {"tokens_sha": "aa"}, "ood": {"tokens_sha": "bb"}}}
    check_same_tokens({"source": same, "rtn": same})
    other = {"decode": {"test": {"tokens_sha": "aa"}, "ood": {"tokens_sha": "cc"}}}
    with pytest.raises(ValueError, match="scored different token streams on decode/ood"):
        check_same_tokens({"source": same, "rtn": other})
    with pytest.raises(ValueError, match="different token streams"):
        check_same_tokens({"source": same, "rtn": {"decode": {"test": {"tokens_sha": "aa"}}}})


def test_token_sha_sees_one_changed_id():
    a = torch.arange(100)
    b = a.clone()
    b[57] += 1
    assert gate.token_sha(a) == gate.token_sha(a.clone()) != gate.token_sha(b)


def test_arms_for_brings_the_rtn_twin():
    arms = gate.arms_for(["gptq"], ["experts", "experts+attn"], ["int8"])
    assert [a.name for a in arms] == ["rtn/experts/W4A8", "gptq/experts/W4A8",
                                      "rtn/experts+attn/W4A8", "gptq/experts+attn/W4A8"]


# ---------------------------------------------------------------------------------------------- instruments

@pytest.mark.parametrize("arch", ["mixtral", "olmoe", "qwen3_moe"])
def test_decode_instrument_equals_full_forward(arch, tok):
    # The KV-cache path, one token per forward, must give the logprobs of one causal full forward.
    wins = gate.decode_windows(tok, gate.documents("test")[5], windows=2, prompt=8, steps=6)
    assert wins.shape == (2, 15)
    m = tiny_lm(arch)
    dec = gate.decode_logprobs(m, wins, 8)
    full = gate.full_forward_logprobs(m, wins, 8)
    assert dec.shape == full.shape == (2, 6, 4096)
    assert (dec - full).abs().max().item() < 1e-4
    q, _ = quantize_model(m, "rtn", "experts+attn", "int8", progress=False)
    dq, fq = gate.decode_logprobs(q, wins, 8), gate.full_forward_logprobs(q, wins, 8)
    assert (dq - fq).abs().max().item() < 2e-2                 # bf16 output roundings may flip by one ulp
    assert (dq - dec).abs().max().item() > 1e-3                # and the quantised model is not the source


def test_decode_metrics_by_hand():
    V = 5
    wins = torch.tensor([[0, 1, 2, 3, 4]])                      # prompt 2: targets are ids 3 and 4
    ref = torch.log_softmax(torch.randn(1, 2, V), -1)
    arm = torch.log_softmax(torch.randn(1, 2, V), -1)
    m = gate.decode_metrics(arm, ref, wins, prompt=2)
    nll = -(arm[0, 0, 3] + arm[0, 1, 4]) / 2
    assert math.isclose(m["ppl"], math.exp(nll.item()), rel_tol=1e-6)
    kl = sum((ref[0, i].exp() * (ref[0, i] - arm[0, i])).sum().item() for i in range(2)) / 2
    assert math.isclose(m["kl"], kl, rel_tol=1e-5)
    assert m["top1"] == ((arm.argmax(-1) == ref.argmax(-1)).float().mean().item())
    same = gate.decode_metrics(ref, ref, wins, prompt=2)
    assert same["kl"] == 0 and same["top1"] == 1


def test_lmeval_instrument_on_a_tiny_model(tok):
    m = tiny_lm("olmoe")
    r = gate.lmeval_metrics(m, tok, limit=1)
    assert set(r) == {"int4lab_test", "int4lab_ood"}
    for t, v in r.items():
        assert v["docs"] == 1 and len(v["tokens_sha"]) == 16
        assert all(math.isfinite(v[k]) and v[k] > 0 for k in ("word_perplexity", "byte_perplexity", "bits_per_byte"))
        assert math.isclose(v["bits_per_byte"], math.log2(v["byte_perplexity"]), rel_tol=1e-6)
        assert v["word_perplexity"] > v["byte_perplexity"]       # a word is several bytes
    q, _ = quantize_model(m, "rtn", "experts", "int8", progress=False)
    rq = gate.lmeval_metrics(q, tok, limit=1)
    assert rq["int4lab_test"]["tokens_sha"] == r["int4lab_test"]["tokens_sha"]
    assert rq["int4lab_test"]["word_perplexity"] != r["int4lab_test"]["word_perplexity"]


def test_run_gate_end_to_end_decode(tok):
    payload = gate.run_gate("tiny", gate.arms_for(["gptq"], ["experts"], ["int8"]), instruments=("decode",),
                            dtype=torch.float32,
                            windows=1, prompt=8, steps=8, calib_seqs=4, calib_len=32, min_rows=8,
                            progress=False, loader=lambda dt: (tiny_lm("mixtral", dt), tok, "tiny"))
    assert set(payload["arms"]) == {"rtn/experts/W4A8", "gptq/experts/W4A8"}
    assert payload["noise"]["decode"]["floor"] >= 0
    for name, a in payload["arms"].items():
        assert a["verdict_overall"] in ("PASS", "FAIL", "PARITY")
        assert set(a["rel"]["decode"]) == {"test", "ood"}
        src = payload["source_metrics"]["decode"]
        for t, r in a["rel"]["decode"].items():
            assert math.isclose(r, a["metrics"]["decode"][t]["ppl"] / src[t]["ppl"] - 1)
    g = payload["arms"]["gptq/experts/W4A8"]
    assert set(g["gain"]["decode"]) == {"test", "ood"}
    assert g["calibration"]["decode"][0] in ("PASS", "FAIL", "PARITY")
    rows = gate.summary_rows(payload)
    assert len(rows) == 2 * 2 and {r["arm"] for r in rows} == set(payload["arms"])
    assert g["quant_report"]["gptq_experts"] + len(g["quant_report"]["fallback"]) == 2 * 8


# ---------------------------------------------------------------------------------------------- errors

def test_missing_model_path_and_unsupported_arch(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="neither a tiny model name"):
        gate.load_model(str(tmp_path / "no_such_checkpoint"))
    tiny_model("llama").config.save_pretrained(tmp_path / "llama")
    with pytest.raises(ValueError, match="unsupported architecture 'llama'"):
        gate.load_model(str(tmp_path / "llama"))
    assert gate.main(["--model", str(tmp_path / "no_such_checkpoint")]) == 2
    assert "neither a tiny model name" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gate.main(["--model", "mixtral", "--scheme", "awq"])


def test_missing_corpus_file(tmp_path, monkeypatch):
    import int4lab.corpus as C
    monkeypatch.setattr(C, "CORPUS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="ood.txt is missing"):
        gate.documents("ood")


def test_decode_windows_bad_inputs(tok):
    with pytest.raises(ValueError, match="steps must be a positive int"):
        gate.decode_windows(tok, "some text", 1, 4, 0)
    with pytest.raises(ValueError, match="fewer than windows"):
        gate.decode_windows(tok, "too short", 2, 8, 8)
    with pytest.raises(ValueError, match="instruments must be among"):
        gate.run_gate("tiny", [Scheme()], instruments=("perplexity",))


def test_decode_steps_through_the_kernels_match_the_reference(tok):
    # The scored steps through int4lab.kernels (Triton's interpreter here, the GPU kernels on CUDA) against
    # the CPU reference decode of the same quantised model: same quantisation points, same bf16 roundings.
    wins = gate.decode_windows(tok, gate.documents("ood")[2], windows=1, prompt=4, steps=2)
    q, _ = quantize_model(tiny_lm("mixtral"), "rtn", "experts+attn", "int8", progress=False)
    ref = gate.decode_logprobs(q, wins, 4)
    ker = gate.decode_logprobs(q, wins, 4, kernels=True)
    assert (ker - ref).abs().max().item() < 1e-3
    assert (ker.argmax(-1) == ref.argmax(-1)).all()
