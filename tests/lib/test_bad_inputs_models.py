"""Bad inputs to the quantised models and their checkpoints: one behaviour per input on every path, and a refused
load leaves the model as it was (tests/lib/test_bad_inputs.py holds the first round of cases)."""
import json

import pytest
import torch
from torch import nn

import int4lab as il
from int4lab.quantize import Int4Experts, load_quantized, quantize_model, read_metadata, save_quantized
from int4lab.quantize.prefill import prefill_experts

from test_quantize import tiny_model


# ---------------------------------------------------------------------------------------------- expert ids

def _experts(E=4, H=64, I=32, device="cpu"):
    gu = il.pack_int4_b32(torch.randn(E, 2 * I, H) * 0.1)
    dn = il.pack_int4_b32(torch.randn(E, H, I) * 0.1)
    return Int4Experts(tuple(t.to(device) for t in gu), tuple(t.to(device) for t in dn), nn.SiLU(), "int8")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("bad", [-1, 4, 9])
@pytest.mark.parametrize("path", ["reference", "kernels", "prefill"])
def test_out_of_range_expert_ids_one_rule_on_every_path(device, bad, path):
    """An id outside [0, E): refused by name where the ids are on the host (the CPU reference, the kernels in the
    interpreter, the prefill path), a NaN row for that token only on a GPU (no read-back; as under capture).
    E itself, transformers' expert-parallel padding, is refused as well: an int4 model is never expert-parallel."""
    mod = _experts(device=device)
    mod.kernels = path != "reference"
    mod.prefill_min_rows = 0 if path == "prefill" else None
    x = torch.randn(3, 64, device=device).bfloat16()
    ids = torch.tensor([[0, 1], [bad, 2], [3, 0]], device=device)
    w = torch.full((3, 2), 0.5, device=device)
    if device == "cpu":
        with pytest.raises(ValueError, match=rf"top_k_index must lie in \[0, E\) = \[0, 4\), got values in "
                                             rf"\[{min(bad, 0)}, {max(bad, 3)}\]"):
            mod(x, ids, w)
    else:
        assert mod(x, ids, w).float().isnan().any(1).tolist() == [False, True, False]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_prefill_and_reference_give_the_gpu_rule_without_a_read_back():
    """What the GPU paths compute, checked on the host: the prefill path's mask and the reference loop's weights
    make the bad token's row NaN and leave the others as they were."""
    mod = _experts()
    x = torch.randn(3, 64).bfloat16()
    ids = torch.tensor([[0, 1], [7, 2], [3, 0]])
    w = torch.full((3, 2), 0.5)
    y = prefill_experts(mod, x, ids, w)
    assert y.float().isnan().any(1).tolist() == [False, True, False]
    good = torch.tensor([[0, 1], [1, 2], [3, 0]])
    mod.kernels = False
    ref = mod(x, good, w)
    assert torch.equal(ref[[0, 2]], mod(x[[0, 2]], good[[0, 2]], w[[0, 2]]))


# ---------------------------------------------------------------------------------------------- load_quantized

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "q.safetensors"
    save_quantized(quantize_model(tiny_model("mixtral"), progress=False)[0], path)
    return path


def _resaved(saved, out, edit):
    """The saved file rewritten with its state edited by edit(state) and its sha256 list made to match."""
    from safetensors.torch import load_file, save_file
    from int4lab.quantize.checkpoint import tensor_sha256
    meta, state = dict(read_metadata(saved)), load_file(saved)
    edit(state)
    meta["sha256"] = json.dumps({k: tensor_sha256(v) for k, v in state.items()})
    save_file(state, str(out), metadata=meta)
    return out


def _snapshot(model):
    return [type(m).__name__ for m in model.modules()], {k: v.clone() for k, v in model.state_dict().items()}


def _no_tensor_read(monkeypatch):
    from int4lab.quantize import checkpoint

    def tripwire(*a, **k):
        raise AssertionError("a tensor was read before the header was checked")
    monkeypatch.setattr(checkpoint, "tensor_sha256", tripwire)


