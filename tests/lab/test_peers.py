"""The peers built outside the repository, without a GPU: llama.cpp's test-backend-ops output parsed and merged
into a decode receipt, its case list, every row over its own read floor, Marlin's quantisation and bytes (and,
where Marlin's source has been fetched into .peers/, its packer's layout)."""
import json
import re

import pytest
import torch

from lab.bench import shapes
from lab import bench, report
from lab.bench import ggml_peer, marlin_peer, peer_table
from lab.bench.schema import validate_receipt

# test-backend-ops perf lines in its own format (SYNTHETIC times), one of each kind the parser meets
PERF = """\
  MUL_MAT(type_a=q4_0,type_b=f32,m=14336,n=1,k=4096,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1,src_overlap=0):   65604 runs -    15.39 us/run - 117.44 MFLOP/run -   7.63 TFLOPS
  MUL_MAT(type_a=q4_K,type_b=f32,m=14336,n=1,k=4096,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1,src_overlap=0):   60000 runs -    16.50 us/run - 117.44 MFLOP/run -   7.12 TFLOPS
  MUL_MAT(type_a=q4_0,type_b=f32,m=2048,n=1,k=768,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1,src_overlap=0):   106496 runs -     9.88 us/run -   3.15 MFLOP/run - 318.28 GFLOPS
  MUL_MAT(type_a=f16,type_b=f32,m=16416,n=1,k=128,bs=[8,1],nr=[4,1],per=[0,2,1,3],k_v=0,o=1,src_overlap=0):     41664 runs -    24.42 us/run - 134.48 MFLOP/run -   5.51 TFLOPS
  MUL_MAT(type_a=q4_0,type_b=f16,m=2048,n=1,k=768,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1,src_overlap=0):   106496 runs -     1.00 us/run -   3.15 MFLOP/run - 318.28 GFLOPS
  MUL_MAT(type_a=q4_K,type_b=f32,m=2048,n=1,k=768,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1,src_overlap=0): not supported [CUDA0]
  MUL_MAT_ID(type_a=q4_0,type_b=f32,n_mats=128,n_used=8,b=0,m=768,n=1,k=2048):                143064 runs -     7.20 us/run -  25.17 MFLOP/run -   3.49 TFLOPS
  MUL_MAT_ID(type_a=q4_0,type_b=f32,n_mats=128,n_used=8,b=0,m=2048,n=1,k=768):                119220 runs -     8.61 us/run -  25.17 MFLOP/run -   2.92 TFLOPS
  Backend CUDA0: OK
"""
# the rotating harness's lines (SYNTHETIC times): the same format plus the copies it rotated through
ROTATED = """\
  MUL_MAT(type_a=q4_0,type_b=f32,m=14336,n=1,k=4096,copies=4): 320 runs -    17.10 us/run - p10 17.00 p90 17.30
  MUL_MAT_ID(type_a=q4_0,type_b=f32,n_mats=128,n_used=8,b=0,m=768,n=1,k=2048,copies=29): 11600 runs -     6.00 us/run - p10 5.9 p90 6.1
  MUL_MAT_ID(type_a=q4_0,type_b=f32,n_mats=128,n_used=8,b=0,m=2048,n=1,k=768,copies=29): 11600 runs -     7.00 us/run - p10 6.9 p90 7.1
  MUL_MAT(type_a=q4_K,type_b=f32,m=2048,n=1,k=768,copies=227): not supported [allocation of 1.2 GB failed]
"""


def _row(**kw):
    base = {"model": "mixtral", "layer": "gate|up", "N": 14336, "K": 4096, "E": 1, "topk": 1, "rows": 1,
            "impl": "int4_b32", "us": 10.0, "GBps": 1.0}
    return {**base, **kw}


