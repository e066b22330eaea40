"""Bad command-line values refused before any work, with one `error: ...` line naming the flag and the rule
(exit 2); and the CLIs that must not touch committed files: lab.bench.pack's default output, notebooks --no-write's
figures, an interrupted synth.

Each CLI runs in-process with its expensive step replaced by a tripwire, so a case that gets past the checks
fails at once instead of running.
"""
import json
import os
import re
import stat

import pytest
import torch

from int4lab import export
from int4lab.gate import cli as gate_cli
from int4lab.gate import lmeval

from lab.paths import RECEIPTS

PUBLISHED = (RECEIPTS / "gptq_pack_cpu.json",)


def _tripwire(*a, **k):
    raise AssertionError("the work started before the arguments were checked")


@pytest.fixture
def trip(monkeypatch):
    """Replace each CLI's expensive step by the tripwire."""
    from lab import llamacpp, realscale, realscale_gate, synth
    from lab.bench import cli as bench_cli
    from lab.bench import pack as bench_pack, prefill as prefill_bench
    from lab.decode_step import bench as ds_bench
    from lab.tune import sweep
    for mod, attr in ((gate_cli, "run_gate"), (export, "build_model"), (realscale_gate, "measure_depth"),
                      (realscale, "measure_arch"),
                      (bench_cli, "run"), (bench_cli, "dry_run"), (ds_bench, "Run"), (llamacpp, "judge"),
                      (bench_pack, "bench_pack"), (prefill_bench, "run"), (sweep, "sweep_dense"),
                      (synth, "_init_")):
        monkeypatch.setattr(mod, attr, _tripwire)


def _main(name):
    import importlib
    mod = {"gate": "int4lab.gate.cli", "export": "int4lab.export", "rsg": "lab.realscale_gate",
           "decode": "lab.decode_step.cli", "llamacpp": "lab.llamacpp", "bench": "lab.bench.cli",
           "bench_pack": "lab.bench.pack", "prefill": "lab.bench.prefill", "sweep": "lab.tune.sweep",
           "synth": "lab.synth", "notebooks": "lab.notebooks", "realscale": "lab.realscale"}[name]
    return importlib.import_module(mod).main


G = ["--model", "olmoe", "--max-docs", "20", "--texts", "test"]
RSG = ["--arch", "olmoe", "--width", "tiny", "--workdir", "{tmp}/w", "--out", "{tmp}/r.json"]
DS = ["--arch", "olmoe", "--width", "tiny", "--out", "{tmp}/d.json"]

