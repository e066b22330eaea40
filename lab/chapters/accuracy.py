"""Accuracy cases of the decode kernels against float64 references: chapter 03 tabulates and plots these.

Shape legend: E = experts, N = out features, K = in features, R = activation rows, T = tokens, A = top-k.

Each case draws fresh random weights and activations, runs one kernel (into a NaN-poisoned buffer where the
kernel takes one: the MoE steps allocate their own output, so for them only the comparison with the reference
speaks to completeness: exact_frac, else the error) and
reports max|out - ref| / max|ref| (the format's reference tolerance is 2**-7: met on the draws tried, not a
proven bound, as heavy cancellation in an output could break it) and the fraction of outputs equal, bit
for bit, to the reference rounded to bf16 (what an exact kernel with one final rounding gives): once from
float64 for the GEMV cases (`bf16_once`); for the MoE steps from moe_decode_ref's float32 output.

The one-launch checks compare a kernel with its own two-launch decomposition, bit for bit: x quantised
inside the dense GEMV against quant_x_rows then the same dense GEMV on codes (`fused_quant_case`), the last-arriving
split-K finish against reduce_partials of the same slots (`split_finish_case`), and the down GEMV's fused
router-weighted combine against combine_rows (`fused_combine_case`).
"""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import torch

from unittest import mock

from int4lab.format import X_QMAX, _blocks, dequant_int4_ref, pack_int4_b32, quant_x_rows_ref, true_div
from int4lab.kernels import launch as _launch
from int4lab.kernels import plan as _plan
from int4lab.kernels.gemv import X_CODES, X_SWIGLU, gemv_int4_b32, int4_linear
from int4lab.kernels.launch import launch_gemv
from int4lab.kernels.grouped import build_group_tiles, gemm_int4_b32_grouped
from int4lab.kernels.moe import combine_rows, moe_decode_grouped, moe_decode_ref, moe_decode_routed
from int4lab.kernels.quant import quant_x_rows
from int4lab.kernels.reduce import reduce_partials

TOLERANCE = 2.0 ** -7     # pass line max|out - ref| <= TOLERANCE * max|ref|: met on the draws tried, not a bound


def bf16_once(x64: torch.Tensor) -> torch.Tensor:
    """float64 -> bf16 rounded once, to nearest with ties to even. torch's own float64 -> bf16 cast goes through
    float32, two roundings that can differ at a bf16 tie; here the float32 step rounds to odd (truncate, then set
    the last bit when inexact), which float32's 16 spare bits make exact for the bf16 step."""
    x64 = x64.double()
    f = x64.float()
    f = torch.where(f.double().abs() > x64.abs(), torch.nextafter(f, torch.zeros_like(f)), f)
    f = torch.where(f.double() != x64, (f.view(torch.int32) | 1).view(torch.float32), f)
    return f.bfloat16()


def _row(kernel, shape, out, ref):
    """`ref` in float64 (GEMV cases: rounded once to bf16 for exact_frac) or float32 (moe_decode_ref's output)."""
    out, ref = out.float().cpu(), ref.cpu()
    scale = float(ref.abs().max())
    return {"kernel": kernel, "shape": shape, "unwritten": int(out.isnan().sum()),
            "rel_err": float((out.double() - ref.double()).abs().max()) / scale,
            "exact_frac": float((out == bf16_once(ref).float()).float().mean())}


