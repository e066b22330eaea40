"""The timing harness and the README report, without a GPU: shapes, byte formulas, receipt schema,
correctness gates, table generation from a synthetic receipt, and the CLI's refusal to time on a CPU."""
import pytest
import torch

import int4lab as il
from int4lab import bench, report

# ---- model table and shapes ----------------------------------------------------------------------------


def test_model_table_matches_transformers_configs():
    from transformers import MixtralConfig, OlmoeConfig, Qwen3MoeConfig
    mx, ol, qw = MixtralConfig(), OlmoeConfig(), Qwen3MoeConfig()
    m = bench.MODELS["mixtral"]
    assert (m.hidden, m.intermediate, m.n_experts, m.top_k, m.n_heads, m.n_kv_heads) == (
        mx.hidden_size, mx.intermediate_size, mx.num_local_experts, mx.num_experts_per_tok,
        mx.num_attention_heads, mx.num_key_value_heads)
    assert m.head_dim == mx.hidden_size // mx.num_attention_heads
    q = bench.MODELS["qwen3"]
    assert (q.hidden, q.intermediate, q.n_experts, q.top_k, q.n_heads, q.n_kv_heads) == (
        qw.hidden_size, qw.moe_intermediate_size, qw.num_experts, qw.num_experts_per_tok,
        qw.num_attention_heads, qw.num_key_value_heads)
    o = bench.MODELS["olmoe"]
    assert (o.hidden, o.n_experts, o.top_k, o.n_heads, o.n_kv_heads) == (
        ol.hidden_size, ol.num_experts, ol.num_experts_per_tok, ol.num_attention_heads, ol.num_key_value_heads)
    # the class default (2048) is not the released checkpoint's expert width (1024, its config.json)
    assert o.intermediate == 1024 and ol.intermediate_size == 2048


def _shapes(name):
    return {s.layer: (s.N, s.K) for s in bench.decode_shapes(bench.MODELS[name])}


def test_decode_shapes_from_configs():
    assert _shapes("mixtral") == {"q/o": (4096, 4096), "k/v": (1024, 4096), "gate_up": (28672, 4096),
                                  "down": (4096, 14336)}
    assert _shapes("olmoe") == {"q/k/v/o/gate_up": (2048, 2048), "down": (2048, 1024)}
    assert _shapes("qwen3") == {"q": (4096, 2048), "k/v": (512, 2048), "o": (2048, 4096),
                                "gate_up": (1536, 2048), "down": (2048, 768)}


def test_all_anchor_shapes_are_benchmarked():
    nk = {(s.N, s.K) for s in bench.all_shapes()}
    for shape in [(14336, 4096), (4096, 14336), (28672, 8192), (4096, 4096), (512, 2048), (2048, 768)]:
        assert shape in nk
    assert {(s.N, s.K) for s in bench.all_shapes(quick=True)} <= nk
    assert len(bench.all_shapes(quick=True)) < len(bench.all_shapes())


# ---- bytes ---------------------------------------------------------------------------------------------


def test_gemv_bytes_per_weight():
    N, K = 4096, 4096
    act = 2 * K + 2 * N
    assert bench.gemv_bytes("bf16", N, K) - act == 2 * N * K == 33554432                   # anchors' bytes_bf16
    assert bench.gemv_bytes("int4_b32", N, K) - act == N * K * 9 // 16 == 9437184         # 0.5625 B / weight
    assert bench.gemv_bytes("tinygemm", N, K) - act == N * K * 5 // 8                       # bf16 scale + zero
    assert bench.gemv_bytes("gemlite", N, K) == bench.gemv_bytes("tinygemm", N, K)
    assert bench.gemv_bytes("w4a16_cutlass", N, K, scale_itemsize=2) - act == N * K // 2 + 2 * N
    assert bench.gemv_bytes("int4_b32", N, K, R=4) - bench.gemv_bytes("int4_b32", N, K) == 3 * act
    with pytest.raises(ValueError, match="impl must be one of"):
        bench.gemv_bytes("int3", N, K)


