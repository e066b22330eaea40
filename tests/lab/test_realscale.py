"""The real-checkpoint path at tiny width on the CPU: the published configs, the synthetic sharded checkpoint,
the gate CLI by path on it, the realscale receipt and its extrapolation arithmetic, accelerate offload,
batched GPTQ, --max-memory, and the quantised checkpoint's format version."""
import json

import numpy as np
import pytest
import torch

from int4lab import gate
from lab.bench import shapes
from lab import realscale, report
from lab import synth

from test_gate import short_documents
from test_quantize import tiny_model


# ---------------------------------------------------------------------------------------------- configs

def test_published_configs_are_the_hub_numbers():
    m, o, q = (synth.config_fields(a, synth.FULL_LAYERS[a]) for a in ("mixtral", "olmoe", "qwen3_moe"))
    assert (m["hidden_size"], m["intermediate_size"], m["num_hidden_layers"], m["num_attention_heads"],
            m["num_key_value_heads"], m["num_local_experts"], m["num_experts_per_tok"], m["vocab_size"],
            m["rope_theta"], m["max_position_embeddings"]) == (4096, 14336, 32, 32, 8, 8, 2, 32000, 1e6, 32768)
    assert (o["hidden_size"], o["intermediate_size"], o["num_hidden_layers"], o["num_attention_heads"],
            o["num_key_value_heads"], o["num_experts"], o["num_experts_per_tok"], o["vocab_size"],
            o["rope_theta"], o["norm_topk_prob"]) == (2048, 1024, 16, 16, 16, 64, 8, 50304, 1e4, False)
    assert (q["hidden_size"], q["moe_intermediate_size"], q["num_hidden_layers"], q["num_attention_heads"],
            q["num_key_value_heads"], q["head_dim"], q["num_experts"], q["num_experts_per_tok"], q["vocab_size"],
            q["rope_theta"], q["norm_topk_prob"]) == (2048, 768, 48, 32, 4, 128, 128, 8, 151936, 1e6, True)


@pytest.mark.parametrize("arch,row", [("mixtral", "mixtral"), ("olmoe", "olmoe"), ("qwen3_moe", "qwen3")])
def test_built_configs_agree_with_the_shape_table(arch, row):
    from int4lab.models import expert_shapes
    cfg = synth.synth_config(arch, 2)             # the transformers config, nothing allocated
    s, t = expert_shapes(cfg), shapes.MODELS[row]
    assert cfg.num_hidden_layers == 2 and cfg.model_type == arch
    assert (s["hidden"], s["intermediate"], s["experts"], s["top_k"]) == (t.hidden, t.intermediate, t.n_experts,
                                                                          t.top_k)
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, hd) == (t.n_heads, t.n_kv_heads, t.head_dim)
    assert cfg.rope_parameters["rope_theta"] == synth.PUBLISHED[arch]["rope_theta"]


def test_synth_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="arch must be one of"):
        synth.config_fields("llama", 2)
    with pytest.raises(ValueError, match=r"layers must be an int in \[1, 16\]"):
        synth.config_fields("olmoe", 0)
    with pytest.raises(ValueError, match=r"layers must be an int in \[1, 32\]"):
        synth.config_fields("mixtral", 33)
    with pytest.raises(ValueError, match="width must be one of"):
        synth.config_fields("olmoe", 2, "huge")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("")
    with pytest.raises(ValueError, match="not empty"):
        synth.write_checkpoint("olmoe", 1, tmp_path / "x", "tiny")
    assert synth.main(["--arch", "olmoe", "--layers", "0", "--width", "tiny", "--out", str(tmp_path / "y")]) == 2
    with pytest.raises(SystemExit):
        synth.main(["--arch", "gpt2", "--layers", "1", "--out", str(tmp_path / "z")])


# ---------------------------------------------------------------------------------------------- checkpoint

@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "olmoe"
    assert synth.main(["--arch", "olmoe", "--layers", "2", "--width", "tiny", "--max-shard-size", "1MB",
                       "--out", str(out)]) == 0
    return out


