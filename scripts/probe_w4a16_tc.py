"""v39 probe: the grouped MoE step on bf16 tensor cores (W4A16), against the W4A8 tile of the table.

Why: the W4A8 tile scales every (row, column, 32-block) after its int8 MMA (I2FP, FMUL, FFMA: v24's SASS reading
gives them 96 of bm16's 216 instructions per step), a cost that grows with the rows. A W4A16 tile scales every
*weight* once while decoding it to bf16 and accumulates over the whole K inside the MMA, so its per-step work
does not grow with the rows. It changes the numerics (activations stay bf16, each weight is rounded to bf16
after its scale), so it is a measurement for the maintainers' decision, not a kernel of the library.

Variants of the weight decode (deq; none is bit-identical to any library path):
  0 exact   (nibble - 8) * scale in float32 (exact), then one rounding to bf16; Triton ops
  1 packed  bf16 arithmetic on bytes: 128 + nibble through the bf16 exponent, - 136, * bf16(scale) (two roundings)
  2 u16     the same numerics as 1, two uint16 per 32-bit register in inline PTX, four dots of K / 4 (the timed one)
Outcome (notes/perf.md v39): every variant 1.4-3.2x slower than the W4A8 tile; dropped.

    PYTHONPATH=$PWD python3 scripts/probe_w4a16_tc.py $OUT          # -> $OUT/probe_w4a16_tc_h200.json
    PYTHONPATH=$PWD python3 scripts/probe_w4a16_tc.py --check        # CPU interpreter: the kernel against torch
    TRITON_INTERPRET=0 PYTHONPATH=$PWD python3 scripts/probe_w4a16_tc.py --sass   # compiler report (sm_90, no GPU)
"""
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from int4lab._checks import interpreting
from int4lab.kernels.epilogue import finish_rows, grid_ids, to_bf16_rne
from int4lab.kernels.grouped import build_group_tiles
from int4lab.kernels.gemv import _workspace
from int4lab.kernels.quant import silu_mul


@triton.jit
def _bf16(v, RNE: tl.constexpr):
    """float32 -> bf16, round to nearest even (the interpreter's cast truncates: epilogue.to_bf16_rne there)."""
    if RNE:
        return to_bf16_rne(v)
    else:
        return v.to(tl.bfloat16)


@triton.jit
def _deq(wb, s, PACKED: tl.constexpr, RNE: tl.constexpr):
    """uint8 [BN, NB, 16] codes, float16 scales [BN, NB] -> bf16 (low nibbles, high nibbles) [BN, NB, 16]."""
    if PACKED:
        sb = s.to(tl.bfloat16)[:, :, None]
        lo = ((wb & 15).to(tl.uint16) | 0x4300).to(tl.bfloat16, bitcast=True)      # 128 + nibble, exact
        hi = ((wb >> 4).to(tl.uint16) | 0x4300).to(tl.bfloat16, bitcast=True)
        c136 = tl.full(lo.shape, 0x4308, tl.uint16).to(tl.bfloat16, bitcast=True)    # 136.0 in bf16
        return (lo - c136) * sb, (hi - c136) * sb
    else:
        sf = s.to(tl.float32)[:, :, None]
        lo = ((wb & 15).to(tl.int32) - 8).to(tl.float32) * sf
        hi = ((wb >> 4).to(tl.int32) - 8).to(tl.float32) * sf
        return _bf16(lo, RNE), _bf16(hi, RNE)


