"""What the writers and the CLIs refuse before any work, and what an interrupted or failed run leaves behind.

    targets   every writer (receipts, pages, checkpoints, GGUF) refuses a symlink, a FIFO, a device node or a
              directory where it would write, by name, and leaves it as it was (never pointed at /dev: the nodes
              are made inside tmp_path)
    CLIs      an unusable --out / --workdir / --receipts is refused with exit 2 before the work (a tripwire)
    runs      lab.train writes under runs/ by default; an interrupted lab.decode_step or lab.realscale_gate
              says so in its receipt and the report refuses it; lab.report writes every page or none
"""
import json
import os
import re
import stat
from pathlib import Path

import pytest
import torch

from int4lab import export, gate
from int4lab.files import check_out_path
from int4lab.files import atomic_path, write_text_atomic
from int4lab.gate import cli as gate_cli
from int4lab.quantize import quantize_model, save_quantized
from lab.provenance import write_receipt

from test_quantize import tiny_model


def _tripwire(*a, **k):
    raise AssertionError("the work started before the arguments were checked")


def _node(tmp_path: Path, kind: str) -> Path:
    """A path inside tmp_path holding `kind`: symlink (to a file), dangling (symlink), fifo, dir, chardev."""
    p = tmp_path / f"target_{kind}"
    if kind == "symlink":
        (tmp_path / "real.json").write_text("keep")
        p.symlink_to(tmp_path / "real.json")
    elif kind == "dangling":
        p.symlink_to(tmp_path / "nowhere.json")
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "dir":
        p.mkdir()
    elif kind == "chardev":
        try:
            os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        except (PermissionError, OSError):
            pytest.skip("making a device node needs privileges here")
    return p


def _unchanged(p: Path, kind: str) -> None:
    st = os.lstat(p)
    assert {"symlink": stat.S_ISLNK, "dangling": stat.S_ISLNK, "fifo": stat.S_ISFIFO, "dir": stat.S_ISDIR,
            "chardev": stat.S_ISCHR}[kind](st.st_mode), f"{p} is no longer a {kind}"
    if kind == "symlink":
        assert (p.parent / "real.json").read_text() == "keep"
    assert not [q for q in p.parent.iterdir() if q.name.endswith(".partial")]


KINDS = ["symlink", "dangling", "fifo", "dir", "chardev"]
RULE = {"symlink": "a symbolic link", "dangling": "a symbolic link", "fifo": "a FIFO", "dir": "a directory",
        "chardev": "a character device"}


@pytest.fixture(scope="module")
def quantised():
    return quantize_model(tiny_model("mixtral"), progress=False)[0]