@pytest.mark.parametrize("edit,match", [
    (lambda s: s.__setitem__("extra.huge", torch.zeros(4096)), r"unexpected \['extra.huge'\]"),
    (lambda s: s.pop("model.layers.1.mlp.experts.down_scales"),
     r"missing \['model.layers.1.mlp.experts.down_scales'\]"),
    (lambda s: s.__setitem__("model.layers.0.mlp.experts.down_scales",
                             s["model.layers.0.mlp.experts.down_scales"][:, :, :1].contiguous()),
     r"tensor model.layers.0.mlp.experts.down_scales is declared \(8, 64, 1\) F16, the model expects \(8, 64, \d+\)"),
    (lambda s: s.__setitem__("model.layers.0.mlp.experts.down_scales",
                             s["model.layers.0.mlp.experts.down_scales"].float()), r"declared .* F32, .* F16"),
], ids=["extra_tensor", "missing_tensor", "wrong_shape", "wrong_dtype"])
def test_refused_load_leaves_the_model_as_it_was_and_reads_no_tensor(saved, tmp_path, monkeypatch, edit, match):
    """Names, shapes and dtypes are checked from the header before any tensor is read (a declared-huge extra tensor
    is never loaded), and the refusal puts the base model's modules back: same modules, same weights, unquantised."""
    bad = _resaved(saved, tmp_path / "bad.safetensors", edit)
    base = tiny_model("mixtral")
    before = _snapshot(base)
    _no_tensor_read(monkeypatch)
    with pytest.raises(ValueError, match=r"bad.safetensors: .*" + match):
        load_quantized(bad, base)
    after = _snapshot(base)
    assert after[0] == before[0] and not hasattr(base, "int4_scheme")
    assert after[1].keys() == before[1].keys() and all(torch.equal(before[1][k], after[1][k]) for k in before[1])
    monkeypatch.undo()
    model, sch = load_quantized(saved, base)                  # the same model still loads the good file
    assert sch.name == "rtn/experts/W4A8" and isinstance(model.model.layers[0].mlp.experts, Int4Experts)


def test_header_tensors_must_be_the_checksummed_ones(saved, tmp_path, monkeypatch):
    """A tensor the metadata's sha256 list does not name is refused before the model is touched."""
    from safetensors.torch import load_file, save_file
    state = load_file(saved)
    state["extra.huge"] = torch.zeros(4096)
    save_file(state, str(tmp_path / "x.safetensors"), metadata=read_metadata(saved))
    base = tiny_model("mixtral")
    _no_tensor_read(monkeypatch)
    with pytest.raises(ValueError, match=r"x.safetensors: the header's tensors differ from the metadata's sha256 "
                                         r"list: unlisted \['extra.huge'\]"):
        load_quantized(tmp_path / "x.safetensors", base)
    assert not any(isinstance(m, Int4Experts) for m in base.modules())


# ---------------------------------------------------------------------------------------------- GPTQ, the gate

def test_moe_gptq_refuses_an_asymmetric_hessian_as_its_2d_twin_does():
    from int4lab.gptq import gptq_pack_int4_b32, gptq_pack_int4_b32_experts
    w = torch.randn(3, 16, 64)
    x = torch.randn(3, 256, 64)
    H = x.transpose(1, 2) @ x / 256
    H[1, 0, 5] += 1.0                                                     # expert 1 only
    with pytest.raises(ValueError, match=r"hessian must be symmetric"):
        gptq_pack_int4_b32(w[1], H[1])
    with pytest.raises(ValueError, match=r"hessian must be symmetric \(H = 2/n Σ x xᵀ\): experts \[1\] are not"):
        gptq_pack_int4_b32_experts(w, H)
    H[1, 0, 5] -= 1.0
    gptq_pack_int4_b32_experts(w, H)                                      # the symmetric one still packs


def test_calibration_length_follows_the_window_rule():
    """--calib-len past the trained context is refused as --window is, by the CLI's checks and by run_gate."""
    from int4lab.gate.settings import check_settings
    with pytest.raises(ValueError, match=r"--calib-len: calib_len must be at most the model's trained context 256"):
        check_settings(calib_len=512, trained_context=256)
    with pytest.raises(ValueError, match=r"--window: window must be at most the model's trained context 256"):
        check_settings(window=512, trained_context=256)
    check_settings(calib_len=256, trained_context=256)