def _gemv_ref64(xq, xs, packed, scales, eids, N, K) -> torch.Tensor:
    """gemv_ref's value before its float32 cast: float64 [R, N]."""
    w = dequant_int4_ref(packed.cpu(), scales.cpu(), N, K).double()
    x = (xq.cpu().double().reshape(-1, K // 32, 32) * xs.cpu().double()[..., None]).reshape(-1, K)
    return torch.einsum("rk,rnk->rn", x, w[eids.cpu().long()])


def _poisoned(shape, device):
    return torch.full(shape, float("nan"), dtype=torch.bfloat16, device=device)


def gemv_case(R, N, K, E, device, split_k=None):
    p, s = (t.to(device) for t in pack_int4_b32(torch.randn(E, N, K) * 0.1))
    xq, xs = quant_x_rows(torch.randn(R, K).bfloat16().to(device))
    eids = torch.randint(0, E, (R,), dtype=torch.int32, device=device)
    out = gemv_int4_b32(xq, xs, p, s, eids, N, K, out=_poisoned((R, N), device), split_k=split_k)
    name = "gemv_int4_b32" + (f" split_k={split_k}" if split_k else "")
    return _row(name, f"R{R} {N}x{K} E{E}", out, _gemv_ref64(xq, xs, p, s, eids, N, K))


def linear_case(R, N, K, device, act, pack=None):
    """`int4_linear` on a fresh [N, K] weight against float64: on x's int8 codes for act="int8" (W4A8), on the
    bf16 x itself for act="bf16" (W4A16). `pack` (default `pack_int4_b32`) maps the float weight to (packed,
    scales); chapter 01 passes llama.cpp Q4_0's signed-scale rule through it."""
    p, s = (t.to(device) for t in (pack or pack_int4_b32)(torch.randn(N, K) * 0.1))
    x = torch.randn(R, K).bfloat16().to(device)
    out = int4_linear(x, p, s, act=act, out=_poisoned((R, N), device))
    w = dequant_int4_ref(p.cpu(), s.cpu(), N, K).double()
    xd = x.cpu().double()
    if act == "int8":
        q, sc = quant_x_rows_ref(x.cpu())
        xd = (q.double().reshape(R, -1, 32) * sc.double()[..., None]).reshape(R, K)
    return _row(f"int4_linear act={act}", f"R{R} {N}x{K}", out, xd @ w.T)


def grouped_case(L, N, K, E, device, block_m=4, kind="dp4a"):
    """The grouped kernel on L routed rows over E >= 2 experts: kind "dp4a" on the device's table row for
    block_m; "mma", the tensor-core kernel, on the tile of sm90's first tensor-core row (block_n, block_k) at
    block_m >= 4, weights loaded by the threads (not TMA; the suite checks that TMA gives the same bits), one warp
    off a GPU. The ids skip expert E // 2, so at least one expert always gets no row (a random draw leaves one empty
    only by chance): for E >= 3 an interior expert, whose neighbours get rows unless the same draw leaves them empty
    too; for E = 2 the last expert. The row adds "empty_experts", the number of experts that got no row."""
    if E < 2:
        raise ValueError(f"E must be >= 2 (one expert is left without rows), got {E}")
    if kind not in ("dp4a", "mma"):
        raise ValueError(f"kind must be 'dp4a' or 'mma', got {kind!r}")
    plan = None
    if kind == "mma":
        row = next(p for *_, p in _plan.GROUPED_TABLE["sm90"] if p.kind == "mma")
        plan = dataclasses.replace(row, block_m=block_m, tma=False, half_tiles=False,
                                   num_warps=row.num_warps if torch.device(device).type == "cuda" else 1)
    p, s = (t.to(device) for t in pack_int4_b32(torch.randn(E, N, K) * 0.1))
    ids = torch.randint(0, E - 1, (L,), dtype=torch.int32)
    ids = (ids + (ids >= E // 2).int()).to(device)            # E - 1 values onto [0, E) without E // 2
    t = build_group_tiles(ids, E, block_m)
    xq, xs = quant_x_rows(torch.randn(L, K).bfloat16().to(device))
    out = gemm_int4_b32_grouped(xq, xs, p, s, t, out=_poisoned((L, N), device), plan=plan)
    row = _row(f"gemm_int4_b32_grouped {kind}", f"L{L} {N}x{K} E{E} block_m={block_m}", out,
               _gemv_ref64(xq, xs, p, s, ids, N, K))
    row["empty_experts"] = int((torch.bincount(ids.cpu().long(), minlength=E) == 0).sum())
    return row


def moe_case(T, A, E, H, I, device, grouped=False):
    gp, gs = (t.to(device) for t in pack_int4_b32(torch.randn(E, 2 * I, H) * 0.2))
    dp, ds = (t.to(device) for t in pack_int4_b32(torch.randn(E, H, I) * 0.2))
    x = torch.randn(T, H).bfloat16().to(device)
    ids = torch.stack([torch.randperm(E)[:A] for _ in range(T)]).int().to(device)
    tw = torch.softmax(torch.randn(T, A), -1).to(device)
    fn = moe_decode_grouped if grouped else moe_decode_routed
    out = fn(x, ids, tw, gp, gs, dp, ds)
    return _row(fn.__name__, f"T{T} A{A} E{E} H{H} I{I}", out, moe_decode_ref(x, ids, tw, gp, gs, dp, ds))


# ---- the one-launch design against its two-launch decomposition ------------------------------------------
def bits(t) -> torch.Tensor:
    """bf16 tensor -> its int16 bit patterns on the CPU (for bit-for-bit comparisons)."""
    return t.view(torch.int16).cpu()


def ulps_apart(a, b) -> int:
    """Largest distance, in bf16 units in the last place, between two same-sign bf16 tensors."""
    return int((bits(a).int() - bits(b).int()).abs().max()) if a.numel() else 0


def counters_zero() -> bool:
    """True when every cached split-K arrival counter is zero (as every launch must leave them)."""
    return all(int(c.abs().sum()) == 0 for _, c in _launch.WORKSPACES.values())


def quant_x_rows_floor_ref(x):
    """An alternative activation rounding: q = floor(x / s + 0.5), one IEEE division per value (same s as
    quant_x_rows_ref), to count where it and quant_x_rows_ref's rint(x * (1/s)) disagree."""
    xb = _blocks(x.float())
    s = true_div(xb.abs().amax(-1), float(X_QMAX)) + 1e-12
    q = torch.floor(xb / s.unsqueeze(-1) + 0.5).clamp_(-X_QMAX, X_QMAX).to(torch.int8)
    return q.reshape(x.shape), s


def fused_quant_case(R, N, K, device, split_k=1):
    """int4_linear(act="int8") (x quantised inside the GEMV, one launch) against quant_x_rows followed by the
    same dense GEMV on the codes (two launches; no expert ids, so the same tl.sum fold of the block columns), same
    plan: "ulps" apart, where only the place of the quantiser differs. "ulps_routed": against gemv_int4_b32 on
    expert 0, whose routed kernel folds the block columns with epilogue.fold_blocks, another float32 order."""
    p, s = (t.to(device) for t in pack_int4_b32(torch.randn(N, K) * 0.1))
    x = torch.randn(R, K).bfloat16().to(device)
    plan = _plan.gemv_plan(N, K, R, device, split_k)
    one = int4_linear(x, p, s, act="int8", plan=plan)
    xq, xs = quant_x_rows(x)
    two = launch_gemv(xq, xs, p, s, None, N, K, R, x_mode=X_CODES, plan=plan)
    routed = gemv_int4_b32(xq, xs, p[None], s[None], torch.zeros(R, dtype=torch.int32, device=device), N, K,
                           plan=plan)
    return {"shape": f"R{R} {N}x{K} split_k={plan.split_k}", "ulps": ulps_apart(one, two),
            "ulps_routed": ulps_apart(one, routed), "counters_zero": counters_zero()}


def split_finish_case(R, N, K, E, split_ks, device, repeats=2):
    """Per split-K: does the one-launch finish equal reduce_partials of its own float32 slots bit for bit,
    are the counters zero afterwards, do repeated calls differ (count), and how many outputs differ from
    split_k = 1 (a different summation order, so some may)."""
    p, s = (t.to(device) for t in pack_int4_b32(torch.randn(E, N, K) * 0.1))
    xq, xs = quant_x_rows(torch.randn(R, K).to(device))
    eids = torch.randint(0, E, (R,), dtype=torch.int32, device=device)
    base = gemv_int4_b32(xq, xs, p, s, eids, N, K, split_k=1)
    rows = []
    for sk in split_ks:
        part = torch.full((sk, R, N), float("nan"), device=device) if sk > 1 else None
        out = gemv_int4_b32(xq, xs, p, s, eids, N, K, part=part, out=_poisoned((R, N), device), split_k=sk)
        same = bool(torch.equal(bits(out), bits(reduce_partials(part, sk, R, N)))) if sk > 1 else None
        again = [gemv_int4_b32(xq, xs, p, s, eids, N, K, split_k=sk) for _ in range(repeats)]
        rows.append({"split_k": sk, "equals_reduce": same, "counters_zero": counters_zero(),
                     "repeat_diffs": int(sum((bits(a) != bits(out)).sum() for a in again)),
                     "vs_split1": int((bits(out) != bits(base)).sum()), "outputs": R * N})
    return rows


def fused_combine_case(T, A, N, K, E, device, split_k=1):
    """The down GEMV with the router-weighted combine in its last-arriving epilogue (moe_decode_step's
    second launch) against the same GEMV's bf16 rows combined by combine_rows: bf16 ulps apart."""
    p, s = (t.to(device) for t in pack_int4_b32(torch.randn(E, N, K) * 0.1))
    h = (torch.randn(T * A, 2 * K) * 2).bfloat16().to(device)
    eids = torch.stack([torch.randperm(E)[:A] for _ in range(T)]).reshape(-1).int().to(device)
    tw = torch.softmax(torch.randn(T, A), -1).to(device)
    fused = launch_gemv(h, None, p, s, eids, N, K, T * A, x_mode=X_SWIGLU, topk_w=tw, split_k=split_k)
    rows = launch_gemv(h, None, p, s, eids, N, K, T * A, x_mode=X_SWIGLU, split_k=split_k)
    return {"shape": f"T{T} A{A} {N}x{K} E{E} split_k={split_k}", "ulps": ulps_apart(fused, combine_rows(rows, tw)),
            "counters_zero": counters_zero()}


@contextmanager
def _on(generation: str, sms: int):
    """Inside it, plan.py answers its device queries as `generation` with `sms` SMs. plan.py is hashed into every
    GPU receipt (lab.provenance.kernel_sources_hash), so its functions are reused with the queries answered,
    instead of editing that file."""
    with mock.patch.object(_plan, "generation", lambda _: generation), \
            mock.patch.object(_plan, "num_sms", lambda _: sms):
        yield


def plan_on(generation: str, sms: int, N: int, K: int, R: int) -> _plan.GemvPlan:
    """gemv_plan's choice for a GPU generation and SM count, computed on any machine (no GPU needed; `_on`)."""
    with _on(generation, sms):
        return _plan.gemv_plan(N, K, R, "cpu")


def moe_step_on(generation: str, sms: int, tokens: int, top_k: int, experts: int, H: int, I: int) -> dict:
    """What the modules' MoE entry (int4lab.kernels.ops.moe) prepares for one step on a GPU generation and SM
    count, computed on any machine with shape-only (meta) tensors: {"path": "routed" or "grouped", "plans": the
    (gate_up, down) GroupedPlans of the grouped path (None on the routed one), "refused": the ValueError message
    with which the entry refuses the step before any launch, else None}. moe_decode_step's grouped path
    (moe_decode_grouped) builds one set of tiles at gate_up's block_m, so where the two plans' block_m differ it
    runs gate_up and then raises at the down GEMM (`moe_grouped_with`)."""
    from int4lab.kernels import ops
    if H % 32 or I % 32:
        raise ValueError(f"H and I must be multiples of 32 (the format's block), got H = {H}, I = {I}")
    T, A, E = tokens, top_k, experts

    def meta(*shape, dtype=torch.float32):
        return torch.empty(*shape, dtype=dtype, device="meta")
    args = (meta(T, H, dtype=torch.bfloat16), meta(T, A, dtype=torch.int32), meta(T, A),
            meta(E, 2 * I, H // 2, dtype=torch.uint8), meta(E, 2 * I, H // 32, dtype=torch.float16),
            meta(E, H, I // 2, dtype=torch.uint8), meta(E, H, I // 32, dtype=torch.float16))
    with _on(generation, sms):
        grouped = _plan.moe_grouped(T, A, E, "meta", H * I)
        plans = tuple(_plan.grouped_plan(n, k, T * A, E, "meta") for n, k in ((2 * I, H), (H, I))) if grouped else None
        try:
            ops._prepare_moe(*args)
            refused = None
        except ValueError as e:
            if "must share block_m" not in str(e):
                raise
            refused = str(e)
    return {"path": "grouped" if grouped else "routed", "plans": plans, "refused": refused}


def moe_path_on(generation: str, sms: int, tokens: int, top_k: int, experts: int, H: int, I: int) -> str:
    """The kernels moe_decode_step picks for one step on a GPU generation and SM count, computed on any machine
    (moe_step_on): "routed" (the dp4a GEMVs), "grouped " + the grouped plans' kind ("dp4a" or "mma"), or
    "refused (block_m a/b)" where gate_up's and down's plans have different tile heights (a and b): a step the
    library refuses."""
    m = moe_step_on(generation, sms, tokens, top_k, experts, H, I)
    if m["path"] == "routed":
        return "routed"
    gu, dn = m["plans"]
    if m["refused"]:
        return f"refused (block_m {gu.block_m}/{dn.block_m})"
    return "grouped " + "/".join(dict.fromkeys((gu.kind, dn.kind)))


def moe_grouped_with(plans, device, E=4, H=64, I=64, T=4, A=2):
    """moe_decode_grouped on a small random step with the (gate_up, down) plan pair `plans`: None when it runs, else
    the ValueError message with which it stops."""
    gp, gs = (t.to(device) for t in pack_int4_b32(torch.randn(E, 2 * I, H) * 0.1))
    dp, ds = (t.to(device) for t in pack_int4_b32(torch.randn(E, H, I) * 0.1))
    x = torch.randn(T, H).bfloat16().to(device)
    ids = torch.stack([torch.randperm(E)[:A] for _ in range(T)]).int().to(device)
    tw = torch.softmax(torch.randn(T, A), -1).to(device)
    try:
        moe_decode_grouped(x, ids, tw, gp, gs, dp, ds, plan=tuple(plans))
        return None
    except ValueError as e:
        return str(e)


def excerpt(fn, first: str, last: str | None = None) -> str:
    """The source lines of `fn` (a function or a @triton.jit kernel) from the first line containing `first`
    through the first later line containing `last` (to the end when None): what a chapter shows and tests."""
    import inspect
    lines = inspect.getsource(getattr(fn, "fn", fn)).splitlines()
    i = next((n for n, line in enumerate(lines) if first in line), None)
    if i is None:
        raise ValueError(f"first={first!r} is on no line of {getattr(fn, '__name__', fn)}'s source")
    j = len(lines) - 1 if last is None else next((n for n in range(i, len(lines)) if last in lines[n]), None)
    if j is None:
        raise ValueError(f"last={last!r} is on no line of {getattr(fn, '__name__', fn)}'s source after {first!r}")
    return "\n".join(lines[i:j + 1])