WRITERS = {
    "write_receipt": lambda p, m: write_receipt(p, {"x": 1}, command="t"),
    "write_text_atomic": lambda p, m: write_text_atomic(p, "text"),
    "atomic_path": lambda p, m: atomic_path(p).__enter__(),
    "save_quantized": lambda p, m: save_quantized(m, p),
    "write_gguf": lambda p, m: export.write_gguf(m, p, force=True),
    "check_out_path": lambda p, m: check_out_path(p),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("writer", list(WRITERS))
def test_every_writer_refuses_what_is_not_a_regular_file(tmp_path, quantised, writer, kind):
    p = _node(tmp_path, kind)
    with pytest.raises(ValueError, match=rf"'{p}' is {RULE[kind]}[:;] name a"):
        WRITERS[writer](p, quantised)
    _unchanged(p, kind)


def test_writer_replaces_a_regular_file_and_keeps_its_mode(tmp_path):
    p = tmp_path / "r.json"
    p.write_text("old")
    write_text_atomic(p, "new")
    assert p.read_text() == "new" and stat.S_ISREG(os.lstat(p).st_mode)


def test_a_link_appearing_during_the_write_is_not_replaced(tmp_path):
    """The rule is checked again just before the rename: a symlink made while the file was written survives."""
    p = tmp_path / "r.json"
    (tmp_path / "real").write_text("keep")
    with pytest.raises(ValueError, match="is a symbolic link"):
        with atomic_path(p) as tmp:
            tmp.write_text("new")
            p.symlink_to(tmp_path / "real")
    assert p.is_symlink() and (tmp_path / "real").read_text() == "keep"
    assert sorted(q.name for q in tmp_path.iterdir()) == ["r.json", "real"]


# ---------------------------------------------------------------------------------------------- the CLIs

def _gate(argv):
    return gate.main(argv)


def _bench(argv):
    from lab.bench.cli import main
    return main(argv)


def _realscale(argv):
    from lab import realscale
    return realscale.main(argv)


def _realscale_gate(argv):
    from lab import realscale_gate
    return realscale_gate.main(argv)


def _decode_step(argv):
    from lab.decode_step.cli import main
    return main(argv)


def _synth(argv):
    from lab import synth
    return synth.main(argv)


def _train(argv):
    from lab import train
    return train.main(argv)


def _export(argv):
    return export.main(argv)


def _prefill(argv):
    from lab.bench import prefill as prefill_bench
    return prefill_bench.main(argv)


def _decide(argv):
    from lab.bench import decide
    return decide.main(argv)


def _sweep(argv):
    from lab.tune import sweep
    return sweep.main(argv)


def _replay(argv):
    from lab.tune import replay_check
    return replay_check.main(argv)


def _bench_pack(argv):
    from lab.bench import pack as bench_pack
    return bench_pack.main(argv)


CLI = [
    (_gate, ["--model", "olmoe", "--out", "{fifo}"], r"--out '.*' is a FIFO"),
    (_gate, ["--model", "olmoe", "--out", "{link}"], r"--out '.*' is a symbolic link"),
    (_bench, ["--out", "{fifo}"], r"--out '.*' is a FIFO"),
    (_export, ["--model", "olmoe", "--out", "{link}", "--force"], r"--out '.*' is a symbolic link"),
    (_realscale, ["--arch", "olmoe", "--layers", "1", "--workdir", "{tmp}/w", "--out", "{fifo}"],
     r"--out '.*' is a FIFO"),
    (_realscale_gate, ["--arch", "olmoe", "--layers", "1", "2", "--workdir", "{tmp}/w", "--out", "{fifo}"],
     r"--out '.*' is a FIFO"),
    (_realscale_gate, ["--arch", "olmoe", "--layers", "1", "2", "--workdir", "{file}", "--out", "{tmp}/r.json"],
     r"--workdir '.*' is a file, not a directory"),
    (_realscale_gate, ["--arch", "olmoe", "--layers", "1", "2", "--workdir", "{tmp}/w", "--out", "{tmp}/r.json",
                       "--gate-args=--no-such-flag"], r"--gate-args: not flags the gate takes: '--no-such-flag'"),
    (_decode_step, ["--width", "tiny", "--out", "{fifo}"], r"--out '.*' is a FIFO"),
    (_decode_step, ["--width", "tiny", "--out", "{tmp}"], r"--out '.*' is a directory"),
    (_decode_step, ["--width", "tiny", "--out", "{file}"], r"--out '.*' is not a readable JSON receipt"),
    (_decode_step, ["--width", "tiny", "--out", "{tmp}/r.json", "--prior", "{tmp}/none.json"],
     r"--prior '.*none.json' does not exist"),
    (_synth, ["--arch", "olmoe", "--layers", "1", "--width", "tiny", "--out", "{file}"],
     r"--out '.*' is a file, not a directory"),
    (_synth, ["--arch", "olmoe", "--layers", "1", "--width", "tiny", "--out", "{fifo}"],
     r"--out '.*' is not a regular file, not a directory"),
    (_train, ["--arch", "mixtral", "--out", "{tmp}/m", "--receipts", "{file}"], r"--receipts '.*' is a file, not a "
                                                                                 r"directory"),
    (_train, ["--arch", "mixtral", "--out", "{file}", "--receipts", "{tmp}/r"], r"--out '.*' is a file"),
    (_train, ["--arch", "mixtral", "--out", "{tmp}/m", "--receipts", "{tmp}/r", "--tokenizer", "{tmp}/none"],
     r"--tokenizer: no tokenizer.json in"),
    (_prefill, ["--out", "{fifo}"], r"--out '.*' is a FIFO"),
    (_decide, ["--spec", "gemv:4096x4096", "--out", "{link}"], r"--out '.*' is a symbolic link"),
    (_decide, ["--spec", "gemv:4096x4096", "--rounds", "2", "--out", "{tmp}/d.json"], r"--rounds must be >= "),
    (_sweep, ["--out", "{tmp}"], r"--out '.*' is a directory"),
    (_replay, ["--out", "{fifo}"], r"--out '.*' is a FIFO"),
    (_replay, ["--replays", "0", "--out", "{tmp}/r.json"], r"--replays must be >= 1"),
    (_bench_pack, ["--shapes", "32x64", "--out", "{link}"], r"--out '.*' is a symbolic link"),
]


@pytest.mark.parametrize("main,argv,match", CLI, ids=lambda v: v.__name__.strip("_") if callable(v) else None)
def test_cli_refuses_an_unusable_output_before_any_work(main, argv, match, tmp_path, capsys, monkeypatch):
    from lab import realscale, realscale_gate, synth, train
    from lab.bench import cli as bench_cli
    from lab.bench import pack as bench_pack, prefill as prefill_bench
    from lab.bench import decide
    from lab.decode_step import bench as step_bench
    from lab.tune import replay_check
    for mod, attr in ((gate_cli, "run_gate"), (export, "build_model"), (realscale, "measure_arch"),
                      (bench_cli, "run"), (realscale_gate, "measure_depth"), (step_bench, "Run"),
                      (synth, "synth_config"), (train, "train_one"), (prefill_bench, "run"), (decide, "measure"),
                      (decide.subprocess, "run"), (replay_check, "run"), (bench_pack, "bench_pack")):
        monkeypatch.setattr(mod, attr, _tripwire)
    f = tmp_path / "a_file"
    f.write_text("not json")
    (tmp_path / "real").write_text("keep")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    os.mkfifo(tmp_path / "fifo")
    argv = [a.format(tmp=tmp_path, file=f, fifo=tmp_path / "fifo", link=tmp_path / "link") for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert __import__("re").search(match, err), err
    assert "Traceback" not in err
    assert f.read_text() == "not json" and (tmp_path / "link").is_symlink()
    assert (tmp_path / "real").read_text() == "keep"
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)


# ---------------------------------------------------------------------------------------------- lab.train


@pytest.mark.parametrize("flags, match", [
    (["--lr", "-1"], r"--lr must be a positive finite"), (["--lr", "nan"], r"--lr must be a positive finite"),
    (["--weight-decay", "-0.1"], r"--weight-decay must be a finite number >= 0"),
    (["--time-budget", "0"], r"--time-budget must be a positive number"),
    (["--device", "gpu7"], r"--device must be cpu or cuda"),
    *([(["--device", "cuda"], r"--device cuda: torch sees no CUDA device")] if not torch.cuda.is_available() else []),
])
def test_train_refuses_bad_settings_before_any_work(flags, match, capsys, monkeypatch):
    """Each bad setting is one line naming the flag (exit 2) before the corpus is read or a model built."""
    from lab import train
    monkeypatch.setattr(train, "train_one", lambda *a: pytest.fail("trained despite a bad setting"))
    with pytest.raises(SystemExit) as e:
        train.main(["--arch", "olmoe", *flags])
    assert e.value.code == 2 and re.search(match, capsys.readouterr().err)

def test_train_writes_under_runs_unless_told(monkeypatch, tmp_path):
    """The defaults are runs/models and runs/ (never data/models, data/receipts), and a checkpoint directory is
    replaced only once the new one is saved: a failed save leaves the old one whole."""
    from lab.paths import RUNS
    from lab import train
    seen = {}
    monkeypatch.setattr(train, "train_one", lambda arch, texts, args, cmd: seen.update(vars(args)))
    monkeypatch.setattr("int4lab.corpus.load_split", lambda k: "text")
    assert train.main(["--arch", "mixtral"]) == 0
    assert Path(seen["out"]) == RUNS / "models" and Path(seen["receipts"]) == RUNS
    old = tmp_path / "mixtral"
    old.mkdir()
    (old / "model.safetensors").write_text("old")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "model.safetensors").write_text("new")
    real = os.replace
    calls = []

    def second_fails(a, b):
        calls.append((a, b))
        if len(calls) == 2:
            raise OSError("disk gone")
        return real(a, b)
    monkeypatch.setattr(train.os, "replace", second_fails)
    with pytest.raises(OSError, match="disk gone"):
        train._replace_dir(fresh, old)
    assert (old / "model.safetensors").read_text() == "old"
    monkeypatch.setattr(train.os, "replace", real)
    train._replace_dir(fresh, old)
    assert (old / "model.safetensors").read_text() == "new" and not fresh.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mixtral"]