CASES = [
    # gate: values the `or` fallbacks used to swallow, and settings checked only after the model loaded
    ("gate", G + ["--calib-len", "0"], r"--calib-len: calib_len must be an int >= 1"),
    ("gate", G + ["--out", ""], r"--out: out must name a file"),
    ("gate", G + ["--device-map", "everywhere"], r"--device-map: device_map must be one of"),
    ("gate", G + ["--batch-tokens", "0"], r"--batch-tokens: batch_tokens must be an int >= 1"),
    ("gate", G + ["--stat-bytes", "0"], r"--stat-bytes: stat_bytes must be an int >= 1"),
    ("gate", G + ["--seed", "-1"], r"--seed: seed must be an int >= 0"),
    # realscale_gate
    ("rsg", RSG + ["--layers", "1", "1"], r"--layers: a fit needs two or more distinct depths"),
    ("rsg", RSG + ["--layers", "1"], r"--layers: a fit needs two or more distinct depths"),
    ("rsg", RSG + ["--layers", "1", "2", "--deadline", "-1"], r"--deadline must be a positive finite"),
    ("rsg", RSG + ["--layers", "1", "2", "--card-gib", "0"], r"--card-gib must be a positive finite"),
    ("rsg", RSG + ["--layers", "1", "2", "--gate-args=--max-docs 1"], r"--gate-args: --max-docs: max_docs must"),
    ("rsg", RSG + ["--layers", "1", "2", "--gate-args=--out /tmp/x.json"], r"--gate-args: may not set --out"),
    ("rsg", RSG + ["--layers", "1", "2", "--gate-args=--max-docs '10"], r"--gate-args: must split as shell words"),
    ("rsg", RSG + ["--layers", "1", "2", "--gate-args=--bogus 3"], r"--gate-args: not flags the gate takes"),
    ("rsg", RSG + ["--layers", "1", "2", "--device", "gpu7"], r"--device: device must be cpu or cuda"),
    ("rsg", RSG + ["--layers", "1", "2", "--device-map", "auto", "--max-memory", "x"], r"--max-memory: max_memory item 'x'"),
    ("realscale", ["--arch", "olmoe", "--width", "tiny", "--layers", "1", "--workdir", "{tmp}/w", "--split-gpu",
                   "lots"], r"--split-gpu must be a size with a unit"),
    # decode_step
    pytest.param("decode", DS + ["--replays", "0"], r"--replays must be an int >= 1"),
    pytest.param("decode", DS + ["--samples", "0"], r"--samples must be an int >= 1"),
    ("decode", DS + ["--prior", "{tmp}/nope.json"], r"--prior '.*nope.json' does not exist"),
    ("decode", DS + ["--prior", "{garbage}"], r"--prior '.*garbage.json' is not a readable JSON receipt"),
    pytest.param("decode", DS + ["--budget-s", "-5"], r"--budget-s must be a positive finite"),
    *([pytest.param("decode", DS + ["--runs", "graphed"], r"--runs graphed needs a CUDA device")]
      if not torch.cuda.is_available() else []),
    # llamacpp
    ("llamacpp", ["--model", "olmoe", "--threads", "0", "--out", "{tmp}/l.json"], r"--threads must be an int >= 1"),
    ("llamacpp", ["--model", "olmoe", "--window", "0", "--out", "{tmp}/l.json"], r"--window must be an int >= 2"),
    ("llamacpp", ["--model", "olmoe", "--windows", "0", "--out", "{tmp}/l.json"], r"--windows must be an int >= 1"),
    ("llamacpp", ["--model", "{tmp}/nope", "--out", "{tmp}/l.json"], r"--model '.*nope' is neither"),
    # bench: --dry-run checks too
    pytest.param("bench", ["--dry-run", "--only", "nonsense"], r"--only must name impls from .*unknown nonsense"),
    pytest.param("bench", ["--dry-run", "--only", ""], r"--only must name at least one"),
    pytest.param("bench", ["--dry-run", "--replays", "5"], r"--replays must be >= 20"),
    pytest.param("bench", ["--dry-run", "--budget-s", "-1"], r"--budget-s must be a finite number >= 0"),
    # lab.bench.pack
    ("bench_pack", ["--shapes", "0x64", "--no-write"], r"--shapes 0x64: N must be >= 1"),
    ("bench_pack", ["--shapes", "64x33", "--no-write"], r"--shapes 64x33: .*multiple of 32"),
    ("bench_pack", ["--shapes", "64x64", "--repeats", "0", "--no-write"], r"--repeats must be an int >= 1"),
    *([("bench_pack", ["--device", "cuda", "--no-write"], r"--device cuda: no CUDA device here")]
      if not torch.cuda.is_available() else []),
    # lab.bench.prefill
    ("prefill", ["--arch", "olmoe", "--width", "tiny", "--layers", "0", "--out", "{tmp}/p.json"],
     r"--layers must be an int in \[1, 16\]"),
    ("prefill", ["--arch", "olmoe", "--width", "tiny", "--layers", "1", "--out", "{tmp}"], r"--out .* is a directory"),
    # sweep
    ("sweep", ["--pick", "--out", "{tmp}/nope.json"], r"--out '.*nope.json' \(with --pick\) must be a readable"),
    ("sweep", ["--pick", "--out", "{garbage}"], r"--out '.*garbage.json' \(with --pick\) must be a readable"),
    ("sweep", ["--kinds", "zz", "--out", "{tmp}/s.json"], r"--kinds must be a comma list of dp4a, baselines"),
    # synth
    pytest.param("synth", ["--arch", "olmoe", "--width", "tiny", "--layers", "1", "--device", "gpu7", "--out", "{tmp}/s"],
     r"--device: device must be cpu or cuda"),
    pytest.param("synth", ["--arch", "olmoe", "--width", "tiny", "--layers", "1", "--max-shard-size", "lots", "--out", "{tmp}/s"],
     r"--max-shard-size: max_shard_size must be a positive size"),
    pytest.param("synth", ["--arch", "olmoe", "--width", "tiny", "--layers", "1", "--max-shard-size", "0", "--out", "{tmp}/s"],
     r"--max-shard-size: max_shard_size must be a positive size"),
    # export: calibration sizes against each other and the trained context, before the model loads
    ("export", ["--model", "olmoe", "--scheme", "gptq", "--calib-tokens", "10", "--out", "{tmp}/x.gguf"],
     r"--calib-tokens: calib_tokens must be at least calib_len \(256\)"),
    ("export", ["--model", "olmoe", "--scheme", "gptq", "--calib-len", "100000", "--out", "{tmp}/x.gguf"],
     r"--calib-len: calib_len must be at most the model's trained context"),
    # notebooks
    ("notebooks", ["--no-write", "--quick", ""], r"a notebook pattern must be a non-empty part"),
]


