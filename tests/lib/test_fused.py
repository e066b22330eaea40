"""The fused decode pieces: one-launch RMSNorm and router against float64 references of their contracts, and
`fuse_decode` as a drop-in for transformers models (same logits and tokens, graph- and compile-ready ops).

Shape legend: R = rows, N = normalised features, T = tokens, H = hidden, E = experts, A = top-k.
Tiny awkward shapes: on a CPU machine the kernels run in Triton's interpreter; on CUDA the same tests run there.
"""
import contextlib
import copy

import pytest
import torch

import int4lab.quantize as Q
from int4lab.archs import get
from int4lab.kernels import launch, ops
from int4lab.kernels.norm import rms_norm, rms_norm_ref
from int4lab.kernels.router import router_topk, router_topk_ref
from int4lab.quantize.fused import rms_norm_torch, router_torch

ULP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 2.0 ** -23}


def within_ulps(got, ref, dtype, ulps=1):
    """|got - ref| <= ulps ulps of dtype at ref's magnitude, elementwise; returns the fraction exactly equal."""
    g, r = got.float().cpu(), ref.float().cpu()
    tol = ulps * ULP[dtype] * r.abs().clamp_min(torch.finfo(dtype).tiny)
    assert ((g - r).abs() <= tol).all(), f"max {(g - r).abs().max():.3g} at |ref| {r.abs().max():.3g}"
    return (g == r).float().mean().item()


def counters_zero():
    return all(int(c.abs().sum()) == 0 for _, c in launch.WORKSPACES.values())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("R,N", [(1, 33), (3, 96), (2, 300)])
def test_rms_norm_matches_its_contract(device, dtype, R, N):
    x = (torch.randn(R, N) * torch.logspace(-2, 1, N)).to(dtype).to(device)
    w = (torch.randn(N) * 0.3 + 1).to(dtype).to(device)
    y = rms_norm(x, w, 1e-5)
    assert y.dtype == dtype and y.shape == (R, N)
    # bf16 / fp16: the two roundings decide, so nearly every element is the reference's; float32: no rounding
    # to hide the sum's order and rsqrt, a few ulps
    ulps, equal = (4, 0.0) if dtype == torch.float32 else (1, 0.95)
    assert within_ulps(y, rms_norm_ref(x, w, 1e-5), dtype, ulps) >= equal
    assert within_ulps(y, rms_norm_torch(x, w, 1e-5), dtype, ulps) >= equal  # the transformers module's arithmetic


def test_rms_norm_reads_strided_rows(device):
    wide = torch.randn(4, 160).bfloat16().to(device)
    w = torch.rand(64).bfloat16().to(device)
    assert torch.equal(rms_norm(wide[:, :64], w, 1e-6), rms_norm(wide[:, :64].contiguous(), w, 1e-6))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("T,H,E,A,renorm", [(1, 64, 8, 2, True), (3, 200, 37, 5, False), (2, 96, 64, 8, True),
                                            (1, 40, 3, 3, False)])
def test_router_matches_its_contract(device, dtype, T, H, E, A, renorm):
    x = torch.randn(T, H).to(dtype).to(device)
    w = (torch.randn(E, H) * 0.1).to(dtype).to(device)
    wdt = torch.float32 if renorm else dtype                                # Mixtral keeps float32 weights
    logits, wts, ids = router_topk(x, w, A, renorm, wdt)
    assert (logits.dtype, wts.dtype, ids.dtype) == (dtype, wdt, torch.int64)
    ref = x.double() @ w.double().t()
    if dtype == torch.float32:      # float32 sums in another order: the dot's error bound H * 2^-24 * sum |x w|
        assert ((logits.double() - ref).abs() <= H * 2 ** -24 * (x.double().abs() @ w.double().abs().t())).all()
    else:
        within_ulps(logits, ref.to(dtype), dtype)                            # the dot, rounded once to the dtype
    rw, rid = router_topk_ref(logits, A, renorm, wdt)                       # the rest, from the kernel's logits
    assert torch.equal(ids.cpu(), rid)
    within_ulps(wts, rw, wdt, ulps=4 if wdt == torch.float32 else 1)       # float32 sums in another order
    assert counters_zero()


def test_router_breaks_ties_toward_the_lower_expert(device):
    x = torch.ones(1, 32, device=device)
    w = torch.zeros(6, 32, device=device)
    w[[1, 4]] = 1.0                                     # experts 1 and 4 tie for first, the rest tie after them
    _, wts, ids = router_topk(x, w, 4, False)
    assert ids.cpu().tolist() == [[1, 4, 0, 2]]