def _receipt():
    """A SYNTHETIC bench receipt (made-up times): two GEMV shapes and Qwen3's one-token MoE layer, with floors."""
    rows, floor = [], []
    for model, layer, N, K, fl in (("mixtral", "gate|up", 14336, 4096, 9.0), ("qwen3", "down", 2048, 768, 2.5)):
        fb = bench.gemv_bytes("int4_b32", N, K)
        floor.append({"bytes": fb, "us": fl, "cfg": "B512_I8_w4"})
        for impl, us in (("int4_b32", 1.1 * fl), ("bf16", 3.4 * fl), ("marlin", 1.5 * fl)):
            nb = bench.gemv_bytes(impl, N, K)
            rows.append(_row(model=model, layer=layer, N=N, K=K, impl=impl, us=us, GBps=nb / (us * 1e3), bytes=nb,
                             floor_us=fl, floor_bytes=fb))
    m = shapes.MODELS["qwen3"]
    fb = bench.moe_bytes("int4_b32_moe", m, 1, 8)
    floor.append({"bytes": fb, "us": 8.0, "cfg": "B512_I8_w4"})
    for impl, us in (("int4_b32_moe", 12.0), ("bf16_loop", 200.0), ("grouped_mm", 70.0)):
        nb = bench.moe_bytes(impl, m, 1, 8)
        rows.append(_row(model="qwen3", layer="moe", N=768, K=2048, E=128, topk=8, impl=impl, us=us,
                         GBps=nb / (us * 1e3), bytes=nb, n_active=8, floor_us=8.0, floor_bytes=fb))
    return {"provenance": {"device": "synthetic"}, "rows": rows, "skipped": [], "floor": floor,
            "launch": {"bytes": 4, "us": 0.6, "cfg": "B512_I8_w4"}}


def test_parse_reads_timings_types_and_unsupported_cases():
    timed, unsupported = ggml_peer.parse(PERF)
    assert len(timed) == 6                                   # the f16-activation line is not a peer of ours
    assert {t["type"] for t in timed} == {"q4_0", "q4_K", "f16"}
    q = [t for t in timed if t["op"] == "MUL_MAT" and t["type"] == "q4_0" and t["N"] == 14336][0]
    assert (q["K"], q["n"], q["runs"], q["us"]) == (4096, 1, 65604, 15.39)
    mmid = [t for t in timed if t["op"] == "MUL_MAT_ID"]
    assert {(t["n_mats"], t["n_used"], t["N"], t["K"]) for t in mmid} == {(128, 8, 768, 2048), (128, 8, 2048, 768)}
    assert unsupported == [{"op": "MUL_MAT", "type": "q4_K", "N": 2048, "K": 768, "n": 1,
                            "reason": "not supported [CUDA0]"}]



def test_parse_keeps_the_rotating_harness_spread():
    """The rotating harness prints p10 / p90 of its samples; a GEMV row carries them (a MoE row, a sum of
    launches, does not: percentiles do not add)."""
    line = ("  MUL_MAT(type_a=q4_0,type_b=f32,m=4096,n=1,k=4096,copies=64): 20480 runs -     5.10 us/run - "
            "p10 5.02 p90 5.31\n")
    timed, _ = ggml_peer.parse(line)
    assert timed[0]["us"] == 5.10 and (timed[0]["p10_us"], timed[0]["p90_us"]) == (5.02, 5.31)

def test_parse_reads_the_recorded_anchor_format():
    anchors = sorted(report.ANCHORS.glob("ggml_q4_0_*.txt"))
    if not anchors:
        pytest.skip("no recorded ggml anchor in this checkout")
    timed, _ = ggml_peer.parse(anchors[0].read_text())
    assert sum(t["op"] == "MUL_MAT_ID" for t in timed) >= 6 and all(t["us"] > 0 for t in timed)


def test_cases_cover_every_bench_shape_and_moe_projection_in_the_patch_grammar():
    lines = ggml_peer.cases()
    grammar = re.compile(r"^(mm (q4_0|q4_K) \d+ \d+|mmid (q4_0|q4_K) \d+ \d+ \d+ \d+)$")
    assert all(grammar.match(line) for line in lines)
    dense = {(t, int(n), int(k)) for _, t, n, k in (line.split() for line in lines if line.startswith("mm "))}
    for s in shapes.all_shapes():
        assert ("q4_0", s.N, s.K) in dense and ("q4_K", s.N, s.K) in dense
    for m in shapes.MODELS.values():
        for n, k in ((m.intermediate, m.hidden), (m.hidden, m.intermediate)):
            assert f"mmid q4_0 {m.n_experts} {m.top_k} {n} {k}" in lines
    assert lines[0] == "mm q4_0 14336 4096"                  # the targets first: a run cut short keeps them