@triton.jit
def _deq_u16(w, sb):
    """uint16 [BN, C] (4 nibbles: k = 4 c + 0..3), bf16 scales [BN, C] -> four bf16 [BN, C], k = 4 c + j.
    Two uint16 per 32-bit register: (w >> 4 j) & 0x000F000F | 0x43004300 is the bf16 pair 128 + nibble j of
    both; - 136 is exact; * bf16(scale) rounds (two roundings in all: this variant's numerics)."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 t, u, c; mov.b32 c, 0x43084308; "
        "lop3.b32 t, $4, 0x000F000F, 0x43004300, 0xEA; sub.rn.bf16x2 t, t, c; mul.rn.bf16x2 $0, t, $5; "
        "shr.u32 u, $4, 4; lop3.b32 t, u, 0x000F000F, 0x43004300, 0xEA; sub.rn.bf16x2 t, t, c; mul.rn.bf16x2 $1, t, $5; "
        "shr.u32 u, $4, 8; lop3.b32 t, u, 0x000F000F, 0x43004300, 0xEA; sub.rn.bf16x2 t, t, c; mul.rn.bf16x2 $2, t, $5; "
        "shr.u32 u, $4, 12; lop3.b32 t, u, 0x000F000F, 0x43004300, 0xEA; sub.rn.bf16x2 t, t, c; mul.rn.bf16x2 $3, t, $5; }",
        "=r,=r,=r,=r,r,r", [w, sb], dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16), is_pure=True,
        pack=2)


@triton.jit
def _xpiece(ptrs, mask, K, SWIGLU: tl.constexpr, RNE: tl.constexpr):
    """bf16 activations at ptrs (SWIGLU: silu(gate at ptrs) * (up at ptrs + K), rounded to bf16)."""
    if SWIGLU:
        g = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(ptrs + K, mask=mask, other=0.0).to(tl.float32)
        return _bf16(silu_mul(g, u), RNE)
    else:
        return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def grouped_w4a16_kernel(x_ptr, w_ptr, ws_ptr, order_ptr, row0_ptr, rows_ptr, group_ptr, out_ptr, part_ptr, cnt_ptr,
                         tw_ptr, L, N, E, stride_x, stride_we, KH, stride_se, KB, stride_wu, KU,
                         ROWS_PER_X: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr,
                         TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         HAS_W: tl.constexpr, TILE_MAJOR: tl.constexpr, PACKED: tl.constexpr,
                         SWIGLU: tl.constexpr, DOT_F32: tl.constexpr,
                         MMA_SYNC: tl.constexpr = False):
    """grouped_mma_kernel's grid and epilogue; x bf16 [*, K] (SWIGLU: [*, 2K] gate | up, silu(g) * u rounded
    to bf16 in the prologue), weights decoded to bf16, one bf16 dot per step of BLOCK_K (two: even / odd k)."""
    pid_n, tile, split = grid_ids(TILE_MAJOR)
    n_rows = tl.load(rows_ptr + tile)
    if n_rows > 0:
        g = tl.load(group_ptr + tile).to(tl.int64)
        valid = g < E
        e = tl.where(valid, g, 0)
        row0 = tl.load(row0_ptr + tile)
        NB: tl.constexpr = BLOCK_K // 32
        offs_m = tl.arange(0, BLOCK_M)
        m_mask = offs_m < n_rows
        r = tl.load(order_ptr + row0 + offs_m, mask=m_mask, other=0)
        xr = (r // ROWS_PER_X).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < N
        offs_b = tl.arange(0, NB)
        offs_h = tl.arange(0, 16)
        offs_k2 = tl.arange(0, BLOCK_K // 2)
        x_rows = x_ptr + xr[:, None] * stride_x                                                   # [BM, 1]
        w_rows = w_ptr + e * stride_we + offs_n[:, None, None].to(tl.int64) * KH + offs_h[None, None, :]
        offs_c = tl.arange(0, BLOCK_K // 4)
        offs_u = tl.arange(0, 8)
        # uint16 offsets from arguments (KU = K / 4 per row), so the compiler knows their alignment: 16-byte loads
        wu_rows = (w_ptr.to(tl.pointer_type(tl.uint16)) + e * stride_wu
                   + offs_n[:, None, None].to(tl.int64) * KU + offs_u[None, None, :])                  # [BN, 1, 8]
        s_rows = ws_ptr + e * stride_se + offs_n[:, None].to(tl.int64) * KB
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for i in range(0, TILES_PER_SPLIT):
            t = split * TILES_PER_SPLIT + i
            kb = t * NB + offs_b
            live = kb < KB
            s = tl.load(s_rows + kb[None, :], mask=n_mask[:, None] & live[None, :], other=0.0)
            if PACKED == 2:
                wu = tl.load(wu_rows + kb[None, :, None] * 8, mask=n_mask[:, None, None] & live[None, :, None], other=0)
                sb = tl.broadcast_to(s.to(tl.bfloat16)[:, :, None], [BLOCK_N, NB, 8])
                q0, q1, q2, q3 = _deq_u16(tl.reshape(wu, [BLOCK_N, BLOCK_K // 4]),
                                          tl.reshape(sb, [BLOCK_N, BLOCK_K // 4]))
                xk = x_rows + t * BLOCK_K + 4 * offs_c[None, :]
                xm = m_mask[:, None] & (t * BLOCK_K + 4 * offs_c < KB * 32)[None, :]
                K = KB * 32
                # four dots of K = BLOCK_K / 4, one per nibble position j: k = 4 c + j on both sides
                if MMA_SYNC:    # a batch of one: Triton lowers a 3-D dot to mma.sync, not wgmma
                    a3 = tl.reshape(acc, [1, BLOCK_N, BLOCK_M])
                    a3 = tl.dot(tl.reshape(q0, [1, BLOCK_N, BLOCK_K // 4]),
                                tl.reshape(tl.trans(_xpiece(xk, xm, K, SWIGLU, DOT_F32)), [1, BLOCK_K // 4, BLOCK_M]), a3)
                    a3 = tl.dot(tl.reshape(q1, [1, BLOCK_N, BLOCK_K // 4]),
                                tl.reshape(tl.trans(_xpiece(xk + 1, xm, K, SWIGLU, DOT_F32)), [1, BLOCK_K // 4, BLOCK_M]), a3)
                    a3 = tl.dot(tl.reshape(q2, [1, BLOCK_N, BLOCK_K // 4]),
                                tl.reshape(tl.trans(_xpiece(xk + 2, xm, K, SWIGLU, DOT_F32)), [1, BLOCK_K // 4, BLOCK_M]), a3)
                    a3 = tl.dot(tl.reshape(q3, [1, BLOCK_N, BLOCK_K // 4]),
                                tl.reshape(tl.trans(_xpiece(xk + 3, xm, K, SWIGLU, DOT_F32)), [1, BLOCK_K // 4, BLOCK_M]), a3)
                    acc = tl.reshape(a3, [BLOCK_N, BLOCK_M])
                else:
                    acc = tl.dot(q0, tl.trans(_xpiece(xk, xm, K, SWIGLU, DOT_F32)), acc)
                    acc = tl.dot(q1, tl.trans(_xpiece(xk + 1, xm, K, SWIGLU, DOT_F32)), acc)
                    acc = tl.dot(q2, tl.trans(_xpiece(xk + 2, xm, K, SWIGLU, DOT_F32)), acc)
                    acc = tl.dot(q3, tl.trans(_xpiece(xk + 3, xm, K, SWIGLU, DOT_F32)), acc)
            else:
                wb = tl.load(w_rows + kb[None, :, None] * 16, mask=n_mask[:, None, None] & live[None, :, None], other=0)
                k_even = t * BLOCK_K + 2 * offs_k2
                km = (k_even < KB * 32)[None, :] & m_mask[:, None]
                if SWIGLU:
                    K = KB * 32
                    ge = tl.load(x_rows + k_even[None, :], mask=km, other=0.0).to(tl.float32)
                    go = tl.load(x_rows + k_even[None, :] + 1, mask=km, other=0.0).to(tl.float32)
                    ue = tl.load(x_rows + K + k_even[None, :], mask=km, other=0.0).to(tl.float32)
                    uo = tl.load(x_rows + K + k_even[None, :] + 1, mask=km, other=0.0).to(tl.float32)
                    xe = _bf16(silu_mul(ge, ue), DOT_F32)
                    xo = _bf16(silu_mul(go, uo), DOT_F32)
                else:
                    xe = tl.load(x_rows + k_even[None, :], mask=km, other=0.0)
                    xo = tl.load(x_rows + k_even[None, :] + 1, mask=km, other=0.0)
                lo, hi = _deq(wb, s, PACKED, DOT_F32)
                if DOT_F32:     # the CPU interpreter's bf16 tl.dot reads the raw bits: same values in float32
                    lo, hi, xe, xo = lo.to(tl.float32), hi.to(tl.float32), xe.to(tl.float32), xo.to(tl.float32)
                acc = tl.dot(tl.reshape(lo, [BLOCK_N, BLOCK_K // 2]), tl.trans(xe), acc)
                acc = tl.dot(tl.reshape(hi, [BLOCK_N, BLOCK_K // 2]), tl.trans(xo), acc)
        finish_rows(tl.trans(acc), valid, r, m_mask, out_ptr, part_ptr, cnt_ptr, tw_ptr, split, L, N, pid_n,
                    tl.cdiv(N, BLOCK_N), offs_n, n_mask, SPLIT_K, TOPK, HAS_W)


def grouped_w4a16(x, packed, scales, tiles, *, rows_per_x=1, topk_w=None, swiglu=False, block_n=64, block_k=128,
                  split_k=1, num_warps=4, num_stages=3, packed_deq=False, mma_sync=False):
    """bf16 [L, N] (or [L / A, N] combined with topk_w) = rows of x (bf16) times their experts, W4A16."""
    E, N, K = packed.shape[0], packed.shape[1], packed.shape[2] * 2
    L = tiles.order.shape[0]
    A = topk_w.shape[1] if topk_w is not None else 1
    dev = x.device
    out = torch.empty(L // A, N, dtype=torch.bfloat16, device=dev)
    n_tiles = triton.cdiv(N, block_n)
    if split_k * A > 1:
        part, cnt = _workspace(dev, split_k * L * N, (L // A) * n_tiles)
    else:
        part = cnt = out
    T = tiles.row0.shape[0]
    grid = (T, split_k, n_tiles)
    grouped_w4a16_kernel[grid](
        x, packed, scales, tiles.order, tiles.row0, tiles.rows, tiles.group, out, part, cnt,
        topk_w if topk_w is not None else out, L, N, E, x.stride(0), N * K // 2, K // 2, N * K // 32, K // 32,
        N * K // 4, K // 4,
        ROWS_PER_X=rows_per_x, TILES_PER_SPLIT=triton.cdiv(triton.cdiv(K, block_k), split_k), SPLIT_K=split_k,
        TOPK=A, BLOCK_M=max(16, tiles.block_m), BLOCK_N=block_n, BLOCK_K=block_k, HAS_W=topk_w is not None,
        TILE_MAJOR=True, PACKED=packed_deq, SWIGLU=swiglu, DOT_F32=interpreting(), MMA_SYNC=mma_sync, num_warps=num_warps, num_stages=num_stages)
    return out


@triton.jit
def swiglu_rows_kernel(h_ptr, a_ptr, I, BLOCK: tl.constexpr, RNE: tl.constexpr):
    """a [L, I] bf16 = silu(h[:, :I]) * h[:, I:], in float32, one rounding (h bf16 [L, 2I])."""
    r = tl.program_id(0).to(tl.int64)
    off = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = off < I
    g = tl.load(h_ptr + r * 2 * I + off, mask=m, other=0.0).to(tl.float32)
    u = tl.load(h_ptr + r * 2 * I + I + off, mask=m, other=0.0).to(tl.float32)
    tl.store(a_ptr + r * I + off, _bf16(silu_mul(g, u), RNE), mask=m)


def moe_w4a16(x, ids, tw, gu_p, gu_s, dn_p, dn_s, *, block_m=16, deq=0, block_n=64, block_k=128, num_stages=3,
              fused_swiglu=True, mma_sync=False):
    """The grouped MoE step in W4A16 after the routing: gate_up; then down with SwiGLU in its prologue
    (fused_swiglu) or a SwiGLU launch first; the top-k combine in down's epilogue. deq: 0 exact, 1 packed
    (bytes), 2 packed (uint16 pairs, inline PTX)."""
    A = ids.shape[1]
    tiles = build_group_tiles(ids, gu_p.shape[0], block_m)
    kw = dict(packed_deq=deq, block_n=block_n, block_k=block_k, num_stages=num_stages, mma_sync=mma_sync)
    h = grouped_w4a16(x, gu_p, gu_s, tiles, rows_per_x=A, **kw)
    if fused_swiglu:
        return grouped_w4a16(h, dn_p, dn_s, tiles, topk_w=tw, swiglu=True, **kw)
    L, I = h.shape[0], h.shape[1] // 2
    a = torch.empty(L, I, dtype=torch.bfloat16, device=h.device)
    swiglu_rows_kernel[(L, triton.cdiv(I, 1024))](h, a, I, BLOCK=1024, RNE=interpreting(), num_warps=4)
    return grouped_w4a16(a, dn_p, dn_s, tiles, topk_w=tw, **kw)


def moe_w4a16_ref(x, ids, tw, gu_p, gu_s, dn_p, dn_s, packed_deq=False):
    """float32 [T, H]: the probe's numerics in torch (float64 sums on the CPU, float32 on a GPU)."""
    from int4lab.format import dequant_int4_ref
    f = torch.float64 if x.device.type == "cpu" else torch.float32

    def deq(p, s, N, K):
        if packed_deq:
            codes = dequant_int4_ref(p, torch.ones_like(s), N, K)                       # nibble - 8
            return (codes.bfloat16() * s.bfloat16().repeat_interleave(32, dim=1)).to(f)
        return dequant_int4_ref(p, s, N, K).bfloat16().to(f)

    ids, tw = ids.long(), tw.to(f)
    H, I = x.shape[1], gu_p.shape[1] // 2
    out = torch.zeros(x.shape[0], H, dtype=f, device=x.device)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = (deq(gu_p[e], gu_s[e], 2 * I, H) @ x[t].to(f)).float().bfloat16().float()
            a = (torch.nn.functional.silu(h[:I]) * h[I:]).bfloat16().to(f)
            y = (deq(dn_p[e], dn_s[e], H, I) @ a).float().bfloat16().to(f)
            out[t] += tw[t, j] * y
    return out.float()