def test_gate_cli_refuses_a_long_calibration_before_loading(capsys, monkeypatch):
    from int4lab import gate
    from int4lab.gate import cli
    monkeypatch.setattr(cli, "run_gate", lambda *a, **k: pytest.fail("the gate ran"))
    assert gate.main(["--model", "olmoe", "--calib-len", "100000"]) == 2
    assert "--calib-len: calib_len must be at most the model's trained context" in capsys.readouterr().err


def test_gate_cli_default_calibration_fits_a_long_trained_context(capsys, monkeypatch):
    """A trained context longer than --calib-tokens (Qwen3-MoE's 40,960, Mixtral's 32,768 against the default
    16,384) is no error when --calib-len is left out: the calibration sequence is cut to the calibration set."""
    from int4lab import gate
    from int4lab.gate import cli
    from int4lab.gate.run import calib_len_default
    assert calib_len_default(40960, 16384) == 16384 and calib_len_default(4096, 16384) == 4096
    ran = {}
    monkeypatch.setattr(cli, "run_gate", lambda *a, **k: ran.update(k) or pytest.skip("reached the gate"))
    with pytest.raises(pytest.skip.Exception):                          # tiny OLMoE: trained context 256
        gate.main(["--model", "olmoe", "--scheme", "gptq", "--calib-tokens", "128", "--out", "x.json"])
    assert "calib_tokens must be at least" not in capsys.readouterr().err and ran["calib_len"] is None


def test_fallback_is_shown_beside_the_verdict():
    """A GPTQ arm whose experts partly fell back to round-to-nearest says so where its verdict is printed: the
    CLI's table and the README's."""
    from int4lab.gate.table import fallback_note, format_table, rows
    ci = {"value": 0.001, "lo": 0.0, "hi": 0.002}
    arm = {"kind": "gptq", "quant_report": {"gptq_experts": 17, "fallback": [{"layer": 0, "expert": e, "rows": 1}
                                                                             for e in range(111)]},
           "texts": {"test": {"tokens": 10, "ppl": 2.0, "rel": ci, "kl": ci, "top1": {"value": 0.9}}},
           "held_out": {"test": {"tokens": 5, "rel": ci, "kl": ci, "top1": {"value": 0.9}}},
           "verdict": {"verdict": "PASS"}}
    assert fallback_note(arm) == " (GPTQ→RTN fallback: 111 of 128 experts)"
    assert fallback_note({**arm, "kind": "rtn"}) == "" and fallback_note({**arm, "quant_report": {}}) == ""
    payload = {"texts": {"test": {"tokens": 10, "source_ppl": 2.0}}, "arms": {"gptq/experts/W4A8 draw#0": arm},
               "budget": 0.01, "settings": {"window": 8, "n_boot": 100, "seed": 0},
               "split": {"seed": 0, "texts": {"test": {"dev": [0], "held_out": [1]}}}}
    assert rows(payload)[-1]["verdict"] == "PASS (GPTQ→RTN fallback: 111 of 128 experts)"
    assert format_table(payload).splitlines()[-3].endswith("PASS (GPTQ→RTN fallback: 111 of 128 experts)")


def test_gate_table_in_the_readme_shows_the_fallback(tmp_path):
    from int4lab.gate import render_gate_table
    ci = {"value": 0.001, "lo": 0.0, "hi": 0.002}
    arm = {"kind": "gptq", "quant_report": {"gptq_experts": 17, "fallback": [{}] * 111},
           "texts": {"test": {"rel": ci, "kl": ci}}, "held_out": {"test": {"rel": ci, "kl": ci}},
           "verdict": {"verdict": "PASS"}}
    rec = {"settings": {"scored": "every arm on every document"}, "model": "tiny", "split": {},
           "texts": {"test": {"source_ppl": 2.0, "tokens": 10}}, "arms": {"gptq/experts/W4A8 draw#0": arm},
           "choice": {"chosen": "gptq/experts/W4A8 draw#0", "held_out": arm["held_out"], "verdict": arm["verdict"]}}
    (tmp_path / "gate_tiny.json").write_text(json.dumps(rec))
    line = [x for x in render_gate_table(tmp_path).splitlines() if "draw#0" in x][0]
    assert "| PASS (GPTQ→RTN fallback: 111 of 128 experts) |" in line


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt_dir") / "olmoe"
    tiny_model("olmoe").save_pretrained(d, max_shard_size="100KB")
    from int4lab.models import load_tokenizer
    load_tokenizer().save_pretrained(d)
    return d


