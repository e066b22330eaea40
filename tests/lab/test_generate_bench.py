"""lab.decode_step.generate: `generate`'s tokens/s, int4 against bf16. The tiny CPU path end to end (the int4
kernels in Triton's interpreter, eager only: the compiled mode is CUDA's), the ratio's verdict on synthetic rounds,
and the refusals of bad arguments."""
import json
import random

import pytest
import torch

from lab.bench.decide import median_ci
from lab.decode_step import generate as G


@pytest.fixture(scope="module")
def receipt(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen") / "generate_cpu.json"
    rc = G.main(["--width", "tiny", "--archs", "mixtral", "--prompt", "2", "--new", "2", "--rounds", "3",
                 "--warmup", "1", "--out", str(out)])
    assert rc == 0
    return json.loads(out.read_text())


def test_tiny_run_writes_a_complete_receipt(receipt):
    assert receipt["kind"] == "generate" and receipt["complete"] is True and "interrupted" not in receipt
    assert receipt["provenance"]["sources"]["files"] and receipt["provenance"]["commit"]
    assert "lab/decode_step/generate.py" in receipt["provenance"]["sources"]["files"]
    assert receipt["settings"]["new"] == 2 and receipt["settings"]["prompt"] == 2
    rec = receipt["archs"]["mixtral"]
    assert rec["states"] == ["bf16", "int4", "int4_fused"] and rec["depths"] == [1, 2] and not rec["errors"]
    assert rec["skipped"] == [{"what": "compiled", "why": rec["skipped"][0]["why"]}] and "CUDA" in \
        rec["skipped"][0]["why"]
    eager = rec["modes"]["eager"]
    assert eager["rounds"] == 3 and not eager["errors"] and set(eager["warmup_s"]) == set(rec["states"])
    for state in rec["states"]:
        row = eager["rows"][state]
        for d in ("1", "2"):
            r = row["depths"][d]
            assert len(r["t1_s"]) == len(r["tN_s"]) == len(r["decode_ms"]) == 3
            for t1, tn, ms in zip(r["t1_s"], r["tN_s"], r["decode_ms"]):
                assert ms == pytest.approx((tn - t1) / (2 - 1) * 1e3)    # (t(N) - t(1)) / (N - 1)
        pl = row["per_layer_ms"]["per_round"]
        assert pl == pytest.approx([b - a for a, b in zip(row["depths"]["1"]["decode_ms"],
                                                          row["depths"]["2"]["decode_ms"])])
        assert len(eager["tokens"][state]) == 2 and eager["stable"][state] is True
    for key in ("int4/bf16", "int4_fused/bf16"):
        for d in ("1", "2", "per_layer"):
            v = eager["ratios"][key][d]
            assert v["verdict"] == "undecided" and v.get("lo") is None and v["note"]   # 3 rounds: no interval
        assert "need 6" in eager["ratios"][key]["2"]["note"]


def test_tiny_run_tokens_are_generates_and_compiled_is_not_claimed(receipt):
    rec = receipt["archs"]["mixtral"]
    g = rec["greedy"]["int4"]
    assert g["eager"] == rec["modes"]["eager"]["tokens"]["int4"]
    assert g["compiled"] is None and g["equal"] is None                 # never a claim the run did not test
    assert rec["summary"]["int4_tokens_equal_eager_compiled"] is None
    # the int4 modules' interpreter kernels give the tokens the same model gives in torch arithmetic
    from lab.decode_step import model as M
    from int4lab.quantize import quantize_model
    m = quantize_model(M.build("mixtral", 2, "tiny", "cpu", torch.bfloat16, seed=0), "rtn", "experts+attn",
                       progress=False)[0]
    ids = torch.randint(0, m.config.vocab_size, (1, 2), generator=torch.Generator().manual_seed(0))
    _, toks = G.call(m, ids, 2, "eager", kernels=False)
    assert toks == g["eager"]


def test_a_state_that_raises_is_an_error_row_and_the_budget_skips(monkeypatch):
    """run_mode with generate replaced by a clock: a raising state is recorded with its message and left out of
    the ratios; a compiled state the budget cannot fit is recorded as skipped."""
    from lab.decode_step import model as M
    models = {s: M.build("olmoe", 2, "tiny", "cpu", torch.bfloat16) for s in G.STATES}

    def fake_call(model, ids, n, mode, cache=None, kernels=False):
        if model is models["int4_fused"]:
            raise RuntimeError("no kernel for this shape")
        per = 0.002 if model is models["int4"] else 0.004
        return 0.01 + (n - 1) * per * len(model.model.layers), [7] * n
    monkeypatch.setattr(G, "call", fake_call)
    args = G.parser().parse_args(["--width", "tiny", "--rounds", "7", "--new", "8"])
    out = G.run_mode(models, "eager", torch.zeros(1, 4, dtype=torch.long), args, lambda: 1e9, lambda m: None)
    assert "no kernel for this shape" in out["errors"]["int4_fused"]["error"]
    assert set(out["rows"]) == {"bf16", "int4"} and set(out["ratios"]) == {"int4/bf16"}
    r = out["ratios"]["int4/bf16"]
    assert r["2"]["median"] == pytest.approx(2.0) and r["2"]["verdict"] == "int4 faster"
    assert r["per_layer"]["verdict"] == "int4 faster"
    skipped = G.run_mode(models, "compiled", torch.zeros(1, 4, dtype=torch.long), args, lambda: 5.0,
                         lambda m: None)
    assert [s["what"] for s in skipped["skipped"]] == ["compiled bf16", "compiled int4", "compiled int4_fused",
                                                        "compiled rounds"]
    assert not skipped["rows"] and "ratios" not in skipped


def _rows(tps_a, tps_b, n=64):
    """Synthetic summarise_state rows from tokens/s per round at depths 1 and 2 (t(1) = 0.05 s)."""
    def row(tps):
        return G.summarise_state({d: [(0.05, 0.05 + (n - 1) * d / t) for t in tps] for d in (1, 2)}, n)
    return {"int4": row(tps_a), "bf16": row(tps_b)}


def test_ratio_and_verdict_on_synthetic_rounds():
    rng = random.Random(7)
    bf16 = [100 + rng.uniform(-5, 5) for _ in range(7)]
    fast = G.ratios(_rows([b * 1.3 for b in bf16], bf16), "int4")
    assert fast["1"]["per_round"] == pytest.approx([1.3] * 7)
    assert fast["1"]["verdict"] == "int4 faster" and fast["1"]["lo"] > 1
    assert fast["per_layer"]["verdict"] == "int4 faster"
    slow = G.ratios(_rows([b * 0.8 for b in bf16], bf16), "int4")
    assert slow["2"]["verdict"] == "int4 slower" and slow["2"]["hi"] < 1
    # rounds either side of 1: the interval covers 1, no verdict
    mixed = [0.9, 1.2, 0.95, 1.1, 1.05, 0.97, 1.3]
    r = G.ratio_summary(mixed)
    med, lo, hi = median_ci(mixed)
    assert (r["median"], r["lo"], r["hi"]) == (med, lo, hi) and lo < 1 < hi and r["verdict"] == "undecided"
    # a median above 1 whose interval still reaches below 1 is not "faster"
    tight = [0.99, 1.2, 1.2, 1.2, 1.2, 1.2, 1.2]
    assert G.ratio_summary(tight)["median"] > 1 and G.ratio_summary(tight)["verdict"] == "undecided"
    few = G.ratio_summary([2.0, 2.1, 2.2, 2.3, 2.4])                   # all above 1, but no 95 % interval
    assert few["verdict"] == "undecided" and few["lo"] is None and few["median"] == 2.2
    assert G.verdict(1.01, 1.2) == "int4 faster" and G.verdict(0.8, 0.99) == "int4 slower"
    assert G.verdict(1.0, 1.2) == "undecided" and G.verdict(None, None) == "undecided"
    with pytest.raises(ValueError, match="lo <= hi"):
        G.verdict(1.2, 1.1)


def test_decode_time_cancels_the_prefill():
    assert G.decode_s(0.5, 0.5 + 63 * 0.004, 64) == pytest.approx(0.004)
    rows = _rows([250.0] * 3, [125.0] * 3)
    d1 = rows["int4"]["depths"]["1"]
    assert d1["tokens_per_s"] == pytest.approx([250.0] * 3)
    assert rows["int4"]["depths"]["2"]["tokens_per_s_spread"]["median"] == pytest.approx(125.0)
    assert rows["int4"]["per_layer_ms"]["median"] == pytest.approx(1e3 / 250)   # 8 ms - 4 ms per token
    neg = G.summarise_state({1: [(0.2, 0.1)], 2: [(0.2, 0.3)]}, 2)             # t(N) < t(1): no tokens/s
    assert neg["depths"]["1"]["tokens_per_s"] == [None] and neg["depths"]["1"]["tokens_per_s_spread"] is None


@pytest.mark.parametrize("argv,flag", [
    (["--layers", "0", "1"], "--layers"), (["--layers", "17"], "--layers"), (["--new", "1"], "--new"),
    (["--prompt", "0"], "--prompt"), (["--rounds", "2"], "--rounds"), (["--archs", "gpt2"], "--archs"),
    (["--states", "int4"], "--states"), (["--modes", "graphed"], "--modes"), (["--budget-s", "0"], "--budget-s"),
    (["--budget-s", "nan"], "--budget-s"), (["--compile-reserve-s", "-1"], "--compile-reserve-s"),
    (["--warmup", "0"], "--warmup"), (["--width", "huge"], "--width"), (["--new", "2.5"], "--new"),
])
def test_bad_arguments_are_refused_before_any_model(argv, flag, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(G, "build_states", lambda *a: pytest.fail("a model was built"))
    with pytest.raises(SystemExit) as e:
        G.main(argv + ["--out", str(tmp_path / "r.json")])
    assert e.value.code == 2 and flag in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_check_raises_value_error_and_out_must_be_a_file(tmp_path, capsys):
    args = G.parser().parse_args(["--rounds", "2"])
    with pytest.raises(ValueError, match="--rounds must be an int >= 3"):
        G.check(args)
    with pytest.raises(SystemExit):
        G.main(["--out", str(tmp_path)])                                # a directory
    assert "--out" in capsys.readouterr().err


def test_a_reused_static_cache_gives_the_fresh_caches_tokens():
    """--cache reused (one StaticCache per state and depth, reset before each call) decodes what generate's own
    static cache does, round after round (torch arithmetic here: the cache handling is under test, not the
    kernels)."""
    ids = torch.randint(0, 4096, (1, 5), generator=torch.Generator().manual_seed(1))
    got = {}
    for cache in ("fresh", "reused"):
        args = G.parser().parse_args(["--width", "tiny", "--rounds", "3", "--new", "4", "--warmup", "1", "--states",
                                      "bf16", "int4", "--cache", cache, "--no-cpu-kernels", "--seed", "3"])
        models, errors = G.build_states("olmoe", args, "cpu")
        assert list(models) == ["bf16", "int4"] and not errors
        out = G.run_mode(models, "eager", ids, args, lambda: 1e9, lambda m: None)
        assert not out["errors"] and out["rounds"] == 3 and all(out["stable"].values())
        got[cache] = out["tokens"]
    assert got["fresh"] == got["reused"] and len(got["fresh"]["int4"]) == 4


def test_an_interrupted_run_says_so_in_its_receipt(tmp_path, monkeypatch):
    def stop(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(G, "run_arch", stop)
    out = tmp_path / "r.json"
    with pytest.raises(KeyboardInterrupt):
        G.main(["--width", "tiny", "--archs", "olmoe", "--out", str(out)])
    r = json.loads(out.read_text())
    assert r["complete"] is False and r["interrupted"].startswith("KeyboardInterrupt")
