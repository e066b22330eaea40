"""The prefill path (int4lab/kernels/prefill.py): weight decode and activation codes bit for bit, the dense and
expert outputs within the forward-error bounds the module doc derives, and the modules' dispatch.

Shape legend: R = rows (tokens), N = out features, K = in features, E = experts, H = hidden size,
I = expert intermediate size, k = experts per token."""
import pytest
import torch
import torch.nn as nn

from conftest import poison
from int4lab.format import dequant_int4_ref, pack_int4_b32, quant_x_rows_ref
from int4lab.kernels import swiglu_quant_rows
from int4lab.kernels.moe import moe_decode_ref
from int4lab.kernels.prefill import act_rows, combine_slots, dequant_int4_bf16, prefill_matmul, prefill_moe
from int4lab.kernels.quant import swiglu_quant_rows_ref
from int4lab.quantize import Int4Experts, Int4Linear, int4_matmul_ref
from int4lab.quantize import modules as M
from int4lab.quantize.prefill import PREFILL_MIN_ROWS, prefill_experts, prefill_rows

U = 2.0 ** -8                   # bf16 unit roundoff (8-bit significand)
LIP = 1.13                      # max |act'(g)|: SiLU 1.0998, exact GELU 1.1289


def gam(n: int) -> float:
    """A float32 sum of n products in any order, each operation within one float32 ulp (module doc)."""
    return (n + 1) * 2.0 ** -23


def bits(t):
    return t.contiguous().view(torch.int16)