@pytest.mark.parametrize("name,argv,match", CASES, ids=[f"{(c.values if hasattr(c, 'values') else c)[0]}:{' '.join((c.values if hasattr(c, 'values') else c)[1])[-40:]}" for c in CASES])
def test_cli_refuses_before_any_work(name, argv, match, trip, tmp_path, capsys):
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    argv = [a.format(tmp=tmp_path, garbage=garbage) for a in argv]
    rc = _main(name)(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err and err[-1].startswith("error: ")
    assert re.search(match, err[-1]), err[-1]


def test_gate_refuses_unknown_lmeval_task_before_any_work(trip, capsys):
    """--tasks is checked against lm-eval's task index (its YAML files; no model) before anything loads."""
    pytest.importorskip("lm_eval")
    assert gate_cli.main(G + ["--tasks", "no_such_task_xyz"]) == 2
    assert "--tasks: ['no_such_task_xyz'] are not lm-eval tasks" in capsys.readouterr().err
    lmeval.check_tasks(["int4lab_test", "int4lab_ood"])            # the local tasks need no index


def test_llamacpp_without_its_binding_says_so_before_any_work(trip, tmp_path, capsys, monkeypatch):
    from lab import llamacpp
    monkeypatch.setattr(llamacpp, "have_llama_cpp", lambda: False)
    assert llamacpp.main(["--model", "olmoe", "--out", str(tmp_path / "l.json")]) == 2
    assert "error: llama_cpp is not installed: pip install" in capsys.readouterr().err


def test_report_refuses_a_missing_anchors_folder(tmp_path, capsys):
    from lab.report import cli as report_cli
    with pytest.raises(SystemExit) as e:
        report_cli.main(["--anchors", str(tmp_path / "nope")])
    assert e.value.code == 2 and "--anchors" in capsys.readouterr().err


def test_export_refuses_a_checkpoint_with_an_extra_tensor(tmp_path, capsys):
    """Weights the config's model has no place for (here one extra tensor) are named, not dropped in silence."""
    from safetensors.torch import load_file, save_file

    from lab.synth import write_checkpoint
    ck = tmp_path / "ck"
    write_checkpoint("olmoe", 1, ck, "tiny", dtype=torch.float32, device="cpu")
    w = load_file(ck / "model.safetensors")
    w["model.evil.weight"] = torch.zeros(3)
    save_file(w, ck / "model.safetensors", metadata={"format": "pt"})
    assert export.main(["--model", str(ck), "--out", str(tmp_path / "x.gguf")]) == 2
    err = capsys.readouterr().err
    assert "model.evil.weight" in err and "disagree" in err
    assert not (tmp_path / "x.gguf").exists()


def test_bench_pack_writes_runs_by_default(tmp_path, monkeypatch):
    """A toy run never replaces the committed receipt: the default output is runs/, data/receipts/ only by --out."""
    from lab import paths
    from lab.bench import pack as bench_pack
    monkeypatch.setattr(paths, "RUNS", tmp_path / "runs")
    published = {p: os.stat(p).st_mtime_ns for p in PUBLISHED if p.exists()}
    assert bench_pack.main(["--shapes", "32x64", "--impls", "rtn", "--repeats", "1"]) == 0
    assert json.loads((tmp_path / "runs" / "gptq_pack_cpu.json").read_text())["rows"]
    assert published == {p: os.stat(p).st_mtime_ns for p in published}
    assert bench_pack.main(["--shapes", "32x64", "--impls", "rtn", "--repeats", "1",
                            "--out", str(tmp_path / "o.json")]) == 0 and (tmp_path / "o.json").exists()


def test_notebooks_no_write_leaves_the_committed_figures_as_they_were(tmp_path, monkeypatch):
    """--no-write (without --quick): a figure the chapter rewrites or adds is put back / removed after the run."""
    from lab import notebooks
    figs = tmp_path / "figures"
    figs.mkdir()
    (figs / "kept.png").write_bytes(b"published")
    monkeypatch.setattr(notebooks, "FIGURES", figs)

    class Client:
        def __init__(self, *a, **k):
            pass

        def execute(self):
            (figs / "kept.png").write_bytes(b"overwritten")
            (figs / "new.png").write_bytes(b"added")

    import nbclient
    import nbformat
    nb = tmp_path / "n.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), nb)
    monkeypatch.setattr(nbclient, "NotebookClient", Client)
    notebooks.run_notebook(nb, write=False)
    assert (figs / "kept.png").read_bytes() == b"published" and not (figs / "new.png").exists()
    notebooks.run_notebook(nb, write=True)
    assert (figs / "kept.png").read_bytes() == b"overwritten"


def test_synth_stages_its_checkpoint_and_keeps_umask_modes(tmp_path, monkeypatch):
    """An interrupted write leaves no --out (and no staging folder); a finished one has umask modes throughout
    (safetensors itself writes 0600)."""
    from lab import synth
    out = tmp_path / "ck"

    def boom(*a, **k):
        raise KeyboardInterrupt
    import int4lab.models as models
    monkeypatch.setattr(models, "load_tokenizer", boom)
    with pytest.raises(KeyboardInterrupt):
        synth.write_checkpoint("olmoe", 1, out, "tiny", device="cpu")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    old = os.umask(0o022)
    try:
        synth.write_checkpoint("olmoe", 1, out, "tiny", device="cpu")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert set(modes.values()) == {0o644}, modes
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]


