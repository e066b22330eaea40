"""Decode attention over a static cache (kernels/attention.py) against a float64 reference of its contract, the
cache write against transformers' StaticCache.update, and FusedAttention as a drop-in for the three models.

Shape legend: B = batch, HQ / HKV = query / key-value heads, D = head dim, C = cache slots, S = splits.
Roundings the comparisons allow (the contract's): q and k after the norm and rope are bf16 (the same roundings
as transformers' ops; the norm's float32 sum may move one in twenty elements by an ulp), the cache holds bf16
values (exactly StaticCache.update's when there is no norm), the output is one bf16 rounding of a float32
computation (so within an ulp of the float64 reference, plus the float32 sums' error).
"""
import contextlib
import copy

import pytest
import torch

import int4lab.quantize as Q
from int4lab.kernels import launch
from int4lab.kernels.attention import decode_attention, decode_attention_ref, plan_splits

BF16_ULP = 2.0 ** -8        # half the spacing of bf16 at 1: one rounding's relative error


def inputs(B, HQ, HKV, D, C, norm, device, cos_rows=None):
    q = torch.randn(B, HQ * D).bfloat16()
    k, v = torch.randn(B, HKV * D).bfloat16(), torch.randn(B, HKV * D).bfloat16()
    ang = torch.rand(cos_rows or B, D // 2) * 50
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos().bfloat16(), emb.sin().bfloat16()
    kc, vc = torch.randn(B, HKV, C, D).bfloat16(), torch.randn(B, HKV, C, D).bfloat16()
    qn = kn = None
    if norm != "none":
        qn = (torch.rand(D if norm == "head" else HQ * D) + 0.5).bfloat16()
        kn = (torch.rand(D if norm == "head" else HKV * D) + 0.5).bfloat16()
    return [t.to(device) if t is not None else None for t in (q, k, v, cos, sin, kc, vc, qn, kn)]


def counters_zero():
    return all(int(c.abs().sum()) == 0 for _, c in launch.WORKSPACES.values())


def check_output(out, ref, vmax):
    """out bf16 within one bf16 rounding of the float64 reference, plus the weights' two-bf16 error (2^-16 of
    each, so at most 2^-16 max|V| in sum) and float32 sums' error: 2^-14 max|V| in all."""
    r = ref.view(out.shape[0], -1)
    tol = BF16_ULP * r.abs() + 2 ** -14 * vmax
    err = (out.cpu().double() - r).abs()
    assert (err <= tol).all(), f"max err {err.max():.3g}, max |ref| {r.abs().max():.3g}"


CASES = [  # B, HQ, HKV, D, C, pos, norm, S
    (1, 2, 1, 64, 37, 0, "none", 1),        # position 0
    (2, 4, 2, 16, 37, 36, "head", 3),       # the last slot, an awkward head dim
    (1, 6, 2, 128, 50, 23, "row", 2),       # 3 queries per KV head, OLMoE's whole-row norm, D = 128
    (3, 3, 3, 32, 19, 7, "head", 4),        # MHA, more splits than whole blocks
    (1, 8, 1, 64, 80, 79, "none", 4),       # 8 queries on one KV head (Qwen3-like), pos in the last split
    (2, 4, 1, 16, 33, 33, "row", 2),        # pos = C: nothing written, every slot read
]


@pytest.mark.parametrize("B,HQ,HKV,D,C,pos,norm,S", CASES)
def test_decode_attention_matches_its_contract(device, B, HQ, HKV, D, C, pos, norm, S):
    q, k, v, cos, sin, kc, vc, qn, kn = inputs(B, HQ, HKV, D, C, norm, device)
    k0, v0 = kc.clone(), vc.clone()
    length = torch.tensor(pos, device=device)
    out = decode_attention(q, k, v, cos, sin, kc, vc, length, q_norm=qn, k_norm=kn, norm=norm, eps_q=1e-6,
                           eps_k=1e-5, splits=S, block_n=16)
    ref, kr, vr, _, _ = decode_attention_ref(q, k, v, cos, sin, k0, v0, pos, q_norm=qn, k_norm=kn, norm=norm,
                                             eps_q=1e-6, eps_k=1e-5)
    assert out.dtype == torch.bfloat16 and out.shape == (B, HQ * D)
    assert int(length) == pos + 1 and counters_zero()
    assert torch.equal(vc.cpu(), vr)                                        # v as it came, in its slot
    if norm == "none":
        assert torch.equal(kc.cpu(), kr)
    else:                                                                   # the norm's sum order: an ulp, rarely
        d = (kc.cpu().float() - kr.float()).abs()
        assert (d <= 2 * 2 ** -7 * kr.float().abs()).all() and (d == 0).float().mean() >= 0.95
    check_output(out, ref, max(vc.abs().max().item(), v.abs().max().item()))


def test_mask_hides_slots_and_splits_agree(device):
    B, HQ, HKV, D, C, pos = 2, 4, 2, 32, 45, 30
    q, k, v, cos, sin, kc, vc, _, _ = inputs(B, HQ, HKV, D, C, "none", device, cos_rows=1)
    mask = torch.rand(B, C, device=device) > 0.3
    mask[:, pos] = True
    outs = []
    for S in (1, 2, 3, 4):
        length = torch.tensor(pos, device=device)
        outs.append(decode_attention(q, k, v, cos, sin, kc.clone(), vc.clone(), length, mask=mask, splits=S,
                                     block_n=16))
    ref = decode_attention_ref(q, k, v, cos, sin, kc, vc, pos, mask=mask)[0]
    for o in outs:
        check_output(o, ref, max(vc.abs().max().item(), v.abs().max().item()))
    assert plan_splits(1, 4, 256, torch.device("cpu"))[0] == 1                 # short context, one device SM
    assert plan_splits(1, 4, 4096, torch.device("cpu"), splits=7) == (7, 640)


def test_cache_write_matches_static_cache_update(device):
    """The slot, the bf16 values and the length StaticCache.update gives, for a Mixtral-layout step (no q/k norm:
    the rope's roundings are transformers' own)."""
    from transformers import MixtralConfig, StaticCache
    from transformers.models.mixtral.modeling_mixtral import apply_rotary_pos_emb
    B, HQ, HKV, D, C, P = 2, 4, 2, 32, 21, 6
    cfg = MixtralConfig(hidden_size=HQ * D, num_attention_heads=HQ, num_key_value_heads=HKV, num_hidden_layers=1)
    q, k, v, cos, sin, _, _, _, _ = inputs(B, HQ, HKV, D, C, "none", device)
    caches = []
    for _ in range(2):
        cache = StaticCache(config=cfg, max_cache_len=C)
        g = torch.Generator().manual_seed(1)
        pk, pv = (torch.randn(B, HKV, P, D, generator=g).bfloat16().to(device) for _ in range(2))
        cache.update(pk, pv, 0)                                             # a prefill of P positions
        caches.append(cache)
    qh, kh = apply_rotary_pos_emb(q.view(B, 1, HQ, D).transpose(1, 2), k.view(B, 1, HKV, D).transpose(1, 2),
                                  cos.view(B, 1, D), sin.view(B, 1, D))
    caches[0].update(kh, v.view(B, 1, HKV, D).transpose(1, 2), 0)
    lay = caches[1].layers[0]
    decode_attention(q, k, v, cos, sin, lay.keys, lay.values, lay.cumulative_length, block_n=16)
    ref = caches[0].layers[0]
    assert torch.equal(lay.keys, ref.keys) and torch.equal(lay.values, ref.values)
    assert int(lay.cumulative_length) == int(ref.cumulative_length) == P + 1


def test_bad_arguments_are_refused_before_launch(device):
    q, k, v, cos, sin, kc, vc, qn, kn = inputs(1, 2, 1, 16, 20, "head", device)
    length = torch.tensor(3, device=device)
    with pytest.raises(TypeError, match="q"):
        decode_attention(q.float(), k, v, cos, sin, kc, vc, length)
    with pytest.raises(ValueError, match="k and v"):
        decode_attention(q, k[:, :8], v, cos, sin, kc, vc, length)
    with pytest.raises(ValueError, match="norm"):
        decode_attention(q, k, v, cos, sin, kc, vc, length, norm="layer")
    with pytest.raises(ValueError, match="q_norm"):
        decode_attention(q, k, v, cos, sin, kc, vc, length, q_norm=qn.repeat(2), k_norm=kn, norm="head")
    with pytest.raises(ValueError, match="splits"):
        decode_attention(q, k, v, cos, sin, kc, vc, length, splits=0)
    with pytest.raises(TypeError, match="length"):
        decode_attention(q, k, v, cos, sin, kc, vc, length.int())
    assert int(length) == 3


ARCHS = ("mixtral", "olmoe", "qwen3_moe")


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_attention_keeps_the_logits_and_the_cache(device, arch, monkeypatch):
    """fuse_decode with the attention launch against fuse_decode without it: a prefill (the model's own forward)
    then decode steps over a StaticCache with the step's boolean mask; the first layer's cache holds transformers'
    values (its inputs are the same; k up to the norm's sum order), the logits within the bf16 roundings of
    attention's output."""
    from transformers import StaticCache
    from test_quantize import tiny_model
    m, _ = Q.quantize_model(tiny_model(arch, dtype=torch.bfloat16).to(device), "rtn", "experts+attn", progress=False)
    base = Q.fuse_decode(copy.deepcopy(m), attention=False)
    f = Q.fuse_decode(copy.deepcopy(m))
    assert f.int4_fused["attention"] == 2 and isinstance(f.model.layers[0].self_attn, Q.FusedAttention)
    from int4lab.kernels import ops
    calls = []
    launch_one = ops.decode_attention
    monkeypatch.setattr(ops, "decode_attention", lambda *a: calls.append(1) or launch_one(*a))
    B, C, P = 2, 12, 3
    ids = torch.randint(0, 256, (B, P), device=device)
    steps = torch.randint(0, 256, (2, B, 1), device=device)
    runs = []
    for model in (base, f):
        cache = StaticCache(config=model.config, max_cache_len=C)
        logits = []
        with torch.no_grad(), (Q.kernels_on_cpu(model, True) if device == "cpu" else contextlib.nullcontext()):
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            for i, tok in enumerate(steps):
                pos = torch.tensor(P + i, device=device)
                mask = (torch.arange(C, device=device) <= pos).view(1, 1, 1, C).expand(B, 1, 1, C)
                out = model(input_ids=tok, position_ids=pos.view(1, 1).expand(B, 1), attention_mask=mask,
                            past_key_values=cache, use_cache=True)
                logits.append(out.logits[:, -1].float())
        runs.append((logits, cache))
    (la, ca), (lb, cb) = runs
    assert len(calls) == 2 * 2                                              # 2 layers x 2 steps took the launch
    for a, b in zip(la, lb):
        assert (a - b).abs().max() <= 4 * 2 ** -8 * a.abs().max()
    assert torch.equal(ca.layers[0].values, cb.layers[0].values)
    ka, kb = ca.layers[0].keys.float(), cb.layers[0].keys.float()
    if arch == "mixtral":                                                   # no q/k norm: rope's bits
        assert torch.equal(ka, kb)
    else:                                                                   # the norm's sum order: an ulp, rarely
        assert ((ka - kb).abs() <= 2 ** -7 * ka.abs()).all() and (ka == kb).float().mean() >= 0.99
    assert [int(x.cumulative_length) for x in ca.layers] == [int(x.cumulative_length) for x in cb.layers] == [5, 5]


def test_decode_attention_op_is_one_opaque_op(device):
    """torch.compile sees one int4lab::decode_attention op, which gives the eager call's output and cache."""
    import torch._dynamo
    from int4lab.kernels import ops
    q, k, v, cos, sin, kc, vc, qn, kn = inputs(1, 4, 2, 16, 20, "row", device)
    seen = []

    def recording(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    def step(q, k, v, kc, vc, length):
        return ops.decode_attention(q, k, v, cos, sin, kc, vc, length, qn, kn, "row", 1e-6, 1e-6, 0.25, None)
    torch._dynamo.reset()
    k1, v1, k2, v2 = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    l1, l2 = torch.tensor(5, device=device), torch.tensor(5, device=device)
    eager = step(q, k, v, k1, v1, l1)
    compiled = torch.compile(step, backend=recording)(q, k, v, k2, v2, l2)
    assert torch.equal(eager, compiled) and torch.equal(k1, k2) and torch.equal(v1, v2) and int(l2) == 6
    assert seen.count("int4lab.decode_attention.default") == 1


def test_decode_attention_op_passes_opcheck(device):
    from int4lab.kernels import ops
    q, k, v, cos, sin, kc, vc, qn, kn = inputs(2, 4, 2, 16, 20, "head", device)
    length = torch.tensor(7, device=device)
    torch.library.opcheck(ops.decode_attention_op, (q, k, v, cos, sin, kc, vc, length, qn, kn, "head", 1e-6, 1e-6,
                                                    0.25, None))