def random_pack(shape, device):
    """Random bytes (every nibble, -8 included) and fp16 scales over 2**-24 (subnormal) .. 2**13, some zero."""
    *lead, N, K = shape
    packed = torch.randint(0, 256, (*lead, N, K // 2), dtype=torch.uint8)
    e = torch.randint(-24, 14, (*lead, N, K // 32)).float()
    scales = (torch.rand(*lead, N, K // 32) + 0.5) * torch.exp2(e) * torch.where(torch.rand(e.shape) < .1, 0., 1.)
    return packed.to(device), scales.half().to(device)


# ------------------------------------------------------------------------------------------ kernels

@pytest.mark.parametrize("shape", [(1, 32), (7, 96), (33, 160), (3, 17, 64)])
def test_dequant_is_bit_exact_bf16_of_the_reference(shape, device):
    packed, scales = random_pack(shape, device)
    got = dequant_int4_bf16(packed, scales)
    ref = dequant_int4_ref(packed.cpu(), scales.cpu(), shape[-2], shape[-1]).bfloat16()
    assert torch.equal(bits(got.cpu()), bits(ref))


def test_dequant_skips_experts_without_rows(device):
    packed, scales = random_pack((3, 9, 64), device)
    out = poison(torch.empty(3, 9, 64, dtype=torch.bfloat16, device=device))
    dequant_int4_bf16(packed, scales, torch.tensor([2, 0, 1], device=device), out=out)
    ref = dequant_int4_ref(packed.cpu(), scales.cpu(), 9, 64).bfloat16()
    assert torch.equal(bits(out[0::2].cpu()), bits(ref[0::2])) and out[1].isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_activation_codes_are_the_w4a8_codes(dtype, device):
    span = 8 if dtype == torch.float16 else 20                                 # fp16: stay finite
    x = torch.randn(65, 96) * torch.exp2(torch.randint(-span, span, (65, 1)).float())
    x[3, 32:64] = 0                                                            # an all-zero block
    x = x.to(dtype)
    out, q, s = act_rows(x.to(device), "int8", codes=True)
    qr, sr = quant_x_rows_ref(x)
    assert torch.equal(q.cpu(), qr) and torch.equal(s.cpu(), sr)
    deq = (qr.float().view(65, 3, 32) * sr[..., None]).view(65, 96)            # the reference's float32 value
    # the same values, and the same bits but for a zero's sign: on CUDA the kernel's rint keeps the sign of a
    # value that rounds to zero (-0.0 x scale), where the reference's int8 code 0 has none
    got, want = out.cpu(), deq.bfloat16()
    assert torch.equal(got.float(), want.float())
    assert (got.view(torch.int16) != want.view(torch.int16)).logical_and(want != 0).sum() == 0
    rows = torch.randint(0, 65, (200,), device=device)                         # gathered rows (experts' sort)
    assert torch.equal(bits(act_rows(x.to(device), "int8", rows=rows)), bits(out[rows]))
    assert torch.equal(bits(act_rows(x.to(device), "bf16")), bits(x.to(device).bfloat16()))


def test_swiglu_activations_match_the_decode_kernels(device):
    h = (torch.randn(70, 128) * 3).bfloat16().to(device)                      # [L, 2I], gate first
    _, q, s = act_rows(h, "int8", swiglu=True, codes=True)
    qk, sk = swiglu_quant_rows(h)                                              # the decode path's codes
    assert torch.equal(q, qk) and torch.equal(s, sk)
    qr, _ = swiglu_quant_rows_ref(h.cpu())                                     # exp may differ by an ulp
    assert (q.cpu().int() - qr.int()).abs().max() <= 1
    g, u = h.float().chunk(2, dim=-1)
    ref = torch.nn.functional.silu(g) * u
    got = act_rows(h, "bf16", swiglu=True).float()
    assert ((got - ref).abs() <= (U + 2 ** -18) * ref.abs() + 1e-30).all()     # one bf16 rounding


def test_combine_sums_slots_in_order_and_drops_invalid(device):
    y = torch.randn(50, 96).bfloat16().to(device)
    slot_rows = torch.randint(0, 50, (20, 3), device=device)
    slot_rows[4, 1] = slot_rows[7, 0] = -1
    w = torch.rand(20, 3, device=device)
    got = combine_slots(y, slot_rows, w)
    acc = torch.zeros(20, 96, device=device)
    for j in range(3):                                                         # float32, j in order
        acc = acc + torch.where(slot_rows[:, j:j + 1] >= 0, w[:, j:j + 1], 0.) * y[slot_rows[:, j].clamp_min(0)].float()
    if device == "cpu":
        assert torch.equal(bits(got), bits(acc.bfloat16()))
    else:                                                                      # a fused multiply-add may differ
        assert ((got.float() - acc).abs() <= U * acc.abs() + gam(3) * 3 * acc.abs().amax()).all()


def test_bf16_activations_add_little_to_the_int8_error():
    """The module doc's size of the change: bf16(q * s) against x, over q * s against x, in rms."""
    def ratio(v):
        q, s = quant_x_rows_ref(v)
        a = (q.float().view(v.shape[0], -1, 32) * s[..., None]).view(v.shape)
        return ((a.bfloat16().float() - v).pow(2).mean() / (a - v).pow(2).mean()).sqrt().item()
    uniform = (torch.rand(4096, 256) * 2 - 1) * torch.rand(4096, 1)
    assert 1 < ratio(uniform) < 1.1 and 1 < ratio(torch.randn(4096, 256)) < 1.06


# ------------------------------------------------------------------------------------------ dense

def dense_bound(a, w, act, got, ref):
    """The module doc's bound on |got - ref|; a = the reference's float32 activations, w = float32 weights."""
    S = a.double().abs() @ w.double().abs().t()
    rho = 2 * U + U * U if act == "int8" else U
    K = a.shape[1]
    return (rho + 2 * gam(K) * (1 + U) ** 2) * S + U * (got.double().abs() + ref.double().abs()) / (1 - U)


def ref_acts(x, act):
    if act == "bf16":
        return x.bfloat16().float()
    q, s = quant_x_rows_ref(x)
    return (q.float().view(x.shape[0], -1, 32) * s[..., None]).view(x.shape)


@pytest.mark.parametrize("R", [64, 65, 300])
@pytest.mark.parametrize("act", ["int8", "bf16"])
def test_prefill_matmul_within_the_bound_of_the_reference(R, act, device):
    N, K = 40, 160
    packed, scales = pack_int4_b32(torch.randn(N, K))
    x = torch.randn(R, K) * torch.exp2(torch.randint(-6, 6, (R, 1)).float())
    got = prefill_matmul(x.to(device), packed.to(device), scales.to(device), act).cpu()
    ref = int4_matmul_ref(x, packed, scales, act)
    w = dequant_int4_ref(packed, scales, N, K)
    a = ref_acts(x, act)
    assert got.dtype == torch.bfloat16 and got.shape == (R, N)
    assert ((got.double() - ref.double()).abs() <= dense_bound(a, w, act, got, ref)).all()
    # Nothing else: got is the bf16 of the float64 sum of the bf16-rounded operands, up to the float32
    # summation term (rounding is monotone, so got lies between the roundings of the interval's ends).
    exact = a.bfloat16().double() @ w.bfloat16().double().t()
    slack = gam(K) * (a.bfloat16().double().abs() @ w.bfloat16().double().abs().t())
    lo, hi = (exact - slack).float().bfloat16().double(), (exact + slack).float().bfloat16().double()
    assert ((got.double() >= lo) & (got.double() <= hi)).all()


# ------------------------------------------------------------------------------------------ experts

PATHS = {   # how each path rounds (module doc; modules.Int4Experts's loop; kernels.moe.moe_decode_ref)
    # in: GEMM operand rounding, act: SwiGLU rounding, w/prod/sum/final: the combine's roundings
    "prefill": dict(act=2.0 ** -20, w=0.0, prod=0.0, sum=None, final=U),
    "module": dict(act=2 * U + U * U + 2.0 ** -19, w=U, prod=U, sum="bf16", final=U),
    "decode_ref": dict(act=2.0 ** -20, w=0.0, prod=0.0, sum=0.0, final=2.0 ** -24),
}


def experts_bounds(mod, x, ids, tw, path: str):
    """(out_ex, D): the float64 chain without any rounding (exact W4A8 activations, float64 SwiGLU, no bf16)
    and the bound D [R, H] on |path's output - out_ex| from each rounding the path makes (module doc):
    h within (rho + g) S1 then bf16; SwiGLU by Lipschitz (|act'| <= LIP); W4A8 requantisation within half a
    step of the moved value (step from the block's largest possible amax); down as h; the combine."""
    p = PATHS[path]
    E, I = mod.num_experts, mod.intermediate_dim
    rho = (2 * U + U * U if mod.act == "int8" else U) if path == "prefill" else 0.0
    act_round = p["act"] + (U if path == "prefill" and mod.act == "bf16" else 0.0)
    wgu = dequant_int4_ref(mod.gate_up_packed.cpu(), mod.gate_up_scales.cpu(), 2 * I, x.shape[1]).double()
    wdn = dequant_int4_ref(mod.down_packed.cpu(), mod.down_scales.cpu(), x.shape[1], I).double()
    xd = ref_acts(x, mod.act).double()
    R, k = ids.shape
    out = torch.zeros(R, x.shape[1], dtype=torch.float64)
    D = torch.zeros_like(out)
    P = torch.zeros_like(out)
    for t in range(R):
        for j in range(k):
            e = int(ids[t, j])
            if not 0 <= e < E:
                continue
            h = wgu[e] @ xd[t]
            d0 = (rho + gam(x.shape[1]) * (1 + rho)) * (wgu[e].abs() @ xd[t].abs())
            dh = d0 + U * (h.abs() + d0)
            (g, u), (dg, du) = h.chunk(2), dh.chunk(2)
            act = mod.act_fn(g)
            lip = LIP * dg * (u.abs() + du) + act.abs() * du
            a = act * u
            da = lip + act_round * (a.abs() + lip)
            if mod.act == "int8":
                amax = (a.abs() + da).view(-1, 32).amax(-1, keepdim=True)
                step = amax / 127 * (1 + 2.0 ** -22) + 1e-12
                da = da + (step * (0.5 + 2.0 ** -15)).expand(-1, 32).reshape(-1)
            y = wdn[e] @ a
            d0 = wdn[e].abs() @ da + (rho + gam(I) * (1 + rho)) * (wdn[e].abs() @ (a.abs() + da))
            dy = d0 + U * (y.abs() + d0)
            wj = float(tw[t, j])
            out[t] += wj * y
            D[t] += abs(wj) * (1 + p["w"]) * dy + p["w"] * abs(wj) * y.abs() \
                + p["prod"] * abs(wj) * (1 + p["w"]) * (y.abs() + dy)
            P[t] += abs(wj) * (1 + p["w"]) * (1 + p["prod"]) * (y.abs() + dy)
    s = p["sum"]
    D += (gam(k) if s is None else k * U if s == "bf16" else s) * P
    return out, D + p["final"] * (out.abs() + D)


def experts_module(E, H, I, act, act_fn, device):
    gu = pack_int4_b32(torch.randn(E, 2 * I, H) * 0.1)
    dn = pack_int4_b32(torch.randn(E, H, I) * 0.1)
    return Int4Experts(tuple(t.to(device) for t in gu), tuple(t.to(device) for t in dn), act_fn, act)


def routing(R, k, E, used):
    """ids from the first `used` experts only (the others get no rows), router weights softmax-like."""
    ids = torch.stack([torch.randperm(used)[:k] for _ in range(R)])
    return ids, torch.softmax(torch.randn(R, k), -1)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")     # the interpreter on rows no expert computes
@pytest.mark.parametrize("R", [64, 65, 300])
@pytest.mark.parametrize("k", [1, 8])
def test_prefill_experts_within_the_bound_of_the_reference(R, k, device):
    E, H, I = 12, 64, 32
    mod = experts_module(E, H, I, "int8", nn.SiLU(), device)
    ids, tw = routing(R, k, E, used=9)                                         # experts 9..11 unused
    x = torch.randn(R, H).bfloat16()
    got = prefill_experts(mod, x.to(device), ids.to(device), tw.to(device)).cpu()
    mod.kernels = False
    ref = mod(x.to(device), ids.to(device), tw.to(device)).cpu()               # the module's reference loop
    ex, d_pre = experts_bounds(mod, x, ids, tw, "prefill")
    _, d_ref = experts_bounds(mod, x, ids, tw, "module")
    assert got.dtype == torch.bfloat16 and got.shape == (R, H)
    assert ((got.double() - ex).abs() <= d_pre).all() and ((ref.double() - ex).abs() <= d_ref).all()
    assert ((got.double() - ref.double()).abs() <= d_pre + d_ref).all()
    if R == 64:                                                                # the decode kernels' contract
        dec = moe_decode_ref(x, ids, tw, mod.gate_up_packed, mod.gate_up_scales, mod.down_packed,
                             mod.down_scales).double()
        assert ((dec - ex).abs() <= experts_bounds(mod, x, ids, tw, "decode_ref")[1]).all()


@pytest.mark.parametrize("act,act_fn,grouped", [("bf16", nn.SiLU(), None), ("int8", nn.GELU(), None),
                                                 ("int8", nn.SiLU(), False)])
def test_prefill_experts_other_activations_and_the_loop(act, act_fn, grouped, device):
    E, H, I, R, k = 6, 96, 64, 65, 2
    mod = experts_module(E, H, I, act, act_fn, device)
    assert mod.swiglu == isinstance(act_fn, nn.SiLU)
    ids, tw = routing(R, k, E, used=5)
    x = torch.randn(R, H).bfloat16()
    got = prefill_experts(mod, x.to(device), ids.to(device), tw.to(device), grouped=grouped).cpu()
    mod.kernels = False
    ref = mod(x.to(device), ids.to(device), tw.to(device)).cpu()
    ex, d_pre = experts_bounds(mod, x, ids, tw, "prefill")
    _, d_ref = experts_bounds(mod, x, ids, tw, "module")
    assert ((got.double() - ex).abs() <= d_pre).all()
    assert ((got.double() - ref.double()).abs() <= d_pre + d_ref).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="bit-exact on the CPU only: cuBLAS and the grouped GEMM "
                    "sum in their own orders (the bounds above hold on CUDA)")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")     # the interpreter on rows no expert computes
@pytest.mark.parametrize("grouped", [None, False])
def test_prefill_experts_is_exactly_its_stated_composition(grouped):
    """The chain of the module doc from torch's own pieces (bf16 GEMM per expert, router weights in float32,
    slots in order): the same bits. The SwiGLU stage is act_rows, checked against the decode kernels above."""
    E, H, I, R, k = 5, 64, 32, 70, 3
    mod = experts_module(E, H, I, "int8", nn.SiLU(), "cpu")
    ids, tw = routing(R, k, E, used=4)
    ids[2, 1] = E
    x = torch.randn(R, H).bfloat16()
    got = prefill_moe(x, ids, tw, mod.gate_up_packed, mod.gate_up_scales, mod.down_packed, mod.down_scales,
                      grouped=grouped)
    wgu = dequant_int4_ref(mod.gate_up_packed, mod.gate_up_scales, 2 * I, H).bfloat16()
    wdn = dequant_int4_ref(mod.down_packed, mod.down_scales, H, I).bfloat16()
    xa = ref_acts(x, "int8").bfloat16()
    out = torch.zeros(R, H)
    for j in range(k):
        for e in range(E):
            rows = (ids[:, j] == e).nonzero().flatten()
            h = torch.mm(xa[rows], wgu[e].t())
            y = torch.mm(act_rows(h, "int8", swiglu=True), wdn[e].t())
            out[rows] = out[rows] + tw[rows, j:j + 1] * y.float()
    assert torch.equal(bits(got), bits(out.bfloat16()))


# ------------------------------------------------------------------------------------------ dispatch

def _spy(monkeypatch, name):
    calls = []
    real = getattr(M, name)
    monkeypatch.setattr(M, name, lambda mod, x, *a: calls.append(x.shape[0]) or real(mod, x, *a))
    return calls


def test_int4_linear_takes_the_prefill_path_from_the_threshold(monkeypatch, device):
    assert PREFILL_MIN_ROWS is None and Int4Linear.prefill_min_rows is None      # off by default (module doc)
    lin = nn.Linear(64, 32, bias=True)
    mod = Int4Linear.from_linear(lin, "int8").to(device)
    mod.kernels = True
    calls = _spy(monkeypatch, "prefill_linear")
    x3 = torch.randn(2, 32, 64, device=device)                                 # 64 rows in a [B, T, K] input
    mod(x3)
    assert calls == []                                                         # off: the decode kernel, any rows
    mod.prefill_min_rows = 64
    x = torch.randn(63, 64, device=device)
    below = mod(x)                                                             # 63 rows: the decode kernel
    assert calls == []
    y = mod(x3)
    assert calls == [2] and y.shape == (2, 32, 32) and y.dtype == x3.dtype
    want = prefill_matmul(x3.reshape(64, 64), mod.packed, mod.scales, "int8").float() + mod.bias
    assert torch.equal(y.reshape(64, 32), want)
    mod.kernels = False
    ref = mod(x)
    assert ((below - ref).abs() <= 2 * U * ref.abs() + 1e-6).all()             # the decode kernel ran


def test_int4_experts_takes_the_prefill_path_from_the_threshold(monkeypatch, device):
    mod = experts_module(4, 64, 32, "int8", nn.SiLU(), device)
    mod.kernels = True
    calls = _spy(monkeypatch, "prefill_experts")
    with prefill_rows(nn.ModuleList([mod]), 2):                               # 2 rows per expert: R * k >= 8
        assert mod.prefill_min_rows == 2
        ids, tw = routing(3, 2, 4, used=4)
        mod(torch.randn(3, 64).bfloat16().to(device), ids.to(device), tw.to(device))   # 6 routed rows
        assert calls == []
        ids, tw = routing(4, 2, 4, used=4)
        mod(torch.randn(4, 64).bfloat16().to(device), ids.to(device), tw.to(device))   # 8 routed rows
        assert calls == [4]
    assert mod.prefill_min_rows == PREFILL_MIN_ROWS and "prefill_min_rows" not in mod.__dict__
    with prefill_rows(nn.ModuleList([mod]), None):                            # None: never
        mod(torch.randn(64, 64).bfloat16().to(device), *(t.to(device) for t in routing(64, 2, 4, used=4)))
    assert calls == [4]


def test_bad_arguments_are_refused(device):
    packed, scales = pack_int4_b32(torch.randn(8, 64))
    with pytest.raises(ValueError, match="= 64 columns"):
        prefill_matmul(torch.randn(3, 96, device=device), packed.to(device), scales.to(device))
    with pytest.raises(ValueError, match="act must be"):
        act_rows(torch.randn(3, 64, device=device), "int4")
    with pytest.raises(ValueError, match="multiple of 32"):
        act_rows(torch.randn(3, 48, device=device), "int8")
    mod = experts_module(2, 64, 32, "int8", nn.SiLU(), device)
    with pytest.raises(ValueError, match="must agree"):
        prefill_moe(torch.randn(3, 32, device=device), torch.zeros(3, 1, dtype=torch.long, device=device),
                    torch.ones(3, 1, device=device), mod.gate_up_packed, mod.gate_up_scales, mod.down_packed,
                    mod.down_scales)
    with pytest.raises(ValueError, match="min_rows"):
        with prefill_rows(mod, -1):
            pass


# ------------------------------------------------------------------------------------------ the lab script

def test_prefill_bench_threshold_reads_the_crossover():
    from lab.bench.prefill import threshold
    rows = [{"module": "attn", "rows": R, "prefill_over_decode_speed": v} for R, v in ((16, 0.5), (64, 1.2),
                                                                                      (256, 0.9), (1024, 2.0))]
    rows += [{"module": "experts", "rows": R, "prefill_over_decode_speed": v} for R, v in ((64, 0.8), (256, 1.5))]
    t = threshold(rows, experts=64, top_k=8)
    assert t["attn"] == {"crossover_rows": 1024, "rows_per_weight": 1024}          # 256 is slower again
    assert t["experts"] == {"crossover_rows": 256, "rows_per_weight": 256 * 8 / 64}
    assert t["suggested_prefill_min_rows"] == 1024
    assert threshold(rows[:1], 64, 8)["suggested_prefill_min_rows"] is None


def test_prefill_bench_runs_end_to_end_at_tiny_width(tmp_path, device):
    """lab.bench.prefill on a 1-layer tiny Mixtral, 4 tokens (on a CPU the kernels run in the interpreter): the
    receipt holds the three arms, the ratios, the logits differences and the sweep."""
    import json

    from lab.bench.prefill import main
    out = tmp_path / "p.json"
    assert main(["--arch", "mixtral", "--width", "tiny", "--layers", "1", "--batches", "1x4", "--warmup", "0",
                 "--repeats", "1", "--rounds", "2", "--sweep", "2,8", "--device", device, "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    (row,) = rec["rows"]
    assert row["tokens"] == 4 and row["default_takes_prefill"] == {"attn": False, "experts": False}
    assert all(row[a]["tokens_per_s"] > 0 for a in ("bf16", "decode", "prefill"))
    # paired rounds: each path's per-round medians, the ratio the median of the rounds' ratios
    assert all(len(row[a]["round_medians_s"]) == 2 for a in ("bf16", "decode", "prefill"))
    ratios = [b / p for p, b in zip(row["prefill"]["round_medians_s"], row["bf16"]["round_medians_s"])]
    assert row["prefill_over_bf16_rounds"]["rounds"] == ratios
    assert row["prefill_over_bf16"] == pytest.approx(sum(ratios) / 2)          # the median of two
    assert row["prefill_over_bf16_rounds"]["min"] <= row["prefill_over_bf16"] <= row["prefill_over_bf16_rounds"]["max"]
    d = row["logits"]
    # the prefill path moves the logits far less than int4 quantisation itself does
    assert 0 < d["prefill_vs_decode"]["max_rel"] < d["decode_vs_bf16"]["max_rel"] / 4
    assert [(r["module"], r["rows"]) for r in rec["sweep"]] == [("attn", 2), ("attn", 8), ("experts", 2),
                                                                ("experts", 8)]
    assert set(rec["threshold"]) >= {"attn", "experts", "suggested_prefill_min_rows", "rule"}
    assert rec["settings"]["rounds"] == 2
    assert "lab/bench/prefill.py" in rec["provenance"]["sources"]["files"] and rec["provenance"]["command"].startswith("python -m lab.bench.prefill")