def check():
    """CPU interpreter: both decodes against their torch numerics on an awkward routing (a zero-row expert,
    an expert with more rows than a tile)."""
    from int4lab.tune.sweep import dense_weights
    torch.manual_seed(0)
    E, H, I, T, A = 5, 64, 96, 7, 2
    gu, dn = dense_weights(2 * I, H, E, "cpu"), dense_weights(H, I, E, "cpu")
    x = torch.randn(T, H).bfloat16()
    ids = torch.tensor([[0, 1], [1, 3], [1, 0], [3, 1], [1, 4], [0, 1], [1, 3]], dtype=torch.int32)
    tw = torch.rand(T, A)
    # the interpreter's bf16 arithmetic reads raw bits and it cannot run PTX: the packed decodes are checked
    # on the GPU (the probe's "err")
    for fused in (True, False):
        y = moe_w4a16(x, ids, tw, *gu, *dn, fused_swiglu=fused).float()
        ref = moe_w4a16_ref(x, ids, tw, *gu, *dn)
        err = ((y - ref).abs().max() / ref.abs().max()).item()
        print("exact, fused swiglu" if fused else "exact, swiglu launch", "max rel err", err)
        assert err < 5e-3, err


def main(out_dir):
    from int4lab.bench import timing
    from int4lab.kernels.moe import moe_decode_grouped
    from int4lab.kernels.plan import grouped_plan
    from int4lab.receipts import provenance
    from int4lab.shapes import MODELS
    from int4lab.tune.sweep import moe_setup, summarise, time_calls
    dev = torch.device("cuda")
    res = {"probe": "v39 grouped MoE step, W4A16 on bf16 tensor cores vs the table's W4A8 tile",
           "provenance": provenance(command="scripts/probe_w4a16_tc.py"), "rows": []}
    path = Path(out_dir, "probe_w4a16_tc_h200.json")
    rows = [("mixtral", 8), ("mixtral", 16), ("mixtral", 32), ("mixtral", 64), ("olmoe", 16), ("olmoe", 32),
            ("olmoe", 64), ("qwen3", 16), ("qwen3", 32), ("qwen3", 64)]
    for model, tokens in rows:
        m = MODELS[model]
        x, ids, tw, w, act, nbytes = moe_setup(m, tokens, dev, 60 * 2**20)
        L = tokens * m.top_k
        bm = grouped_plan(2 * m.intermediate, m.hidden, L, m.n_experts, dev).block_m
        bm16 = max(16, bm)
        big = L / min(m.n_experts, L) >= 16
        variants = {
            "w4a8_table": lambda i: moe_decode_grouped(x, ids, tw, *w[i]),
            "w4a16_exact_bn64": lambda i: moe_w4a16(x, ids, tw, *w[i], block_m=bm16, fused_swiglu=False),
            "w4a16_u16_bn64": lambda i: moe_w4a16(x, ids, tw, *w[i], block_m=bm16, deq=2, fused_swiglu=False),
            "w4a16_u16_bn128": lambda i: moe_w4a16(x, ids, tw, *w[i], block_m=bm16, deq=2, block_n=128,
                                                   fused_swiglu=False),
            "w4a16_u16_bn128_bk256": lambda i: moe_w4a16(x, ids, tw, *w[i], block_m=bm16, deq=2, block_n=128,
                                                         block_k=256, fused_swiglu=False),
        }
        if big:
            variants["w4a16_u16_bn128_bm32"] = lambda i: moe_w4a16(x, ids, tw, *w[i], block_m=32, deq=2, block_n=128,
                                                                   fused_swiglu=False)
        ref = moe_w4a16_ref(x[:2], ids[:2], tw[:2], *w[0])      # the first 2 tokens
        row = {"model": model, "tokens": tokens, "n_active": act, "bytes_int4_b32": nbytes, "copies": len(w),
               "block_m_table": bm, "us": {}, "err": {}}
        for label, f in variants.items():
            try:
                y = f(0)
                torch.cuda.synchronize()
                if ref is not None:                 # w4a8_table: how far the W4A8 numerics lie from W4A16's
                    pk = "u16" in label
                    r2 = moe_w4a16_ref(x[:2], ids[:2], tw[:2], *w[0], packed_deq=pk) if pk else ref
                    row["err"][label] = float((y[:2].float() - r2).abs().max() / r2.abs().max())
            except Exception as exc:              # a variant that does not compile is recorded, not fatal
                row["us"][label] = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
                continue
        for _ in range(2):                        # alternate, so a drift of the GPU hits every variant alike
            for label, f in variants.items():
                if isinstance(row["us"].get(label), str):
                    continue
                s = summarise(time_calls([lambda i=i, f=f: f(i) for i in range(len(w))]))
                row["us"].setdefault(label, []).append([round(s["us"], 2), round(s["p10_us"], 2),
                                                        round(s["p90_us"], 2)])
        res["rows"].append(row)
        print(model, tokens, {k: (v if isinstance(v, str) else [a[0] for a in v]) for k, v in row["us"].items()},
              row["err"], flush=True)
        path.write_text(json.dumps(res, indent=1))
        del x, ids, tw, w
        torch.cuda.empty_cache()


