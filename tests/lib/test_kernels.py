"""Decode kernels against float64 references of the same int4 values and int8 activations.

Shapes are tiny because on a CPU machine every kernel runs in Triton's interpreter; the same tests run
on CUDA when a GPU is present (graph-capture tests only there). Output buffers are poisoned first.
Shape legend: E = experts, N = out features, K = in features, R = activation rows.
"""
import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from conftest import DEVICE, poison

import int4lab as il
from int4lab.format import quant_x_rows_ref
from int4lab.kernels import (build_group_tiles, combine_rows, gemm_int4_b32_grouped, gemv_int4_b32, gemv_plan,
                             int4_linear, moe_decode_grouped, moe_decode_routed, moe_decode_step, quant_x_rows,
                             reduce_partials, swiglu_quant_rows)
from int4lab import _checks as _validate
from int4lab.kernels import gemv as gemv_mod
from int4lab.kernels.gemv import X_FLOAT, X_SWIGLU, gemv_ref
from int4lab.kernels import launch as launch_mod
from int4lab.kernels.launch import launch_gemv
from int4lab.kernels.moe import moe_decode_ref
from int4lab.kernels import plan as plan_mod
from int4lab.kernels.grouped import MAX_ROUTED_ROWS, build_group_tiles_ref, grouped_ref
from int4lab.kernels.plan import GemvPlan, GroupedPlan, choose_split_k, resolve
from int4lab.kernels.quant import swiglu_quant_rows_ref

BF16_TOL = 2.0 ** -7        # bf16 output rounding is <= 2^-8 relative; the reference bound is 2^-7 of max|ref|
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA-graph capture needs a CUDA device")


def pack(E, N, K, device, scale=0.1):
    p, s = il.pack_int4_b32(torch.randn(E, N, K) * scale)
    return p.to(device), s.to(device)


def assert_same_bits(a, b, cuda_ulps=1):
    """Bit-identical in the interpreter; on CUDA two differently compiled kernels may sum the same float32
    block products in another order (their register layouts differ), so allow `cuda_ulps` bf16 ulps."""
    d = (a.view(torch.int16).int() - b.view(torch.int16).int()).abs().max().item() if a.numel() else 0
    assert d <= (cuda_ulps if a.is_cuda else 0), f"{d} bf16 ulps apart"


def counters_all_zero():
    return all(int(c.abs().sum()) == 0 for _, c in launch_mod.WORKSPACES.values())


def assert_close_bf16(out, ref):
    assert out.dtype == torch.bfloat16
    assert not out.isnan().any(), "unwritten (poisoned) or NaN elements"
    err = (out.float().cpu() - ref.float().cpu()).abs().max()
    assert err <= BF16_TOL * ref.abs().max(), f"max err {float(err):.3g} vs max|ref| {float(ref.abs().max()):.3g}"


