"""The decode-attention kernel: q/k norm, rope, the static cache's write and attention over it, one launch.

Shape legend: B = batch, HQ = query heads, HKV = key/value heads, G = HQ / HKV (queries per KV head, padded to
GP >= 16 rows for the tensor-core dot), D = head dim, DH = D / 2 (the rope halves, padded to DHP >= 16),
C = cache slots, S = context splits, BLOCK_N = slots per loop step.

Program (g, s) of a (B * HKV, S) grid owns KV head j of sequence b (g = b * HKV + j), its G query heads and the
slots [s * SPL, min(C, (s + 1) * SPL)). Everything is held as two halves (d < DH, d >= DH), so rope's
rotate_half is a swap of registers, not a gather. The new key and value of slot `pos` (read from the layer's
length tensor inside the kernel: no host read-back, a fixed grid) are computed by every program and used in
place of the cache's row at `pos`; the program whose range holds `pos` also stores them there. So no program
reads a row another one writes. With S > 1 each program stores its partial softmax (max, sum, unnormalised
output, float32) and counts its arrival; the last of a KV head's S programs combines them in the order
s = 0..S-1 (same bits whichever arrives last) and resets its counter. The last program of the whole grid writes
length = pos + 1 (StaticCache.update's `cumulative_length.add_(1)`) and resets its counter: counters are zero
before and after a launch, so a captured graph replays with no memset.
"""
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from .epilogue import to_bf16_rne
from .norm import OUT_BF16, round_to

# q/k norm kinds (the kernel's NORM argument)
NORM_NONE, NORM_HEAD, NORM_ROW = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@triton.jit
def _inv_rms(ss, n, eps, USE_LIBDEVICE: tl.constexpr):
    v = tl.math.div_rn(ss, tl.full(ss.shape, 1.0, tl.float32) * n) + eps
    if USE_LIBDEVICE:
        return libdevice.rsqrt(v)
    else:
        return 1.0 / tl.sqrt(v)


@triton.jit
def _row_sumsq(ptr, n, NP: tl.constexpr):
    offs = tl.arange(0, NP)
    x = tl.load(ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    return tl.sum(x * x, axis=0)


@triton.jit
def _norm_rope(x1, x2, row_ptr, heads, w_ptr, cs_ptr, sn_ptr, eps, dh, dm, NH: tl.constexpr, D: tl.constexpr,
               DH: tl.constexpr, NORM: tl.constexpr, NP: tl.constexpr, USE_LIBDEVICE: tl.constexpr):
    """Halves x1, x2 [R, DHP] (float32 of bf16) of heads `heads` [R]: RMSNorm (NORM_HEAD over each head's D,
    NORM_ROW over the whole projection row of NH heads, weight index head * D + d), then rope with cos/sin,
    every product and sum rounded to bf16 as transformers' bf16 ops do."""
    if NORM != NORM_NONE:
        if NORM == NORM_HEAD:
            inv = _inv_rms(tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1), D, eps, USE_LIBDEVICE)
            w1 = tl.load(w_ptr + dh, mask=dm, other=0.0).to(tl.float32)[None, :]
            w2 = tl.load(w_ptr + DH + dh, mask=dm, other=0.0).to(tl.float32)[None, :]
        else:
            inv = _inv_rms(_row_sumsq(row_ptr, NH * D, NP), NH * D, eps, USE_LIBDEVICE)
            inv = tl.full([x1.shape[0]], 1.0, tl.float32) * inv
            wm = dm[None, :] & (heads < NH)[:, None]
            w1 = tl.load(w_ptr + heads[:, None] * D + dh[None, :], mask=wm, other=0.0).to(tl.float32)
            w2 = tl.load(w_ptr + heads[:, None] * D + DH + dh[None, :], mask=wm, other=0.0).to(tl.float32)
        x1 = round_to(w1 * round_to(x1 * inv[:, None], OUT_BF16), OUT_BF16)
        x2 = round_to(w2 * round_to(x2 * inv[:, None], OUT_BF16), OUT_BF16)
    c1 = tl.load(cs_ptr + dh, mask=dm, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cs_ptr + DH + dh, mask=dm, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sn_ptr + dh, mask=dm, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sn_ptr + DH + dh, mask=dm, other=0.0).to(tl.float32)[None, :]
    # q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-q2, q1)
    y1 = round_to(round_to(x1 * c1, OUT_BF16) - round_to(x2 * s1, OUT_BF16), OUT_BF16)
    y2 = round_to(round_to(x2 * c2, OUT_BF16) + round_to(x1 * s2, OUT_BF16), OUT_BF16)
    return y1, y2


@triton.jit
def _dot(a, b, BF16_DOT: tl.constexpr):
    """a @ b of bf16 tiles, exact products and float32 sums: the tensor cores, or (the interpreter, whose dot
    reads bf16 as integers) the same values as float32."""
    if BF16_DOT:
        return tl.dot(a, b)
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")