def sass_report():
    """The compiler report of notes/perf.md v39: instructions in the K loop (the backward branch's body) and
    registers per variant, compiled for sm_90 without a GPU (bn64 bk128 unless named)."""
    import subprocess
    import tempfile
    from collections import Counter
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from int4lab.tune import resources
    sig = {"x_ptr": "*bf16", "w_ptr": "*u8", "ws_ptr": "*fp16", "order_ptr": "*i32", "row0_ptr": "*i32",
           "rows_ptr": "*i32", "group_ptr": "*i32", "out_ptr": "*bf16", "part_ptr": "*fp32", "cnt_ptr": "*i32",
           "tw_ptr": "*fp32", "L": "i32", "N": "i32", "E": "i32", "stride_x": "i32", "stride_we": "i32", "KH": "i32",
           "stride_se": "i32", "KB": "i32", "stride_wu": "i32", "KU": "i32"}
    aligned = [k for k, t in sig.items() if t.startswith("*")] + ["stride_x", "N", "stride_we", "KH", "stride_se",
                                                                   "KB", "stride_wu", "KU"]
    variants = {"exact bm16": (16, 64, 0, False, False), "packed bytes bm16": (16, 64, 1, False, False),
                "u16 bm16": (16, 64, 2, False, False), "u16 bm16 bn128": (16, 128, 2, False, False),
                "u16 bm32": (32, 64, 2, False, False), "u16 bm16, SwiGLU prologue": (16, 64, 2, True, False),
                "u16 bm16, mma.sync": (16, 64, 2, False, True), "u16 bm32 bn128, mma.sync": (32, 128, 2, False, True)}
    for label, (bm, bn, deq, swiglu, mma_sync) in variants.items():
        cst = {"ROWS_PER_X": 1, "TILES_PER_SPLIT": 2, "SPLIT_K": 1, "TOPK": 1, "BLOCK_M": bm, "BLOCK_N": bn,
               "BLOCK_K": 128, "HAS_W": False, "TILE_MAJOR": True, "PACKED": deq, "SWIGLU": swiglu, "DOT_F32": False,
               "MMA_SYNC": mma_sync}
        full = {**sig, **{k: "constexpr" for k in cst}}
        names = list(full)
        try:
            k = triton.compile(ASTSource(fn=grouped_w4a16_kernel, signature=full, constexprs=cst,
                                         attrs={(names.index(a),): [["tt.divisibility", 16]] for a in aligned}),
                               target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
        except Exception as exc:              # the first packed layouts crashed Triton's dot-operand pass
            print(f"{label:28s} failed to compile: {type(exc).__name__}")
            continue
        with tempfile.TemporaryDirectory() as d:
            Path(d, "k.cubin").write_bytes(k.asm["cubin"])
            sass = subprocess.run([str(resources._tool("cuobjdump")), "--dump-sass", str(Path(d, "k.cubin"))],
                                  capture_output=True, text=True).stdout
        loops = [(len(body), dict(Counter(body).most_common(6))) for body in resources.loops(sass)]
        rep = resources.report(k)
        print(f"{label:28s} regs {rep['registers']:3d} spills {rep['spill_store_bytes']:4d}  K loop: {loops}")


if __name__ == "__main__":
    if "--check" in sys.argv:
        check()
    elif "--sass" in sys.argv:
        sass_report()
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/out"))