def test_synth_cli_writes_a_hub_layout(ckpt):
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in ckpt.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 2 and set(index["weight_map"].values()) == set(shards)
    keys = index["weight_map"]
    assert "model.layers.1.mlp.experts.63.down_proj.weight" in keys          # per-expert keys, as the hub's
    assert not any("gate_up_proj" in k for k in keys)
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (ckpt / f).is_file()
    cfg = json.loads((ckpt / "config.json").read_text())
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["num_experts_per_tok"]) == ("olmoe", 2, 8)


def test_gate_cli_by_path_on_the_synthetic_checkpoint(ckpt, tmp_path, capsys, monkeypatch):
    short_documents(monkeypatch)
    out = tmp_path / "gate.json"
    rc = gate.main(["--model", str(ckpt), "--scheme", "rtn", "gptq", "--targets", "experts", "experts+attn",
                    "--lottery", "0", "--calib-draws", "1", "--calib-tokens", "256", "--calib-len", "64",
                    "--min-rows", "4", "--window", "64", "--max-docs", "20", "--texts", "test", "--no-floor",
                    "--parity-steps", "0", "--boot", "100", "--device", "cpu", "--quiet", "--out", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["model"] == ckpt.name and r["arch"] == "olmoe" and len(r["arms"]) == 4
    g = r["arms"]["gptq/experts+attn/W4A8 draw#0"]
    assert g["quant_report"]["gptq_experts"] > 0 and len(g["quant_report"]["timing"]) == 2
    assert {"calib_s", "experts_pack_s", "gptq_matrices"} <= set(g["quant_report"]["timing"][0])
    assert g["load_s"] > 0


def test_max_memory_parsing_and_cli_errors(ckpt, capsys):
    assert gate.parse_max_memory(["0=20GiB", "cpu=100GiB"]) == {0: "20GiB", "cpu": "100GiB"}
    assert gate.parse_max_memory(None) is None
    for bad, msg in ((["0:20GiB"], "must be DEVICE=SIZE"), (["0=20"], "must be DEVICE=SIZE"),
                     (["gpu=1GB"], "GPU index, cpu or disk"), (["0=1GB", "0=2GB"], "twice")):
        with pytest.raises(ValueError, match=msg):
            gate.parse_max_memory(bad)
    base = ["--model", str(ckpt), "--device", "cpu", "--quiet"]
    assert gate.main(base + ["--max-memory", "0=1GiB"]) == 2
    assert "max_memory needs device_map (e.g. --device-map auto)" in capsys.readouterr().err
    assert gate.main(base + ["--device-map", "auto", "--max-memory", "zero=1GiB"]) == 2
    assert "max_memory item 'zero=1GiB'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_memory needs device_map"):
        gate.load_model(str(ckpt), max_memory={"cpu": "1GiB"})


# ---------------------------------------------------------------------------------------------- realscale

def test_realscale_tiny_receipt_and_extrapolation(tmp_path, monkeypatch):
    short_documents(monkeypatch)
    out = tmp_path / "rs.json"
    assert realscale.main(["--arch", "olmoe", "--layers", "2", "--width", "tiny", "--workdir",
                           str(tmp_path / "w"), "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["provenance"]["commit"] and r["settings"]["layers"] == 2
    a = r["archs"]["olmoe"]
    assert not a.get("errors")
    assert {"synth", "gate", "checkpoint", "decode", "gate_split", "extrapolation", "params"} <= set(a)
    assert len(a["synth"]["shards"]) >= 2 and a["synth"]["host_peak_bytes"] > 0
    assert set(a["gate"]["arms"]) == {"rtn/experts/W4A8", "rtn/experts+attn/W4A8", "gptq/experts/W4A8 draw#0",
                                      "gptq/experts+attn/W4A8 draw#0"}
    gp = a["gate"]["gptq_per_layer"]["gptq/experts/W4A8 draw#0"]
    assert gp["expert_matrices_per_layer"] == 2 * 64 and gp["per_expert_matrix_s"] > 0
    assert a["checkpoint"]["bytes"] > 0 and a["checkpoint"]["load"]["s"] > 0
    assert a["decode"]["int4"]["tokens_per_s"] > 0 and a["decode"]["bf16"]["tokens_per_s"] > 0
    for name, e in a["extrapolation"].items():
        if isinstance(e, dict):
            assert e["full_layers"] == 16 and e["layers"] == 2, name
            assert e["measured"] == pytest.approx(e["fixed"] + 2 * e["per_layer"]), name
            assert e["full_depth"] == pytest.approx(e["fixed"] + 16 * e["per_layer"]), name
    # the parameter extrapolation is exact: a 16-layer tiny model has that many parameters
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(synth.synth_config("olmoe", 16, "tiny"))
    assert a["extrapolation"]["params"]["full_depth"] == sum(p.numel() for p in m.parameters())
    # a second architecture merges into the same receipt
    realscale.merge_receipt(out, {"arch": "qwen3_moe", "layers": 1}, r["settings"], "x")
    assert set(json.loads(out.read_text())["archs"]) == {"qwen3_moe", "olmoe"}


def test_realscale_bad_inputs(tmp_path, capsys):
    assert realscale.main(["--arch", "olmoe", "--layers", "17", "--width", "tiny", "--workdir", str(tmp_path),
                           "--out", str(tmp_path / "r.json")]) == 2
    assert "--layers must be in [1, 16] for olmoe" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        realscale.main(["--arch", "llama", "--layers", "1", "--workdir", str(tmp_path), "--out", "r.json"])
    e = realscale.extrapolate(10.0, 2, 32, fixed=2.0)
    assert (e["per_layer"], e["full_depth"]) == (4.0, 2.0 + 32 * 4.0)


# ---------------------------------------------------------------------------------------------- quantisation

@pytest.mark.parametrize("scheme", ["rtn", "gptq"])
def test_offloaded_model_quantises_like_the_resident_one(scheme):
    from accelerate import cpu_offload
    from int4lab.quantize import quantize_model
    calib = torch.randint(0, 256, (2, 32))
    a, b = tiny_model("qwen3_moe"), tiny_model("qwen3_moe")
    cpu_offload(b, execution_device=torch.device("cpu"))     # weights on meta, fetched by hooks per forward
    assert b.model.layers[0].mlp.experts.gate_up_proj.device.type == "meta"
    kw = dict(calib_ids=calib, min_rows=4) if scheme == "gptq" else {}
    qa, _ = quantize_model(a, scheme, "experts+attn", progress=False, **kw)
    qb, rb = quantize_model(b, scheme, "experts+attn", progress=False, **kw)
    for x, y in zip(qa.model.layers, qb.model.layers):
        assert torch.equal(x.mlp.experts.gate_up_packed, y.mlp.experts.gate_up_packed)
        assert torch.equal(x.self_attn.o_proj.packed, y.self_attn.o_proj.packed)
    ids = torch.randint(0, 256, (1, 8))
    assert torch.equal(qa(ids).logits, qb(ids).logits)
    assert len(rb.timing) == 2


def test_onload_leaves_every_tensor_on_the_execution_device():
    """Detaching accelerate's offload hook puts each tensor back where it was before dispatch (the host, where
    transformers loads a device map's "cpu" entries), so _onload must detach before placing. The bug this
    pins down failed the GPU/host split run on the H200; here meta stands in for the GPU when there is none."""
    from accelerate.hooks import attach_align_device_hook
    from accelerate.utils import OffloadedWeightsLoader
    from int4lab.quantize.placement import onload as _onload
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("meta")
    layer = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.LayerNorm(4))
    weights = OffloadedWeightsLoader(state_dict={k: v.clone() for k, v in layer.state_dict().items()})
    attach_align_device_hook(layer, execution_device=dev, offload=True, weights_map=weights)
    assert layer[0].weight.device.type == "meta"               # offloaded: fetched per forward
    _onload(layer)
    for name, t in layer.named_parameters():
        assert t.device.type == dev.type, name
    assert not any(hasattr(m, "_hf_hook") for m in layer.modules())


def test_batched_gptq_equals_the_per_expert_sweep():
    from int4lab.gptq import gptq_pack_int4_b32, gptq_pack_int4_b32_experts
    E, N, K = 3, 64, 128
    w = torch.randn(E, N, K) * 0.02
    X = torch.randn(E, 256, K)
    X[1, :, 7] = 0                                             # a dead input channel in one expert
    H = 2 * X.transpose(1, 2) @ X / 256
    p, s = gptq_pack_int4_b32_experts(w, H)
    for e in range(E):
        pe, se = gptq_pack_int4_b32(w[e], H[e])
        assert torch.equal(p[e], pe) and torch.equal(s[e], se)
    with pytest.raises(ValueError, match="hessian must have shape"):
        gptq_pack_int4_b32_experts(w, H[:2])


def test_load_quantized_refuses_an_unknown_format_version(tmp_path):
    from safetensors.torch import load_file, save_file
    from int4lab.quantize import FORMAT_VERSION, load_quantized, quantize_model, read_metadata, save_quantized
    m, _ = quantize_model(tiny_model("mixtral"), "rtn", "experts", progress=False)
    path = tmp_path / "q.safetensors"
    save_quantized(m, path)
    meta = read_metadata(path)
    assert meta["format_version"] == str(FORMAT_VERSION)
    save_file(load_file(path), str(tmp_path / "future.safetensors"), metadata={**meta, "format_version": "999"})
    with pytest.raises(ValueError, match="format_version '999' is not supported"):
        load_quantized(tmp_path / "future.safetensors", tiny_model("mixtral"))
    back, _ = load_quantized(path, tiny_model("mixtral"))
    for x, y in zip(m.state_dict().values(), back.state_dict().values()):
        assert torch.equal(x, y)


# ---------------------------------------------------------------------------------------------- the gate at scale

def test_fit_depths_and_the_group_prediction():
    from lab.realscale_gate import predict_groups
    f = realscale.fit_depths({2: 10.0, 4: 16.0}, 16)
    assert (f["fixed"], f["per_layer"], f["full_depth"]) == pytest.approx((4.0, 3.0, 4.0 + 16 * 3.0))
    assert f["formula"] == "4 + 16 x 3 = 52" and "warning" not in f
    f = realscale.fit_depths({1: 5.0, 2: 7.5, 4: 11.0}, 48)                   # least squares through three
    assert f["per_layer"] == pytest.approx(np.polyfit([1, 2, 4], [5.0, 7.5, 11.0], 1)[0])
    assert f["full_depth"] == pytest.approx(f["fixed"] + 48 * f["per_layer"])
    assert realscale.fit_depths({2: 8.0}, 32)["full_depth"] == pytest.approx(128.0)
    neg = realscale.fit_depths({1: 5.0, 2: 4.0}, 16)
    assert "warning" in neg and neg["undecided"] and "undecided" in neg["warning"]
    with pytest.raises(ValueError, match="two different depths"):
        realscale.fit_depths({2: 1.0, "2": 2.0}, 16)

    G = 2 ** 30
    p = predict_groups(80 * G, 13 * G, 4 * G, 15 * G, 3 * G, 16)
    assert (p["arms_per_group"], p["groups"], p["fits"]) == (13, 2, True)      # floor(49 / 4) + 1
    assert p["peak_bytes"] == 13 * G + max(12 * 4 * G + 15 * G, 13 * 4 * G + 3 * G) <= 80 * G
    assert predict_groups(80 * G, 60 * G, 4 * G, 25 * G, 3 * G, 16)["fits"] is False
    assert predict_groups(80 * G, 1 * G, 1 * G, 2 * G, 1 * G, 16)["groups"] == 1


def test_a_target_read_off_a_falling_fit_is_undecided(monkeypatch):
    # gate_s measured 30 s at 1 layer and 20 s at 2: the fit's full depth is negative; the target must be
    # neither met nor missed, and the GPTQ share of a negative total is not given.
    import lab.realscale_gate as rg
    pts = {1: {"gate_s": 30.0, "forward_s": 20.0, "default_gate_s": 300.0, "gptq_sweep_default_s": 50.0},
           2: {"gate_s": 20.0, "forward_s": 10.0, "default_gate_s": 200.0, "gptq_sweep_default_s": 60.0}}
    monkeypatch.setattr(rg, "quantities", lambda d: {**{k: None for k in rg.FITTED}, **pts[d["L"]],
                                                     "score_s": 1.0})
    out = rg.extrapolate_arch("qwen3_moe", {L: {"L": L, "gate": {"groups": [], "arms": 1}} for L in pts},
                              None, "auto")
    assert out["targets"]["gate_s"]["met"] is None and out["targets"]["gate_over_forwards"]["met"] is None
    assert out["readme_defaults"]["gptq_share"] is None
    assert {"gate_s", "forward_s", "default_gate_s"} <= set(out["undecided_fits"])


def test_realscale_gate_runs_the_readme_command_on_the_cpu(tmp_path, monkeypatch):
    from lab import realscale_gate as rg
    short_documents(monkeypatch)
    out, work = tmp_path / "rsg.json", tmp_path / "w"
    rc = rg.main(["--arch", "olmoe", "--layers", "2", "1", "--width", "tiny", "--workdir", str(work), "--out", str(out),
                  "--gate-args=--texts ood --max-docs 20 --lottery 0 --calib-draws 1 --boot 100 --parity-steps 0 "
                  "--calib-tokens 512 --min-rows 4"])
    assert rc == 0
    r = json.loads(out.read_text())
    a = r["archs"]["olmoe"]
    assert r["settings"]["readme_flags"] == rg.README_FLAGS and a["full_layers"] == 16
    assert list(a["depths"]) == ["1", "2"] and "warmup" in a["depths"]["1"] and "warmup" not in a["depths"]["2"]
    for L, d in a["depths"].items():
        g = d["gate"]
        assert "--scheme rtn gptq --targets experts experts+attn" in d["command"]
        assert g["arms"] == 4 and g["groups"] == [4] and g["s"] >= g["seconds"] > 0 and g["host_peak_bytes"] > 0
        assert 0 < g["timing"]["forward_s"] <= g["timing"]["score_s"]
        assert set(g["verdicts"]) == {"rtn/experts/W4A8", "rtn/experts+attn/W4A8", "gptq/experts/W4A8 draw#0",
                                      "gptq/experts+attn/W4A8 draw#0"}
    e = a["extrapolation"]
    for k, f in e["fits"].items():                      # the arithmetic written in the receipt holds
        for L, v in f["points"].items():
            assert v == pytest.approx(f["fixed"] + int(L) * f["per_layer"], rel=1e-9, abs=1e-6), k
        assert f["full_depth"] == pytest.approx(f["fixed"] + 16 * f["per_layer"]), k
    assert e["fits"]["checkpoint_bytes"]["per_layer"] > 0
    assert set(e["targets"]) >= {"gate_s", "gate_over_forwards"}
    assert list(work.iterdir()) == []                   # each depth's directory removed, nothing else touched
    assert rg.main(["--arch", "olmoe", "--layers", "17", "--workdir", str(work), "--out", str(out)]) == 2


# ---------------------------------------------------------------------------------------------- drivers' logic

def _args(*argv):
    from lab import realscale_gate as rg
    return rg.parser().parse_args(["--workdir", "w", "--out", "o", *argv])


def test_realscale_gate_argument_checks():
    from lab import realscale_gate as rg
    assert rg.check_args(_args("--arch", "qwen3_moe", "mixtral", "--layers", "3", "1", "2")) == {
        "qwen3_moe": [1, 2, 3], "mixtral": [1, 2, 3]}
    assert rg.check_args(_args("--arch", "olmoe", "mixtral", "--full")) == {"olmoe": [16], "mixtral": [32]}
    for argv, msg in ((("--arch", "olmoe", "--full", "--layers", "2"), "not with --full"),
                      (("--arch", "olmoe"), "give the depths to measure"),
                      (("--arch", "olmoe", "mixtral", "--layers", "2", "20"), r"in \[1, 16\] for olmoe"),
                      (("--arch", "olmoe", "--layers", "1", "2", "--max-memory", "0=1GiB"), "needs --device-map"),
                      (("--arch", "olmoe", "--layers", "1", "2", "--warmup-full"), "only with --full"),
                      (("--arch", "olmoe", "--layers", "1", "2", "--gate-args=--no-such-flag"), "not flags the gate takes")):
        with pytest.raises(ValueError, match=msg):
            rg.check_args(_args(*argv))
    assert rg.main(["--arch", "olmoe", "--workdir", "w", "--out", "o"]) == 2
    assert rg.window_of("qwen3_moe", "real", []) == 40960 and rg.window_of("olmoe", "real", ["--window", "64"]) == 64
    assert rg.gpu_cap(["0=70GiB", "cpu=100GiB"]) == 70 * 2 ** 30 and rg.gpu_cap(None) is None


def _summary(layers, tokens=1000, docs=20):
    """A depth's summary as realscale_gate.summarise writes it, with times linear in the layers."""
    return {"arms": 8, "arms_by_kind": {"rtn": 2, "lottery": 2, "gptq": 4}, "groups": [5, 3],
            "build_s_by_kind": {"rtn": 1.0 * layers, "lottery": 1.2 * layers, "gptq": 8.0 * layers},
            "gptq_sweep_s": 4.0 * layers, "gptq_forward_s": 2.0 * layers,
            "texts": {"a": {"tokens": tokens // 2, "docs": docs // 2}, "b": {"tokens": tokens // 2, "docs": docs // 2}},
            "timing": {"score_s": 10.0 * layers, "floor_s": 0.0, "bootstrap_s": 0.8, "load_source_s": 2.0,
                       "parity_s": 0.5}}


def test_default_seconds_scale_each_part_by_its_unit_cost():
    from lab.realscale_predict import default_seconds, gptq_share
    arms = {"rtn": 2, "lottery": 32, "gptq": 6}
    full = {"tokens": 250000, "docs": 160}
    d = default_seconds(_summary(2), full, arms)
    assert d["build_s"] == pytest.approx(2.0 / 2 * 2 + 2.4 / 2 * 32 + 16.0 / 4 * 6)
    passes = 8 + 2                                                    # two groups, one source pass each
    unit = 20.0 / (passes * 1000)
    assert d["score_s"] == pytest.approx(unit * (40 + 8) * 250000)    # 40 arms, ceil(40 / 5) = 8 groups
    assert d["floor_s"] == pytest.approx(unit * 2 * 250000 / 16)      # not measured: estimated
    assert d["bootstrap_s"] == pytest.approx(0.8 * 40 / 8 * 160 / 20)
    assert d["fixed_s"] == 2.5
    assert d["total"] == pytest.approx(d["build_s"] + d["score_s"] + d["floor_s"] + d["bootstrap_s"] + 2.5)
    assert "x 48 passes (40 arms, 8 groups)" in d["formulas"]["score_s"]
    g = gptq_share(_summary(3), arms)
    assert (g["sweep_s"], g["calibration_forward_s"]) == pytest.approx((12.0 / 4 * 6, 6.0 / 4 * 6))
    with pytest.raises(ValueError, match="arms of kind 'lottery' were not measured"):
        default_seconds({**_summary(1), "arms_by_kind": {"rtn": 2, "gptq": 4}}, full, arms)
    # the fit of per-depth defaults through three depths is exact for linear parts
    from lab.realscale import fit_depths
    pts = {L: default_seconds(_summary(L), full, arms)["total"] for L in (1, 2, 3)}
    f = fit_depths(pts, 48)
    assert f["full_depth"] == pytest.approx(default_seconds(_summary(48), full, arms)["total"])


def test_earlier_fit_reads_the_committed_receipt_by_field(tmp_path):
    from lab.realscale_predict import earlier_fit
    assert earlier_fit(tmp_path / "absent.json", "olmoe") is None
    (tmp_path / "bad.json").write_text('{"archs": {}}')
    assert earlier_fit(tmp_path / "bad.json", "olmoe") is None
    e = earlier_fit(None, "olmoe")
    if e is not None:                                                 # the receipt may be regenerated away
        assert e["gate_s"] > 0 and len(e["depths"]) >= 2 and e["receipt"] == "realscale_gate_olmoe_h100.json"


def test_realscale_gate_full_depth_on_the_cpu(tmp_path, monkeypatch):
    from lab import realscale_gate as rg
    from lab import realscale_predict as rp
    short_documents(monkeypatch)
    monkeypatch.setattr(rp, "full_text_size", lambda window: {"tokens": 5000, "docs": 40})
    monkeypatch.setitem(rg.FULL_LAYERS, "olmoe", 2)         # "published depth" 2: the same path, CPU-sized

    out, work = tmp_path / "full.json", tmp_path / "w"
    gate_args = ("--gate-args=--texts ood --max-docs 20 --lottery 1 --calib-draws 1 --boot 100 --parity-steps 0 "
                 "--calib-tokens 512 --min-rows 4 --no-floor")
    rc = rg.main(["--arch", "olmoe", "--full", "--width", "tiny", "--workdir", str(work), "--out", str(out), gate_args])
    assert rc == 0
    r = json.loads(out.read_text())
    a = r["archs"]["olmoe"]
    f = a["full"]
    assert list(a["depths"]) == ["2"] and "warmup" not in a["depths"]["2"] and "extrapolation" not in a
    assert r["settings"]["warmup"] == "none"
    assert "that earlier runs on the same machine had not already paid" in report.warmup_text(r)
    assert f["arms"] == {"rtn": 2, "lottery": 2, "gptq": 2} and f["wall_s"] == pytest.approx(
        f["checkpoint_s"] + f["gate_s"])
    assert f["phases"]["gptq_sweep_s"] > 0 and f["gate_over_forwards"] > 1 and f["host_peak_bytes"] > 0
    assert a["depths"]["2"]["defaults"]["arms"] == {"rtn": 2, "lottery": 32, "gptq": 6}
    assert (f["earlier_fit"] is None) == (rp.earlier_fit(None, "olmoe") is None)
    assert list(work.iterdir()) == []
    warm = tmp_path / "warm.json"           # --warmup-full: the small gate first, recorded beside the measured one
    assert rg.main(["--arch", "olmoe", "--full", "--warmup-full", "--width", "tiny", "--workdir", str(work),
                    "--out", str(warm), gate_args]) == 0
    r = json.loads(warm.read_text())
    assert r["settings"]["warmup"] == "before the run" and r["archs"]["olmoe"]["depths"]["2"]["warmup"]["rc"] == 0
    assert "warm-up gate before the run" in report.warmup_text(r)


def test_a_stopped_run_log_is_summarised_from_its_lines(tmp_path):
    """A real-width run stopped before its receipt had a depth: the report reads the phases that finished from the
    stage log beside it, figures as printed there."""
    from lab.report import runlog
    text = ("[03:21:31 +  21.3s] olmoe 16 layers: checkpoint 12.89 GiB written in 19.4 s\n"
            "source synth loaded in 5.1 s; 252147 tokens in 36 forwards per model; window 4096\n"
            "built rtn/experts/W4A8 in 0.7 s (quantise 0.3 s)\n"
            "built rtn/experts/W4A8 lottery#1 in 1.2 s (quantise 0.8 s)\n"
            "built rtn/experts/W4A8 lottery#2 in 1.0 s (quantise 0.6 s)\n"
            "built gptq/experts/W4A8 draw#0 in 11.4 s (quantise 10.9 s)\n"
            "built rtn/experts+attn/W4A8 in 0.9 s (quantise 0.3 s)\n"
            "group 0: 11 arms scored in 381.5 s (free 18.8 GiB against build peak 20.1 + scoring 2.5 GiB)\n"
            "== done (488 s in)\n")
    text = "== dither on CUDA against the CPU (0 s in)\n== gate at full depth: OLMoE 16 layers (15 s in)\n" + text
    s = runlog.summary(text)
    assert (s["checkpoint_gib"], s["checkpoint_s"], s["tokens"], s["forwards"], s["window"]) == \
        (12.89, 19.4, 252147, 36, 4096)
    assert s["built"] == {"rtn": [0.3], "lottery": [0.8, 0.6], "gptq": [10.9], "rtn/experts+attn": [0.3]}
    assert s["groups"] == [(11, 381.5)] and s["stage_s"] == 473 and s["arms_built"] == 5
    log = tmp_path / "realscale_gate_full_olmoe_h100.log"
    log.write_text(text)
    line = runlog.summary_text(log)
    assert "lottery 0.7 s (2)" in line and "34.7 s per arm" in line
    (tmp_path / "empty.log").write_text("")
    assert runlog.summary_text(tmp_path / "empty.log").endswith("no phase finished.")
