"""Bad and edge inputs across the library, the quantised checkpoints and every CLI: each is refused before any
work with an error that names the argument (or flag) and the rule; nothing is answered silently wrong and no
data is lost.

    LIBRARY   a call, the exception type, a regex of the message naming the argument
    CLI       argv, a regex of stderr; exit code 2 and the work never started (it is replaced by a tripwire)
    then      the data-safety cases: atomic receipts and GGUF files, --force, default outputs in runs/, what
              realscale removes, partial receipts refused by the report; and the non-finite policy (packers
              refuse NaN / inf, kernels propagate them as torch.nn.functional.linear does).
"""
import json
import math
import os
from pathlib import Path

import pytest
import torch

import int4lab as il
from int4lab import export, gate
from int4lab.gate import cli as gate_cli
from int4lab.gate.settings import MIN_DOCS, check_settings
from int4lab.kernels import int4_linear, moe_decode_grouped, moe_decode_routed, moe_decode_step
from int4lab.format import dequant_int4_ref
from int4lab.quantize import load_quantized, quantize_model, read_metadata, save_quantized
from int4lab.quantize.driver import dithered_pack
from lab.provenance import write_receipt

from test_quantize import tiny_model

NO_CUDA = not torch.cuda.is_available()


# ---------------------------------------------------------------------------------------------- shared inputs