def test_gemv_bytes_match_packed_tensors():
    N, K = 96, 256
    packed, scales = il.pack_int4_b32(torch.randn(N, K))
    assert bench.gemv_bytes("int4_b32", N, K) == packed.nbytes + scales.nbytes + 2 * (N + K)


def test_moe_bytes():
    q = bench.MODELS["qwen3"]
    per_expert = 3 * 768 * 2048
    assert bench.expert_bytes("int4_b32_moe", q) == per_expert * 9 // 16
    assert bench.expert_bytes("bf16_loop", q) == 2 * per_expert
    assert bench.moe_bytes("int4_b32_moe", q, 1, 8) == 8 * per_expert * 9 // 16 + 4 * 2048
    assert bench.moe_bytes("grouped_mm", q, 16, 40) == 40 * 2 * per_expert + 4 * 16 * 2048
    with pytest.raises(ValueError, match="n_active must be in"):
        bench.moe_bytes("bf16_loop", q, 1, 0)
    with pytest.raises(ValueError, match="n_active must be in"):
        bench.moe_bytes("bf16_loop", q, 1, 129)
    with pytest.raises(ValueError, match="impl must be one of"):
        bench.expert_bytes("bf16", q)


@pytest.mark.parametrize("nbytes", [1, 500_000, 2_359_296, 60 * 2**20, 241 * 2**20, 10**9])
def test_copies_rotate_beyond_four_l2(nbytes):
    l2 = 60 * 2**20
    c = bench.copies_for(nbytes, l2, cap=10**9)
    assert c * nbytes > 4 * l2 or c == 1 and nbytes > 4 * l2
    assert c == 1 or (c - 1) * nbytes <= 4 * l2                        # the fewest copies that do it
    assert bench.copies_for(1, l2, cap=64) == 64


# ---- receipt schema ------------------------------------------------------------------------------------


def _row(**kw):
    row = {"model": "qwen3", "layer": "down", "N": 2048, "K": 768, "E": 1, "topk": 1, "rows": 1,
           "impl": "int4_b32", "us": 3.0, "GBps": 300.0}
    row.update(kw)
    return row


def _receipt(rows, skipped=(), gbps=3000.0):
    return {"provenance": {"device": "synthetic"}, "copy": {"GBps": gbps}, "rows": list(rows),
            "skipped": list(skipped)}


def test_validate_accepts_a_good_receipt():
    bench.validate_receipt(_receipt([_row(), _row(impl="bf16", us=4.0)], [{"impl": "gemlite", "reason": "absent"}]))


@pytest.mark.parametrize("bad, match", [
    ({"impl": "int3"}, "impl must be one of"),
    ({"us": -1.0}, "us must be a positive finite"),
    ({"GBps": float("nan")}, "GBps must be a positive finite"),
    ({"us": "3.0"}, "us must be a positive finite"),
    ({"N": 0}, "N must be a positive int"),
    ({"K": True}, "K must be a positive int"),
    ({"rows": 1.0}, "rows must be a positive int"),
    ({"model": ""}, "model must be a non-empty string"),
])
def test_validate_rejects_bad_rows(bad, match):
    with pytest.raises(ValueError, match=match):
        bench.validate_receipt(_receipt([_row(**bad)]))


def test_validate_rejects_bad_receipts():
    row = _row()
    del row["GBps"]
    with pytest.raises(ValueError, match="missing keys"):
        bench.validate_receipt(_receipt([row]))
    with pytest.raises(ValueError, match="needs a non-empty 'reason'"):
        bench.validate_receipt(_receipt([_row()], [{"impl": "gemlite"}]))
    with pytest.raises(ValueError, match="copy.GBps"):
        bench.validate_receipt(_receipt([_row()], gbps=0))
    rec = _receipt([_row()])
    del rec["provenance"]
    with pytest.raises(ValueError, match="missing 'provenance'"):
        bench.validate_receipt(rec)


# ---- correctness gates (CPU: torch ops and the Triton interpreter on tiny shapes) ---------------------