def test_load_tiny_hint_names_where_training_writes(tmp_path):
    from int4lab.models import load_tiny
    with pytest.raises(FileNotFoundError, match=r"lab.train --arch olmoe --out DIR` and load it with root=DIR "
                                                r"\(without --out it goes to runs/models/\)"):
        load_tiny("olmoe", root=tmp_path)


# ---------------------------------------------------------------------------------------------- partial runs

class _StopsAfterOnePart:
    """A stand-in for lab.decode_step.bench.Run: records one part, saves, then is interrupted."""

    def __init__(self, arch, args, save, log, deadline, prior=None):
        self.rec, self.save = {"rows": [{"part": 1}]}, save

    def run(self):
        self.save()
        raise KeyboardInterrupt


class _Finishes(_StopsAfterOnePart):
    def run(self):
        self.save()


def test_an_interrupted_decode_step_says_so_and_the_report_refuses_it(tmp_path, monkeypatch):
    from lab import report
    from lab.decode_step import bench as step_bench
    from lab.decode_step.cli import main
    out = tmp_path / "decode_step_cpu.json"
    monkeypatch.setattr(step_bench, "Run", _StopsAfterOnePart)
    with pytest.raises(KeyboardInterrupt):
        main(["--width", "tiny", "--arch", "olmoe", "--out", str(out)])
    rec = json.loads(out.read_text())
    assert rec["complete"] is False and rec["interrupted"].startswith("KeyboardInterrupt")
    assert rec["archs"]["olmoe"]["rows"] == [{"part": 1}]                       # what was measured is kept
    with pytest.raises(ValueError, match=r"decode_step_cpu.json was made with partial settings: complete is false "
                                         r"\(interrupted: KeyboardInterrupt"):
        report.decode_step_table(tmp_path)
    monkeypatch.setattr(step_bench, "Run", _Finishes)
    assert main(["--width", "tiny", "--arch", "olmoe", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["complete"] is True and "interrupted" not in rec and len(rec["calls"]) == 2
    assert rec["calls"][0]["complete"] is False
    monkeypatch.setattr(step_bench, "Run", _StopsAfterOnePart)                  # stopped in olmoe again ...
    with pytest.raises(KeyboardInterrupt):
        main(["--width", "tiny", "--arch", "olmoe", "--out", str(out)])
    monkeypatch.setattr(step_bench, "Run", _Finishes)                           # ... and a call on another arch
    assert main(["--width", "tiny", "--arch", "mixtral", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["complete"] is False and "['olmoe']" in rec["interrupted"]


def test_an_interrupted_realscale_gate_says_so(tmp_path, monkeypatch):
    from lab import realscale_gate as rg
    depths = []

    def fake(arch, L, *a, **k):
        depths.append(L)
        if len(depths) == 2:
            raise KeyboardInterrupt
        return {"layers": L, "skipped": "stand-in"}
    monkeypatch.setattr(rg, "measure_depth", fake)
    out = tmp_path / "r.json"
    with pytest.raises(KeyboardInterrupt):
        rg.main(["--arch", "olmoe", "--layers", "1", "2", "--width", "tiny", "--workdir", str(tmp_path / "w"),
                 "--out", str(out)])
    rec = json.loads(out.read_text())
    assert rec["complete"] is False and rec["interrupted"] == "KeyboardInterrupt: " and \
        list(rec["archs"]["olmoe"]["depths"]) == ["1"]


# ---------------------------------------------------------------------------------------------- lab.report

def _pages(tmp_path):
    from lab import report
    results = tmp_path / "RESULTS.md"
    results.write_text(f"{report.START}\nold\n{report.END}\n{report.RESULTS_START}\nold\n{report.RESULTS_END}\n")
    notes = tmp_path / "kernels.md"
    notes.write_text("no markers here\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"{report.LAYOUT_START}\nold\n{report.LAYOUT_END}\n")
    return results, notes, readme


def test_report_writes_every_page_or_none(tmp_path, capsys):
    """A page without its markers (the last one rewritten) stops the run before the first write."""
    from lab import report
    from test_bench import _synthetic_receipt
    rec = _synthetic_receipt(tmp_path)
    path = tmp_path / "decode_synthetic.json"
    path.write_text(json.dumps(rec))
    results, notes, readme = _pages(tmp_path)
    before = {p: p.read_text() for p in (results, notes, readme)}
    (tmp_path / "x").mkdir()                                                          # no anchors
    rc = report.main(["--receipt", str(path), "--readme", str(readme), "--results", str(results), "--notes",
                      str(notes), "--anchors", str(tmp_path / "x")])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"--notes '{notes}' must contain {report.MISSES_START}" in err and "Traceback" not in err
    assert {p: p.read_text() for p in before} == before


@pytest.mark.parametrize("damage,match", [
    (lambda t: t[:len(t) // 2], r"not valid JSON \(truncated or corrupt\?\)"),
    (lambda t: json.dumps({k: v for k, v in json.loads(t).items() if k != "rows"}),
     r"not a usable receipt \(missing or malformed field: KeyError 'rows'\)"),
    (lambda t: "[1, 2]", r"not a receipt \(a JSON list"),
], ids=["truncated", "missing_field", "not_an_object"])
def test_report_names_a_bad_receipt(tmp_path, capsys, damage, match):
    """A truncated or malformed receipt among the tabulated ones: exit 2, one line naming the file, no page written."""
    from lab import report
    from lab.report import cli
    from test_bench import _synthetic_receipt
    rec = _synthetic_receipt(tmp_path)
    path = tmp_path / "decode_synthetic.json"
    path.write_text(json.dumps(rec))
    from lab.paths import RECEIPTS
    receipts = tmp_path / "receipts"
    receipts.mkdir()
    for p in RECEIPTS.glob("gate_*.json"):                # the tables before the damaged one are whole
        (receipts / p.name).write_text(p.read_text())
    bad = receipts / "gptq_pack_cpu.json"
    good = {"provenance": {"device": "cpu"}, "rows": [{"N": 32, "K": 64, "impl": "rtn", "seconds": 0.1}]}
    bad.write_text(damage(json.dumps(good)))
    with pytest.raises(ValueError, match=rf"{bad}: " + match):
        report.pack_table(receipts)
    results, _, _ = _pages(tmp_path)
    old = results.read_text()
    real = cli.render_results
    cli.render_results = lambda receipts=receipts: real(receipts)
    (tmp_path / "x").mkdir()                                                          # no anchors
    try:
        assert report.main(["--receipt", str(path), "--results", str(results), "--anchors", str(tmp_path / "x")]) == 2
    finally:
        cli.render_results = real
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err and results.read_text() == old


def test_report_names_a_truncated_decode_receipt(tmp_path, capsys):
    from lab import report
    path = tmp_path / "decode.json"
    path.write_text('{"provenance": {"device": "H1')
    assert report.main(["--receipt", str(path)]) == 2
    assert f"{path}: not valid JSON" in capsys.readouterr().err


def test_the_report_marks_a_partial_realscale_gate_receipt(tmp_path):
    from lab import report
    from lab.paths import RECEIPTS
    src = sorted(RECEIPTS.glob("realscale_gate_*.json"))
    if not src:
        pytest.skip("no realscale_gate receipt in data/receipts")
    rec = json.loads(src[0].read_text())
    (tmp_path / src[0].name).write_text(json.dumps({**rec, "complete": False, "interrupted": "KeyboardInterrupt: "}))
    text = report.realscale_table(tmp_path)
    ran = any(a.get("depths") for a in rec.get("archs", {}).values())
    head = "stopped before every depth ran" if ran else "stopped before any depth finished"
    assert text.startswith(f"**Partial run: `{src[0].name}` {head}** (KeyboardInterrupt: )")
    (tmp_path / src[0].name).write_text(json.dumps({**rec, "complete": True, "interrupted": None}))
    assert "Partial run" not in report.realscale_table(tmp_path)


def test_a_fit_with_a_negative_slope_is_undecided_and_prints_no_negative_time(tmp_path):
    """A deeper run measured faster: the fitted full-depth time is negative and the receipt's own `targets` call it
    met; the page reads the fits and says undecided instead, and a failed depth shows its error."""
    from lab import report
    gate = {"s": 40.0, "timing": {"build_s": 5.0, "score_s": 30.0, "forward_s": 28.0, "calibration_forward_s": 0.3},
            "verdicts": {"a": "PASS"}, "gpu_peak_bytes": 2 ** 30, "host_peak_bytes": 2 ** 30, "groups": [6]}
    fit = {"full_depth": -404.0, "warning": "per_layer < 0"}
    ok = {"full_depth": 100.0}
    rec = {"provenance": {"device": "GPU", "command": "python -m lab.realscale_gate", "commit": "0" * 40,
                          "torch": "2", "date": "2026-01-01"}, "complete": True,
           "settings": {"mode": "fit", "extrapolation": "q = fixed + layers x per_layer"},
           "archs": {"qwen3_moe": {"full_layers": 48, "depths": {
               "1": {"gate": {**gate, "s": 42.0}}, "2": {"gate": {**gate, "s": 19.5}},
               "3": {"error": {"error": "AssertionError: parity"}}},
               "extrapolation": {"full_layers": 48, "fits": {"gate_s": fit, "forward_s": fit, "score_s": fit,
                                                             "build_s": ok, "host_peak_bytes": ok},
                                 "targets": {"gate_s": {"value": -404.0, "target": 3600.0, "met": True},
                                             "gate_over_forwards": {"value": 0.7, "target": 1.5, "met": True}}}}}}
    (tmp_path / "realscale_gate_qwen3_moe_h100.json").write_text(json.dumps(rec))
    text = report.realscale_table(tmp_path)
    row = text.split("**48 (fitted)**")[1].split("\n")[0]
    # the gate cell names its own fit and its part off the line (forward_s); gate / forwards names the same two
    assert row.count("undecided (the line does not describe `gate_s`, `forward_s`: a negative slope or fixed part)") == 2
    assert "undecided (the line does not describe `score_s`, `forward_s`: a negative slope or fixed part)" in row
    assert "met" not in text.split("**48 (fitted)**")[1].split("\n")[0] and "-404" not in text
    assert "error: AssertionError: parity" in text


def test_tokenizer_cli_names_a_missing_tokenizer(tmp_path, capsys):
    from int4lab.models import tokenizer
    assert tokenizer.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--out: no tokenizer at {tmp_path}" in err and "Traceback" not in err