# ---------------------------------------------------------------- quant_x_rows
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("R,K", [(1, 32), (16, 288), (3, 800)])
def test_quant_x_rows_bit_identical(device, dtype, R, K):
    x = (torch.randn(R, K) * torch.logspace(-3, 2, K)).to(dtype)
    x[0, :32] = 0                                   # an all-zero block: scale 1e-12, codes 0
    if K > 64:
        x[-1, 32:64] = 2.5                          # a constant block: every code exactly 127
    q, s = quant_x_rows(x.to(device), q=poison(torch.empty(R, K, dtype=torch.int8, device=device)),
                        s=poison(torch.empty(R, K // 32, device=device)))
    rq, rs = quant_x_rows_ref(x)                    # on the CPU: torch on CUDA divides by 127 via a reciprocal
    assert torch.equal(q.cpu(), rq)
    assert torch.equal(s.cpu().view(torch.int32), rs.view(torch.int32))


def test_quant_x_rows_strided_rows(device):
    x = torch.randn(4, 2, 64).bfloat16().to(device)[:, 1]       # rows strided, last dim dense
    q, s = quant_x_rows(x)
    rq, rs = quant_x_rows_ref(x.cpu())
    assert torch.equal(q.cpu(), rq) and torch.equal(s.cpu(), rs)


def test_swiglu_quant_rows(device):
    h = (torch.randn(5, 2 * 96) * 3).bfloat16()
    q, s = swiglu_quant_rows(h.to(device))
    rq, rs = swiglu_quant_rows_ref(h)
    assert (q.cpu().int() - rq.int()).abs().max() <= 1             # exp may differ in the last bit
    torch.testing.assert_close(s.cpu(), rs, rtol=1e-6, atol=0)


# ---------------------------------------------------------------- gemv_int4_b32
@pytest.mark.parametrize("R,N,K,E,split_k", [
    (1, 16, 512, 1, 1),          # one full tile
    (1, 50, 800, 3, 1),          # N not a multiple of the block, K not a multiple of the 512 tile
    (16, 24, 96, 4, 1),          # R = 16, K below one tile
    (5, 40, 1536, 3, 2),         # split-K over 3 tiles: one split owns 2, the other 1
    (3, 33, 2048, 2, 4),
])
def test_gemv_matches_reference(device, R, N, K, E, split_k):
    packed, scales = pack(E, N, K, device)
    x = torch.randn(R, K).bfloat16().to(device)
    xq, xs = quant_x_rows(x)
    eids = torch.randint(0, E, (R,), dtype=torch.int32)
    if R > 2:
        eids[:2] = E - 1                          # repeated and unsorted ids
    eids = eids.to(device)
    out = poison(torch.empty(R, N, dtype=torch.bfloat16, device=device))
    part = poison(torch.empty(split_k, R, N, device=device)) if split_k > 1 else None
    got = gemv_int4_b32(xq, xs, packed, scales, eids, N, K, part=part, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert_close_bf16(got, gemv_ref(xq, xs, packed, scales, eids, N, K))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(R=st.integers(1, 16), N=st.integers(1, 70), kb=st.integers(1, 40), E=st.integers(1, 4),
       split_k=st.integers(1, 4), data=st.data())
def test_gemv_random_shapes(device, R, N, kb, E, split_k, data):
    """Any legal shape: K = 32 * kb (tails inside a tile), N below/above a block, ids drawn at random."""
    K = 32 * kb
    packed, scales = pack(E, N, K, device)
    xq, xs = quant_x_rows(torch.randn(R, K).to(device))
    eids = torch.tensor(data.draw(st.lists(st.integers(0, E - 1), min_size=R, max_size=R)), dtype=torch.int32,
                        device=device)
    out = poison(torch.empty(R, N, dtype=torch.bfloat16, device=device))
    got = gemv_int4_b32(xq, xs, packed, scales, eids, N, K, out=out, split_k=split_k)
    assert_close_bf16(got, gemv_ref(xq, xs, packed, scales, eids, N, K))


@pytest.mark.parametrize("split_k", [1, 2, 3, 5, 8, 16])
def test_gemv_split_k_deterministic(device, split_k):
    R, N, K, E = 2, 16, 16 * 512, 2               # 16 tiles of 512: every split owns real work
    packed, scales = pack(E, N, K, device)
    xq, xs = quant_x_rows(torch.randn(R, K).to(device))
    eids = torch.tensor([1, 0], dtype=torch.int32, device=device)
    ref = gemv_ref(xq, xs, packed, scales, eids, N, K)
    runs = []
    for _ in range(2):
        out = poison(torch.empty(R, N, dtype=torch.bfloat16, device=device))
        part = poison(torch.empty(split_k, R, N, device=device))
        runs.append(gemv_int4_b32(xq, xs, packed, scales, eids, N, K, part=part, out=out, split_k=split_k))
    assert_close_bf16(runs[0], ref)
    assert torch.equal(runs[0].view(torch.int16), runs[1].view(torch.int16)), "repeated calls differ in bits"


def test_gemv_stride0_rows(device):
    """One token routed to A experts: its row expanded with stride 0, no copy."""
    N, K, E, A = 20, 256, 4, 3
    packed, scales = pack(E, N, K, device)
    xq, xs = quant_x_rows(torch.randn(1, K).to(device))
    eids = torch.tensor([3, 0, 2], dtype=torch.int32, device=device)
    got = gemv_int4_b32(xq.expand(A, K), xs.expand(A, K // 32), packed, scales, eids, N, K)
    assert_close_bf16(got, gemv_ref(xq.expand(A, K), xs.expand(A, K // 32), packed, scales, eids, N, K))


def test_gemv_bad_id_guard_gives_nan(device):
    """The device-side guard used under capture: a bad id reads no expert memory and writes NaN."""
    N, K, E = 16, 64, 2
    packed, scales = pack(E, N, K, device)
    xq, xs = quant_x_rows(torch.randn(3, K).to(device))
    eids = torch.tensor([1, 7, -1], dtype=torch.int32, device=device)
    out = launch_gemv(xq, xs, packed, scales, eids, N, K, 3)
    assert not out[0].isnan().any() and out[1:].isnan().all()


DP4A_PLAN = GemvPlan(block_n=16, block_k=256, num_warps=4, num_stages=2, waves=1.0)


@pytest.mark.parametrize("plan", [DP4A_PLAN, dataclasses.replace(DP4A_PLAN, prefetch=True)],
                         ids=["dp4a", "dp4a_prefetch"])
@pytest.mark.parametrize("split_k", [1, 2])
def test_fused_prologues_equal_separate_kernels(device, split_k, plan):
    """Quantising (or SwiGLU + quantising) inside the GEMV gives the codes of the separate kernels, so the
    one-launch GEMV equals the two-step one (module doc of gemv.py)."""
    N, K, E = 24, 1024, 3
    packed, scales = pack(E, N, K, device)
    eids = torch.tensor([2, 0, 2, 1], dtype=torch.int32, device=device)
    x = (torch.randn(2, K) * 3).bfloat16().to(device)
    fused = launch_gemv(x, None, packed, scales, eids, N, K, 4, split_k=split_k, x_mode=X_FLOAT, rows_per_x=2,
                         plan=plan)
    xq, xs = quant_x_rows(x)
    sep = gemv_int4_b32(xq.repeat_interleave(2, 0), xs.repeat_interleave(2, 0), packed, scales, eids, N, K,
                        split_k=split_k, plan=plan)
    assert_same_bits(fused, sep)
    h = (torch.randn(4, 2 * K) * 2).bfloat16().to(device)
    fused = launch_gemv(h, None, packed, scales, eids, N, K, 4, split_k=split_k, x_mode=X_SWIGLU, plan=plan)
    aq, as_ = swiglu_quant_rows(h)
    sep = gemv_int4_b32(aq, as_, packed, scales, eids, N, K, split_k=split_k, plan=plan)
    assert_same_bits(fused, sep)
    assert counters_all_zero()


@pytest.mark.parametrize("plan", [DP4A_PLAN], ids=["dp4a"])
def test_one_launch_split_k_equals_reduce_of_its_partials(device, plan):
    """The last-arriving program's sum is reduce_partials' fixed-order sum of the same slots, bit for bit,
    and the arrival counters are back to zero after every call (graph replays need them zero)."""
    N, K, E, R = 45, 1056, 3, 3
    packed, scales = pack(E, N, K, device)
    xq, xs = quant_x_rows(torch.randn(R, K).to(device))
    eids = torch.tensor([1, 2, 0], dtype=torch.int32, device=device)
    for sk in (2, 3, 5):
        part = poison(torch.empty(sk, R, N, device=device))
        out = gemv_int4_b32(xq, xs, packed, scales, eids, N, K, part=part,
                            out=poison(torch.empty(R, N, dtype=torch.bfloat16, device=device)), plan=plan)
        assert torch.equal(out.view(torch.int16), reduce_partials(part, sk, R, N).view(torch.int16))
        assert counters_all_zero()
        again = gemv_int4_b32(xq, xs, packed, scales, eids, N, K, split_k=sk, plan=plan)
        assert torch.equal(out.view(torch.int16), again.view(torch.int16))


@pytest.mark.parametrize("split_k", [1, 3])
def test_fused_combine_equals_combine_rows(device, split_k):
    """The down GEMV's epilogue combine (rows rounded to bf16, weighted in float32, j in order) equals
    combine_rows on the GEMV's own bf16 rows, bit for bit when unsplit."""
    T, A, N, K, E = 3, 2, 40, 512, 4
    packed, scales = pack(E, N, K, device)
    h = (torch.randn(T * A, 2 * K) * 2).bfloat16().to(device)
    eids = torch.tensor([3, 0, 1, 1, 2, 0], dtype=torch.int32, device=device)
    tw = torch.rand(T, A).to(device)
    out = poison(torch.empty(T, N, dtype=torch.bfloat16, device=device))
    fused = launch_gemv(h, None, packed, scales, eids, N, K, T * A, x_mode=X_SWIGLU, topk_w=tw, out=out,
                         split_k=split_k, plan=DP4A_PLAN)
    rows = launch_gemv(h, None, packed, scales, eids, N, K, T * A, x_mode=X_SWIGLU, split_k=split_k,
                        plan=DP4A_PLAN)
    ref = combine_rows(rows, tw)
    if split_k == 1:
        assert torch.equal(fused.view(torch.int16), ref.view(torch.int16))
    else:                       # rows' own split-K finish rounds once more: within an ulp of a row
        assert_close_bf16(fused, ref.float())
    assert counters_all_zero()


def test_reduce_partials_fixed_order(device):
    sk, R, N = 5, 3, 70
    part = (torch.randn(sk, R, N) * 1e3).to(device)
    out = reduce_partials(part, sk, R, N, out=poison(torch.empty(R, N, dtype=torch.bfloat16, device=device)))
    acc = part[0].cpu().clone()
    for s in range(1, sk):
        acc += part[s].cpu()                       # the documented order, float32
    assert torch.equal(out.cpu().view(torch.int16), acc.bfloat16().view(torch.int16))


@pytest.mark.parametrize("act", ["int8", "bf16"])
def test_int4_linear(device, act, monkeypatch):
    monkeypatch.setattr(gemv_mod, "MAX_GRID_ROWS", 4)      # 6 rows: exercise the row chunking
    N, K = 40, 320
    packed, scales = pack(1, N, K, device)
    x = torch.randn(2, 3, K).bfloat16().to(device)
    got = int4_linear(x, packed[0], scales[0], act=act)
    assert got.shape == (2, 3, N)
    w = il.dequant_int4_ref(packed[0].cpu(), scales[0].cpu(), N, K).double()
    x2 = x.reshape(-1, K).cpu()
    if act == "int8":
        q, s = quant_x_rows_ref(x2)
        x2 = (q.double().reshape(6, -1, 32) * s.double()[..., None]).reshape(6, K)
    assert_close_bf16(got.reshape(6, N), (x2.double() @ w.T).float())


# ---------------------------------------------------------------- grouped
@pytest.mark.parametrize("E,block_m,L", [(4, 16, 6), (8, 2, 16), (3, 32, 40), (5, 1, 7), (6, 4, 0), (64, 4, 33)])
def test_build_group_tiles(device, E, block_m, L):
    ids = torch.randint(0, E, (L,), dtype=torch.int64)
    if L:
        ids[ids == 1] = 0                          # expert 1 gets zero rows
    t = build_group_tiles(ids.to(device), E, block_m)
    ref = build_group_tiles_ref(ids, E, block_m)
    for name, got, want in zip(t._fields[:5], t[:5], ref[:5]):
        assert torch.equal(got.cpu(), want), name
    order, counts, row0, rows, group = (v.cpu() for v in t[:5])
    assert len(row0) == -(-L // block_m) + E       # the static budget
    assert torch.equal(counts, torch.bincount(ids, minlength=E).int())
    assert torch.equal(order.long(), torch.sort(ids, stable=True).indices)
    sorted_ids = ids[order.long()]
    covered = torch.zeros(L, dtype=torch.int64)
    for r0, n, g in zip(row0.tolist(), rows.tolist(), group.tolist()):
        assert 0 <= n <= block_m
        if n:
            assert (sorted_ids[r0:r0 + n] == g).all()
            covered[r0:r0 + n] += 1
    assert (covered == 1).all(), "every routed row in exactly one tile"


def grouped_case(device, E, N, K, L, block_m, kind="dp4a", split_k=1, rows_per_x=1, block_k=256):
    packed, scales = pack(E, N, K, device)
    ids = torch.randint(0, E, (L,), dtype=torch.int32)
    ids[ids == E - 1] = 0                          # an expert with zero rows, one with the most
    ids = ids.to(device)
    t = build_group_tiles(ids, E, block_m)
    xq, xs = quant_x_rows(torch.randn(-(-L // rows_per_x), K).to(device))
    plan = GroupedPlan(block_m, 16, block_k, 1 if device == "cpu" else 4, 1, split_k=split_k, kind=kind)
    out = poison(torch.empty(L, N, dtype=torch.bfloat16, device=device))
    got = gemm_int4_b32_grouped(xq, xs, packed, scales, t, rows_per_x=rows_per_x, out=out, plan=plan)
    return got, grouped_ref(xq, xs, packed, scales, ids, N, K, rows_per_x), (xq, xs, packed, scales, t, plan)


@pytest.mark.parametrize("E,N,K,L,block_m,split_k,rows_per_x", [
    (4, 24, 96, 6, 4, 1, 1),        # tokens < block_m for most experts, a K tail inside the tile
    (3, 40, 288, 16, 2, 3, 2),      # split-K (a ragged last split), two rows per x row (gate_up's token map)
    (2, 16, 64, 20, 8, 1, 1),       # one expert with all but a few rows: tiles of 8 (every unrolled row live)
    (5, 17, 128, 7, 1, 2, 1)])      # block_m 1: the routed GEMV's shape, ragged N
def test_grouped_dp4a_matches_reference(device, E, N, K, L, block_m, split_k, rows_per_x):
    got, ref, args = grouped_case(device, E, N, K, L, block_m, split_k=split_k, rows_per_x=rows_per_x)
    assert_close_bf16(got, ref)
    again = gemm_int4_b32_grouped(*args[:5], rows_per_x=rows_per_x, plan=args[5])
    assert torch.equal(got.view(torch.int16), again.view(torch.int16))
    assert counters_all_zero()


@pytest.mark.parametrize("split_k,block_k", [(1, 256), (2, 32), (3, 128)])
def test_grouped_mma_matches_reference(device, split_k, block_k):
    got, ref, _ = grouped_case(device, 3, 40, 192, 19, 16, kind="mma", split_k=split_k, block_k=block_k)
    assert_close_bf16(got, ref)


@pytest.mark.parametrize("split_k", [1, 2])
def test_grouped_mma_half_tiles_same_bits(device, split_k):
    """plan.half_tiles: a tile with at most block_m / 2 live rows runs the loop of half the height. Experts of
    5 rows (half loop at 16 and 32), 13 (full loop at 16, half at 32), 21 (two tiles at 16, full at 32), 30 (full
    at 32) and none: the same bits as the full-height tiles and the dp4a tile. Plans that cannot halve (block_m 8,
    dp4a, a non-bool) are refused by name."""
    E, N, K = 5, 40, 256
    packed, scales = pack(E, N, K, device)
    ids = torch.tensor([0] * 5 + [1] * 13 + [2] * 21 + [4] * 30, dtype=torch.int32)[torch.randperm(69)].to(device)
    xq, xs = quant_x_rows(torch.randn(69, K).to(device))
    nw = 1 if device == "cpu" else 4
    outs = []
    for bm, kind, half in ((4, "dp4a", False), (16, "mma", False), (16, "mma", True), (32, "mma", False),
                           (32, "mma", True)):
        plan = GroupedPlan(bm, 16, 128, nw, 1, split_k=split_k, kind=kind, tile_major=True, half_tiles=half)
        outs.append(gemm_int4_b32_grouped(xq, xs, packed, scales, build_group_tiles(ids, E, bm), plan=plan))
    assert_close_bf16(outs[0], grouped_ref(xq, xs, packed, scales, ids, N, K))
    for o in outs[1:]:
        assert torch.equal(outs[0].view(torch.int16), o.view(torch.int16))
    assert counters_all_zero()
    for bad in (GroupedPlan(8, 16, 128, nw, 1, kind="mma", half_tiles=True),
                GroupedPlan(4, 16, 128, nw, 1, kind="dp4a", half_tiles=True),
                GroupedPlan(16, 16, 128, nw, 1, kind="mma", half_tiles=1)):
        with pytest.raises(ValueError, match="half_tiles"):
            gemm_int4_b32_grouped(xq, xs, packed, scales, build_group_tiles(ids, E, bad.block_m), plan=bad)


@pytest.mark.parametrize("split_k", [1, 2])
def test_grouped_moe_32_row_tiles_same_bits(device, split_k):
    """The 32-row tile with half loops (the table's tile from 16 mean rows per expert) in a whole MoE step, split-K
    partials, arrival counters and the top-k combine included: the routed GEMV's bits with one expert of 20 rows
    (full loop), one of 8 and one of 12 (half loops), and every counter zero afterwards."""
    E, H, I, T, A = 4, 64, 96, 20, 2
    w = moe_weights(E, H, I, device)
    x = torch.randn(T, H).bfloat16().to(device)
    second = torch.tensor([1] * 8 + [2] * 12)[torch.randperm(T)]
    ids = torch.stack([torch.zeros(T, dtype=torch.long), second], 1).int().to(device)
    tw = torch.softmax(torch.randn(T, A), -1).to(device)
    nw = 1 if device == "cpu" else 4
    routed = moe_decode_routed(x, ids, tw, *w, split_k=split_k,
                               plan=GemvPlan(block_n=32, block_k=128, num_warps=nw, num_stages=1, waves=1.0))
    grouped = moe_decode_grouped(x, ids, tw, *w, split_k=split_k,
                                 plan=GroupedPlan(32, 32, 128, nw, 1, kind="mma", tile_major=True, half_tiles=True))
    assert not grouped.isnan().any()
    assert torch.equal(routed.view(torch.int16), grouped.view(torch.int16))
    assert counters_all_zero()


@pytest.mark.parametrize("split_k,K,block_k", [(1, 352, 128), (2, 352, 128), (3, 512, 128), (2, 512, 256), (1, 96, 128)])
def test_grouped_mma_tma_same_bits(device, split_k, K, block_k):
    """plan.tma: the weights through a TensorDescriptor box [block_n, block_k / 2] give the threads' loads'
    bits. Ragged N (boxes that run into the next expert's rows, never stored), a K tail inside the last step (K 352),
    a box wider than the row (K 96 at block_k 128), ragged splits, tiles of fewer rows than block_m, an expert with
    no rows; a base that is not 16-byte aligned falls back to the threads' loads. Plans TMA cannot serve are refused
    by name."""
    E, N, L = 4, 40, 23
    packed, scales = pack(E, N, K, device)
    ids = torch.randint(0, E - 1, (L,), dtype=torch.int32).to(device)
    xq, xs = quant_x_rows(torch.randn(L, K).to(device))
    nw = 1 if device == "cpu" else 4
    buf = torch.empty(packed.numel() + 8, dtype=torch.uint8, device=device)
    shifted = buf[8:].view(packed.shape).copy_(packed)          # 8 bytes off a 16-byte boundary
    assert shifted.data_ptr() % 16 == 8
    outs = []
    for bm, tma, w in ((8, False, packed), (8, True, packed), (16, True, packed), (8, True, shifted)):
        plan = GroupedPlan(bm, 16, block_k, nw, 1, split_k=split_k, kind="mma", tile_major=True, tma=tma)
        outs.append(gemm_int4_b32_grouped(xq, xs, w, scales, build_group_tiles(ids, E, bm), plan=plan))
    assert_close_bf16(outs[0], grouped_ref(xq, xs, packed, scales, ids, N, K))
    for o in outs[1:]:
        assert torch.equal(outs[0].view(torch.int16), o.view(torch.int16))
    assert counters_all_zero()
    for bad in (GroupedPlan(4, 16, 128, nw, 1, kind="dp4a", tma=True), GroupedPlan(8, 16, 1024, nw, 1, kind="mma", tma=True),
                GroupedPlan(8, 512, 128, nw, 1, kind="mma", tma=True), GroupedPlan(8, 16, 128, nw, 1, kind="mma", tma=1)):
        with pytest.raises(ValueError, match="tma"):
            gemm_int4_b32_grouped(xq, xs, packed, scales, build_group_tiles(ids, E, bad.block_m), plan=bad)


@pytest.mark.parametrize("split_k,tile_major,K", [(1, True, 352), (2, False, 352), (3, True, 352), (2, True, 512),
                                                  (1, False, 512)])
def test_grouped_mma_dp4a_and_tile_order_same_bits(device, split_k, tile_major, K):
    """The tensor-core tile (4-16 rows, NB blocks per batched dot) and the dp4a tile (4 rows) scale and fold
    the same block sums in the same order: the same bits for the same block_k and split_k, whichever grid
    order runs the tiles. A K tail inside the last step (K 352) or every split a whole number of steps
    (K 512), ragged N, an expert with no rows."""
    E, N, L = 3, 40, 21
    packed, scales = pack(E, N, K, device)
    ids = torch.randint(0, E - 1, (L,), dtype=torch.int32).to(device)
    xq, xs = quant_x_rows(torch.randn(L, K).to(device))
    nw = 1 if device == "cpu" else 4
    outs = []
    for bm, kind, major in ((4, "dp4a", False), (16, "mma", tile_major), (8, "mma", not tile_major),
                            (4, "mma", tile_major), (4, "dp4a", True)):
        plan = GroupedPlan(bm, 16, 128, nw, 1, split_k=split_k, kind=kind, tile_major=major)
        outs.append(gemm_int4_b32_grouped(xq, xs, packed, scales, build_group_tiles(ids, E, bm), plan=plan))
    assert_close_bf16(outs[0], grouped_ref(xq, xs, packed, scales, ids, N, K))
    for o in outs[1:]:
        assert torch.equal(outs[0].view(torch.int16), o.view(torch.int16))
    assert counters_all_zero()


def test_grouped_invalid_ids_under_capture_give_nan(device, monkeypatch):
    """Pretend to capture: the id check is skipped, bad ids land in bucket E, their rows come out NaN."""
    monkeypatch.setattr(_validate, "capturing", lambda: True)
    E, N, K = 3, 16, 64
    packed, scales = pack(E, N, K, device)
    ids = torch.tensor([2, 9, 0, -3, 2], dtype=torch.int32, device=device)
    t = build_group_tiles(ids, E, 2)
    assert t.counts.cpu().tolist() == [1, 0, 2]
    xq, xs = quant_x_rows(torch.randn(5, K).to(device))
    got = gemm_int4_b32_grouped(xq, xs, packed, scales, t).cpu()
    bad = (ids.cpu() < 0) | (ids.cpu() >= E)
    assert got[bad].isnan().all() and not got[~bad].isnan().any()


# ---------------------------------------------------------------- MoE step
def moe_weights(E, H, I, device):
    gp, gs = pack(E, 2 * I, H, device, scale=0.2)
    dp, ds = pack(E, H, I, device, scale=0.2)
    return gp, gs, dp, ds


@pytest.mark.parametrize("T,A", [(1, 2), (2, 3), (5, 2)])
def test_moe_decode_paths(device, T, A):
    E, H, I = 4, 64, 64
    w = moe_weights(E, H, I, device)
    x = torch.randn(T, H).bfloat16().to(device)
    ids = torch.stack([torch.randperm(E)[:A] for _ in range(T)]).int().to(device)
    tw = torch.softmax(torch.randn(T, A), -1).to(device)
    ref = moe_decode_ref(x, ids, tw, *w)
    # The reference re-rounds each bf16 intermediate like the kernels, but a sum landing within an ulp of a
    # rounding boundary may still flip one activation code; the bound below leaves room for that.
    for got in (moe_decode_step(x, ids, tw, *w), moe_decode_routed(x, ids, tw, *w, split_k=2),
                moe_decode_grouped(x, ids, tw, *w)):
        assert got.shape == (T, H)
        assert_close_bf16(got, ref)


@pytest.mark.parametrize("weight", [0.25, 2.0, -1.0, 0.0])
def test_moe_top1_applies_the_router_weight(device, weight):
    """One expert per token: the output is weight * expert(x), on every path and split (a weight of 1 is not
    implied; the one-row epilogue once stored the expert's row unweighted)."""
    torch.manual_seed(0)
    gu = [t.to(device) for t in il.pack_int4_b32(torch.randn(2, 64, 96))]
    dn = [t.to(device) for t in il.pack_int4_b32(torch.randn(2, 96, 32))]
    x, ids, tw = torch.randn(1, 96).to(device), torch.tensor([[1]]).to(device), torch.tensor([[weight]]).to(device)
    ref = moe_decode_ref(x, ids, tw, *gu, *dn)
    for got in (moe_decode_step(x, ids, tw, *gu, *dn), moe_decode_routed(x, ids, tw, *gu, *dn, split_k=1),
                moe_decode_routed(x, ids, tw, *gu, *dn, split_k=2), moe_decode_grouped(x, ids, tw, *gu, *dn)):
        assert torch.equal(got.float().cpu(), ref.bfloat16().float())


def table_plans(table):
    """Every distinct plan of a launch table (GEMV_TABLE, GROUPED_TABLE) that runs here: the GPU generation's rows
    on CUDA, every generation's in the interpreter (all of them run there). Split-K is passed explicitly, so
    rows differing only in `waves` are one plan."""
    gens = [plan_mod.generation(DEVICE)] if DEVICE == "cuda" else list(table)
    plans = [dataclasses.replace(r[-1], waves=1.0, **({} if DEVICE == "cuda" else {"num_warps": 1}))
             for g in gens for r in table[g]]
    return list(dict.fromkeys(plans))


# (top-k, tokens, router weights): 0, negative and > 1 among them
ROUTER_WEIGHTS = {1: [[0.0], [-1.5], [2.5]], 2: [[0.0, 2.5], [-1.5, 0.75]], 8: [[0.0, -1.5, 2.5, 0.3, -0.2, 1.0, 4.0, 0.05]]}


def router_weight_cases():
    """(path, plan, top-k, split-K): on CUDA every table row with every (top-k, split) pair; in the interpreter
    each row once and each pair at least once per path (the full product takes minutes there)."""
    pairs = [(1, 2), (2, 1), (8, 1), (1, 1), (2, 2), (8, 2)]      # the slowest rows in the interpreter get top-1/2
    cases = []
    for path, plans in (("routed", table_plans(plan_mod.GEMV_TABLE)), ("grouped", table_plans(plan_mod.GROUPED_TABLE))):
        if DEVICE == "cuda":
            cases += [(path, p, a, sk) for p in plans for a, sk in pairs]
        else:
            cases += [(path, plans[i % len(plans)], *pairs[i % len(pairs)]) for i in range(max(len(plans), len(pairs)))]
    return cases


def _case_id(c):
    path, p, a, sk = c
    tile = (f"bn{p.block_n}-bk{p.block_k}" if path == "routed" else
            f"bm{p.block_m}-{p.kind}{'-tma' if p.tma else ''}{'-half' if p.half_tiles else ''}")
    return f"{path}-{tile}-top{a}-split{sk}"


@pytest.mark.parametrize("case", router_weight_cases(), ids=_case_id)
def test_moe_router_weights_every_plan_row_and_split(device, case):
    """out[t] = sum_j w[t, j] * expert_j(x[t]) for any real router weight (0, negative, above 1), whatever the
    path, the table row and the split: the combine never assumes a weight of 1 (the one-row epilogue once did)
    nor weights that sum to 1. Compared with moe_decode_ref token by token (a zero row must be exactly zero)."""
    path, plan, A, split_k = case
    E, H, I = 8, 64, 32
    w = moe_weights(E, H, I, device)
    tw = torch.tensor(ROUTER_WEIGHTS[A]).to(device)
    T = tw.shape[0]
    x = torch.randn(T, H).bfloat16().to(device)
    ids = torch.stack([torch.randperm(E)[:A] for _ in range(T)]).int().to(device)
    fn = moe_decode_routed if path == "routed" else moe_decode_grouped
    got = fn(x, ids, tw, *w, split_k=split_k, plan=plan).float().cpu()
    ref = moe_decode_ref(x, ids, tw, *w)
    assert not got.isnan().any()
    for t in range(T):
        err, scale = (got[t] - ref[t]).abs().max(), ref[t].abs().max()
        assert err <= BF16_TOL * scale, f"token {t} (weights {ROUTER_WEIGHTS[A][t]}): max err {float(err):.3g}"
    assert counters_all_zero()


@pytest.mark.parametrize("split_k,block_m", [(1, 2), (2, 4), (3, 1)])
def test_grouped_and_routed_moe_same_bits(device, split_k, block_m):
    """Same quantisation points, same K tiling, same fold and combine order: the same bits, with uneven
    expert loads (one expert gets most rows, one none) and fewer tokens than block_m for most experts."""
    E, H, I, T, A = 5, 64, 96, 6, 2
    w = moe_weights(E, H, I, device)
    x = torch.randn(T, H).bfloat16().to(device)
    ids = torch.tensor([[0, 2], [0, 3], [1, 0], [0, 2], [3, 0], [0, 1]], dtype=torch.int32, device=device)
    tw = torch.softmax(torch.randn(T, A), -1).to(device)
    nw = 1 if device == "cpu" else 4
    routed = moe_decode_routed(x, ids, tw, *w, split_k=split_k,
                               plan=GemvPlan(block_n=16, block_k=128, num_warps=nw, num_stages=1, waves=1.0))
    grouped = moe_decode_grouped(x, ids, tw, *w, split_k=split_k,
                                 plan=GroupedPlan(block_m, 16, 128, nw, 1))
    assert torch.equal(routed.view(torch.int16), grouped.view(torch.int16))
    assert counters_all_zero()


def test_grouped_moe_plan_pair(device):
    """moe_decode_grouped takes a (gate_up, down) plan pair (the table splits only the down GEMM): a pair of one plan
    gives that plan's bits, a split down stays at the reference, and a pair of tiles of other heights is refused."""
    E, H, I, T, A = 5, 64, 96, 6, 2
    w = moe_weights(E, H, I, device)
    x = torch.randn(T, H).bfloat16().to(device)
    ids = torch.tensor([[0, 2], [0, 3], [1, 0], [0, 2], [3, 0], [0, 1]], dtype=torch.int32, device=device)
    tw = torch.softmax(torch.randn(T, A), -1).to(device)
    p = GroupedPlan(4, 16, 128, 1 if device == "cpu" else 4, 1)
    one = moe_decode_grouped(x, ids, tw, *w, plan=p)
    assert torch.equal(moe_decode_grouped(x, ids, tw, *w, plan=(p, p)).view(torch.int16), one.view(torch.int16))
    split = moe_decode_grouped(x, ids, tw, *w, plan=(p, dataclasses.replace(p, split_k=2)))
    assert_close_bf16(split, moe_decode_ref(x, ids, tw, *w))
    assert counters_all_zero()
    with pytest.raises(ValueError, match="block_m"):
        moe_decode_grouped(x, ids, tw, *w, plan=(p, dataclasses.replace(p, block_m=8)))
    with pytest.raises(TypeError, match="GroupedPlan"):
        moe_decode_grouped(x, ids, tw, *w, plan=(p, "bm4"))


@pytest.mark.parametrize("split_k,x_mode", [(1, X_FLOAT), (3, X_SWIGLU)])
def test_routed_gemv_row_major_grid_same_bits(device, split_k, x_mode):
    """The row-major grid (every row of one N range at once; moe_decode_routed's choice for several tokens)
    only changes which program runs when: the same bits, the split-K finish and the combine included, with
    ragged N and rows of one expert far apart."""
    E, N, K, A = 3, 40, 192, 2
    packed, scales = pack(E, N, K, device)
    ids = torch.tensor([2, 0, 0, 2, 1, 2], dtype=torch.int32, device=device)
    R = ids.numel()
    width = 2 * K if x_mode == X_SWIGLU else K
    x = torch.randn(R, width).bfloat16().to(device)
    tw = torch.softmax(torch.randn(R // A, A), -1).to(device) if x_mode == X_SWIGLU else None
    nw = 1 if device == "cpu" else 4
    plan = GemvPlan(block_n=16, block_k=128, num_warps=nw, num_stages=1, waves=1.0)
    outs = [launch_gemv(x, None, packed, scales, ids, N, K, R, x_mode=x_mode, topk_w=tw, split_k=split_k,
                         plan=plan, row_major=rm) for rm in (False, True)]
    assert outs[0].shape == ((R // A, N) if tw is not None else (R, N))
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
    assert not outs[1].isnan().any()
    assert counters_all_zero()


def test_moe_decode_step_dispatch(device, monkeypatch):
    """moe_decode_step takes the path plan.moe_grouped names for (tokens, top-k, E), never from the routing."""
    from int4lab.kernels import moe as moe_mod
    seen = []
    monkeypatch.setattr(moe_mod, "moe_decode_routed", lambda *a, **k: seen.append("routed"))
    monkeypatch.setattr(moe_mod, "moe_decode_grouped", lambda *a, **k: seen.append("grouped"))
    w = moe_weights(4, 64, 64, device)                  # E = 4, top-2: mean rows per expert = T / 2 from T = 2
    start = plan_mod.grouped_from_mean_rows(64 * 64, device)
    tokens = (1, 3, 2 * int(start), 2 * int(start) + 5)
    for T in tokens:
        moe_mod.moe_decode_step(torch.randn(T, 64, device=device), torch.zeros(T, 2, dtype=torch.int32,
                                device=device), torch.rand(T, 2, device=device), *w)
    assert seen == ["grouped" if 2 * T / min(4, 2 * T) >= start else "routed" for T in tokens]
    assert seen[0] == "routed" and seen[-1] == "grouped"
    sm90 = dict(generation=lambda _: "sm90")
    with monkeypatch.context() as mp:                   # the H200 rule on the bench's models (notes/kernels.md)
        mp.setattr(plan_mod, "generation", sm90["generation"])
        # every model from 2 mean rows (with TMA the 8-row tensor-core tile beats the routed path there)
        assert [plan_mod.moe_grouped(T, 2, 8, "cpu", 4096 * 14336) for T in (1, 4, 8, 16)] == [False, False, True, True]
        assert [plan_mod.moe_grouped(T, 8, 64, "cpu", 2048 * 1024) for T in (8, 16, 32, 64)] == [False, True, True, True]
        assert [plan_mod.moe_grouped(T, 8, 128, "cpu", 2048 * 768) for T in (1, 16, 32, 64)] == [False, False, True, True]
        assert plan_mod.grouped_from_mean_rows(0, "cpu") == 2.0 and plan_mod.grouped_from_mean_rows(2**25, "cpu") == 2.0
    with monkeypatch.context() as mp:                   # without TMA (receipt 3d32813): the small models from 3
        mp.setattr(plan_mod, "generation", lambda _: "sm80")
        assert plan_mod.grouped_from_mean_rows(0, "cpu") == 3.0 and plan_mod.grouped_from_mean_rows(2**25, "cpu") == 2.0


def test_grouped_table_rule(monkeypatch):
    """The H200 grouped table on the bench's models (notes/kernels.md): dp4a rows below 4 mean rows (below 2 with TMA on sm_90 for
    experts under 32 M weights), then
    tensor-core tiles of 8 / 16 / 32 rows, 16 from 4 mean rows for experts of >= 32 M weights (Mixtral)."""
    monkeypatch.setattr(plan_mod, "generation", lambda _: "sm90")
    monkeypatch.setattr(plan_mod, "num_sms", lambda _: 132)

    def height(N, K, T, A, E):
        p = plan_mod.grouped_plan(N, K, T * A, E, "cpu")
        assert p.half_tiles == (p.block_m >= 16)       # the 16- and 32-row tiles run half loops
        return p.kind, p.block_m
    mixtral_gu, olmoe_gu = (28672, 4096), (2048, 2048)
    assert [height(*mixtral_gu, T, 2, 8) for T in (8, 16, 32, 64)] == [("dp4a", 1), ("mma", 16), ("mma", 16),
                                                                         ("mma", 32)]
    assert [height(4096, 14336, T, 2, 8) for T in (16, 32)] == [("mma", 16), ("mma", 16)]    # down: same tiles
    assert [height(*olmoe_gu, T, 8, 64) for T in (8, 16, 32, 64, 128)] == [("dp4a", 1), ("mma", 8), ("mma", 8),
                                                                            ("mma", 16), ("mma", 32)]
    assert height(1536, 2048, 32, 8, 128) == ("mma", 8)             # Qwen3 gate_up at 2 mean rows
    # without TMA (sm_80) the 2-row rows keep the one-row dp4a tile
    monkeypatch.setattr(plan_mod, "generation", lambda _: "sm80")
    assert height(*olmoe_gu, 16, 8, 64) == ("dp4a", 1) and height(*olmoe_gu, 32, 8, 64) == ("mma", 8)
    monkeypatch.setattr(plan_mod, "generation", lambda _: "sm90")
    # a caller's shorter or dp4a tile on a half-loop row drops the half loops instead of being refused
    for over in (dict(block_m=8), dict(block_m=4, kind="dp4a", block_k=512)):
        p = plan_mod.grouped_plan(*mixtral_gu, 64, 8, "cpu", **over)
        assert (p.block_m, p.half_tiles) == (over["block_m"], False)
    # every tensor-core row loads its weights through TMA; an override TMA cannot serve drops it
    assert plan_mod.grouped_plan(*mixtral_gu, 64, 8, "cpu").tma
    assert not plan_mod.grouped_plan(*mixtral_gu, 16, 8, "cpu").tma                     # the dp4a row
    assert not any(p.tma for _, _, p in plan_mod.GROUPED_TABLE["sm80"])               # no TMA before Hopper
    assert [plan_mod.grouped_plan(*mixtral_gu, 64, 8, "cpu", **over).tma
            for over in (dict(kind="dp4a", block_m=4, half_tiles=False), dict(block_k=1024))] == [False, False]
    with pytest.raises(ValueError, match="half_tiles"):
        plan_mod.grouped_plan(*mixtral_gu, 64, 8, "cpu", block_m=8, half_tiles=True)
    # the down GEMM of Mixtral's few N tiles split at 16 and 64 tokens, never gate_up, never OLMoE at 64
    split = {T: (plan_mod.grouped_plan(*mixtral_gu, 2 * T, 8, "cpu").split_k,
                 plan_mod.grouped_plan(4096, 14336, 2 * T, 8, "cpu").split_k) for T in (8, 16, 32, 64)}
    assert split == {8: (1, 1), 16: (1, 4), 32: (1, 1), 64: (1, 2)}
    assert plan_mod.grouped_plan(2048, 1024, 64 * 8, 64, "cpu").split_k == 1


def test_moe_pdl_rule(monkeypatch):
    """The H200 PDL rule (notes/kernels.md): the down GEMV is a dependent launch for OLMoE's and Qwen3's
    experts, not for Mixtral's (>= 32 M weights per projection); never off sm_90."""
    from lab.bench.shapes import MODELS
    monkeypatch.setattr(plan_mod, "generation", lambda _: "sm90")
    assert {k: plan_mod.moe_pdl("cpu", m.hidden * m.intermediate) for k, m in MODELS.items()} == {
        "mixtral": False, "olmoe": True, "qwen3": True}
    for gen in ("sm80", "interp"):
        monkeypatch.setattr(plan_mod, "generation", lambda _, g=gen: g)
        assert not plan_mod.moe_pdl("cpu", 1)


def test_combine_rows_order(device):
    T, A, H = 2, 3, 50
    y = torch.randn(T * A, H).bfloat16().to(device)
    tw = torch.rand(T, A).to(device)
    got = combine_rows(y, tw, out=poison(torch.empty(T, H, dtype=torch.bfloat16, device=device))).cpu()
    acc = torch.zeros(T, H)
    for j in range(A):
        acc += tw.cpu()[:, j:j + 1] * y.cpu().float().view(T, A, H)[:, j]
    assert torch.equal(got.view(torch.int16), acc.bfloat16().view(torch.int16))


# ---------------------------------------------------------------- launch plan
def test_plan_split_rule():
    assert choose_split_k(n_programs=64, k_tiles=28, sms=132, waves=4.0) == 16
    assert choose_split_k(n_programs=1024, k_tiles=8, sms=132, waves=4.0) == 1
    assert choose_split_k(n_programs=64, k_tiles=3, sms=132, waves=4.0) == 2      # never more than K tiles
    p = gemv_plan(4096, 14336, 1, "cpu")
    assert p.split_k >= 1 and p.block_k % 512 == 0
    assert gemv_plan(64, 96, 1, "cpu").block_k == 128               # capped at the next power of two >= K
    with pytest.raises(ValueError, match="split_k"):
        gemv_plan(64, 512, 1, "cpu", split_k=17)
    with pytest.raises(ValueError, match="block_k a power of two"):
        gemv_plan(64, 512, 1, "cpu", block_k=384)


def test_plan_depends_on_sm_count(monkeypatch):
    """notes/kernels.md, "Launch-plan rows": the SM count enters a plan through the split-K waves rule, so two sm_90
    parts can split 4096x14336 at one row differently (4 on 132 SMs, 2 on 114)."""
    monkeypatch.setattr(plan_mod, "generation", lambda _: "sm90")
    splits = {}
    for sms in (132, 114):
        monkeypatch.setattr(plan_mod, "num_sms", lambda _, sms=sms: sms)
        splits[sms] = gemv_plan(4096, 14336, 1, "cpu").split_k
    assert splits == {132: 4, 114: 2}
    with pytest.raises(TypeError, match="plan must be a GemvPlan"):
        resolve({"block_n": 16}, 64, 512, 1, "cpu")
    assert resolve(DP4A_PLAN, 64, 512, 1, "cpu", split_k=3).split_k == 3


# ---------------------------------------------------------------- bad inputs
def test_bad_inputs(device):
    N, K, E = 16, 64, 2
    packed, scales = pack(E, N, K, device)
    xq, xs = quant_x_rows(torch.randn(2, K).to(device))
    eids = torch.tensor([0, 1], dtype=torch.int32, device=device)
    with pytest.raises(TypeError, match="x must have dtype"):
        quant_x_rows(torch.ones(2, K, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="multiple of 32"):
        quant_x_rows(torch.randn(2, 48, device=device))
    with pytest.raises(ValueError, match="contiguous last dimension"):
        quant_x_rows(torch.randn(K, 2, device=device).t())
    with pytest.raises(ValueError, match=r"eids must lie in \[0, E\)"):
        gemv_int4_b32(xq, xs, packed, scales, torch.tensor([0, 2], dtype=torch.int32, device=device), N, K)
    with pytest.raises(ValueError, match=r"eids must lie in \[0, E\)"):
        gemv_int4_b32(xq, xs, packed, scales, torch.tensor([-1, 0], dtype=torch.int32, device=device), N, K)
    with pytest.raises(TypeError, match="eids must have dtype"):
        gemv_int4_b32(xq, xs, packed, scales, eids.float(), N, K)
    with pytest.raises(ValueError, match="eids must have shape"):
        gemv_int4_b32(xq, xs, packed, scales, eids[:1], N, K)
    with pytest.raises(TypeError, match="xq must have dtype"):
        gemv_int4_b32(xq.float(), xs, packed, scales, eids, N, K)
    with pytest.raises(ValueError, match="xq must have shape"):
        gemv_int4_b32(xq[:, :32], xs, packed, scales, eids, N, K)
    with pytest.raises(ValueError, match="xs must have shape"):
        gemv_int4_b32(xq, xs[:, :1], packed, scales, eids, N, K)
    with pytest.raises(ValueError, match="K must be a positive multiple of 32"):
        gemv_int4_b32(xq, xs, packed, scales, eids, N, 40)
    with pytest.raises(ValueError, match="packed must have trailing shape"):
        gemv_int4_b32(xq, xs, packed, scales, eids, N + 1, K)
    with pytest.raises(TypeError, match="scales must have dtype"):
        gemv_int4_b32(xq, xs, packed, scales.float(), eids, N, K)
    with pytest.raises(ValueError, match="packed must be contiguous"):
        gemv_int4_b32(xq, xs, packed.transpose(0, 1).contiguous().transpose(0, 1), scales, eids, N, K)
    with pytest.raises(ValueError, match="packed must have rank 3"):
        gemv_int4_b32(xq, xs, packed[0], scales[0], eids, N, K)
    with pytest.raises(ValueError, match="split_k must be"):
        gemv_int4_b32(xq, xs, packed, scales, eids, N, K, split_k=0)
    with pytest.raises(ValueError, match="part must have shape"):
        gemv_int4_b32(xq, xs, packed, scales, eids, N, K, part=torch.empty(2, 2, N + 1, device=device))
    with pytest.raises(TypeError, match="out must have dtype bfloat16"):
        gemv_int4_b32(xq, xs, packed, scales, eids, N, K, out=torch.empty(2, N, device=device))
    with pytest.raises(ValueError, match="out must have shape"):
        gemv_int4_b32(xq, xs, packed, scales, eids, N, K, out=torch.empty(3, N, dtype=torch.bfloat16,
                                                                           device=device))
    with pytest.raises(ValueError, match="part must have shape"):
        reduce_partials(torch.empty(2, 3, 4, device=device), 3, 3, 4)
    with pytest.raises(ValueError, match="act must be"):
        int4_linear(torch.randn(2, K, device=device), packed[0], scales[0], act="fp8")
    with pytest.raises(ValueError, match="dense layer"):
        int4_linear(torch.randn(2, K, device=device), packed, scales)
    with pytest.raises(ValueError, match="packed must have trailing shape"):
        int4_linear(torch.randn(2, 2 * K, device=device), packed[0], scales[0])
    with pytest.raises(ValueError, match="block_m must be a power of two"):
        build_group_tiles(eids, E, 24)
    with pytest.raises(ValueError, match=r"ids must lie in \[0, E\)"):
        build_group_tiles(eids + 1, E, 16)
    with pytest.raises(ValueError, match="E must be a positive int"):
        build_group_tiles(eids, 0, 16)
    t = build_group_tiles(eids, E, 4)
    with pytest.raises(TypeError, match="tiles must be the GroupTiles"):
        gemm_int4_b32_grouped(xq, xs, packed, scales, (t.order, t.row0, t.rows, t.group))
    with pytest.raises(TypeError, match=r"tiles.row0 must have dtype in \(int32\)"):
        gemm_int4_b32_grouped(xq, xs, packed, scales, t._replace(row0=t.row0.long()))
    with pytest.raises(ValueError, match="xq must have shape"):
        gemm_int4_b32_grouped(xq[:, :32], xs, packed, scales, t)
    with pytest.raises(ValueError, match="xq must have at least"):
        gemm_int4_b32_grouped(xq[:1], xs[:1], packed, scales, t)
    with pytest.raises(ValueError, match="rows_per_x must be a positive int"):
        gemm_int4_b32_grouped(xq, xs, packed, scales, t, rows_per_x=0)
    with pytest.raises(ValueError, match=r"plan.block_m \(8\) must equal tiles.block_m \(4\)"):
        gemm_int4_b32_grouped(xq, xs, packed, scales, t, plan=GroupedPlan(8, 16, 256, 1, 1))
    with pytest.raises(ValueError, match=r"block_m a power of two \(>= 4 for mma"):
        gemm_int4_b32_grouped(xq, xs, packed, scales, t, plan=GroupedPlan(2, 16, 256, 1, 1, kind="mma"))
    with pytest.raises(ValueError, match=r"<= 8 for dp4a: rows unrolled per program"):
        gemm_int4_b32_grouped(xq, xs, packed, scales, t, plan=GroupedPlan(16, 16, 256, 1, 1))
    t16 = build_group_tiles(eids, E, 16)
    with pytest.raises(ValueError, match=r"mma grouped plan needs block_k a power of two >= 32"):
        gemm_int4_b32_grouped(xq, xs, packed, scales, t16, plan=GroupedPlan(16, 16, 48, 1, 1, kind="mma"))
    with pytest.raises(ValueError, match=r"dp4a grouped plan needs block_k a power of two >= 128"):
        gemm_int4_b32_grouped(xq, xs, packed, scales, t, plan=GroupedPlan(4, 16, 64, 1, 1))
    with pytest.raises(ValueError, match="at most 8192 routed rows"):
        build_group_tiles(torch.zeros(MAX_ROUTED_ROWS + 1, dtype=torch.int32, device=device), E, 16)
    gp, gs, dp, ds = moe_weights(E, K, 32, device)
    ids2 = eids.view(1, 2)
    with pytest.raises(ValueError, match="topk_w must have shape"):
        moe_decode_step(torch.randn(1, K, device=device), ids2, torch.rand(1, 3, device=device), gp, gs, dp, ds)
    with pytest.raises(ValueError, match="down_packed must have trailing shape"):
        moe_decode_step(torch.randn(1, K, device=device), ids2, torch.rand(1, 2, device=device), gp, gs, gp, gs)
    with pytest.raises(ValueError, match=r"topk_ids must lie in \[0, E\)"):
        moe_decode_grouped(torch.randn(1, K, device=device), ids2 + 5, torch.rand(1, 2, device=device),
                           gp, gs, dp, ds)


def test_wrong_device_is_refused(device):
    if device != "cuda":
        pytest.skip("needs a second device type to mix")
    N, K = 16, 64
    packed, scales = pack(1, N, K, device)
    xq, xs = quant_x_rows(torch.randn(1, K, device=device))
    with pytest.raises(ValueError, match="must be on the same device"):
        gemv_int4_b32(xq, xs, packed.cpu(), scales, torch.zeros(1, dtype=torch.int32, device=device), N, K)


# ---------------------------------------------------------------- CUDA graphs
@cuda_only
def test_cuda_graph_capture_matches_eager(device):
    E, H, I, A, T = 4, 256, 512, 2, 1
    w = moe_weights(E, H, I, device)
    x = torch.randn(T, H, device=device).bfloat16()
    ids = torch.tensor([[3, 1]], dtype=torch.int32, device=device)
    tw = torch.softmax(torch.randn(T, A, device=device), -1)
    xs_ = torch.randn(3, 4, H, device=device).bfloat16()
    ids3 = torch.tensor([[0, 2], [2, 3], [1, 0]], dtype=torch.int32, device=device)
    tw3 = torch.rand(3, 2, device=device)
    eager = [moe_decode_routed(x, ids, tw, *w, split_k=2), moe_decode_step(x, ids, tw, *w),
             moe_decode_grouped(xs_[:, 0].contiguous(), ids3, tw3, *w)]
    x3 = xs_[:, 0].contiguous()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                      # warm up (compiles) outside the capture
        moe_decode_routed(x, ids, tw, *w, split_k=2)
        moe_decode_grouped(x3, ids3, tw3, *w)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [moe_decode_routed(x, ids, tw, *w, split_k=2), moe_decode_step(x, ids, tw, *w),
                moe_decode_grouped(x3, ids3, tw3, *w)]
    for o in outs:
        poison(o)
    g.replay()
    torch.cuda.synchronize()
    for o, e in zip(outs, eager):
        assert torch.equal(o.view(torch.int16), e.view(torch.int16))
    x.copy_(torch.randn_like(x))                    # new inputs, same graph
    ids.copy_(torch.tensor([[0, 2]], device=device))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(outs[0].view(torch.int16), moe_decode_routed(x, ids, tw, *w, split_k=2).view(torch.int16))
    ids3.copy_(torch.tensor([[3, 2], [3, 2], [3, 0]], device=device))   # new routing, same grouped graph
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(outs[2].view(torch.int16), moe_decode_grouped(x3, ids3, tw3, *w).view(torch.int16))
    assert counters_all_zero()


DP4A = dict(num_warps=4, num_stages=2)


@pytest.mark.parametrize("block_n,block_k", [(16, 128), (32, 512)])
def test_dp4a_plan(device, block_n, block_k):
    """gemv_dp4a.py computes the same function: routed rows, K tails inside a tile, ragged N, split-K,
    dense int4_linear and the MoE step; every output element written (poisoned buffers)."""
    N, K, E = 41, 1056, 3                        # K = 33 blocks: a tail inside every tile size above
    plan = dataclasses.replace(DP4A_PLAN, block_n=block_n, block_k=block_k, **DP4A)
    packed, scales = pack(E, N, K, device)
    xq, xs = quant_x_rows(torch.randn(4, K).to(device))
    eids = torch.tensor([2, 0, 2, 1], dtype=torch.int32, device=device)
    ref = gemv_ref(xq, xs, packed, scales, eids, N, K)
    for sk in (1, 3):
        out = poison(torch.empty(4, N, dtype=torch.bfloat16, device=device))
        got = gemv_int4_b32(xq, xs, packed, scales, eids, N, K, out=out, split_k=sk, plan=plan)
        assert_close_bf16(got, ref)
        again = gemv_int4_b32(xq, xs, packed, scales, eids, N, K, split_k=sk, plan=plan)
        assert torch.equal(got.view(torch.int16), again.view(torch.int16))


def test_dp4a_linear_and_moe(device):
    """int4_linear and the MoE step through a dp4a plan of other tiles agree with the reference."""
    N, K, E = 41, 1056, 2
    plan = dataclasses.replace(DP4A_PLAN, block_n=16, block_k=256, **DP4A)
    packed, scales = pack(E, N, K, device)
    x = torch.randn(3, K).bfloat16().to(device)
    q, s = quant_x_rows_ref(x.cpu())
    xd = (q.double().reshape(3, -1, 32) * s.double()[..., None]).reshape(3, K)
    ref = (xd @ il.dequant_int4_ref(packed[1].cpu(), scales[1].cpu(), N, K).double().T).float()
    assert_close_bf16(int4_linear(x, packed[1], scales[1], plan=plan), ref)
    w = moe_weights(4, 64, 96, device)
    xm = torch.randn(2, 64).bfloat16().to(device)
    ids = torch.tensor([[0, 3], [2, 0]], dtype=torch.int32, device=device)
    tw = torch.rand(2, 2).to(device)
    for sk in (1, 2):
        assert_close_bf16(moe_decode_routed(xm, ids, tw, *w, split_k=sk, plan=plan), moe_decode_ref(xm, ids, tw, *w))


def test_dp4a_plan_rules(device):
    base = DP4A_PLAN
    with pytest.raises(ValueError, match="power of two"):
        gemv_plan(64, 256, 1, device, **{**dataclasses.asdict(base), **DP4A, "block_k": 96})
    with pytest.raises(TypeError, match="kind"):
        gemv_plan(64, 256, 1, device, kind="lut")        # the tensor-core GEMV variant is gone: no plan names one