@triton.jit
def _split_dot(p, v, BF16_DOT: tl.constexpr):
    """p [GP, BN] float32 times v [BN, DHP] bf16 with p carried as the sum of two bf16 (relative error
    <= 2^-16 per weight), products exact, float32 sums."""
    hi = p.to(tl.bfloat16)
    lo = (p - hi.to(tl.float32)).to(tl.bfloat16)
    return _dot(hi, v, BF16_DOT) + _dot(lo, v, BF16_DOT)


@triton.jit
def decode_attention_kernel(
    # Pointers
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, kc_ptr, vc_ptr, len_ptr, mask_ptr, out_ptr,
    part_ptr, cnt_ptr,
    # Strides and sizes
    stride_q, stride_k, stride_v, stride_cs, stride_mb, stride_mc, C, scaling, eps_q, eps_k,
    # Meta-parameters
    HQ: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DH: tl.constexpr,
    DHP: tl.constexpr, NORM: tl.constexpr, QNP: tl.constexpr, KNP: tl.constexpr, BLOCK_N: tl.constexpr,
    SPL: tl.constexpr, SPLITS: tl.constexpr, HAS_MASK: tl.constexpr, USE_LIBDEVICE: tl.constexpr,
):  # USE_LIBDEVICE: compiled (libdevice rsqrt, bf16 tensor-core dots), else the interpreter
    """Module doc. q/k/v rows of sequence b at q_ptr + b * stride_q (heads contiguous, D each), cos/sin [B, D]
    rows at stride_cs, caches [B, HKV, C, D] contiguous, len int64 [], mask (HAS_MASK) uint8 [B, C] strided,
    out [B, HQ * D]; part float32 [B * HKV, S, GP, 2 * DHP + 2], cnt int32 [B * HKV + 1] zero."""
    gid = tl.program_id(0)
    s = tl.program_id(1)
    b = (gid // HKV).to(tl.int64)
    j = gid % HKV
    pos = tl.load(len_ptr)
    rows = tl.arange(0, GP)
    rm = rows < G
    heads = j * G + rows
    dh = tl.arange(0, DHP)
    dm = dh < DH
    qm = rm[:, None] & dm[None, :]
    qrow = q_ptr + b * stride_q
    q1 = tl.load(qrow + heads[:, None] * D + dh[None, :], mask=qm, other=0.0).to(tl.float32)
    q2 = tl.load(qrow + heads[:, None] * D + DH + dh[None, :], mask=qm, other=0.0).to(tl.float32)
    krow = k_ptr + b * stride_k
    k1 = tl.load(krow + j * D + dh[None, :], mask=dm[None, :], other=0.0).to(tl.float32)
    k2 = tl.load(krow + j * D + DH + dh[None, :], mask=dm[None, :], other=0.0).to(tl.float32)
    v1 = tl.load(v_ptr + b * stride_v + j * D + dh, mask=dm, other=0.0).to(tl.bfloat16)
    v2 = tl.load(v_ptr + b * stride_v + j * D + DH + dh, mask=dm, other=0.0).to(tl.bfloat16)
    cs, sn = cos_ptr + b * stride_cs, sin_ptr + b * stride_cs
    q1, q2 = _norm_rope(q1, q2, qrow, heads, qw_ptr, cs, sn, eps_q, dh, dm, HQ, D, DH, NORM, QNP, USE_LIBDEVICE)
    jj = tl.full([1], 0, tl.int32) + j
    k1, k2 = _norm_rope(k1, k2, krow, jj, kw_ptr, cs, sn, eps_k, dh, dm, HKV, D, DH, NORM, KNP, USE_LIBDEVICE)
    q1b, q2b = q1.to(tl.bfloat16), q2.to(tl.bfloat16)        # exact: already bf16 values
    k1n, k2n = tl.reshape(k1, [DHP]).to(tl.bfloat16), tl.reshape(k2, [DHP]).to(tl.bfloat16)

    base = (b * HKV + j) * C * D
    lo = s * SPL
    hi = tl.minimum(lo + SPL, C)
    mine = (pos >= lo) & (pos < hi)
    tl.store(kc_ptr + base + pos * D + dh, k1n, mask=dm & mine)
    tl.store(kc_ptr + base + pos * D + DH + dh, k2n, mask=dm & mine)
    tl.store(vc_ptr + base + pos * D + dh, v1, mask=dm & mine)
    tl.store(vc_ptr + base + pos * D + DH + dh, v2, mask=dm & mine)

    m_i = tl.full([GP], -float("inf"), tl.float32)
    l_i = tl.zeros([GP], dtype=tl.float32)
    acc1 = tl.zeros([GP, DHP], dtype=tl.float32)
    acc2 = tl.zeros([GP, DHP], dtype=tl.float32)
    for n0 in range(0, SPL, BLOCK_N):
        offs_n = lo + n0 + tl.arange(0, BLOCK_N)
        valid = (offs_n < hi) & (offs_n <= pos)
        if HAS_MASK:
            mk = tl.load(mask_ptr + b * stride_mb + offs_n * stride_mc, mask=offs_n < hi, other=0)
            valid = valid & (mk != 0)
        cur = (offs_n == pos)[:, None]
        lm = (valid & (offs_n != pos))[:, None] & dm[None, :]
        kp = kc_ptr + base + offs_n[:, None] * D + dh[None, :]
        vp = vc_ptr + base + offs_n[:, None] * D + dh[None, :]
        kt1 = tl.where(cur, k1n[None, :], tl.load(kp, mask=lm, other=0.0))
        kt2 = tl.where(cur, k2n[None, :], tl.load(kp + DH, mask=lm, other=0.0))
        vt1 = tl.where(cur, v1[None, :], tl.load(vp, mask=lm, other=0.0))
        vt2 = tl.where(cur, v2[None, :], tl.load(vp + DH, mask=lm, other=0.0))
        sc = (_dot(q1b, tl.trans(kt1), USE_LIBDEVICE) + _dot(q2b, tl.trans(kt2), USE_LIBDEVICE)) * scaling
        sc = tl.where(valid[None, :], sc, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(sc - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc1 = acc1 * alpha[:, None] + _split_dot(p, vt1, USE_LIBDEVICE)
        acc2 = acc2 * alpha[:, None] + _split_dot(p, vt2, USE_LIBDEVICE)
        m_i = m_new

    optr = out_ptr + b * (HQ * D) + heads[:, None] * D + dh[None, :]
    if SPLITS == 1:
        inv = tl.math.div_rn(tl.full([GP], 1.0, tl.float32), l_i)[:, None]
        tl.store(optr, to_bf16_rne(acc1 * inv), mask=qm)
        tl.store(optr + DH, to_bf16_rne(acc2 * inv), mask=qm)
    else:
        W: tl.constexpr = 2 * DHP + 2
        pr = part_ptr + ((gid * SPLITS + s) * GP + rows).to(tl.int64) * W
        tl.store(pr[:, None] + dh[None, :], acc1)
        tl.store(pr[:, None] + DHP + dh[None, :], acc2)
        tl.store(pr + 2 * DHP, m_i)
        tl.store(pr + 2 * DHP + 1, l_i)
        tl.debug_barrier()                      # every thread's partial is stored before the release below
        seen = tl.atomic_add(cnt_ptr + gid, 1, sem="acq_rel", scope="gpu")
        if seen == SPLITS - 1:
            mt = tl.full([GP], -float("inf"), tl.float32)
            lt = tl.zeros([GP], dtype=tl.float32)
            a1 = tl.zeros([GP, DHP], dtype=tl.float32)
            a2 = tl.zeros([GP, DHP], dtype=tl.float32)
            for t in range(SPLITS):             # fixed order: the same bits whoever arrives last
                qr = part_ptr + ((gid * SPLITS + t) * GP + rows).to(tl.int64) * W
                ms = tl.load(qr + 2 * DHP, cache_modifier=".cg")
                ls = tl.load(qr + 2 * DHP + 1, cache_modifier=".cg")
                qp = qr[:, None]
                mn = tl.maximum(mt, ms)
                msafe = tl.where(mn == -float("inf"), 0.0, mn)
                e_old, e_new = tl.exp(mt - msafe), tl.exp(ms - msafe)
                lt = lt * e_old + ls * e_new
                a1 = a1 * e_old[:, None] + tl.load(qp + dh[None, :], cache_modifier=".cg") * e_new[:, None]
                a2 = a2 * e_old[:, None] + tl.load(qp + DHP + dh[None, :], cache_modifier=".cg") * e_new[:, None]
                mt = mn
            inv = tl.math.div_rn(tl.full([GP], 1.0, tl.float32), lt)[:, None]
            tl.store(optr, to_bf16_rne(a1 * inv), mask=qm)
            tl.store(optr + DH, to_bf16_rne(a2 * inv), mask=qm)
            tl.atomic_xchg(cnt_ptr + gid, 0, sem="relaxed")     # ready for the next launch (graph replay)
    tl.debug_barrier()
    done = tl.atomic_add(cnt_ptr + tl.num_programs(0), 1, sem="acq_rel", scope="gpu")
    if done == tl.num_programs(0) * SPLITS - 1:  # every program has read pos: advance the layer's length
        tl.store(len_ptr, pos + 1)
        tl.atomic_xchg(cnt_ptr + tl.num_programs(0), 0, sem="relaxed")
