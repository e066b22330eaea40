"""What the bench times, as two registries (name -> prepare function): the batch-1 GEMVs (ours and its peers)
and the MoE layers. A prepare function builds `copies` independent weight copies and returns `Prepared`:
one call per copy, the fp32 reference of the first call's output, the weight-side bytes one call reads, and
the tolerance of the correctness check that runs before any timing. An implementation that cannot run here
raises `Skip` with the reason the receipt records.

Shape legend: E = experts, N = out features, K = in features, R = rows (tokens), A = top-k, H = hidden,
I = one expert's intermediate width; gate_up is [E, 2I, H] (gate rows first), down is [E, H, I].
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from .shapes import MoEModel
from lab.bench.traffic import expert_bytes


class Skip(Exception):
    """An implementation that cannot run here; the message is the receipt's reason."""


class Prepared(NamedTuple):
    calls: list            # one zero-argument callable per weight copy
    ref: torch.Tensor      # fp32 reference of calls[0]()
    wbytes: int            # weight-side bytes one call reads (the prepared tensors' real sizes)
    tol: float             # max|y - ref| / max|ref| allowed before a row is timed


def _kernels():
    try:
        from int4lab import kernels
    except ImportError as e:
        raise Skip(f"int4lab.kernels does not import: {e}") from None
    return kernels


def _need(mod, name: str):
    fn = getattr(mod, name, None)
    if fn is None:
        raise Skip(f"{mod.__name__} has no {name} in this checkout")
    return fn


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """max|y - ref| / max|ref| in fp32 (NaN counts as failure)."""
    d = (y.float() - ref.float()).abs().max()
    return float(d / ref.float().abs().max().clamp_min(1e-30)) if torch.isfinite(d) else float("inf")


def weights(N, K, gen, E=None) -> torch.Tensor:
    """Random bf16 weights [N, K] (or [E, N, K]) of a realistic magnitude, drawn from `gen`."""
    shape = (N, K) if E is None else (E, N, K)
    return (torch.randn(shape, generator=gen, device=gen.device, dtype=torch.float32) * 0.02).to(torch.bfloat16)


def _copies(copies: int, *tensors) -> list[tuple]:
    """`copies` tuples: the tensors themselves, then independent clones (each call reads its own bytes)."""
    return [tensors] + [tuple(t.clone() for t in tensors) for _ in range(copies - 1)]


# ---- batch-1 GEMV: y [1, N] = x [1, K] @ W[N, K].T --------------------------------------------------------
def _int4(W):
    import int4lab as il
    N, K = W.shape
    packed, scales = il.pack_int4_b32(W)
    return packed, scales, il.dequant_int4_ref(packed, scales, N, K)


def _nibbles(packed) -> torch.Tensor:
    """uint8 [N, K] in 0..15: the stored nibble (code + 8) of every weight."""
    from int4lab.format import unpack_codes
    return (unpack_codes(packed).to(torch.int16) + 8).to(torch.uint8)


def prep_bf16(W, x, copies) -> Prepared:
    """cuBLAS bf16 (`torch.matmul`): the uncompressed baseline."""
    cs = _copies(copies, W)
    return Prepared([lambda w=w: torch.matmul(x, w.t()) for (w,) in cs], x.float() @ W.float().t(), W.nbytes,
                    2 ** -7)