def test_weight_bytes_per_block():
    assert ggml_peer.weight_bytes("q4_0", 14336, 4096) == 14336 * 4096 * 18 // 32
    assert ggml_peer.weight_bytes("q4_K", 14336, 4096) == 14336 * 4096 * 144 // 256
    assert ggml_peer.weight_bytes("q4_0", 5, 32) == 90
    with pytest.raises(ValueError, match="multiple of 256"):
        ggml_peer.weight_bytes("q4_K", 8, 128)
    with pytest.raises(ValueError, match="ggml_type must be one of"):
        ggml_peer.weight_bytes("q8_0", 8, 128)


def _merged(tmp_path, rotated=True):
    rec_path, out, rot = (tmp_path / n for n in ("decode_synthetic.json", "ggml_synthetic.txt", "ggml_rot.txt"))
    rec_path.write_text(json.dumps(_receipt()))
    out.write_text(PERF)
    rot.write_text(ROTATED)
    for _ in range(2):                                        # merging twice replaces, never duplicates
        rec = ggml_peer.merge(rec_path, out, "ggml-org/ggml abc", rot if rotated else None)
    return rec_path, out, rec


def test_merge_adds_valid_rows_with_floors_and_sums_the_moe_projections(tmp_path):
    rec_path, out, rec = _merged(tmp_path, rotated=False)
    assert json.loads(rec_path.read_text()) == rec
    validate_receipt(rec)
    ll = {(r["impl"], r["model"], r["layer"]): r for r in rec["rows"] if r["impl"].startswith("llamacpp")}
    assert set(ll) == {("llamacpp_q4_0", "mixtral", "gate|up"), ("llamacpp_q4_K", "mixtral", "gate|up"),
                       ("llamacpp_q4_0", "qwen3", "down"), ("llamacpp_q4_0_moe", "qwen3", "moe")}
    g = ll["llamacpp_q4_0", "mixtral", "gate|up"]
    assert g["us"] == 15.39 and g["bytes"] == 14336 * 4096 * 18 // 32 + 4 * (14336 + 4096)
    assert g["floor_us"] == 9.0 and "eager" in g["timer"] and g["source"] == out.name
    moe = ll["llamacpp_q4_0_moe", "qwen3", "moe"]
    assert moe["us"] == pytest.approx(2 * 7.20 + 8.61)       # gate and up apart, then down
    assert moe["bytes"] == 8 * 3 * 768 * 2048 * 18 // 32 + 8 * 2048 and moe["floor_us"] == 8.0
    assert rec["llamacpp"]["source"] == "ggml-org/ggml abc"
    assert len(rec["llamacpp"]["files"][out.name]["unsupported"]) == 1


def test_merge_adds_the_rotating_harness_rows_beside_test_backend_ops(tmp_path):
    _, _, rec = _merged(tmp_path)
    rot = {(r["impl"], r["model"]): r for r in rec["rows"] if "_rot" in r["impl"]}
    assert set(rot) == {("llamacpp_q4_0_rot", "mixtral"), ("llamacpp_q4_0_rot_moe", "qwen3")}
    assert rot["llamacpp_q4_0_rot", "mixtral"]["us"] == 17.10 and "rotated" in rot["llamacpp_q4_0_rot", "mixtral"]["timer"]
    assert rot["llamacpp_q4_0_rot_moe", "qwen3"]["us"] == pytest.approx(2 * 6.0 + 7.0)
    assert sum(r["impl"] == "llamacpp_q4_0" for r in rec["rows"]) == 2   # the eager rows stay
    timed, bad = ggml_peer.parse(ROTATED)
    assert [t["copies"] for t in timed] == [4, 29, 29] and "allocation" in bad[0]["reason"]
    with pytest.raises(ValueError, match="way must be one of"):
        ggml_peer.rows(timed, rec, "x", way="_graph")