@pytest.mark.parametrize("damage,match", [
    (lambda d: [p.unlink() for p in d.glob("*.safetensors")] and (d / "model.safetensors.index.json").unlink(),
     r"holds no weights \(no \*.safetensors or \*.bin beside config.json\)"),
    (lambda d: sorted(d.glob("model-*.safetensors"))[-1].unlink(), r"weight shards named in "
                                                                   r"model.safetensors.index.json are missing"),
    (lambda d: (d / "tokenizer.json").unlink(), r"holds no tokenizer"),
    (lambda d: (d / "model.safetensors.index.json").write_text("{"), r"is not a usable shard index"),
], ids=["no_weights", "missing_shard", "no_tokenizer", "broken_index"])
def test_gate_refuses_an_incomplete_checkpoint_directory_before_loading(checkpoint_dir, tmp_path, capsys, monkeypatch,
                                                                         damage, match):
    import shutil
    from int4lab import gate
    from int4lab.gate import cli
    d = tmp_path / "olmoe"
    shutil.copytree(checkpoint_dir, d)
    damage(d)
    monkeypatch.setattr(cli, "run_gate", lambda *a, **k: pytest.fail("the gate ran"))
    assert gate.main(["--model", str(d)]) == 2
    err = capsys.readouterr().err
    assert f"--model '{d}'" in err and __import__("re").search(match, err) and "Traceback" not in err
    with pytest.raises(ValueError, match=match):
        gate.load_model(str(d))


def test_unknown_lm_eval_task_is_refused_before_the_model_loads():
    pytest.importorskip("lm_eval")
    from int4lab import gate
    from int4lab.gate.lmeval import check_tasks

    def never(*a, **k):
        raise AssertionError("the model loaded before the task names were checked")
    with pytest.raises(ValueError, match=r"--tasks: \['wikitxet'\] are not lm-eval tasks"):
        gate.run_gate("olmoe", gate.plan_arms(), tasks=["wikitext", "wikitxet"], loader=never)
    check_tasks(["wikitext", "int4lab_test"])


def test_quantize_model_refuses_calibration_past_the_models_positions():
    m = tiny_model("mixtral")
    n = m.config.max_position_embeddings
    with pytest.raises(ValueError, match=rf"calib_ids must hold sequences of at most max_position_embeddings = {n} "
                                         rf"tokens .*got length {n + 1}"):
        quantize_model(m, "gptq", calib_ids=torch.zeros(1, n + 1, dtype=torch.int64), progress=False)


def test_export_refuses_a_calibration_window_past_the_trained_context(tmp_path, capsys, monkeypatch):
    from int4lab import export
    monkeypatch.setattr(export, "build_model", lambda *a, **k: pytest.fail("the model was built"))
    assert export.main(["--model", "olmoe", "--scheme", "gptq", "--calib-len", "4096", "--out",
                        str(tmp_path / "m.gguf")]) == 2
    assert "--calib-len: calib_len must be at most the model's trained context 256" in capsys.readouterr().err


def test_quantize_model_failing_half_way_leaves_the_float_model(monkeypatch):
    """An error (or Ctrl-C) after some layers were swapped puts every float module back."""
    from int4lab.quantize import driver
    m = tiny_model("mixtral")
    before = _snapshot(m)
    real, done = driver._quantize_layer_rtn, []

    def second_fails(layer, *a, **k):
        if done:
            raise KeyboardInterrupt
        done.append(real(layer, *a, **k))
    monkeypatch.setattr(driver, "_quantize_layer_rtn", second_fails)
    with pytest.raises(KeyboardInterrupt):
        quantize_model(m, progress=False)
    assert done and _snapshot(m)[0] == before[0] and not hasattr(m, "int4_scheme")
    monkeypatch.undo()
    quantize_model(m, progress=False)                                # and it still quantises afterwards
    assert isinstance(m.model.layers[1].mlp.experts, Int4Experts)
