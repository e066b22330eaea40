"""The timing harness and the report, without a GPU: shapes, byte formulas, receipt schema, the
read-floor kernel (Triton interpreter), the peer registries, correctness gates, table generation from
synthetic receipts, and the CLI's refusal to time on a CPU."""
import json

import numpy as np
import pytest
import torch
from conftest import DEVICE

import int4lab as il
from lab import bench
from lab import report
from lab.bench import floor, harness, peers, shapes, timing
from lab.paths import RECEIPTS, ROOT
from lab.provenance import write_receipt
from lab.report.targets import near as near_limit

# ---- model table and shapes ----------------------------------------------------------------------------


def test_model_table_matches_transformers_configs():
    from transformers import MixtralConfig, OlmoeConfig, Qwen3MoeConfig
    mx, ol, qw = MixtralConfig(), OlmoeConfig(), Qwen3MoeConfig()
    m = shapes.MODELS["mixtral"]
    assert (m.hidden, m.intermediate, m.n_experts, m.top_k, m.n_heads, m.n_kv_heads) == (
        mx.hidden_size, mx.intermediate_size, mx.num_local_experts, mx.num_experts_per_tok,
        mx.num_attention_heads, mx.num_key_value_heads)
    assert m.head_dim == mx.hidden_size // mx.num_attention_heads
    q = shapes.MODELS["qwen3"]
    assert (q.hidden, q.intermediate, q.n_experts, q.top_k, q.n_heads, q.n_kv_heads) == (
        qw.hidden_size, qw.moe_intermediate_size, qw.num_experts, qw.num_experts_per_tok,
        qw.num_attention_heads, qw.num_key_value_heads)
    o = shapes.MODELS["olmoe"]
    assert (o.hidden, o.n_experts, o.top_k, o.n_heads, o.n_kv_heads) == (
        ol.hidden_size, ol.num_experts, ol.num_experts_per_tok, ol.num_attention_heads, ol.num_key_value_heads)
    # the class default (2048) is not the released checkpoint's expert width (1024, its config.json)
    assert o.intermediate == 1024 and ol.intermediate_size == 2048
    assert bench.MODELS is shapes.MODELS and report.MODELS is shapes.MODELS        # one table, shared


def test_tiny_models_are_built_from_their_architecture_records():
    from int4lab.archs import TRAINED, get
    from int4lab.models.configs import expert_shapes, tiny_config
    for arch in TRAINED:
        t = get(arch).tiny
        cfg = tiny_config(arch)
        got = expert_shapes(cfg)
        assert (got["experts"], got["top_k"], got["intermediate"]) == (t.experts, t.top_k, t.intermediate)
        assert cfg.num_key_value_heads == t.kv_heads


def test_bench_models_are_the_architecture_records_published_sizes():
    """The bench's shape table (lab/bench/shapes.py, what its receipts name) agrees with each architecture's
    published configuration in int4lab/archs, field by field."""
    from int4lab.archs import bench_models
    for name, a in bench_models().items():
        m, s = shapes.MODELS[name], a.published_sizes()
        assert (m.hidden, m.intermediate, m.n_experts, m.top_k, m.n_heads, m.n_kv_heads, m.head_dim) == (
            s["hidden"], s["intermediate"], s["experts"], s["top_k"], s["heads"], s["kv_heads"], s["head_dim"]), name


def _shapes(name):
    return {s.layer: (s.N, s.K) for s in shapes.decode_shapes(shapes.MODELS[name])}


def test_decode_shapes_from_configs():
    assert _shapes("mixtral") == {"q/o": (4096, 4096), "k/v": (1024, 4096), "gate_up": (28672, 4096),
                                  "down": (4096, 14336)}
    assert _shapes("olmoe") == {"q/k/v/o/gate_up": (2048, 2048), "down": (2048, 1024)}
    assert _shapes("qwen3") == {"q": (4096, 2048), "k/v": (512, 2048), "o": (2048, 4096),
                                "gate_up": (1536, 2048), "down": (2048, 768)}


def test_all_anchor_shapes_are_benchmarked():
    nk = {(s.N, s.K) for s in shapes.all_shapes()}
    for shape in [(14336, 4096), (4096, 14336), (28672, 8192), (4096, 4096), (512, 2048), (2048, 768)]:
        assert shape in nk
    assert {(s.N, s.K) for s in shapes.all_shapes(quick=True)} <= nk
    assert len(shapes.all_shapes(quick=True)) < len(shapes.all_shapes())
    first = shapes.by_priority(shapes.all_shapes())[:3]
    assert [(s.N, s.K) for s in first] == list(shapes.TARGET_SHAPES)


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
    q = shapes.MODELS["qwen3"]
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
    c = timing.copies_for(nbytes, l2, cap=10**9)
    assert c * nbytes > 4 * l2 or c == 1 and nbytes > 4 * l2
    assert c == 1 or (c - 1) * nbytes <= 4 * l2                        # the fewest copies that do it
    assert timing.copies_for(1, l2, cap=64) == 64
    with pytest.raises(ValueError, match="bytes_per_call must be positive"):
        timing.copies_for(0, l2)


def test_time_calls_refuses_bad_arguments():
    """Checked before any CUDA call, so this runs anywhere."""
    with pytest.raises(ValueError, match="calls must hold at least one callable"):
        timing.time_calls([])
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="min_calls must be a positive int"):
            timing.time_calls([lambda: None], min_calls=bad)
    for bad in (-1, 0.5, False):
        with pytest.raises(ValueError, match="prefill_cycles must be an int >= 0"):
            timing.time_calls([lambda: None], prefill_cycles=bad)
    for bad in (-1.0, 1e5, "50", None):
        with pytest.raises(ValueError, match="warmup_ms must be a number"):
            timing.time_calls([lambda: None], warmup_ms=bad)


def test_summarise_carries_late_samples():
    s = timing.Samples([3.0, 1.0, 2.0, 4.0, 5.0])
    s.late = 2
    out = timing.summarise(s)
    assert out["us"] == 3.0 and out["late"] == 2 and out["replays"] == 5
    assert "late" not in timing.summarise([3.0, 1.0, 2.0])


# ---- receipt schema ------------------------------------------------------------------------------------


def _row(**kw):
    row = {"model": "qwen3", "layer": "down", "N": 2048, "K": 768, "E": 1, "topk": 1, "rows": 1,
           "impl": "int4_b32", "us": 3.0, "GBps": 300.0}
    row.update(kw)
    return row


def _receipt(rows, skipped=(), **extra):
    return {"provenance": {"device": "synthetic"}, "rows": list(rows), "skipped": list(skipped), **extra}