def test_merge_cli_refuses_missing_files(tmp_path, capsys):
    assert ggml_peer.main(["merge", "--receipt", str(tmp_path / "no.json"), "--ggml", str(tmp_path / "x.txt"),
                           "--source", "s"]) == 2
    assert "is not a file" in capsys.readouterr().err


def test_floor_at_interpolates_and_extends_at_the_largest_rate():
    curve = [(4, 0.6), (1000, 2.0), (3000, 4.0)]
    assert peer_table.floor_at(curve, 1000) == 2.0
    assert peer_table.floor_at(curve, 2000) == pytest.approx(3.0)
    assert peer_table.floor_at(curve, 6000) == pytest.approx(8.0)
    assert peer_table.floor_at(curve, 1) == 0.6
    assert peer_table.floor_at([], 10) is None


def test_every_row_is_judged_against_its_own_bytes():
    rec = _receipt()
    curve = peer_table.floor_curve(rec)
    ours = next(r for r in rec["rows"] if r["impl"] == "int4_b32" and r["N"] == 14336)
    bf16 = next(r for r in rec["rows"] if r["impl"] == "bf16" and r["N"] == 14336)
    # int4-b32's own floor is the floor measured at its bytes; bf16's lies on the curve's last rate, 3.5x the bytes
    assert peer_table.own_floor(rec, ours, curve) == pytest.approx(9.0 * ours["bytes"] / ours["floor_bytes"])
    assert peer_table.own_floor(rec, bf16, curve) == pytest.approx(9.0 * bf16["bytes"] / ours["floor_bytes"])
    no_curve = {k: v for k, v in rec.items() if k not in ("floor", "launch")}
    assert peer_table.own_floor(no_curve, bf16) == pytest.approx(9.0 * bf16["bytes"] / bf16["floor_bytes"])
    assert peer_table.own_floor(rec, {k: v for k, v in bf16.items() if k != "bytes"}) is None


def test_tables_show_each_peer_over_its_floor_and_bf16_at_its_floor(tmp_path):
    _, _, rec = _merged(tmp_path)
    gemv = peer_table.gemv_table(rec)
    head = gemv.splitlines()[0]
    assert "Marlin W4A16 g128" in head and "llama.cpp CUDA Q4_0 (test-backend-ops, eager)†" in head
    assert "llama.cpp CUDA Q4_0 (rotated, CUDA graph)‡" in head
    assert "GemLite" not in head                                   # no rows, no column
    assert "| 15.4 (" in gemv and "×)" in gemv
    moe = peer_table.moe_table(rec)
    line = [x for x in moe.splitlines() if x.startswith("| qwen3 | 1 |")][0]
    bf = peer_table.bf16_floor_us(rec, "qwen3", 1)
    m = shapes.MODELS["qwen3"]
    nb, top = bench.moe_bytes("bf16_loop", m, 1, 8), bench.gemv_bytes("int4_b32", 14336, 4096)
    assert nb > top and bf == pytest.approx(9.0 * nb / top)        # past the largest floor: at its rate
    assert f"| {bf:.1f} |" in line and "| 12.0 (1.50×) |" in line
    text = peer_table.render(rec)
    assert "ggml-org/ggml abc" in text and text.count("†") >= 3 and text.count("‡") >= 3
    assert "| 19.0 (" in moe                                   # the rotated MoE row: 2 x 6.0 + 7.0
    assert "they record percentiles only where the rotating harness printed them" in text


def test_the_report_names_the_rotated_columns_by_what_the_receipt_records(tmp_path):
    """peer_table's rotated headers and ‡ legend repeat ggml_peer's fixed label (CUDA graphs); the report's tables
    (RESULTS.md, chapter 05) name them by what the receipt records and say the graphs are not established."""
    _, _, rec = _merged(tmp_path)
    for table in (report.peer_gemv_table(rec), report.peer_moe_table(rec)):
        head = table.splitlines()[0]
        assert "llama.cpp CUDA Q4_0 " + report.ROT_HEADER in head and "CUDA graph" not in head
    text = report.peer_tables(rec)
    assert report.ROT_LEGEND in text and "given the bench's L2 figure" not in text
    assert "CUDA graph)" not in text and "not established" in text
    assert report.peer_labels(peer_table.render(rec)) == text