def test_gemv_preps_pass_their_own_check_and_a_wrong_kernel_fails():
    gen = torch.Generator().manual_seed(1)
    N, K = 64, 128
    W = bench._weights(N, K, gen)
    x = torch.randn(1, K, generator=gen).to(torch.bfloat16)
    for impl in ("bf16", "int4_b32"):
        calls, ref, wbytes, tol = bench.prep_gemv(impl, N, K, W, x, copies=2)
        assert len(calls) == 2
        assert wbytes + 2 * (N + K) == bench.gemv_bytes(impl, N, K)
        for c in calls:
            assert bench.rel_err(c(), ref) <= tol
        wrong = calls[0]().flip(-1)                                  # a kernel that writes columns in the wrong order
        assert not bench.rel_err(wrong, ref) <= tol
        assert not bench.rel_err(torch.full_like(ref, float("nan")), ref) <= tol


@pytest.mark.parametrize("impl", ["bf16_loop", "grouped_mm"])
@pytest.mark.parametrize("rows", [1, 5])
def test_bf16_moe_peers_match_the_reference(impl, rows):
    if impl == "grouped_mm" and bench.grouped_mm_unavailable("cpu"):
        pytest.skip(bench.grouped_mm_unavailable("cpu"))
    m = bench.MoEModel("tiny", hidden=64, intermediate=32, n_experts=8, top_k=2, n_heads=4, n_kv_heads=2,
                       head_dim=16, source="test")
    gen = torch.Generator().manual_seed(2)
    calls, ref, wbytes, tol, n_active = bench.prep_moe(impl, m, rows, gen, copies=2)
    assert 2 <= n_active <= min(8, 2 * rows)
    assert wbytes + 4 * rows * 64 == bench.moe_bytes(impl, m, rows, n_active)
    for c in calls:
        assert bench.rel_err(c(), ref) <= tol


@pytest.mark.parametrize("impl, rows", [("int4_b32_moe", 1), ("int4_b32_moe", 3), ("int4_b32_grouped", 4)])
def test_int4_moe_paths_pass_the_gate(impl, rows):
    m = bench.MoEModel("tiny", hidden=64, intermediate=32, n_experts=8, top_k=2, n_heads=4, n_kv_heads=2,
                       head_dim=16, source="test")
    gen = torch.Generator().manual_seed(3)
    calls, ref, wbytes, tol, n_active = bench.prep_moe(impl, m, rows, gen, copies=2)
    assert wbytes + 4 * rows * 64 == bench.moe_bytes(impl, m, rows, n_active)
    for c in calls:
        assert bench.rel_err(c(), ref) <= tol
    assert not bench.rel_err(calls[0]().roll(1, 0 if rows > 1 else 1), ref) <= tol


def test_moe_reference_is_the_weighted_swiglu_sum():
    E, H, I = 3, 8, 4
    gu, dn = torch.randn(E, 2 * I, H), torch.randn(E, H, I)
    x = torch.randn(1, H)
    ids, wts = torch.tensor([[2, 0]]), torch.tensor([[0.25, 0.75]])
    want = torch.zeros(H)
    for e, w in ((2, 0.25), (0, 0.75)):
        h = gu[e] @ x[0]
        want += w * (dn[e] @ (h[:I] * torch.sigmoid(h[:I]) * h[I:]))
    torch.testing.assert_close(bench.moe_reference(x, ids, wts, gu, dn)[0], want, rtol=1e-5, atol=1e-5)