def test_export_writes_a_checkpoints_own_vocabulary_and_refuses_one_it_cannot_map(tmp_path, capsys):
    """A checkpoint directory's tokenizer.json is the vocabulary written (here two ids swapped, the same size, which a
    count check alone would pass with this repository's tokens); a tokenizer llama.cpp's gpt2 vocabulary cannot
    hold, or one without the special tokens written as BOS and EOS, is refused before the model is built."""
    import json

    import gguf

    from lab.synth import write_checkpoint
    ck = tmp_path / "ck"
    write_checkpoint("olmoe", 1, ck, "tiny", dtype=torch.float32, device="cpu")
    tj = json.loads((ck / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tj["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[-2:]
    vocab[a], vocab[b] = vocab[b], vocab[a]            # two ids swapped: another vocabulary of the same size
    (ck / "tokenizer.json").write_text(json.dumps(tj), encoding="utf-8")
    out = tmp_path / "x.gguf"
    assert export.main(["--model", str(ck), "--source", "--out", str(out)]) == 0
    tokens = gguf.GGUFReader(str(out)).fields["tokenizer.ggml.tokens"]
    names = [bytes(tokens.parts[i]).decode() for i in tokens.data]
    assert (names[vocab[a]], names[vocab[b]]) == (a, b)        # the checkpoint's ids, not this repository's
    capsys.readouterr()
    for bad, says in (({"pre_tokenizer": {"type": "Metaspace"}}, "only a BPE whose pre_tokenizer is ByteLevel"),
                      ({"added_tokens": [{**t, "content": "<s>"} if t["content"] == "<|bos|>" else t
                                         for t in tj["added_tokens"]]}, "needs special tokens <|bos|> and <|eos|>")):
        (ck / "tokenizer.json").write_text(json.dumps({**tj, **bad}), encoding="utf-8")
        assert export.main(["--model", str(ck), "--source", "--out", str(tmp_path / "y.gguf")]) == 2
        assert says in capsys.readouterr().err and not (tmp_path / "y.gguf").exists()