def prep_int4_b32(W, x, copies) -> Prepared:
    """Ours: `int4_linear` (int8 activations per 32, int4-b32 weights); the reference uses the same x codes."""
    import int4lab as il
    N, K = W.shape
    packed, scales, wq = _int4(W)
    int4_linear = _need(_kernels(), "int4_linear")
    xq, xs = il.quant_x_rows_ref(x)
    ref = (xq.float().reshape(1, K // 32, 32) * xs.unsqueeze(-1)).reshape(1, K) @ wq.t()
    return Prepared([lambda p=p, s=s: int4_linear(x, p, s) for p, s in _copies(copies, packed, scales)], ref,
                    packed.nbytes + scales.nbytes, 2 ** -7)


def prep_tinygemm(W, x, copies) -> Prepared:
    """torch's tinygemm (`_weight_int4pack_mm`), the same codes and scales, zero point 0."""
    N, K = W.shape
    if not hasattr(torch, "_weight_int4pack_mm"):
        raise Skip(f"torch {torch.__version__} has no _weight_int4pack_mm")
    if N % 8 or K % 128:
        raise Skip(f"tinygemm needs N % 8 == 0 and K % 128 == 0 here, got {N}x{K}")
    packed, scales, wq = _int4(W)
    nib = _nibbles(packed)
    # CUDA packing (pytorch test/test_linalg.py `_group_quantize_tensor`): even k in the HIGH nibble;
    # decode w = (q - 8) * scale + zero with [K/32, N, 2] bf16 (scale, zero); zero = 0 is symmetric.
    u8 = (nib[:, 0::2] << 4) | nib[:, 1::2]
    wp = torch._convert_weight_to_int4pack(u8.contiguous(), 8)
    sz = torch.stack([scales.to(torch.bfloat16), torch.zeros_like(scales, dtype=torch.bfloat16)], -1)
    sz = sz.transpose(0, 1).contiguous()                                    # [K/32, N, 2]
    return Prepared([lambda w=w, z=z: torch._weight_int4pack_mm(x, w, 32, z) for w, z in _copies(copies, wp, sz)],
                    x.float() @ wq.t(), wp.nbytes + sz.nbytes, 2 ** -6)


def prep_gemlite(W, x, copies) -> Prepared:
    """GemLite's A16W4 HQQ GEMV on the same grid (optional: skipped when not installed)."""
    try:
        from gemlite.helper import A16W4_HQQ_INT
    except ImportError as e:
        raise Skip(f"gemlite not importable ({e}); install the carried wheel: pip install --no-deps "
                   "--target /tmp/site .whl/gemlite-0.6.0.post2-py3-none-any.whl; PYTHONPATH=/tmp/site") from None
    packed, scales, wq = _int4(W)
    nib = _nibbles(packed)
    # HQQ convention W ~ (W_q - zero) * scale with W_q the nibble 0..15: zero 8 gives the same grid.
    s16 = scales.to(torch.bfloat16)
    mods = [A16W4_HQQ_INT(device="cuda", dtype=torch.bfloat16).from_weights(
        W_q=nib, scales=s16, zeros=torch.full_like(s16, 8.0)) for _ in range(copies)]
    m0 = mods[0]
    wbytes = sum(t.nbytes for t in (m0.W_q, m0.scales, m0.zeros) if isinstance(t, torch.Tensor))
    # A looser gate, for a known cause: where bf16 atomics exist (Hopper) GemLite's batch-1 GEMV sums its
    # split-K partials with tl.atomic_add straight into the bf16 output (gemlite 0.6.0.post2,
    # gemlite/triton_kernels/gemv_revsplitK_kernels.py, `native_atomic`), so every partial is rounded to
    # bf16: 1e-2 to 4e-2 of max|y| on the H200 (receipt of 2026-12-02, 13:14 UTC). A wrong layout gives ~1.
    return Prepared([lambda m=m: m(x) for m in mods], x.float() @ wq.t(), wbytes, 2 ** -4)


def prep_w4a16_cutlass(W, x, copies) -> Prepared:
    """Our W4A16 GEMV on the Paddle / TensorRT-LLM layout (per-channel scales, its own codes)."""
    try:
        from int4lab.cutlass_layout import weight_dequantize, weight_quantize
        from int4lab.kernels.w4a16_cutlass import w4a16_cutlass_gemv
    except ImportError as e:
        raise Skip(f"w4a16_cutlass not importable: {e}") from None
    # Paddle's layout takes [K, N] and quantises per output channel itself (its own codes, not int4-b32's).
    q, s = weight_quantize(W.t().contiguous(), algo="weight_only_int4", arch=80)
    ref = x.float() @ weight_dequantize(q, s, algo="weight_only_int4", arch=80).float()
    return Prepared([lambda q=q, s=s: w4a16_cutlass_gemv(x, q, s) for q, s in _copies(copies, q, s)], ref,
                    q.nbytes + s.nbytes, 2 ** -6)


def prep_marlin(W, x, copies) -> Prepared:
    """Marlin (W4A16, fp16 scale per 128, its own layout; built outside the repository: lab/bench/marlin_peer.py)."""
    from lab.bench import marlin_peer as mp
    try:
        mp.library(), mp.packer()            # before any packing: a missing build is skipped at once
        B, s, wq = mp.pack(W)
        x16 = x.to(torch.float16)
        calls = [mp.mul_call(x16, b, t, W.shape[0]) for b, t in _copies(copies, B, s)]
    except mp.MarlinMissing as e:
        raise Skip(str(e)) from None
    return Prepared(calls, x16.float() @ wq.t(), B.nbytes + s.nbytes, 2 ** -6)


GEMV_PEERS: dict[str, Callable[..., Prepared]] = {
    "int4_b32": prep_int4_b32, "w4a16_cutlass": prep_w4a16_cutlass, "bf16": prep_bf16,
    "tinygemm": prep_tinygemm, "gemlite": prep_gemlite, "marlin": prep_marlin,
}


def prep_gemv(impl: str, W: torch.Tensor, x: torch.Tensor, copies: int) -> Prepared:
    """Look `impl` up in GEMV_PEERS and prepare it for W [N, K] (bf16) and x [1, K] (bf16)."""
    if impl not in GEMV_PEERS:
        raise ValueError(f"impl must be one of {tuple(GEMV_PEERS)}, got {impl!r}")
    return GEMV_PEERS[impl](W, x, copies)


# ---- MoE layer: R tokens, top-k routing -------------------------------------------------------------------
class MoEInputs(NamedTuple):
    x: torch.Tensor        # bf16 [R, H]
    ids: torch.Tensor      # int32 [R, A], distinct per row
    wts: torch.Tensor      # fp32 [R, A], rows sum to 1
    gu: torch.Tensor       # bf16 [E, 2I, H]
    dn: torch.Tensor       # bf16 [E, H, I]


def routing(m: MoEModel, rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random distinct top-k expert ids int32 [R, A] and renormalised softmax weights fp32 [R, A], drawn on the
    CPU from (seed, rows): every implementation of a row, its read floor and `--dry-run` see the same experts.
    The random seed leaves the model out, so models with the same `rows` share a stream (a first row's logits over 64
    experts are the first 64 of a 128-expert model's): their routings are not independent draws."""
    gen = torch.Generator().manual_seed(1000 * seed + rows)
    logits = torch.randn(rows, m.n_experts, generator=gen)
    w, ids = torch.topk(torch.softmax(logits, -1), m.top_k, dim=-1)
    return ids.to(torch.int32), (w / w.sum(-1, keepdim=True)).float()


def n_active(ids: torch.Tensor) -> int:
    """How many distinct experts a routing reads."""
    return int(torch.unique(ids).numel())


def moe_inputs(m: MoEModel, rows: int, gen, seed: int = 0) -> MoEInputs:
    """x and the experts' weights from `gen` (on its device); the routing from `routing(m, rows, seed)`."""
    H, I, E = m.hidden, m.intermediate, m.n_experts
    x = torch.randn(rows, H, generator=gen, device=gen.device).to(torch.bfloat16)
    ids, wts = (t.to(gen.device) for t in routing(m, rows, seed))
    return MoEInputs(x, ids, wts, weights(2 * I, H, gen, E), weights(H, I, gen, E))


def moe_reference(x, ids, wts, gu, dn) -> torch.Tensor:
    """fp32 MoE layer: y[r] = sum_j wts[r, j] * down_e(silu(gate_e x) * up_e x), e = ids[r, j]."""
    I = dn.shape[-1]
    y = torch.zeros(x.shape[0], dn.shape[1], device=x.device)
    for r in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[r, j])
            h = gu[e].float() @ x[r].float()
            a = torch.nn.functional.silu(h[:I]) * h[I:]
            y[r] += float(wts[r, j]) * (dn[e].float() @ a)
    return y


def grouped_mm_unavailable(device) -> str | None:
    """Why torch._grouped_mm cannot run on `device` (None when it can): the op must exist; CUDA bf16 needs sm_90+."""
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no _grouped_mm"
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (9, 0):
        cap = torch.cuda.get_device_capability(device)
        return f"torch._grouped_mm bf16 needs sm_90+, this device is sm_{cap[0]}{cap[1]}"
    return None


def _bf16_loop(x, ids, wts, gu, dn):
    """One matmul per routed expert projection (rows gathered on the host's known routing), as a serving loop."""
    I = dn.shape[-1]
    y = torch.zeros(x.shape[0], dn.shape[1], device=x.device, dtype=torch.float32)
    plan = {}
    for r, row in enumerate(ids.tolist()):
        for j, e in enumerate(row):
            plan.setdefault(e, []).append((r, j))
    plan = [(e, torch.tensor([r for r, _ in p], device=x.device), torch.tensor([j for _, j in p], device=x.device))
            for e, p in sorted(plan.items())]

    def call():
        y.zero_()
        for e, r, j in plan:
            h = torch.matmul(x[r], gu[e].t())
            a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
            y.index_add_(0, r, torch.matmul(a, dn[e].t()).float() * wts[r, j].unsqueeze(-1))
        return y
    return call


def _grouped_mm(x, ids, wts, gu, dn):
    """torch._grouped_mm over all E experts (empty groups for unrouted ones), rows sorted by expert."""
    E, I = gu.shape[0], dn.shape[-1]
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    offs = torch.bincount(flat, minlength=E).cumsum(0).to(torch.int32)
    tok = order // ids.shape[1]
    w_sorted = wts.reshape(-1)[order].unsqueeze(-1)
    y = torch.zeros(x.shape[0], dn.shape[1], device=x.device, dtype=torch.float32)

    def call():
        xs = x[tok]
        h = torch._grouped_mm(xs, gu.transpose(-2, -1), offs=offs)
        a = (torch.nn.functional.silu(h[:, :I]) * h[:, I:]).contiguous()
        o = torch._grouped_mm(a, dn.transpose(-2, -1), offs=offs)
        y.zero_()
        y.index_add_(0, tok, o.float() * w_sorted)
        return y
    return call


def _bf16_peer(make):
    def prep(inp: MoEInputs, copies: int) -> Prepared:
        ref = moe_reference(*inp)
        calls = [make(inp.x, inp.ids, inp.wts, g, d) for g, d in _copies(copies, inp.gu, inp.dn)]
        return Prepared(calls, ref, 0, 2 ** -6)
    return prep


def prep_grouped_mm(inp: MoEInputs, copies: int) -> Prepared:
    """torch._grouped_mm in bf16 over all experts (sm_90+)."""
    why = grouped_mm_unavailable(inp.x.device)
    if why:
        raise Skip(why)
    return _bf16_peer(_grouped_mm)(inp, copies)


def _int4_peer(name: str):
    def prep(inp: MoEInputs, copies: int) -> Prepared:
        import int4lab as il
        fn = _need(_kernels(), name)
        (_, two_i, H), I = inp.gu.shape, inp.dn.shape[-1]
        pgu, sgu = il.pack_int4_b32(inp.gu)
        pdn, sdn = il.pack_int4_b32(inp.dn)
        ref = moe_reference(inp.x, inp.ids, inp.wts, il.dequant_int4_ref(pgu, sgu, two_i, H),
                            il.dequant_int4_ref(pdn, sdn, H, I))
        calls = [lambda c=c: fn(inp.x, inp.ids, inp.wts, *c) for c in _copies(copies, pgu, sgu, pdn, sdn)]
        # activations are int8-quantised twice (x and the SwiGLU output): a looser check than the GEMV's
        return Prepared(calls, ref, 0, 2 ** -5)
    prep.__doc__ = f"Ours: `{name}` on int4-b32 experts (int8 activations per 32)."
    return prep


MOE_PEERS: dict[str, Callable[..., Prepared]] = {
    "int4_b32_moe": _int4_peer("moe_decode_routed"), "bf16_loop": _bf16_peer(_bf16_loop),
    "grouped_mm": prep_grouped_mm, "int4_b32_grouped": _int4_peer("moe_decode_grouped"),
}


def prep_moe(impl: str, m: MoEModel, inp: MoEInputs, copies: int) -> Prepared:
    """Look `impl` up in MOE_PEERS and prepare it; `wbytes` counts the routed experts in `impl`'s storage."""
    if impl not in MOE_PEERS:
        raise ValueError(f"impl must be one of {tuple(MOE_PEERS)}, got {impl!r}")
    p = MOE_PEERS[impl](inp, copies)
    return p._replace(wbytes=n_active(inp.ids) * expert_bytes(impl, m))