# ---- CLI -----------------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is what a CPU-only machine sees")
def test_cli_refuses_to_time_without_cuda(capsys, tmp_path):
    out = tmp_path / "r.json"
    assert bench.main(["--quick", "--out", str(out)]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(RuntimeError, match="CUDA device"):
        bench.run(quick=True)


def test_cli_dry_run_lists_shapes(capsys):
    assert bench.main(["--dry-run", "--quick"]) == 0
    text = capsys.readouterr().out
    assert "14336x4096" in text and "int4_b32" in text and "bf16_loop" in text


# ---- report --------------------------------------------------------------------------------------------


def _synthetic_receipt(tmp_path):
    """A SYNTHETIC receipt (made-up times, not a measurement) written through write_receipt."""
    rows = []
    for (N, K, model, layer), times in {
        (14336, 4096, "mixtral", "gate|up"): {"int4_b32": 10.0, "bf16": 31.0, "tinygemm": 22.0},
        (4096, 14336, "mixtral", "down"): {"int4_b32": 12.0, "bf16": 33.0},
        (2048, 768, "qwen3", "down"): {"int4_b32": 2.0, "bf16": 4.0, "tinygemm": 3.0, "gemlite": 3.5},
        (4096, 4096, "mixtral", "q/o"): {"int4_b32": 9.0, "bf16": 8.0},
    }.items():
        for impl, us in times.items():
            nbytes = bench.gemv_bytes(impl, N, K)
            rows.append(_row(model=model, layer=layer, N=N, K=K, impl=impl, us=us, GBps=nbytes / (us * 1e3),
                             bytes=nbytes))
    m = bench.MODELS["qwen3"]
    for impl, us in (("int4_b32_moe", 14.0), ("bf16_loop", 130.0)):
        nbytes = bench.moe_bytes(impl, m, 1, 8)
        rows.append(_row(model="qwen3", layer="moe", N=768, K=2048, E=128, topk=8, impl=impl, us=us,
                         GBps=nbytes / (us * 1e3), bytes=nbytes, n_active=8))
    path = il.write_receipt(tmp_path / "decode_synthetic.json",
                            {"copy": {"GBps": 4000.0}, "rows": rows,
                             "skipped": [{"impl": "gemlite", "N": 14336, "K": 4096, "reason": "synthetic"}]},
                            command="synthetic test receipt")
    return report.load(path)


GGML_SAMPLE = """\
  MUL_MAT(type_a=q4_0,type_b=f32,m=14336,n=1,k=4096,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1,src_overlap=0):   65604 runs -    15.39 us/run - 117.44 MFLOP/run -   7.63 TFLOPS
  MUL_MAT(type_a=q4_0,type_b=f32,m=2048,n=1,k=768,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1,src_overlap=0):   106496 runs -     9.88 us/run -   3.15 MFLOP/run - 318.28 GFLOPS
  MUL_MAT(type_a=q4_0,type_b=f32,m=1536,n=1,k=2048,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1,src_overlap=0):
  MUL_MAT(type_a=bf16,type_b=f32,m=4096,n=1,k=14336,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1,src_overlap=0):  33228 runs -    30.38 us/run - 117.44 MFLOP/run -   3.87 TFLOPS
  MUL_MAT_ID(type_a=q4_0,type_b=f32,n_mats=128,n_used=8,b=0,m=1536,n=1,k=2048):                91402 runs -    11.06 us/run - 50.33 MFLOP/run -   4.55 TFLOPS
  MUL_MAT_ID(type_a=q4_0,type_b=f32,n_mats=128,n_used=8,b=0,m=2048,n=1,k=768):                119220 runs -     8.61 us/run - 25.17 MFLOP/run -   2.92 TFLOPS
"""


def test_parse_ggml_keeps_q4_0_rows_only():
    rows = report.parse_ggml(GGML_SAMPLE)
    assert [(r["N"], r["K"], r["E"], r["us"]) for r in rows] == [
        (14336, 4096, 1, 15.39), (2048, 768, 1, 9.88), (1536, 2048, 128, 11.06), (2048, 768, 128, 8.61)]
    assert report.llama_gemv_us(rows, 2048, 768) == 9.88
    assert report.llama_gemv_us(rows, 1536, 2048) is None                 # a line without a time is not a row
    assert report.llama_moe_us(rows, bench.MODELS["qwen3"]) == pytest.approx(11.06 + 8.61)
    assert report.llama_moe_us(rows, bench.MODELS["olmoe"]) is None


def test_anchor_rows_absent_folder_is_empty(tmp_path, capsys):
    assert report.anchor_rows(tmp_path / "nowhere") == []
    assert "no llama.cpp anchors" in capsys.readouterr().err


def test_report_tables_and_targets_from_a_synthetic_receipt(tmp_path):
    rec = _synthetic_receipt(tmp_path)
    anchors = report.parse_ggml(GGML_SAMPLE)
    gemv = report.gemv_table(rec, anchors)
    lines = gemv.splitlines()
    assert len(lines) == 2 + 4
    assert all(line.count(" | ") == 11 for line in lines if not line.startswith("|-"))   # 12 cells everywhere
    assert any(line.startswith("| mixtral | gate\\|up | 14336×4096") for line in lines)   # '|' escaped
    qwen = next(line for line in lines if "2048×768" in line)
    floor = bench.gemv_bytes("int4_b32", 2048, 768) / 4000e3
    assert f"| {floor:.1f} |" in qwen and "| 9.9 |" in qwen and "| 2.00 |" in qwen      # floor, llama.cpp, bf16/ours
    assert "| – |" in qwen                                                               # w4a16_cutlass not measured
    moe = report.moe_table(rec, anchors)
    floor = bench.moe_bytes("int4_b32_moe", bench.MODELS["qwen3"], 1, 8) / 4000e3
    assert f"| qwen3 | 1 | 8 | 14.0 | – | 130.0 | – | 19.7 | {floor:.1f} |" in moe
    checks = {c.target: c.status for c in report.targets(rec, anchors)}
    assert checks["14336×4096: int4_b32 ≤ 11 µs"] == "pass"
    assert checks["4096×14336: int4_b32 ≤ 11 µs"] == "miss"
    assert checks["14336×4096: int4_b32 ≥ 2.9× bf16"] == "pass"                           # 31 / 10 = 3.1
    assert checks["4096×14336: int4_b32 ≥ 2.9× bf16"] == "miss"                           # 33 / 12 = 2.75
    assert checks["14336×4096: int4_b32 faster than llama.cpp Q4_0 (recorded 15.39 µs)"] == "pass"
    assert checks["28672×8192: int4_b32 ≤ 40 µs"] == "not measured"
    assert checks["qwen3 down 2048×768: int4_b32 faster than every peer"] == "pass"
    assert checks["qwen3 q 4096×2048: int4_b32 faster than every peer"] == "not measured"
    assert checks["mixtral down 4096×14336: int4_b32 faster than every peer"] == "not measured"   # peers missing
    assert checks["mixtral q/o 4096×4096: int4_b32 faster than every peer"] == "miss"   # slower than bf16 alone
    assert checks["qwen3 one-token MoE layer ≤ 15 µs"] == "pass"
    assert checks["mixtral one-token MoE layer ≤ 65 µs"] == "not measured"
    block = report.render(rec, anchors)
    assert "synthetic" in block and "1 measurements were skipped" in block


def test_rewrite_readme_between_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nintro\n{report.START}\nold table\n{report.END}\n\nrest\n")
    report.rewrite_readme(readme, "| new |")
    text = readme.read_text()
    assert "old table" not in text and "| new |" in text and text.startswith("# title") and text.endswith("rest\n")
    report.rewrite_readme(readme, "| newer |")                             # idempotent: markers kept
    assert readme.read_text().count(report.START) == 1 and "| new |" not in readme.read_text()
    readme.write_text("# no markers\n")
    with pytest.raises(ValueError, match="must contain"):
        report.rewrite_readme(readme, "x")


def test_report_cli(tmp_path, capsys):
    assert report.main(["--receipt", str(tmp_path / "absent.json")]) == 2
    assert "no receipt" in capsys.readouterr().err
    rec = _synthetic_receipt(tmp_path)
    assert rec["provenance"]["command"] == "synthetic test receipt"
    readme = tmp_path / "README.md"
    readme.write_text(f"{report.START}\n{report.END}\n")
    assert report.main(["--receipt", str(tmp_path / "decode_synthetic.json"), "--readme", str(readme),
                        "--anchors", str(tmp_path / "none")]) == 0
    assert "Batch-1 GEMV" in readme.read_text()


def test_report_figures_draw_from_a_synthetic_receipt(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rec = _synthetic_receipt(tmp_path)
    ax = report.plot_bandwidth(rec)
    assert len(ax.get_xticklabels()) == 4
    assert ax.lines[0].get_ydata()[0] == 4000.0                          # the roofline is the receipt's copy GBps
    heights = sorted(round(p.get_height(), 3) for p in ax.patches)
    want = sorted(round(r["GBps"], 3) for r in rec["rows"] if r["layer"] != "moe")
    assert heights == want
    ax = report.plot_moe(rec, rows=1)
    assert sorted(p.get_height() for p in ax.patches) == [14.0, 130.0]
    plt.close("all")


# ---- row assembly, with the GPU timer replaced by a fake (CPU: no CUDA graphs) --------------------------


@pytest.fixture
def fake_timer(monkeypatch):
    """Replace CUDA-graph timing with fixed fake samples: these tests check bookkeeping, not speed."""
    seen = []

    def fake(calls, replays=20, warmup=3):
        seen.append(len(calls))
        return [2.0] * (replays - 1) + [4.0]
    monkeypatch.setattr(bench, "time_calls", fake)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    return seen


def test_bench_gemv_rows_and_skips(fake_timer):
    gen = torch.Generator().manual_seed(4)
    shape = bench.Shape("tiny", "proj", 64, 128)
    l2 = 64 * 1024
    rows, skipped = bench.bench_gemv(shape, bench.GEMV_IMPLS, replays=20, l2=l2, gen=gen)
    got = {r["impl"] for r in rows}
    assert {"bf16", "int4_b32"} <= got
    assert got | {s["impl"] for s in skipped} == set(bench.GEMV_IMPLS)   # nothing silently dropped
    assert all(s["reason"] for s in skipped)
    for r in rows:
        assert r["us"] == 2.0 and r["GBps"] == r["bytes"] / 2e3
        assert r["copies"] * (r["bytes"] - 2 * (64 + 128)) > 4 * l2
        assert r["rel_err"] <= 2 ** -6
    by = {r["impl"]: r for r in rows}
    assert by["int4_b32"]["bytes"] == by["int4_b32"]["bytes_formula"] == bench.gemv_bytes("int4_b32", 64, 128)
    assert fake_timer == [r["copies"] for r in rows]
    bench.validate_receipt({"provenance": {}, "copy": {"GBps": 1.0}, "rows": rows, "skipped": skipped})


def test_a_wrong_kernel_is_skipped_not_timed(fake_timer, monkeypatch):
    real = bench.prep_gemv

    def broken(impl, N, K, W, x, copies):
        calls, ref, wbytes, tol = real(impl, N, K, W, x, copies)
        return [lambda c=c: c() * 1.1 for c in calls], ref, wbytes, tol      # 10% off: a wrong scale
    monkeypatch.setattr(bench, "prep_gemv", broken)
    rows, skipped = bench.bench_gemv(bench.Shape("tiny", "proj", 64, 128), ["bf16"], replays=20, l2=1 << 16,
                                     gen=torch.Generator().manual_seed(5))
    assert rows == [] and fake_timer == []
    assert "wrong result" in skipped[0]["reason"]


def test_bench_moe_row(fake_timer, monkeypatch):
    tiny = bench.MoEModel("tiny", hidden=64, intermediate=32, n_experts=8, top_k=2, n_heads=4, n_kv_heads=2,
                          head_dim=16, source="test")
    gen = torch.Generator().manual_seed(6)
    rows, skipped = bench.bench_moe(tiny, "bf16_loop", 4, replays=20, l2=1 << 16, gen=gen)
    assert skipped == [] and len(rows) == 1
    r = rows[0]
    assert (r["layer"], r["E"], r["topk"], r["rows"], r["N"], r["K"]) == ("moe", 8, 2, 4, 32, 64)
    assert r["bytes"] == bench.moe_bytes("bf16_loop", tiny, 4, r["n_active"])
    bench.validate_row(r)
    monkeypatch.setattr(bench, "_kernels", lambda: (_ for _ in ()).throw(bench.Skip("no kernels in this test")))
    rows, skipped = bench.bench_moe(tiny, "int4_b32_moe", 1, replays=20, l2=1 << 16, gen=gen)
    assert rows == [] and skipped[0]["reason"] == "no kernels in this test"


def test_schedule_puts_targets_first_and_covers_everything():
    work = bench.schedule()
    labels = [w.label() for w in work]
    assert len(set(labels)) == len(labels)
    assert [(w.shape.N, w.shape.K) for w in work[:3]] == list(bench.TARGET_SHAPES)
    assert work[3].model is not None and work[3].rows == 1                      # then one-token MoE layers
    gemv = {(w.shape.model, w.shape.layer) for w in work if w.shape is not None}
    assert gemv == {(s.model, s.layer) for s in bench.all_shapes()}
    moe = {(w.model, w.impls[0], w.rows) for w in work if w.shape is None}
    for m in bench.MODELS:
        assert {(m, i, 1) for i in ("int4_b32_moe", "bf16_loop", "grouped_mm")} <= moe
        for T in bench.GROUPED_TOKENS:
            assert (m, "int4_b32_grouped", T) in moe and (m, "grouped_mm", T) in moe
    last_one_token = max(i for i, w in enumerate(work) if w.shape is None and w.rows == 1)
    first_grouped = min(i for i, w in enumerate(work) if w.rows > 1)
    assert last_one_token < first_grouped
    quick = bench.schedule(quick=True)
    assert len(quick) < len(work) and {w.model for w in quick if w.model} == {"qwen3"}
    only = bench.schedule(only=["bf16_loop"])
    assert only and all(w.shape is None and w.impls == ("bf16_loop",) for w in only)
    assert all(w.impls == ("int4_b32", "bf16") for w in bench.schedule(only=["int4_b32", "bf16"]))


def test_run_stops_at_its_budget_and_checkpoints(monkeypatch):
    """run()'s scheduling with the device parts faked: every unstarted measurement is listed, none dropped."""
    clock = iter(range(0, 10_000, 10))                                   # each look at the clock: +10 s
    monkeypatch.setattr(bench.time, "time", lambda: float(next(clock)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "_generator", lambda seed: torch.Generator().manual_seed(seed))
    monkeypatch.setattr(bench, "l2_bytes", lambda: 1 << 16)
    monkeypatch.setattr(bench, "copy_bandwidth", lambda replays: {"bytes": 2, "us": 1.0, "GBps": 1000.0})
    fake = {"model": "m", "layer": "l", "N": 8, "K": 32, "E": 1, "topk": 1, "rows": 1, "us": 1.0, "GBps": 1.0}
    monkeypatch.setattr(bench, "bench_gemv", lambda shape, impls, **kw: ([dict(fake, impl=impls[0])], []))
    monkeypatch.setattr(bench, "bench_moe", lambda m, impl, rows, **kw: ([dict(fake, impl=impl)], []))
    seen = []
    out = bench.run(quick=True, budget_s=25, checkpoint=lambda p: seen.append(len(p["rows"])))
    work = bench.schedule(quick=True)
    assert 0 < len(out["rows"]) < len(work)
    budget = [s for s in out["skipped"] if "time budget" in s["reason"]]
    started = len(out["rows"])                                           # the fakes give one row per work item
    assert len(budget) == sum(len(w.impls) for w in work[started:])
    assert {s["what"] for s in budget} == {w.label() for w in work[started:]}
    assert seen == list(range(1, len(out["rows"]) + 1))
    assert out["method"]["complete"] is True and out["method"]["budget_s"] == 25
    bench.validate_receipt({"provenance": {}, **out})


def test_results_block_from_committed_receipts():
    """README's models/gates/packing block is generated from the receipts in data/receipts/."""
    from int4lab import report
    text = report.render_results()
    for arch in ("mixtral", "olmoe", "qwen3_moe"):
        assert f"| {arch} |" in text
    assert "gptq" in text and ("PASS" in text or "FAIL" in text)
    assert "14336×4096" in text                      # the H200 pack-time rows
