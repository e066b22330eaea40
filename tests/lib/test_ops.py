"""kernels.ops: the modules' checked-once entry gives the public launchers' bits, skips the ids read-back, and
registers one torch.library custom op per entry (fake implementations, torch.compile).

Shape legend: R = rows, N = out features, K = in features, T = tokens, A = top-k, E = experts, H = hidden,
I = expert intermediate size. Tiny shapes: on a CPU machine the kernels run in Triton's interpreter.
"""
import pytest
import torch

import int4lab as il
from int4lab.kernels import int4_linear, moe_decode_step, ops
from int4lab.kernels import plan as plan_mod


def pack(E, N, K, device, scale=0.1):
    p, s = il.pack_int4_b32(torch.randn(E, N, K) * scale)
    return p.to(device), s.to(device)


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("act", ["int8", "bf16"])
@pytest.mark.parametrize("R,N,K", [(1, 40, 96), (3, 72, 160)])
def test_linear_gives_int4_linear_bits(device, act, R, N, K):
    p, s = pack(1, N, K, device)
    p, s = p[0], s[0]
    x = torch.randn(R, K, device=device).bfloat16()
    ops.clear_caches()
    for _ in range(2):                       # the first call prepares, the second reuses the prepared plan
        assert same_bits(ops.linear(x, p, s, act), int4_linear(x, p, s, act))
    assert len(ops._PREPARED) == 1


@pytest.mark.parametrize("T", [1, 3, 6])
def test_moe_gives_moe_decode_step_bits(device, T):
    """Routed (1 token) and grouped (mean rows per expert >= the switch) paths, router weights in bf16 and float32."""
    E, H, I, A = 4, 64, 96, 2
    gp, gs = pack(E, 2 * I, H, device, 0.2)
    dp, ds = pack(E, H, I, device, 0.2)
    x = torch.randn(T, H, device=device).bfloat16()
    ids = torch.stack([torch.randperm(E)[:A] for _ in range(T)]).to(device)          # int64, as HF's top-k
    w = torch.softmax(torch.randn(T, A), -1).to(device)
    for wt in (w, w.bfloat16()):
        assert same_bits(ops.moe(x, ids, wt, gp, gs, dp, ds), moe_decode_step(x, ids, wt.float(), gp, gs, dp, ds))
    assert plan_mod.moe_grouped(T, A, E, device, H * I) == (T >= 4)      # both paths above were exercised


def test_moe_never_reads_ids_back(device):
    """The public step raises on an out-of-range id (one read-back, a sync on CUDA); the modules' entry never
    reads ids: the row of a bad id comes out NaN (the kernels' guard), the other rows are the public bits."""
    E, H, I, A = 4, 64, 64, 2
    gp, gs = pack(E, 2 * I, H, device)
    dp, ds = pack(E, H, I, device)
    x = torch.randn(2, H, device=device).bfloat16()
    w = torch.rand(2, A, device=device)
    bad = torch.tensor([[0, 7], [1, 2]], device=device)
    with pytest.raises(ValueError, match="must lie in"):
        moe_decode_step(x, bad, w, gp, gs, dp, ds)
    got = ops.moe(x, bad, w, gp, gs, dp, ds)
    assert got[0].isnan().all()
    assert same_bits(got[1:], moe_decode_step(x[1:], bad[1:], w[1:], gp, gs, dp, ds))


def test_bad_arguments_raise_on_the_first_call(device):
    p, s = pack(1, 32, 64, device)
    x = torch.randn(2, 64, device=device).bfloat16()
    with pytest.raises(TypeError, match="scales"):
        ops.linear(x, p[0], s[0].float(), "int8")
    with pytest.raises(ValueError, match="act"):
        ops.linear(x, p[0], s[0], "int4")
    with pytest.raises(ValueError, match=r"x\.shape\[-1\]|K"):
        ops.linear(torch.randn(2, 48, device=device), p[0], s[0], "int8")
    gp, gs = pack(2, 64, 64, device)
    with pytest.raises(ValueError, match="topk_w"):
        ops.moe(x, torch.zeros(2, 2, dtype=torch.int64, device=device), torch.rand(2, 3, device=device),
                gp, gs, *pack(2, 64, 32, device))


def test_custom_ops_pass_opcheck(device):
    """Schema, fake implementation (shapes and dtypes without running), and AOT dispatch of both ops."""
    p, s = pack(1, 40, 96, device)
    x = torch.randn(3, 96, device=device).bfloat16()
    torch.library.opcheck(ops.linear_op, (x, p[0], s[0], "int8"))
    E, H, I = 4, 64, 64
    gp, gs = pack(E, 2 * I, H, device)
    dp, ds = pack(E, H, I, device)
    ids = torch.tensor([[0, 3], [2, 1]], device=device)
    torch.library.opcheck(ops.moe_op, (x[:2, :64].contiguous(), ids, torch.rand(2, 2, device=device), gp, gs, dp, ds))


def test_fake_tensors_give_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(5, 96, dtype=torch.bfloat16)
        y = torch.ops.int4lab.linear(x, torch.empty(40, 48, dtype=torch.uint8), torch.empty(40, 3, dtype=torch.float16),
                                     "int8")
        z = torch.ops.int4lab.moe(torch.empty(5, 64), torch.empty(5, 2, dtype=torch.int64), torch.empty(5, 2),
                                  torch.empty(4, 128, 32, dtype=torch.uint8), torch.empty(4, 128, 2, dtype=torch.float16),
                                  torch.empty(4, 64, 32, dtype=torch.uint8), torch.empty(4, 64, 2, dtype=torch.float16))
    assert (tuple(y.shape), y.dtype) == ((5, 40), torch.bfloat16)
    assert (tuple(z.shape), z.dtype) == ((5, 64), torch.bfloat16)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_quantised_model_matches_eager(device, backend):
    """torch.compile traces a model holding int4 modules (one opaque op per kernel call) and gives its logits."""
    import torch._dynamo
    from test_quantize import tiny_model
    import int4lab.quantize as Q
    model, _ = Q.quantize_model(tiny_model("olmoe", experts=4, layers=1).to(torch.bfloat16).to(device), "rtn",
                                "experts+attn", progress=False)
    ids = torch.randint(0, 256, (1, 3), device=device)
    torch._dynamo.reset()
    seen = []

    def recording(gm, example_inputs):              # the graphs dynamo hands the backend: which ops they hold
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)
    with Q.kernels_on_cpu(model, True) if device == "cpu" else _nothing(), torch.no_grad():
        eager = model(ids).logits
        compiled = torch.compile(model, backend=recording)(ids).logits
    assert torch.equal(eager, compiled)
    assert seen.count("int4lab.linear.default") == 4 and seen.count("int4lab.moe.default") == 1   # q, k, v, o; experts


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False