class Ctx:
    """Objects the cases need, built once per module on first use."""

    def __init__(self, root: Path):
        self.root = root
        self._cache = {}

    def _once(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def moe(self, T, A, device):
        E, H, I = 2, 64, 32
        gu = [t.to(device) for t in il.pack_int4_b32(torch.randn(E, 2 * I, H) * 0.2)]
        dn = [t.to(device) for t in il.pack_int4_b32(torch.randn(E, H, I) * 0.2)]
        return (torch.randn(T, H, device=device), torch.zeros(T, A, dtype=torch.int32, device=device),
                torch.ones(T, A, device=device), *gu, *dn)

    def quantised(self):
        return self._once("q", lambda: quantize_model(tiny_model("mixtral"), progress=False)[0])

    def saved(self):
        def make():
            path = self.root / "q.safetensors"
            save_quantized(self.quantised(), path)
            return path
        return self._once("saved", make)

    def variant(self, name, **changes):
        """The saved file's base model with config fields changed (top-k, experts, ...)."""
        from transformers import AutoModelForCausalLM
        cfg = tiny_model("mixtral").config
        for k, v in changes.items():
            setattr(cfg, k, v)
        return AutoModelForCausalLM.from_config(cfg).eval()

    def corrupt(self, name, edit):
        """A copy of the saved file with its bytes edited by edit(bytearray) -> bytes."""
        out = self.root / name
        out.write_bytes(edit(bytearray(self.saved().read_bytes())))
        return out

    def resaved(self, name, **meta_changes):
        """The saved file rewritten with metadata fields changed (None removes one)."""
        from safetensors.torch import load_file, save_file
        meta = dict(read_metadata(self.saved()))
        for k, v in meta_changes.items():
            meta.pop(k) if v is None else meta.__setitem__(k, v)
        out = self.root / name
        save_file(load_file(self.saved()), str(out), metadata=meta)
        return out


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    return Ctx(tmp_path_factory.mktemp("bad_inputs"))


def _flip_in_tensor(b: bytearray, name="model.layers.0.mlp.experts.down_packed") -> bytes:
    """Flip one byte inside tensor `name`'s data (located through the safetensors header)."""
    n = int.from_bytes(b[:8], "little")
    off = json.loads(bytes(b[8:8 + n]))[name]["data_offsets"][0]
    b[8 + n + off + 3] ^= 0x5A
    return bytes(b)


def _gptq(model, ids):
    return quantize_model(model, "gptq", calib_ids=ids, progress=False)


# ---------------------------------------------------------------------------------------------- the library

LIBRARY = [
    # kernels: an empty step is refused by name (was an AssertionError inside the launch plan)
    ("moe_step_zero_tokens", lambda c, d: moe_decode_step(*c.moe(0, 2, d)), ValueError,
     r"x must hold at least one token \(T >= 1\)"),
    ("moe_step_zero_slots", lambda c, d: moe_decode_step(*c.moe(1, 0, d)), ValueError,
     r"topk_ids must route each token to at least one expert \(A >= 1\)"),
    ("moe_routed_zero_tokens", lambda c, d: moe_decode_routed(*c.moe(0, 1, d)), ValueError, r"x must hold at least"),
    ("moe_grouped_zero_slots", lambda c, d: moe_decode_grouped(*c.moe(3, 0, d)), ValueError,
     r"topk_ids must route each token"),
    # quantisation
    ("calib_ids_above_vocab", lambda c, d: _gptq(tiny_model("mixtral"), torch.full((2, 16), 300)), ValueError,
     r"calib_ids must lie in \[0, vocab_size\) = \[0, 256\), got values in \[300, 300\]"),
    ("calib_ids_negative", lambda c, d: _gptq(tiny_model("mixtral"), torch.full((2, 16), -1)), ValueError,
     r"calib_ids must lie in \[0, vocab_size\)"),
    ("quantise_a_quantised_model", lambda c, d: quantize_model(c.quantised(), progress=False), ValueError,
     r"model is already quantised \(rtn/experts/W4A8\)"),
    ("dithered_pack_nan", lambda c, d: dithered_pack(torch.full((2, 32), math.nan), 0.1, torch.Generator()),
     ValueError, r"w must be finite"),
    # quantised checkpoints
    ("load_into_a_quantised_model", lambda c, d: load_quantized(c.saved(), c.quantised()), ValueError,
     r"base_model is already quantised"),
    ("load_truncated_file", lambda c, d: load_quantized(c.corrupt("half.safetensors", lambda b: b[:len(b) // 2]),
                                                        tiny_model("mixtral")), ValueError,
     r"half.safetensors: not a readable safetensors file \(truncated or corrupt\?\)"),
    ("load_truncated_header", lambda c, d: load_quantized(c.corrupt("head.safetensors", lambda b: b[:40]),
                                                          tiny_model("mixtral")), ValueError,
     r"not a readable safetensors file"),
    ("load_flipped_byte", lambda c, d: load_quantized(c.corrupt("flip.safetensors", _flip_in_tensor),
                                                      tiny_model("mixtral")), ValueError,
     r"tensor model\.layers\.0\.mlp\.experts\.down_packed fails its sha256 check"),
    ("load_top2_file_into_top8_model", lambda c, d: load_quantized(c.saved(), c.variant("top8", num_experts_per_tok=8)),
     ValueError, r"holds a model with top_k = 2, base_model has top_k = 8"),
    ("load_into_fewer_experts", lambda c, d: load_quantized(c.saved(), c.variant("e4", num_local_experts=4)),
     ValueError, r"holds a model with experts = 8, base_model has experts = 4"),
    ("load_into_another_arch", lambda c, d: load_quantized(c.saved(), tiny_model("olmoe")), ValueError,
     r"holds a model with arch = 'mixtral', base_model has arch = 'olmoe'"),
    ("load_format_1", lambda c, d: load_quantized(c.resaved("v1.safetensors", format_version="1"),
                                                  tiny_model("mixtral")), ValueError,
     r"format_version '1' is not supported .*predates the per-tensor sha256.*re-save it"),
    ("load_without_checksums", lambda c, d: load_quantized(c.resaved("nosum.safetensors", sha256=None),
                                                           tiny_model("mixtral")), ValueError,
     r"metadata field 'sha256' is missing"),
    # the gate's settings (the same rules the CLI applies, named by flag)
    ("max_docs_1", lambda c, d: check_settings(max_docs=1), ValueError,
     r"--max-docs: max_docs must be None \(every document\) or an int >= 20"),
    ("max_docs_negative", lambda c, d: check_settings(max_docs=-1), ValueError, r"--max-docs: max_docs must be"),
    ("max_docs_0", lambda c, d: check_settings(max_docs=0), ValueError, r"--max-docs: max_docs must be"),
    ("budget_inf", lambda c, d: check_settings(budget=math.inf), ValueError,
     r"--budget: budget must be a positive finite relative change below 1"),
    ("budget_nan", lambda c, d: check_settings(budget=math.nan), ValueError, r"--budget: budget must be"),
    ("budget_above_1", lambda c, d: check_settings(budget=1.5), ValueError, r"--budget: budget must be"),
    ("window_0", lambda c, d: check_settings(window=0), ValueError, r"--window: window must be a positive int"),
    ("window_past_trained_context", lambda c, d: check_settings(window=100000, trained_context=256), ValueError,
     r"--window: window must be at most the model's trained context 256"),
    ("batch_0", lambda c, d: check_settings(batch=0), ValueError, r"--batch: batch must be an int >= 1"),
    ("threads_negative", lambda c, d: check_settings(threads=-1), ValueError, r"--threads: threads must be"),
    ("floor_stride_0", lambda c, d: check_settings(floor_stride=0), ValueError, r"--floor-stride: floor_stride"),
    ("boot_5", lambda c, d: check_settings(n_boot=5), ValueError, r"--boot: n_boot must be an int >= 100"),
    ("unknown_text", lambda c, d: check_settings(texts=("wiki",)), ValueError, r"--texts: texts must be among"),
    ("device_tpu", lambda c, d: check_settings(device="tpu"), ValueError,
     r"--device: device must be cpu or cuda\[:N\], got 'tpu'"),
    pytest.param("device_cuda_without_cuda", lambda c, d: check_settings(device="cuda"), ValueError,
                 r"--device: .*torch sees no CUDA device", marks=pytest.mark.skipif(not NO_CUDA, reason="has CUDA")),
    ("run_gate_one_document", lambda c, d: gate.run_gate("tiny", gate.plan_arms(), max_docs=1, loader=_tripwire),
     ValueError, r"--max-docs: max_docs must be"),
    ("broken_config_json", lambda c, d: gate.load_model(str(_dir(c, "broken", '{"model_type": "olmoe", '))),
     ValueError, r"--model '.*broken': config.json is not valid JSON"),
    ("no_config_json", lambda c, d: gate.load_model(str(_dir(c, "empty", None))), ValueError,
     r"--model '.*empty' has no config.json"),
    ("truncated_checkpoint_weights", lambda c, d: gate.load_model(str(_truncated_checkpoint(c))), ValueError,
     r"--model '.*truncated': a weight file is not readable safetensors"),
    ("write_gguf_over_a_file", lambda c, d: export.write_gguf(c.quantised(), _file(c, "old.gguf")), FileExistsError,
     r"path '.*old.gguf' exists; pass --force"),
    ("write_gguf_to_a_directory", lambda c, d: export.write_gguf(c.quantised(), c.root), ValueError,
     r"path '.*' is a directory; name a file"),
]


def _tripwire(*a, **k):
    raise AssertionError("the work started before the arguments were checked")


def _dir(c, name, config_text):
    d = c.root / name
    d.mkdir(exist_ok=True)
    if config_text is not None:
        (d / "config.json").write_text(config_text)
    return d


def _file(c, name):
    p = c.root / name
    p.write_bytes(b"old")
    return p


def _truncated_checkpoint(c):
    d = c.root / "truncated"
    if not d.exists():
        tiny_model("olmoe").save_pretrained(d)
        w = next(d.glob("*.safetensors"))
        w.write_bytes(w.read_bytes()[:200])
    return d


@pytest.mark.parametrize("name,call,exc,match", [pytest.param(*c.values, marks=c.marks, id=c.values[0])
                                                 if hasattr(c, "marks") else pytest.param(*c, id=c[0]) for c in LIBRARY])
def test_library_refuses_by_name(ctx, device, name, call, exc, match):
    with pytest.raises(exc, match=match):
        call(ctx, device)


# ---------------------------------------------------------------------------------------------- the CLIs

def _gate(argv):
    return gate.main(argv)


def _export(argv):
    return export.main(argv)


def _realscale(argv):
    from lab import realscale
    return realscale.main(argv)


def _bench(argv):
    from lab.bench.cli import main
    return main(argv)


CLI = [
    (_gate, ["--model", "olmoe", "--max-docs", "1"], r"--max-docs: max_docs must be None .* int >= 20"),
    (_gate, ["--model", "olmoe", "--max-docs", "-1"], r"--max-docs: max_docs must be"),
    (_gate, ["--model", "olmoe", "--max-docs", "0"], r"--max-docs: max_docs must be"),
    (_gate, ["--model", "olmoe", "--budget", "inf"], r"--budget: budget must be a positive finite"),
    (_gate, ["--model", "olmoe", "--window", "0"], r"--window: window must be a positive int"),
    (_gate, ["--model", "olmoe", "--window", "100000"], r"--window: window must be at most the model's trained "
                                                        r"context 256"),
    (_gate, ["--model", "olmoe", "--batch", "0"], r"--batch: batch must be an int >= 1"),
    (_gate, ["--model", "olmoe", "--threads", "-1"], r"--threads: threads must be an int >= 1"),
    (_gate, ["--model", "olmoe", "--boot", "10"], r"--boot: n_boot must be an int >= 100"),
    (_gate, ["--model", "olmoe", "--calib-tokens", "10", "--calib-len", "64"], r"--calib-tokens: calib_tokens must "
                                                                                r"be at least calib_len \(64\)"),
    (_gate, ["--model", "olmoe", "--device", "tpu"], r"--device: device must be cpu or cuda"),
    pytest.param(_gate, ["--model", "olmoe", "--device", "cuda"], r"--device: .*no CUDA device",
                 marks=pytest.mark.skipif(not NO_CUDA, reason="has CUDA")),
    (_gate, ["--model", "qwen3"], r"--model 'qwen3' is neither a tiny model name"),
    (_gate, ["--model", "olmoe", "--out", "{tmp}"], r"--out '.*' is a directory; name a file"),
    (_gate, ["--model", "olmoe", "--out", "{file}/r.json"], r"--out '.*r.json' cannot be created: '.*' is a file"),
    (_gate, ["--model", "{broken}"], r"--model '.*': config.json is not valid JSON"),
    (_export, ["--model", "qwen3", "--out", "{tmp}/q.gguf"], r"--model 'qwen3' is neither a tiny model name"),
    (_export, ["--model", "olmoe", "--source", "--scheme", "gptq", "--out", "{tmp}/s.gguf"],
     r"--source writes the unquantised model: drop --scheme / --targets"),
    (_export, ["--model", "olmoe", "--out", "{file}"], r"--out '.*' exists; pass --force"),
    (_export, ["--model", "olmoe", "--out", "{tmp}"], r"--out '.*' is a directory"),
    (_export, ["--model", "olmoe", "--calib-tokens", "0", "--out", "{tmp}/c.gguf"], r"--calib-tokens: calib_tokens "
                                                                                     r"must be an int >= 1"),
    (_realscale, ["--arch", "olmoe", "--layers", "1", "--workdir", "{tmp}", "--out", "{tmp}"],
     r"--out '.*' is a directory"),
    (_realscale, ["--arch", "olmoe", "--layers", "1", "--workdir", "{file}", "--out", "{tmp}/r.json"],
     r"--workdir '.*' is a file, not a directory"),
    (_realscale, ["--arch", "olmoe", "--layers", "1", "--workdir", "{tmp}", "--out", "{file}"],
     r"--out '.*' exists and is not JSON"),
    (_bench, ["--out", "{tmp}"], r"--out '.*' is a directory"),
]


@pytest.mark.parametrize("main,argv,match", CLI, ids=lambda v: v.__name__.strip("_") if callable(v) else None)
def test_cli_refuses_before_any_work(main, argv, match, tmp_path, capsys, monkeypatch):
    from lab import realscale
    from lab.bench import cli as bench_cli
    for mod, attr in ((gate_cli, "run_gate"), (export, "build_model"), (realscale, "measure_arch"),
                      (bench_cli, "run")):
        monkeypatch.setattr(mod, attr, _tripwire)
    f = tmp_path / "a_file"
    f.write_text("not json")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{")
    argv = [a.format(tmp=tmp_path, file=f, broken=broken) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re_search(match, err), err
    assert f.read_text() == "not json"                   # nothing overwritten


def re_search(pattern, text):
    import re
    return re.search(pattern, text) is not None


# ---------------------------------------------------------------------------------------------- data safety

def test_receipts_are_written_atomically(tmp_path, monkeypatch):
    """A failed write (a payload that is not JSON, a full disk) leaves the old receipt whole and no temp file."""
    path = write_receipt(tmp_path / "r.json", {"x": 1}, command="t")
    old = path.read_text()
    with pytest.raises(TypeError):
        write_receipt(path, {"x": {1, 2}}, command="t")
    orig = Path.write_text

    def full_disk(self, text, *a, **k):
        orig(self, text[:len(text) // 2])
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_receipt(path, {"x": 2}, command="t")
    monkeypatch.undo()
    assert path.read_text() == old and json.loads(old)["x"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask       # not mkstemp's 0600



def test_an_overwrite_keeps_the_file_mode(tmp_path):
    """A file rewritten through atomic_path keeps its mode, whatever the writer does to the temporary file
    (safetensors recreates it as 0600): as an in-place write would."""
    from int4lab.files import atomic_path
    p = tmp_path / "w.bin"
    p.write_bytes(b"old")
    os.chmod(p, 0o640)
    with atomic_path(p) as tmp:
        tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"new")
        os.close(fd)
    assert p.read_bytes() == b"new" and p.stat().st_mode & 0o777 == 0o640

def test_gguf_export_interrupted_leaves_no_partial_file(ctx, tmp_path, monkeypatch):
    """An interrupt while the tensors are written leaves nothing under the final name (and an existing file as it
    was, even with force); --force replaces a file whole."""
    import gguf
    n_tokens = export.read_tokenizer()[-1]           # the file carries this tokenizer: the model's vocabulary matches it
    m = quantize_model(tiny_model("mixtral", vocab=n_tokens), progress=False)[0]

    def interrupted(self, *a, **k):
        raise KeyboardInterrupt
    with monkeypatch.context() as mp:
        mp.setattr(gguf.GGUFWriter, "write_tensors_to_file", interrupted)
        with pytest.raises(KeyboardInterrupt):
            export.write_gguf(m, tmp_path / "m.gguf")
        assert list(tmp_path.iterdir()) == []
        old = _file(ctx, "keep.gguf")
        with pytest.raises(KeyboardInterrupt):
            export.write_gguf(m, old, force=True)
        assert old.read_bytes() == b"old"
    path = export.write_gguf(m, old, force=True)
    assert path.read_bytes()[:4] == b"GGUF"
    assert sorted(p.name for p in old.parent.iterdir() if p.name.startswith(".keep.gguf")) == []


def test_checkpoint_round_trip_records_checksums_and_shape(ctx):
    meta = read_metadata(ctx.saved())
    sums, shape = json.loads(meta["sha256"]), json.loads(meta["shape"])
    assert set(sums) == set(ctx.quantised().state_dict()) and all(len(v) == 64 for v in sums.values())
    assert (shape["arch"], shape["experts"], shape["top_k"]) == ("mixtral", 8, 2)
    back, _ = load_quantized(ctx.saved(), tiny_model("mixtral"))
    for k, v in ctx.quantised().state_dict().items():
        assert torch.equal(v, back.state_dict()[k])


def test_default_outputs_go_to_runs_never_data_receipts(tmp_path, monkeypatch, capsys):
    """Without --out, the gate, the llama.cpp judge, the bench and realscale write under runs/ (git-ignored);
    data/receipts/ only when --out names it."""
    from lab import llamacpp, realscale
    from lab.bench import cli as bench_cli
    from lab import paths
    assert bench_cli.DEFAULT_RUN_OUT.parent == paths.RUNS and gate.receipt_path("olmoe").parent == paths.RUNS
    assert "/runs/" in (paths.ROOT / ".gitignore").read_text().splitlines()
    runs = tmp_path / "runs"
    monkeypatch.setattr(gate_cli, "RUNS", runs)
    monkeypatch.setattr(gate_cli, "run_gate", lambda *a, **k: {"model": "olmoe"})
    monkeypatch.setattr(gate_cli, "format_table", lambda p: "table")
    assert gate.main(["--model", "olmoe"]) == 0 and (runs / "gate_olmoe.json").is_file()
    monkeypatch.setattr(llamacpp, "RUNS", runs)
    monkeypatch.setattr(llamacpp, "have_llama_cpp", lambda: True)
    monkeypatch.setattr(llamacpp, "judge", lambda *a, **k: {"model": "olmoe"})
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    assert llamacpp.main(["--model", "olmoe"]) == 0 and (runs / "llamacpp_olmoe.json").is_file()
    monkeypatch.setattr(paths, "RUNS", runs)
    monkeypatch.setattr(realscale, "measure_arch", lambda arch, *a, **k: {"arch": arch})
    assert realscale.main(["--arch", "olmoe", "--layers", "1", "--workdir", str(tmp_path / "w")]) == 0
    assert set(json.loads((runs / "realscale.json").read_text())["archs"]) == {"olmoe"}


def test_realscale_removes_only_what_it_made(tmp_path, monkeypatch):
    """A file already under <workdir>/<arch> survives; the run's own directory goes, even when the run fails."""
    from lab import realscale
    mine = tmp_path / "olmoe" / "mine.txt"
    mine.parent.mkdir()
    mine.write_text("keep")
    seen = []

    def fake(arch, layers, work, *a):
        (work / "checkpoint").mkdir()
        (work / "checkpoint" / "w.safetensors").write_bytes(b"x")
        seen.append(work)
        if len(seen) == 2:
            raise RuntimeError("a step failed")
        return {"arch": arch}
    monkeypatch.setattr(realscale, "_measure_arch", fake)
    realscale.measure_arch("olmoe", 1, tmp_path, "tiny")
    with pytest.raises(RuntimeError):
        realscale.measure_arch("olmoe", 1, tmp_path, "tiny")
    assert mine.read_text() == "keep" and not any(w.exists() for w in seen)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["olmoe"]


def _gate_receipt(tmp_path, **settings):
    s = {"bootstrap_unit": "document", "max_docs": None, "texts": ["test", "ood"], **settings}
    return write_receipt(tmp_path / "gate_tiny.json", {"settings": s}, command="t")


@pytest.mark.parametrize("settings,match", [({"max_docs": 2}, r"settings.max_docs = 2"),
                                            ({"texts": ["ood"]}, r"settings.texts = \['ood'\]")])
def test_report_refuses_partial_gate_receipts(tmp_path, settings, match):
    from lab import report
    _gate_receipt(tmp_path, **settings)
    with pytest.raises(ValueError, match=r"gate_tiny.json was made with partial settings: " + match):
        report.gate_table(tmp_path)


@pytest.mark.parametrize("method,match", [({"complete": False}, r"method.complete is false"),
                                          ({"complete": True, "quick": True}, r"method.quick")])
def test_report_refuses_a_partial_decode_receipt_for_the_results(tmp_path, capsys, method, match):
    from lab import report
    from test_bench import _synthetic_receipt
    rec = _synthetic_receipt(tmp_path)
    path = tmp_path / "decode_synthetic.json"
    path.write_text(json.dumps({**rec, "method": method}))
    results = tmp_path / "RESULTS.md"
    results.write_text(f"{report.START}\nold\n{report.END}\n")
    (tmp_path / "x").mkdir()                                                                  # no anchors
    assert report.main(["--receipt", str(path), "--results", str(results), "--anchors", str(tmp_path / "x")]) == 2
    assert re_search(match, capsys.readouterr().err) and "old" in results.read_text()
    assert report.main(["--receipt", str(path), "--anchors", str(tmp_path / "x")]) == 0      # printed, marked


# ---------------------------------------------------------------------------------------------- non-finite values

@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_packers_refuse_non_finite_weights(bad):
    w = torch.randn(4, 64)
    w[1, 3] = bad
    from int4lab.gptq import gptq_pack_int4_b32
    for pack in (il.pack_int4_b32, lambda w: dithered_pack(w, 0.1, torch.Generator()),
                 lambda w: gptq_pack_int4_b32(w, torch.eye(64))):
        with pytest.raises(ValueError, match=r"w (must be finite|has a block whose scale)"):
            pack(w)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_kernels_propagate_non_finite_activations_and_router_weights(device, bad):
    """A row holding NaN or inf comes out non-finite, as torch.nn.functional.linear's does, and the other rows stay
    finite: for both activation modes of int4_linear, the MoE step's activations and its router weights."""
    p, s = il.pack_int4_b32(torch.randn(48, 64))
    w = dequant_int4_ref(p, s, 48, 64)
    x = torch.randn(3, 64)
    x[1, 5] = bad
    want = torch.nn.functional.linear(x, w).isfinite().all(1)
    assert want.tolist() == [True, False, True]
    for act in ("int8", "bf16"):
        got = int4_linear(x.to(device), p.to(device), s.to(device), act=act).float().cpu()
        assert got.isfinite().all(1).tolist() == want.tolist(), act
    args = list(Ctx(Path(".")).moe(3, 1, device))
    args[0] = x.to(device)
    assert moe_decode_step(*args).float().isfinite().all(1).tolist() == [True, False, True]
    args[0] = torch.randn(3, 64, device=device)
    args[2] = torch.tensor([[0.5], [bad], [2.0]], device=device)
    assert moe_decode_step(*args).float().isfinite().all(1).tolist() == [True, False, True]


def test_min_docs_is_what_the_gate_documents():
    assert MIN_DOCS == gate.MIN_DOCS == 10 and "MIN_DOCS = 10" in gate.settings.__doc__