def test_validate_accepts_a_good_receipt_with_and_without_floor():
    bench.validate_receipt(_receipt([_row(), _row(impl="bf16", us=4.0, replays=20, late=0)],
                                    [{"impl": "gemlite", "reason": "absent"}], copy={"GBps": 3000.0}))
    with_floor = [_row(floor_us=2.5, floor_bytes=1_000_000), _row(impl="bf16", us=4.0, floor_us=2.5,
                                                                  floor_bytes=1_000_000)]
    bench.validate_receipt(_receipt(with_floor, floor=[{"bytes": 1_000_000, "us": 2.5, "cfg": "B512_I8_w4"}]))


@pytest.mark.parametrize("bad, match", [
    ({"impl": "int3"}, "impl must be one of"),
    ({"us": -1.0}, "us must be a positive finite"),
    ({"GBps": float("nan")}, "GBps must be a positive finite"),
    ({"us": "3.0"}, "us must be a positive finite"),
    ({"N": 0}, "N must be a positive int"),
    ({"K": True}, "K must be a positive int"),
    ({"rows": 1.0}, "rows must be a positive int"),
    ({"model": ""}, "model must be a non-empty string"),
    ({"floor_us": 0.0, "floor_bytes": 10}, "floor_us must be a positive finite"),
    ({"floor_us": float("inf"), "floor_bytes": 10}, "floor_us must be a positive finite"),
    ({"floor_us": 2.0, "floor_bytes": 2.5}, "floor_bytes must be a positive int"),
    ({"floor_us": 2.0}, "floor_us and floor_bytes come together"),
    ({"n_active": 0}, "n_active must be a positive int"),
    ({"late": -1}, "late must be an int in"),
    ({"late": 21, "replays": 20}, "late must be an int in"),
    ({"late": 1.0}, "late must be an int in"),
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
        bench.validate_receipt(_receipt([_row()], copy={"GBps": 0}))
    with pytest.raises(ValueError, match="floor entry needs"):
        bench.validate_receipt(_receipt([_row()], floor=[{"bytes": 0, "us": 1.0, "cfg": "x"}]))
    with pytest.raises(ValueError, match="names its launch configuration"):
        bench.validate_receipt(_receipt([_row()], floor=[{"bytes": 10, "us": 1.0}]))
    rec = _receipt([_row()])
    del rec["provenance"]
    with pytest.raises(ValueError, match="missing 'provenance'"):
        bench.validate_receipt(rec)


# ---- the read floor: the kernel in the interpreter, the search with a fake timer -------------------------


@pytest.mark.parametrize("nbytes, block, iters", [(1, 4, 1), (3, 4, 1), (4, 8, 2), (4099, 16, 3), (2 * 4096 + 2, 32, 4)])
def test_floor_kernel_reads_every_byte(nbytes, block, iters):
    """The kernel's words xor to the host's xor of the buffer (zero-padded to whole words): it read every byte,
    once, and nothing past the end (the bytes after the buffer are poison)."""
    backing = torch.randint(0, 256, (nbytes + 64,), dtype=torch.uint8).to(DEVICE)
    buf = backing[:nbytes]
    padded = np.zeros(-(-nbytes // 4) * 4, dtype=np.uint8)
    padded[:nbytes] = buf.cpu().numpy()
    want = int(np.bitwise_xor.reduce(padded.view("<i4"))) if padded.size else 0
    out = floor.read_xor_call(buf, block, iters, 4)()
    assert out.numel() == max(1, -(-(nbytes // 4) // (block * iters)))       # one word per program
    assert floor.xor_words(buf, block, iters, 4) == want
    flipped = buf.clone()
    flipped[-1] ^= 0x10                                                      # the last (tail) byte matters
    assert floor.xor_words(flipped, block, iters, 4) != want


def test_floor_kernel_rejects_bad_arguments():
    buf = torch.zeros(64, dtype=torch.uint8)
    with pytest.raises(TypeError, match="buf must be a 1-D uint8"):
        floor.read_xor_call(buf.float(), 16, 1, 4)
    with pytest.raises(TypeError, match="buf must be a 1-D uint8"):
        floor.read_xor_call(buf.view(8, 8), 16, 1, 4)
    with pytest.raises(ValueError, match="non-empty and contiguous"):
        floor.read_xor_call(buf[:0], 16, 1, 4)
    with pytest.raises(ValueError, match="non-empty and contiguous"):
        floor.read_xor_call(buf[::2], 16, 1, 4)
    with pytest.raises(ValueError, match="4-byte boundary"):
        floor.read_xor_call(buf[1:], 16, 1, 4)
    with pytest.raises(ValueError, match="block must be a power of two"):
        floor.read_xor_call(buf, 24, 1, 4)
    with pytest.raises(ValueError, match="iters must be >= 1"):
        floor.read_xor_call(buf, 16, 0, 4)
    with pytest.raises(ValueError, match="num_warps must be one of"):
        floor.read_xor_call(buf, 16, 1, 3)
    with pytest.raises(ValueError, match="nbytes must be a positive int"):
        floor.read_floor(0, l2=1 << 16, device="cpu")


def test_read_floor_keeps_the_best_configuration(monkeypatch):
    """read_floor with the CUDA-graph timer replaced: every config's calls run (interpreter) and the fastest
    median wins; copies rotate past 4x the given L2."""
    fake_us = {16: 5.0, 32: 3.0, 64: 4.0}
    seen = []

    def fake(calls, replays=20, warmup=3):
        outs = [c() for c in calls]
        seen.append((len(calls), outs[0].numel()))
        return [fake_us[current[0]]] * replays
    current = [None]
    configs = [(16, 1, 4), (32, 1, 4), (64, 1, 2)]

    def labelled(buf, block, iters, warps):
        current[0] = block
        return real(buf, block, iters, warps)
    real = floor.read_xor_call
    monkeypatch.setattr(timing, "time_calls", fake)
    monkeypatch.setattr(floor, "read_xor_call", labelled)
    got = floor.read_floor(1000, l2=1024, replays=20, configs=configs, device=DEVICE)
    assert got["cfg"] == "B32_I1_w4" and got["us"] == 3.0 and got["bytes"] == 1000
    assert got["configs"] == {"B16_I1_w4": 5.0, "B32_I1_w4": 3.0, "B64_I1_w2": 4.0}
    assert got["copies"] == timing.copies_for(1000, 1024) and got["copies"] * 1000 > 4 * 1024
    assert [n for n, _ in seen] == [got["copies"]] * 3
    bench.schema.validate_floor(got)


# ---- peer registries and correctness gates (CPU: torch ops and the Triton interpreter on tiny shapes) ------


def test_peer_registries_cover_the_schema():
    assert tuple(peers.GEMV_PEERS) == bench.GEMV_IMPLS
    assert set(peers.MOE_PEERS) == set(bench.MOE_IMPLS)
    with pytest.raises(ValueError, match="impl must be one of"):
        peers.prep_gemv("int3", torch.zeros(8, 32), torch.zeros(1, 32), 1)
    with pytest.raises(ValueError, match="impl must be one of"):
        peers.prep_moe("int3", TINY, None, 1)


def test_gemv_preps_pass_their_own_check_and_a_wrong_kernel_fails():
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    N, K = 64, 128
    W = peers.weights(N, K, gen)
    x = torch.randn(1, K, generator=gen, device=DEVICE).to(torch.bfloat16)
    for impl in ("bf16", "int4_b32"):
        calls, ref, wbytes, tol = peers.prep_gemv(impl, W, x, copies=2)
        assert len(calls) == 2
        assert wbytes + 2 * (N + K) == bench.gemv_bytes(impl, N, K)
        for c in calls:
            assert peers.rel_err(c(), ref) <= tol
        wrong = calls[0]().flip(-1)                                  # a kernel that writes columns in the wrong order
        assert not peers.rel_err(wrong, ref) <= tol
        assert not peers.rel_err(torch.full_like(ref, float("nan")), ref) <= tol


TINY = shapes.MoEModel("tiny", hidden=64, intermediate=32, n_experts=8, top_k=2, n_heads=4, n_kv_heads=2,
                       head_dim=16, source="test")


def test_routing_is_shared_by_every_impl_and_the_dry_run():
    ids, wts = peers.routing(TINY, 5, seed=3)
    ids2, wts2 = peers.routing(TINY, 5, seed=3)
    assert torch.equal(ids, ids2) and torch.equal(wts, wts2)
    assert ids.dtype == torch.int32 and ids.shape == (5, 2) and torch.allclose(wts.sum(-1), torch.ones(5))
    assert all(len(set(r)) == 2 for r in ids.tolist())                      # distinct experts per token
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(peers.moe_inputs(TINY, 5, gen, seed=3).ids, ids)
    q = shapes.MODELS["qwen3"]
    dry = [d for d in bench.dry_run() if d["model"] == "qwen3" and d["layer"] == "moe" and d["rows"] == 16]
    active = peers.n_active(peers.routing(q, 16)[0])
    assert {d["n_active"] for d in dry} == {active}
    assert next(d for d in dry if d["impl"] == "floor")["bytes"] == bench.moe_bytes("int4_b32_moe", q, 16, active)


@pytest.mark.parametrize("impl", ["bf16_loop", "grouped_mm"])
@pytest.mark.parametrize("rows", [1, 5])
def test_bf16_moe_peers_match_the_reference(impl, rows):
    if impl == "grouped_mm" and peers.grouped_mm_unavailable("cpu"):
        pytest.skip(peers.grouped_mm_unavailable("cpu"))
    inp = peers.moe_inputs(TINY, rows, torch.Generator().manual_seed(2))
    calls, ref, wbytes, tol = peers.prep_moe(impl, TINY, inp, copies=2)
    n_active = peers.n_active(inp.ids)
    assert 2 <= n_active <= min(8, 2 * rows)
    assert wbytes + 4 * rows * 64 == bench.moe_bytes(impl, TINY, rows, n_active)
    for c in calls:
        assert peers.rel_err(c(), ref) <= tol


@pytest.mark.parametrize("impl, rows", [("int4_b32_moe", 1), ("int4_b32_moe", 3), ("int4_b32_grouped", 4)])
def test_int4_moe_paths_pass_the_gate(impl, rows):
    inp = peers.moe_inputs(TINY, rows, torch.Generator(device=DEVICE).manual_seed(3))
    calls, ref, wbytes, tol = peers.prep_moe(impl, TINY, inp, copies=2)
    assert wbytes + 4 * rows * 64 == bench.moe_bytes(impl, TINY, rows, peers.n_active(inp.ids))
    for c in calls:
        assert peers.rel_err(c(), ref) <= tol
    assert not peers.rel_err(calls[0]().roll(1, 0 if rows > 1 else 1), ref) <= tol


def test_moe_reference_is_the_weighted_swiglu_sum():
    E, H, I = 3, 8, 4
    gu, dn = torch.randn(E, 2 * I, H), torch.randn(E, H, I)
    x = torch.randn(1, H)
    ids, wts = torch.tensor([[2, 0]]), torch.tensor([[0.25, 0.75]])
    want = torch.zeros(H)
    for e, w in ((2, 0.25), (0, 0.75)):
        h = gu[e] @ x[0]
        want += w * (dn[e] @ (h[:I] * torch.sigmoid(h[:I]) * h[I:]))
    torch.testing.assert_close(peers.moe_reference(x, ids, wts, gu, dn)[0], want, rtol=1e-5, atol=1e-5)


# ---- CLI -----------------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is what a CPU-only machine sees")
def test_cli_refuses_to_time_without_cuda(capsys, tmp_path):
    out = tmp_path / "r.json"
    assert bench.main(["--quick", "--out", str(out)]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(RuntimeError, match="CUDA device"):
        bench.run(quick=True)


def test_cli_dry_run_lists_shapes_and_floors(capsys):
    assert bench.main(["--dry-run", "--quick"]) == 0
    text = capsys.readouterr().out
    assert "14336x4096" in text and "int4_b32" in text and "bf16_loop" in text
    floor_line = next(line for line in text.splitlines() if "14336x4096" in line and " floor " in line)
    assert floor_line.split()[-2] == str(bench.gemv_bytes("int4_b32", 14336, 4096))
    full = bench.dry_run()
    for name in shapes.MODELS:
        assert {d["rows"] for d in full if d["model"] == name and d["impl"] == "floor" and d["layer"] == "moe"} \
            == set(bench.MOE_TOKENS) == {1, 2, 4, 8, 16, 32, 64}
    assert sum(d["impl"] == "floor" and d["layer"] != "moe" for d in full) == len(shapes.all_shapes())


# ---- report --------------------------------------------------------------------------------------------


def _synthetic_receipt(tmp_path, with_floor=True):
    """A SYNTHETIC receipt (made-up times, not a measurement) written through write_receipt."""
    rows = []
    floors = {(14336, 4096): 9.0, (4096, 14336): 10.0, (2048, 768): 2.5, (4096, 4096): 4.0}
    for (N, K, model, layer), times in {
        (14336, 4096, "mixtral", "gate|up"): {"int4_b32": 10.0, "bf16": 31.0, "tinygemm": 22.0},
        (4096, 14336, "mixtral", "down"): {"int4_b32": 12.0, "bf16": 33.0},
        (2048, 768, "qwen3", "down"): {"int4_b32": 2.0, "bf16": 4.0, "tinygemm": 3.0, "gemlite": 3.5},
        (4096, 4096, "mixtral", "q/o"): {"int4_b32": 9.0, "bf16": 8.0},
    }.items():
        for impl, us in times.items():
            nbytes = bench.gemv_bytes(impl, N, K)
            fl = {"floor_us": floors[N, K], "floor_bytes": bench.gemv_bytes("int4_b32", N, K)} if with_floor else {}
            rows.append(_row(model=model, layer=layer, N=N, K=K, impl=impl, us=us, GBps=nbytes / (us * 1e3),
                             bytes=nbytes, **fl))
    m = shapes.MODELS["qwen3"]
    for R, times, fl_us in ((1, (("int4_b32_moe", 14.0), ("bf16_loop", 130.0)), 11.0),
                            (4, (("int4_b32_moe", 40.0), ("int4_b32_grouped", 30.0), ("bf16_loop", 700.0),
                                 ("grouped_mm", 140.0)), 25.0)):
        for impl, us in times:
            nbytes = bench.moe_bytes(impl, m, R, 8 * R)
            fl = {"floor_us": fl_us, "floor_bytes": bench.moe_bytes("int4_b32_moe", m, R, 8 * R)} if with_floor else {}
            rows.append(_row(model="qwen3", layer="moe", N=768, K=2048, E=128, topk=8, rows=R, impl=impl, us=us,
                             GBps=nbytes / (us * 1e3), bytes=nbytes, n_active=8 * R, **fl))
    path = write_receipt(tmp_path / "decode_synthetic.json",
                         {"copy": {"GBps": 4000.0}, "rows": rows,
                          "skipped": [{"impl": "gemlite", "N": 14336, "K": 4096, "reason": "synthetic"}]},
                         command="synthetic test receipt --out /somewhere/else/decode_synthetic.json")
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
    assert report.llama_moe_us(rows, shapes.MODELS["qwen3"]) == pytest.approx(11.06 + 8.61)
    assert report.llama_moe_us(rows, shapes.MODELS["olmoe"]) is None


def test_anchor_rows_absent_folder_is_empty(tmp_path, capsys):
    assert report.anchor_rows(tmp_path / "nowhere") == []
    assert "no llama.cpp anchors" in capsys.readouterr().err


def test_recorded_anchors_are_read_from_the_repository():
    assert report.ANCHORS == RECEIPTS / "anchors" and report.ANCHORS.is_relative_to(ROOT)
    rows = report.anchor_rows()
    assert report.llama_gemv_us(rows, 14336, 4096) == 15.39                # data/receipts/anchors/ggml_q4_0_h200_2026-12-02.txt
    assert not hasattr(report, "RECEIPTS") or report.RECEIPTS is RECEIPTS


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def test_report_tables_show_floor_ratios_and_peer_ratios(tmp_path):
    rec = _synthetic_receipt(tmp_path)
    rec["provenance"]["device"] = "NVIDIA H100 80GB HBM3"
    anchors = report.parse_ggml(GGML_SAMPLE, source="ggml_q4_0_h100_sample.txt")
    other = report.parse_ggml(GGML_SAMPLE, source="ggml_q4_0_h200_sample.txt")   # another card: no peer of this run
    assert report.same_card(rec, anchors + other) == anchors
    assert "9.9" not in report.gemv_table(rec, other)
    lines = report.gemv_table(rec, anchors).splitlines()
    assert len(lines) == 2 + 4
    head = _cells(lines[0])
    assert head[:6] == ["model", "layer", "N×K", "read floor", "int4_b32", "int4_b32 / floor"]
    assert all(len(_cells(line)) == len(head) for line in lines if not line.startswith("|-"))
    assert any(line.startswith("| mixtral | gate\\|up | 14336×4096") for line in lines)   # '|' escaped
    qwen = dict(zip(head, _cells(next(line for line in lines if "2048×768" in line))))
    assert qwen["read floor"] == "2.5" and qwen["int4_b32"] == "2.0" and qwen["int4_b32 / floor"] == "0.80"
    assert qwen["bf16"] == "4.0 (2.00×)" and qwen["tinygemm"] == "3.0 (1.50×)"            # peer / ours
    assert qwen[report.LLAMA] == "9.9 (4.94×)" and "w4a16_cutlass" not in qwen          # never timed: no column
    moe = report.moe_table(rec, anchors).splitlines()
    head = _cells(moe[0])
    one = dict(zip(head, _cells(next(line for line in moe if line.startswith("| qwen3 | 1 |")))))
    assert one["experts read"] == "8" and one["read floor"] == "11.0" and one["best int4 / floor"] == "1.27"
    assert one["bf16 loop"] == "130.0 (9.29×)" and one["int4-b32 grouped"] == "–"
    assert one["llama.cpp Q4_0 routed (recorded)"] == f"19.7 ({(11.06 + 8.61) / 14.0:.2f}×)"
    four = dict(zip(head, _cells(next(line for line in moe if line.startswith("| qwen3 | 4 |")))))
    assert four["best int4 / floor"] == "1.20" and four["grouped_mm (bf16)"] == "140.0 (4.67×)"   # best = grouped


def test_report_targets_from_a_synthetic_receipt(tmp_path):
    rec = _synthetic_receipt(tmp_path)
    anchors = report.parse_ggml(GGML_SAMPLE)
    checks = {c.target: c.status for c in report.targets(rec, anchors)}
    assert checks["14336×4096: int4_b32 ≤ 1.15× read floor"] == "pass"                # 10 / 9 = 1.11
    assert checks["4096×14336: int4_b32 ≤ 1.15× read floor"] == "miss"                # 12 / 10 = 1.2
    assert checks["28672×8192: int4_b32 ≤ 1.15× read floor"] == "not measured"
    assert checks["qwen3 down 2048×768: int4_b32 faster than every peer"] == "pass"
    assert checks["qwen3 down 2048×768: int4_b32 ≤ 1.4× read floor"] == "pass"        # 0.8
    assert checks["mixtral q/o 4096×4096: int4_b32 ≤ 1.4× read floor"] == "miss"      # 9 / 4 = 2.25
    assert checks["mixtral q/o 4096×4096: int4_b32 faster than every peer"] == "miss"  # slower than bf16 alone
    assert checks["mixtral down 4096×14336: int4_b32 faster than every peer"] == "not measured"   # peers missing
    assert checks["qwen3 q 4096×2048: int4_b32 faster than every peer"] == "not measured"
    assert checks["mixtral gate|up 14336×4096: int4_b32 faster than every peer"] == "not measured"  # no gemlite
    assert checks["qwen3 one-token MoE layer ≤ 1.2× read floor of routed bytes"] == "miss"   # 14 / 11 = 1.27
    assert checks["qwen3 one-token MoE layer ≥ 15× the bf16 loop"] == "miss"                # 130 / 14 = 9.3
    assert checks["mixtral one-token MoE layer ≤ 1.2× read floor of routed bytes"] == "not measured"
    assert checks["qwen3 MoE, 4 tokens: best int4 ≤ 1.3× read floor of unique experts"] == "pass"  # 30 / 25
    assert checks["qwen3 MoE, 4 tokens: best int4 ≥ 2× faster than bf16 loop and grouped_mm"] == "pass"  # 4.67
    assert checks["qwen3 MoE, 8 tokens: best int4 ≥ 2× faster than bf16 loop and grouped_mm"] == "not measured"
    block = report.render(rec, anchors)
    assert "synthetic" in block and "1 measurements were skipped" in block and "predates" not in block
    assert "…/decode_synthetic.json" in block and "/somewhere/" not in block               # no machine paths


def test_report_undecided_within_the_run_to_run_spread(tmp_path):
    """A target met or missed by less than the run-to-run spread is "undecided"; the spread is the 90th
    percentile of how far torch's own kernels' medians moved between two receipts."""
    import copy
    rec = _synthetic_receipt(tmp_path)
    anchors = report.parse_ggml(GGML_SAMPLE)
    other = copy.deepcopy(rec)
    stable = [r for r in other["rows"] if r["impl"] in report.STABLE_PEERS]
    assert stable
    for i, r in enumerate(stable):                     # all but one move by 1 %, one by 10 %
        r["us"] *= 1.10 if i == 0 else 1.01
    assert len(stable) == 9                            # the 90th percentile of 9 moves is the largest
    assert abs(report.run_to_run(rec, other) - (1 - 1 / 1.10)) < 1e-9
    assert abs(report.run_to_run(rec, other, q=0.5) - (1 - 1 / 1.01)) < 1e-9
    assert report.run_to_run(rec, {"rows": []}) is None
    big = "14336×4096: int4_b32 ≤ 1.15× read floor"                                  # 10 / 9 = 1.111: 3.4 % inside
    assert {c.target: c.status for c in report.targets(rec, anchors, 0.02)}[big] == "pass"
    assert {c.target: c.status for c in report.targets(rec, anchors, 0.05)}[big] == "undecided"
    miss = "4096×14336: int4_b32 ≤ 1.15× read floor"                                 # 1.2: 4.3 % over
    assert {c.target: c.status for c in report.targets(rec, anchors, 0.05)}[miss] == "undecided"
    assert {c.target: c.status for c in report.targets(rec, anchors, 0.04)}[miss] == "miss"
    none = "28672×8192: int4_b32 ≤ 1.15× read floor"
    assert {c.target: c.status for c in report.targets(rec, anchors, 0.5)}[none] == "not measured"
    block = report.render(rec, anchors, 0.05)
    n_open = sum(c.status == "undecided" for c in report.targets(rec, anchors, 0.05))
    assert f"{n_open} undecided" in block and "less than 5.0 %" in block


def test_report_handles_receipts_from_before_the_floor(tmp_path):
    rec = _synthetic_receipt(tmp_path, with_floor=False)
    anchors = report.parse_ggml(GGML_SAMPLE)
    lines = report.gemv_table(rec, anchors).splitlines()
    head = _cells(lines[0])
    qwen = dict(zip(head, _cells(next(line for line in lines if "2048×768" in line))))
    assert qwen["read floor"] == "–" and qwen["int4_b32 / floor"] == "–" and qwen["bf16"] == "4.0 (2.00×)"
    checks = report.targets(rec, anchors)
    assert all(c.status == "not measured" for c in checks if "read floor" in c.target)
    assert "predates the read floor" in report.render(rec, anchors)
    committed = report.load(report.DEFAULT_OUT)                                # the committed receipt renders
    assert "**Batch-1 GEMV, µs**" in report.render(committed, report.anchor_rows())


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
    assert rec["provenance"]["command"].startswith("synthetic test receipt")
    results, notes = tmp_path / "RESULTS.md", tmp_path / "kernels.md"
    results.write_text(f"# R\n{report.TARGETS_START}\n{report.TARGETS_END}\n{report.START}\n{report.END}\nhand\n")
    notes.write_text(f"# N\n{report.MISSES_START}\nstale\n{report.MISSES_END}\n")
    (tmp_path / "none").mkdir()                                                       # no anchors
    assert report.main(["--receipt", str(tmp_path / "decode_synthetic.json"), "--results", str(results),
                        "--notes", str(notes), "--anchors", str(tmp_path / "none")]) == 0
    text = results.read_text()
    assert "Batch-1 GEMV" in text and f"**{report.BATCHED_MOE}**" in text and text.endswith("hand\n")
    assert "stale" not in notes.read_text() and "4096×14336: int4_b32 ≤ 1.15× read floor" in notes.read_text()
    readme = tmp_path / "README.md"                                    # the layout block needs no receipt
    readme.write_text(f"# T\n{report.LAYOUT_START}\n{report.LAYOUT_END}\n")
    assert report.main(["--readme", str(readme), "--receipt", str(tmp_path / "absent.json")]) == 0
    assert "int4lab/" in readme.read_text() and "files" in readme.read_text()


def test_every_target_has_a_name_and_the_misses_table_holds_only_misses(tmp_path):
    rec = _synthetic_receipt(tmp_path)
    checks = report.targets(rec, report.parse_ggml(GGML_SAMPLE))
    names = {report.GEMV_FLOOR, report.GEMV_BESIDE_PEERS, report.ONE_TOKEN_MOE, report.BATCHED_MOE}
    assert {c.name for c in checks} == names
    table = report.misses_table(checks)
    # a miss, an undecided target, or a single-run verdict within NEAR of its limit (listed as undecided, its side
    # named), after one paragraph that counts the near verdicts
    close = [c for c in checks if near_limit(c)]
    left = [c for c in checks if c.status in ("miss", "undecided") or c in close]
    assert close and left and len(table.split("\n\n")[-1].splitlines()) == 2 + len(left)
    assert table.startswith(f"These are the verdicts of one run. {len(close)} of them lie within 5 % of their limit")
    assert all(c.target not in table for c in checks if c.status == "pass" and c not in close)
    assert all(f"| {c.target} |" in table and "undecided (" in table for c in close)
    assert all(f"**{n}**" in report.target_definitions() for n in names)
    assert report.misses_table([c for c in checks if c.status == "pass" and c not in close]) == "Every target is met."


def test_report_figures_draw_from_a_synthetic_receipt(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rec = _synthetic_receipt(tmp_path)
    ax = report.plot_time_over_floor(rec)
    assert len(ax.get_xticklabels()) == 4
    floor_us = {(r["N"], r["K"]): r["floor_us"] for r in rec["rows"] if r["layer"] != "moe" and r["impl"] == "int4_b32"}
    points = sorted(round(float(y), 4) for line in ax.lines if line.get_marker() == "o" for y in line.get_ydata())
    want = sorted(round(r["us"] / floor_us[(r["N"], r["K"])], 4) for r in rec["rows"] if r["layer"] != "moe")
    assert points == want                                                     # every row, over its shape's floor
    assert any(line.get_marker() != "o" and list(line.get_ydata()) == [1.0, 1.0] for line in ax.lines)
    assert report.floor_fixed_share(rec) == {}                                 # no floor list in this receipt
    share = report.floor_fixed_share({"floor": [{"bytes": 1e6, "us": 2.0}, {"bytes": 4e8, "us": 100.0}]})
    assert share == {1e6: 0.875, 4e8: 0.0}          # 1 MB at the fastest rate (4 MB/µs) is 0.25 µs of its 2 µs
    ax = report.plot_moe(rec, rows=1)
    assert sorted(p.get_height() for p in ax.patches) == [14.0, 130.0]
    assert [line.get_ydata()[0] for line in ax.lines] == [11.0]
    plt.close("all")


# ---- row assembly, with the GPU timer replaced by a fake (CPU: no CUDA graphs) --------------------------


@pytest.fixture
def fake_timer(monkeypatch):
    """Replace CUDA-graph timing with fixed fake samples: these tests check bookkeeping, not speed."""
    seen = []

    def fake(calls, replays=20, warmup=3):
        seen.append(len(calls))
        out = timing.Samples([2.0] * (replays - 1) + [4.0])
        out.late = 1
        return out
    monkeypatch.setattr(timing, "time_calls", fake)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    return seen


def _fake_floor(nbytes):
    return {"bytes": nbytes, "us": 1.5, "cfg": "fake"}


def test_bench_gemv_rows_and_skips(fake_timer):
    gen = torch.Generator(device=DEVICE).manual_seed(4)
    shape = shapes.Shape("tiny", "proj", 64, 128)
    l2 = 64 * 1024
    rows, skipped = bench.bench_gemv(shape, bench.GEMV_IMPLS, replays=20, l2=l2, gen=gen, floor_of=_fake_floor)
    got = {r["impl"] for r in rows}
    assert {"bf16", "int4_b32"} <= got
    assert got | {s["impl"] for s in skipped} == set(bench.GEMV_IMPLS)   # nothing silently dropped
    assert all(s["reason"] for s in skipped)
    for r in rows:
        assert r["us"] == 2.0 and r["GBps"] == r["bytes"] / 2e3 and r["late"] == 1
        assert r["copies"] * (r["bytes"] - 2 * (64 + 128)) > 4 * l2
        assert r["rel_err"] <= 2 ** -6
        assert r["floor_us"] == 1.5 and r["floor_bytes"] == bench.gemv_bytes("int4_b32", 64, 128)
    by = {r["impl"]: r for r in rows}
    assert by["int4_b32"]["bytes"] == by["int4_b32"]["bytes_formula"] == bench.gemv_bytes("int4_b32", 64, 128)
    assert fake_timer == [r["copies"] for r in rows]
    bench.validate_receipt({"provenance": {}, "rows": rows, "skipped": skipped})


def test_a_wrong_kernel_is_skipped_not_timed(fake_timer, monkeypatch):
    real = peers.GEMV_PEERS["bf16"]

    def broken(W, x, copies):
        p = real(W, x, copies)
        return p._replace(calls=[lambda c=c: c() * 1.1 for c in p.calls])      # 10% off: a wrong scale
    monkeypatch.setitem(peers.GEMV_PEERS, "bf16", broken)
    rows, skipped = bench.bench_gemv(shapes.Shape("tiny", "proj", 64, 128), ["bf16"], replays=20, l2=1 << 16,
                                     gen=torch.Generator().manual_seed(5))
    assert rows == [] and fake_timer == []
    assert "wrong result" in skipped[0]["reason"]


def test_bench_moe_row(fake_timer, monkeypatch):
    gen = torch.Generator().manual_seed(6)
    rows, skipped = bench.bench_moe(TINY, "bf16_loop", 4, replays=20, l2=1 << 16, gen=gen, floor_of=_fake_floor)
    assert skipped == [] and len(rows) == 1
    r = rows[0]
    assert (r["layer"], r["E"], r["topk"], r["rows"], r["N"], r["K"]) == ("moe", 8, 2, 4, 32, 64)
    assert r["n_active"] == peers.n_active(peers.routing(TINY, 4)[0])
    assert r["bytes"] == bench.moe_bytes("bf16_loop", TINY, 4, r["n_active"])
    assert r["floor_bytes"] == bench.moe_bytes("int4_b32_moe", TINY, 4, r["n_active"]) and r["floor_us"] == 1.5
    bench.validate_row(r)
    monkeypatch.setattr(peers, "_kernels", lambda: (_ for _ in ()).throw(peers.Skip("no kernels in this test")))
    rows, skipped = bench.bench_moe(TINY, "int4_b32_moe", 1, replays=20, l2=1 << 16, gen=gen)
    assert rows == [] and skipped[0]["reason"] == "no kernels in this test"


def test_schedule_puts_targets_first_and_covers_everything():
    work = bench.schedule()
    labels = [w.label() for w in work]
    assert len(set(labels)) == len(labels)
    assert [(w.shape.N, w.shape.K) for w in work[:3]] == list(shapes.TARGET_SHAPES)
    assert work[3].model is not None and work[3].rows == 1                      # then one-token MoE layers
    gemv = {(w.shape.model, w.shape.layer) for w in work if w.shape is not None}
    assert gemv == {(s.model, s.layer) for s in shapes.all_shapes()}
    moe = {(w.model, w.impls[0], w.rows) for w in work if w.shape is None}
    for m in shapes.MODELS:
        assert {(m, i, 1) for i in ("int4_b32_moe", "bf16_loop", "grouped_mm")} <= moe
        for T in (2, 4, 8, 16, 32, 64):
            assert {(m, i, T) for i in bench.MOE_IMPLS} <= moe
    last_one_token = max(i for i, w in enumerate(work) if w.shape is None and w.rows == 1)
    first_grouped = min(i for i, w in enumerate(work) if w.rows > 1)
    assert last_one_token < first_grouped
    quick = bench.schedule(quick=True)
    assert len(quick) < len(work) and {w.model for w in quick if w.model} == {"qwen3"}
    only = bench.schedule(only=["bf16_loop"])
    assert only and all(w.shape is None and w.impls == ("bf16_loop",) for w in only)
    assert all(w.impls == ("int4_b32", "bf16") for w in bench.schedule(only=["int4_b32", "bf16"]))


def _fake_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(harness, "_generator", lambda seed: torch.Generator().manual_seed(seed))
    monkeypatch.setattr(timing, "l2_bytes", lambda: 1 << 16)
    monkeypatch.setattr(timing, "copy_bandwidth", lambda replays: {"bytes": 2, "us": 1.0, "GBps": 1000.0})


def test_run_stops_at_its_budget_and_checkpoints(monkeypatch):
    """run()'s scheduling with the device parts faked: every unstarted measurement is listed, none dropped."""
    clock = iter(range(0, 10_000, 10))                                   # each look at the clock: +10 s
    monkeypatch.setattr(harness.time, "time", lambda: float(next(clock)))
    _fake_device(monkeypatch)
    fake = {"model": "m", "layer": "l", "N": 8, "K": 32, "E": 1, "topk": 1, "rows": 1, "us": 1.0, "GBps": 1.0}
    monkeypatch.setattr(harness, "bench_gemv", lambda shape, impls, **kw: ([dict(fake, impl=impls[0])], []))
    monkeypatch.setattr(harness, "bench_moe", lambda m, impl, rows, **kw: ([dict(fake, impl=impl)], []))
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


def test_run_measures_each_floor_once_and_records_a_failing_one(monkeypatch, fake_timer):
    """The floor is measured once per byte count and shared by the rows that need it; a floor that fails is
    a skipped entry with its reason and leaves its rows without floor_us."""
    _fake_device(monkeypatch)
    asked = []

    def fake_floor(nbytes, *, l2, replays, configs=floor.FLOOR_CONFIGS):
        asked.append(nbytes)
        if len(asked) == 2:                                              # the first row's (one-token MoE) floor
            raise RuntimeError("floor kernel broke")
        return {"bytes": nbytes, "us": 1.0, "p10_us": 1.0, "p90_us": 1.0, "replays": replays, "copies": 1,
                "cfg": "fake", "configs": {"fake": 1.0}}
    monkeypatch.setattr(floor, "read_floor", fake_floor)
    monkeypatch.setattr(harness, "QUICK_TOKENS", (1, 2))
    monkeypatch.setattr(harness, "all_shapes", lambda quick=False: [shapes.Shape("tiny", "proj", 64, 128),
                                                                   shapes.Shape("tiny", "proj2", 64, 128)])
    monkeypatch.setitem(harness.MODELS, "qwen3", TINY)
    out = bench.run(quick=True, only=["bf16", "bf16_loop"], budget_s=None)
    assert out["launch"]["bytes"] == 4 == asked[0]                       # one launch's cost: a one-word read
    asked = asked[1:]
    assert len(asked) == len(set(asked)) == 3                            # one measurement per byte count
    assert [f["bytes"] for f in out["floor"]] == asked[1:]
    broken = [s for s in out["skipped"] if s.get("impl") == "floor"]
    assert len(broken) == 1 and "floor kernel broke" in broken[0]["reason"]
    gemv = [r for r in out["rows"] if r["layer"] != "moe"]
    assert len(gemv) == 2 and all(r["floor_bytes"] == bench.gemv_bytes("int4_b32", 64, 128) for r in gemv)
    assert sum("floor_us" not in r for r in out["rows"]) >= 1
    bench.validate_receipt({"provenance": {}, **out})


def test_results_block_from_committed_receipts():
    """RESULTS.md's models/gates/packing block is generated from the receipts in data/receipts/."""
    from lab.chapters.gate_study import regenerate
    text = report.render_results()
    for arch in ("mixtral", "olmoe", "qwen3_moe"):       # a model without its receipt is listed as not measured
        if (RECEIPTS / f"gate_{arch}.json").is_file():
            assert f"| {arch} |" in text and "gptq" in text and ("PASS" in text or "FAIL" in text)
        else:
            assert "*Not measured*" in text
            assert f"{arch}, no data/receipts/gate_{arch}.json (run `{regenerate(arch)}`)" in text
    assert ("**GPTQ pack time per layer**" in text) == any(RECEIPTS.glob("gptq_pack_*.json"))   # only where measured
    assert ("**The small trained models**" in text) == any(RECEIPTS.glob("train_*.json"))


def test_receipt_commands_carry_no_machine_paths():
    from lab.provenance import portable_command
    cmd = "python -m lab.bench --out /some/machine/dir/decode_h200.json --quick"
    assert portable_command(cmd) == "python -m lab.bench --out …/decode_h200.json --quick"
    assert portable_command("python -m lab.bench --out r.json") == "python -m lab.bench --out r.json"


def test_floor_kernel_streams_16_byte_loads_on_sm90():
    """Compiled for an H100/H200 (no GPU needed), the whole-chunk path is 16-byte loads only: the floor is a
    fast read, not one the GEMV could beat by loading wider. Run in a subprocess: compiling needs the
    interpreter off, and this process has it on."""
    import os
    import subprocess
    import sys
    script = (
        "import re, triton\n"
        "from triton.backends.compiler import GPUTarget\n"
        "from triton.compiler import ASTSource\n"
        "from lab.bench.floor import FLOOR_CONFIGS, read_xor_kernel\n"
        "sig = dict(words_ptr='*i32', tail_ptr='*u8', out_ptr='*i32', n_words='i32', n_tail='i32',\n"
        "           BLOCK='constexpr', ITERS='constexpr', HAS_TAIL='constexpr')\n"
        "for block, iters, warps in FLOOR_CONFIGS:\n"
        "    src = ASTSource(fn=read_xor_kernel, signature=sig, attrs={(0,): [['tt.divisibility', 16]]},\n"
        "                    constexprs=dict(BLOCK=block, ITERS=iters, HAS_TAIL=False))\n"
        "    ptx = triton.compile(src, target=GPUTarget('cuda', 90, 32), options={'num_warps': warps}).asm['ptx']\n"
        "    print(block, iters, warps, len(re.findall(r'ld\\.global\\.v4\\.b32', ptx)))\n")
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for line in out.stdout.split("\n")[:-1]:
        block, iters, warps, v4 = map(int, line.split())
        assert v4 == iters * block // (32 * warps * 4), line           # every word of a whole chunk, 4 per load


# ---- the tuning sweep: its shapes are the table's, its pick is a geometric mean -----------------------------


def test_sweep_shapes_come_from_the_shapes_table():
    from lab.tune import sweep
    got = sweep.sweep_shapes()
    nk = [(N, K) for _, N, K in got]
    assert len(nk) == len(set(nk)) and set(nk) == {(s.N, s.K) for s in shapes.all_shapes()}
    assert nk[:3] == list(shapes.TARGET_SHAPES)
    assert sweep.int4_bytes(4096, 4096) == 4096 * 4096 * 9 // 16


def test_sweep_pick_plan_takes_the_smallest_geometric_mean():
    from lab.tune import sweep

    def variant(us, bn):
        return {"us": us, "plan": {"block_n": bn, "split_k": 4}}
    payload = {"dense": [
        {"int4_b32": {"table": {"us": 1.0}, "dp4a_a": variant(10.0, 16), "dp4a_b": variant(4.0, 32)}},
        {"int4_b32": {"dp4a_a": variant(1.0, 16), "dp4a_b": variant(3.0, 32), "dp4a_c": variant(0.1, 64)}},
    ]}
    assert sweep.pick_plan(payload) == {"block_n": 16}          # 10 x 1 < 4 x 3; c was not timed everywhere
    assert sweep.pick_plan({"dense": []}) is None


def test_moe_series_and_tokens_plot_from_a_synthetic_receipt(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rec = _synthetic_receipt(tmp_path)
    series = report.moe_series(rec, "qwen3")
    assert series["int4_b32_moe"] == {1: 14.0, 4: 40.0} and series["int4_b32_grouped"] == {4: 30.0}
    assert series["floor"] == {1: 11.0, 4: 25.0} and series["grouped_mm"] == {4: 140.0}
    assert report.moe_series(rec, "mixtral") == {}
    ax = report.plot_moe_tokens(rec, "qwen3")
    drawn = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines}
    assert drawn["int4_b32_moe"] == ([1, 4], [14.0, 40.0])
    assert drawn["bf16_loop"] == ([1, 4], [130.0, 700.0])
    assert drawn["read floor (unique experts)"] == ([1, 4], [11.0, 25.0])
    assert set(drawn) == {"int4_b32_moe", "int4_b32_grouped", "bf16_loop", "grouped_mm", "read floor (unique experts)"}
    plt.close("all")


def test_gemv_summary_ratios_from_a_synthetic_receipt(tmp_path):
    rec = _synthetic_receipt(tmp_path)
    anchors = report.parse_ggml(GGML_SAMPLE, source=f"ggml_q4_0_{report.card(rec).lower()}_sample.txt")
    rows = {(r["N"], r["K"]): r for r in report.gemv_summary(rec, anchors)}
    qwen = rows[2048, 768]
    assert qwen["floor"] == 2.5 and qwen["ours"] == 2.0 and qwen["ratio"] == pytest.approx(0.8)
    assert qwen["vs"] == pytest.approx({"bf16": 2.0, "tinygemm": 1.5, "gemlite": 1.75, "llama.cpp": 9.88 / 2.0})
    assert rows[4096, 4096]["vs"] == pytest.approx({"bf16": 8.0 / 9.0})       # ours slower: ratio < 1


@pytest.mark.parametrize("generation", ["sm90", "sm80"])
def test_moe_tile_is_the_plan_grouped_plan_takes(generation, monkeypatch):
    """report.moe_tile reads the grouped table without a GPU; on every model and batch it names the tile that
    plan.grouped_plan picks for the step's gate_up on that generation."""
    from int4lab.kernels import plan
    monkeypatch.setattr(plan, "generation", lambda device: generation)
    monkeypatch.setattr(plan, "num_sms", lambda device: 132)
    for name, m in shapes.MODELS.items():
        for T in bench.MOE_TOKENS:
            want = plan.grouped_plan(2 * m.intermediate, m.hidden, T * m.top_k, m.n_experts, "cpu")
            got = report.moe_tile(name, T, generation)
            assert (got.kind, got.block_m, got.block_n, got.tma) == (want.kind, want.block_m, want.block_n, want.tma)


def test_checks_attach_the_same_commits_checks_and_refuse_another(tmp_path):
    from lab.bench import checks
    text = "....F.\nFAILED tests/test_a.py::test_x - boom\nFAILED tests/test_b.py::test_y[1]\n" \
           "=== 2 failed, 5 passed, 1 skipped in 3.00s ===\n"
    assert checks.cuda_tests_outcome(text) == {"summary": "2 failed, 5 passed, 1 skipped in 3.00s",
                                               "failed": ["tests/test_a.py::test_x", "tests/test_b.py::test_y[1]"]}
    assert checks.cuda_tests_outcome("..F")["summary"] is None                  # stopped before its summary
    prov = {"commit": "a" * 40, "kernel_sources_sha256": "k", "device": "NVIDIA H100"}
    rec, rep = tmp_path / "decode.json", tmp_path / "replay.json"
    rec.write_text(json.dumps({"provenance": prov, "rows": [], "sanitizer_note": "old"}))
    rep.write_text(json.dumps({"provenance": prov, "all_pass": True, "rows": []}))
    (tmp_path / "san.txt").write_text("memcheck rc=0 ========= ERROR SUMMARY: 0 errors\nnoise\n")
    (tmp_path / "ct.txt").write_text(text)
    out = checks.attach(rec, tmp_path / "san.txt", rep, tmp_path / "ct.txt", "a" * 40)
    assert out["sanitizer"] == ["memcheck rc=0 ========= ERROR SUMMARY: 0 errors"] and "sanitizer_note" not in out
    assert out["replay_check"]["all_pass"] and out["cuda_tests"]["file"] == "ct.txt"
    rep.write_text(json.dumps({"provenance": {**prov, "commit": "b" * 40}, "all_pass": True, "rows": []}))
    with pytest.raises(ValueError, match="replay: its commit"):
        checks.attach(rec, tmp_path / "san.txt", rep, tmp_path / "ct.txt", "a" * 40)