def test_a_host_timed_moe_row_is_decided_on_the_ops_actually_timed():
    """gate_up is twice the one [I, H] op timed (gate and up), so the 10 µs rule applies to half of it."""
    ours = _row(layer="moe", impl="int4_b32_moe", us=20.0, p10_us=19.9, p90_us=20.1)
    peer = _row(layer="moe", impl="llamacpp_q4_0_moe", us=40.0, parts_us={"gate_up": 28.0, "down": 12.0})
    assert peer_table.timed_ops_us(peer) == [14.0, 12.0] and peer_table.decided(ours, peer)
    short = {**peer, "us": 30.0, "parts_us": {"gate_up": 18.0, "down": 12.0}}   # the timed gate op: 9 µs
    assert peer_table.timed_ops_us(short) == [9.0, 12.0] and not peer_table.decided(ours, short)
    assert peer_table.timed_ops_us(_row(impl="llamacpp_q4_0", us=15.0)) == [15.0]


def test_marlin_bytes_and_quantisation():
    N, K = 512, 384
    assert bench.gemv_bytes("marlin", N, K) == N * K // 2 + 2 * N * K // 128 + 2 * (N + K)
    gen = torch.Generator().manual_seed(7)
    W = torch.randn(N, K, generator=gen, dtype=torch.float64) * 0.02
    W[3, :128] = 0                                                  # an all-zero group keeps a usable scale
    q, s = marlin_peer.quantise_g128(W)
    assert q.dtype == torch.int8 and int(q.min()) >= -8 and int(q.max()) <= 7 and s.shape == (N, K // 128)
    wq = marlin_peer.dequant_g128(q, s).double()
    step = s.double().repeat_interleave(128, dim=1)
    assert bool(((W - wq).abs() <= step / 2 + 1e-12).all())         # round to nearest within the grid
    with pytest.raises(ValueError, match="multiple of 128"):
        marlin_peer.quantise_g128(W[:, :100])


def test_marlin_packer_holds_our_codes_where_its_source_is_fetched():
    try:
        Layer = marlin_peer.packer()
    except marlin_peer.MarlinMissing as e:
        pytest.skip(str(e))
    import numpy as np
    perm = Layer.pack.__globals__["_perm"].numpy()                   # Marlin's own fragment permutation
    N, K = 256, 256
    gen = torch.Generator().manual_seed(3)
    q, s = marlin_peer.quantise_g128(torch.randn(N, K, generator=gen) * 0.02)
    layer = Layer(K, N, groupsize=128)
    lin = torch.nn.Linear(K, N, bias=False, dtype=torch.float16)
    lin.weight.data = marlin_peer.dequant_g128(q, s).half()
    layer.pack(lin, s)                                                 # scales [N, K / 128]
    B = layer.B.numpy().astype(np.uint32)                             # [K / 16, 2N] words of 8 nibbles
    res = np.zeros((K // 16, N * 16), dtype=np.int64)
    for i in range(8):
        res[:, i::8] = (B >> (4 * i)) & 15
    res = res.reshape(-1, perm.size)
    orig = np.empty_like(res)
    orig[:, perm] = res                                               # undo the kernel's fragment order
    codes = orig.reshape(K // 16, N // 16, 16, 16).transpose(0, 2, 1, 3).reshape(K, N) - 8
    assert (codes == q.t().numpy()).all()
    sperm = np.array(Layer.pack.__globals__["_scale_perm"])
    packed_s = layer.s.numpy().reshape(-1, sperm.size)
    scales = np.empty_like(packed_s)
    scales[:, sperm] = packed_s
    assert (scales.reshape(K // 128, N) == s.t().numpy()).all()      # each group's scale, same order undone