def test_custom_ops_of_norm_and_router_pass_opcheck(device):
    x = torch.randn(3, 96, device=device).bfloat16()
    torch.library.opcheck(ops.rms_norm_op, (x, torch.rand(96, device=device).bfloat16(), 1e-5))
    torch.library.opcheck(ops.router_op, (x, torch.randn(7, 96, device=device).bfloat16(), 2, True, torch.float32))


ARCHS = ("mixtral", "olmoe", "qwen3_moe")


def quantised(arch, device="cpu", dtype=torch.bfloat16):
    from test_quantize import tiny_model
    m, _ = Q.quantize_model(tiny_model(arch, dtype=dtype).to(device), "rtn", "experts+attn", progress=False)
    return m


def kernels(model, device):
    """The kernels for this device's tensors: CUDA takes them by default, a CPU through the interpreter."""
    return Q.kernels_on_cpu(model, True) if device == "cpu" else contextlib.nullcontext()


@pytest.mark.parametrize("arch", ARCHS)
def test_fuse_decode_replaces_the_pieces_and_keeps_the_logits(device, arch):
    m = quantised(arch, device)
    f = Q.fuse_decode(copy.deepcopy(m))
    lay = f.model.layers[0]
    assert f.int4_fused == {"qkv": 2, "router": 2, "norms": f.int4_fused["norms"], "attention": 2, "add_norm": 2,
                           "left": []}
    qk = len(get(arch).layout.qk_norms)                                    # 2 per layer (+ q/k norms) + the final
    assert f.int4_fused["norms"] == 2 * (2 + qk) + 1
    assert isinstance(lay.mlp.gate, Q.FusedRouter) and isinstance(lay.input_layernorm, Q.FusedRMSNorm)
    assert type(lay).__name__ == "FusedDecoderLayer" and type(lay.self_attn).__name__ == "FusedAttention"
    assert lay.self_attn.q_proj.qkv is lay.self_attn.k_proj.qkv is lay.self_attn.qkv_proj
    # two sequences on a GPU; one of 3 tokens through the CPU interpreter (each kernel program runs in Python)
    ids = torch.randint(0, 256, (2, 5) if device != "cpu" else (1, 3), device=device)
    with torch.no_grad():
        with Q.kernels_on_cpu(m, False), Q.kernels_on_cpu(f, False):        # the torch arithmetic, unchanged
            r, rf = m(ids).logits, f(ids).logits                            # (q/k/v in one matmul: on CUDA
        assert (r - rf).abs().max() <= 2 * 2 ** -8 * r.abs().max()          # another GEMM algorithm may round)
        with kernels(m, device), kernels(f, device):                        # the kernels (interpreter on a CPU)
            a, b = m(ids).logits, f(ids).logits
    assert (a - b).abs().max() <= 2 * 2 ** -8 * a.abs().max()               # bf16 roundings of the fused pieces


def test_fused_model_generates_with_a_static_cache_and_compiles(device):
    """A drop-in: generate with a static cache gives the unfused model's tokens; torch.compile sees one op per
    fused piece and gives the eager logits."""
    import torch._dynamo
    m = quantised("qwen3_moe", device)
    f = Q.fuse_decode(copy.deepcopy(m))
    ids = torch.randint(0, 256, (1, 4), device=device)
    kw = dict(max_new_tokens=3, min_new_tokens=3, do_sample=False, cache_implementation="static")
    with torch.no_grad(), Q.kernels_on_cpu(m, False), Q.kernels_on_cpu(f, False):
        assert torch.equal(m.generate(ids, **kw), f.generate(ids, **kw))
    seen = []

    def recording(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward
    torch._dynamo.reset()
    with kernels(f, device), torch.no_grad():
        eager = f(ids).logits
        compiled = torch.compile(f, backend=recording)(ids).logits
    assert torch.equal(eager, compiled)
    assert seen.count("int4lab.linear.default") == 4                        # qkv and o, two layers
    assert seen.count("int4lab.router.default") == 2 and seen.count("int4lab.moe.default") == 2
    assert seen.count("int4lab.rms_norm.default") == 7                      # + 2 post-attention norms in
    assert seen.count("int4lab.add_rms_norm.default") == 2                  # add_rms_norm (FusedDecoderLayer)


def test_router_probe_refuses_what_it_cannot_compute():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(6, 32))

        def forward(self, x):                           # top-2 of the logits themselves, no softmax
            lg = x @ self.weight.t()
            v, i = torch.topk(lg, 2, -1)
            return lg, v, i
    with pytest.raises(ValueError, match="does not compute softmax"):
        Q.FusedRouter.from_router(Odd())
    lg = torch.randn(3, 6)
    assert torch.equal(router_torch(lg, 2, True, None)[2], torch.topk(lg, 2).indices)
