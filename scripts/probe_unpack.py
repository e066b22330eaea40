"""The grouped tensor-core tile's loop, variant by variant: the weight unpack (notes/perf.md v45) and the scale
loads (v46, v47). Every variant gives the tree's bits; none was faster beyond 1-2 % on most rows, so none landed.

The tree's tile turns each 32-bit word of packed weights (8 nibbles) into two int8 operand registers with about
nine instructions: per nibble half a shift, a mask, the add and the xor of "(n + 0x78) ^ 0x80 = n - 8", then two
PRMTs that interleave the even-k and odd-k bytes into the k order the MMA operand wants. Variants, each the tree's
grouped_mma.py rewritten by asserted text substitutions (tune.variants):
  dec16  codes as 16 (n - 8): a nibble moved to the top of its byte with the sign bit flipped is 16 (n - 8) as an
         int8 (v41's CUDA decode), one LOP3 for the high nibbles, a shift and a LOP3 for the low ones. The block dot
         is then 16 d, exact in int32, and the activation scales are divided by 16 where they are loaded, so
         16 d * (ws * (xs / 16)) rounds as d * (ws * xs) does: same bits while ws * xs / 16 is a normal float32
         (above 2**-126; below that the tree's product was already within 4 binades of underflow).
  kord   dec16, and the weights in a kernel byte order made once at load time (`kernel_order`): in each 32-block,
         byte 4t + i holds k = 8t + i (low nibble) and k = 8t + 4 + i (high nibble), so one word's low nibbles are
         four consecutive k and its high nibbles the next four: the two operand registers need no PRMT. A lossless
         permutation of int4-b32's bytes; same bytes read.
  eord   kord's kernel on int4-b32's own bytes, the activations permuted instead: the quantiser stores code k of
         each 8-group at 8t + 4h + i (k = 8t + 2i + h: the even k, then the odd), the order in which an int4-b32
         word's low and high nibbles lie. The dot is a sum, so both operands permuted alike give the same int32
         sums; no format change (the codes are an intermediate of the step).
  sc2, sc3  the scale loads two or three steps ahead instead of one (v46). Triton's pipeliner then stops staging
         the loop (no cp.async, one TMA load in the TTGIR), so these time an unpipelined loop.
  wsT    the weight scales from a k-major copy (`kmajor_scales`, [E, KB, N] memory, made once at load time; v47).
  scp    the scale loads as plain loads in their own step and the loop as tl.range(num_stages=3), so that the
         pipeliner stages them with the dot's operands (v49).
  r96, r128  the tree's kernel with a register cap (`maxnreg`): 96 on tiles of 16 rows or more, 128 on 32-row tiles
         (v48: 4 -> 5 and 3 -> 4 programs per SM; ptxas spills a little in the loop).
Rows: the MoE step's tensor-core rows (table plans); kord, eord and wsT only where both projections run the mma tile.
Variants alternate within each round.
    PYTHONPATH=$PWD python3 scripts/probe_unpack.py $OUT       # -> $OUT/probe_v45_unpack_<card>.json
        [--variants=tree,wsT] [--rows=mixtral16,qwen332] [--tag=v47_kmajor_scales]   (the receipt's name)
    python3 scripts/probe_unpack.py --check                     # interpreter: the variants give the tree's bits
    TRITON_INTERPRET=0 python3 scripts/probe_unpack.py --sass   # compiler report (sm_90), no GPU needed
"""
import json
import os
import sys
from collections import Counter
from pathlib import Path

import torch

from int4lab.tune.variants import compiled, grouped_case, load, sub

SRC = Path(__file__).resolve().parents[1] / "int4lab" / "kernels"
GMMA = (SRC / "grouped_mma.py").read_text()
ROWS = (("mixtral", 16), ("mixtral", 32), ("qwen3", 32), ("olmoe", 32), ("mixtral", 64), ("olmoe", 64), ("qwen3", 64))
ROUNDS = 6                                   # median_ci needs 6 rounds for a 95 % interval

CODES16 = '''

@triton.jit
def _codes16(wb, SHIFT: tl.constexpr, USE_ASM: tl.constexpr):
    """uint8 packed bytes -> int8 16 * (nibble - 8) of the low (SHIFT 0) or high (SHIFT 4) nibbles: the nibble at
    the top of its byte, sign bit flipped."""
    if USE_ASM and SHIFT == 4:
        return tl.inline_asm_elementwise("lop3.b32 $0, $1, 0xF0F0F0F0, 0x80808080, 0x6A;",
                                         "=r,r", [wb], dtype=tl.int8, is_pure=True, pack=4)
    elif USE_ASM:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; shl.b32 t, $1, 4; lop3.b32 $0, t, 0xF0F0F0F0, 0x80808080, 0x6A; }",
            "=r,r", [wb], dtype=tl.int8, is_pure=True, pack=4)
    else:
        return (((wb << (4 - SHIFT)) & 0xF0) ^ 0x80).to(tl.int8, bitcast=True)


@triton.jit
def _tile('''
AS = "mask=(kb < KB)[:, None] & m_mask[None, :], other=0.0)\n"
AS_NEXT = "mask=ahead[:, None] & m_mask[None, :], other=0.0)\n"
UNPACK = ("        lo = _codes(wb, 0, USE_ASM)                                     # [NB, BN, 16] codes of even k\n"
          "        hi = _codes(wb, 4, USE_ASM)                                     # [NB, BN, 16] codes of odd k\n")
INTERLEAVE = "        w = tl.interleave(lo, hi)                                       # [NB, BN, 32] codes in k order\n"


def dec16(src):
    src = sub(src, "\n\n@triton.jit\ndef _tile(", CODES16)
    src = sub(src, AS, AS.replace("other=0.0)", "other=0.0) * 0.0625"))
    src = sub(src, AS_NEXT, AS_NEXT.replace("other=0.0)", "other=0.0) * 0.0625"))
    return sub(src, UNPACK, UNPACK.replace("_codes(", "_codes16("))


def kord(src):
    return sub(dec16(src), INTERLEAVE,
               "        lo = tl.reshape(lo, [NB, BLOCK_N, 4, 4])                        # [.., t, i]: k = 8t + i\n"
               "        hi = tl.reshape(hi, [NB, BLOCK_N, 4, 4])                        # k = 8t + 4 + i\n"
               "        w = tl.reshape(tl.permute(tl.join(lo, hi), (0, 1, 2, 4, 3)), [NB, BLOCK_N, 32])\n")


def kernel_order(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] int4-b32 -> the same nibbles in kord's byte order: per 32-block, byte 4t + i holds
    k = 8t + i (low) and k = 8t + 4 + i (high). K % 32 == 0."""
    if packed.dtype != torch.uint8 or packed.shape[-1] % 16:
        raise ValueError(f"packed must be uint8 with K/2 % 16 == 0, got {packed.dtype} {tuple(packed.shape)}")
    b = packed.reshape(*packed.shape[:-1], -1, 16)
    c = torch.stack((b & 15, b >> 4), -1).reshape(*b.shape[:-1], 4, 2, 4)      # [.., t, h, i]: k = 8t + 4h + i
    return (c[..., 0, :] | (c[..., 1, :] << 4)).reshape(packed.shape)


WSC = "    wsc = tl.load(s_rows + kb[:, None], mask=(kb < KB)[:, None] & n_mask[None, :], other=0.0)\n"
AHEAD = ("        ahead = (kb + NB < KB) & (i + 1 < TILES_PER_SPLIT)\n"
         "        asc_next = tl.load(as_rows + (kb + NB)[:, None], mask=ahead[:, None] & m_mask[None, :], other=0.0)\n"
         "        wsc_next = tl.load(s_rows + (kb + NB)[:, None], mask=ahead[:, None] & n_mask[None, :], other=0.0)\n")
ROTATE = "        asc, wsc = asc_next, wsc_next\n"


def scales_ahead(src, d):
    """The scale loads d steps ahead instead of one (v46: is the L1TEX wait of v43b the scale loads?)."""
    pre = "".join(f"    kb{j} = kb + {j} * NB\n    ahead{j} = (kb{j} < KB) & ({j} < TILES_PER_SPLIT)\n"
                  f"    asc{j} = tl.load(as_rows + kb{j}[:, None], mask=ahead{j}[:, None] & m_mask[None, :], other=0.0)\n"
                  f"    wsc{j} = tl.load(s_rows + kb{j}[:, None], mask=ahead{j}[:, None] & n_mask[None, :], other=0.0)\n"
                  for j in range(1, d))
    src = sub(src, WSC, WSC + pre)
    src = sub(src, AHEAD, AHEAD.replace("kb + NB", f"kb + {d} * NB").replace("i + 1 <", f"i + {d} <"))
    chain = ", ".join(["asc", "wsc"] + [f"asc{j}, wsc{j}" for j in range(1, d)])
    return sub(src, ROTATE, f"        {chain} = {', '.join([f'asc{j}, wsc{j}' for j in range(1, d)] + ['asc_next, wsc_next'])}\n")


def scales_piped(src):
    """The scale loads in their own step, as plain loads, and the K loop as tl.range(num_stages=3) (the sm_90 table's
    stages): Triton's pipeliner then stages them through shared memory with the dot's operands, 2 steps ahead
    (v49; in the TTGIR, 3 cp.async copies per loop instead of 1, and 1 KB more shared memory at bm16)."""
    src = sub(src, AHEAD, "")
    src = sub(src, ROTATE, "")
    src = sub(src, "        a = tl.load(a_rows",
              "        asc = tl.load(as_rows + kb[:, None], mask=live[:, None] & m_mask[None, :], other=0.0)\n"
              "        wsc = tl.load(s_rows + kb[:, None], mask=live[:, None] & n_mask[None, :], other=0.0)\n"
              "        a = tl.load(a_rows")
    return sub(src, "    for i in range(0, TILES_PER_SPLIT):\n", "    for i in tl.range(0, TILES_PER_SPLIT, num_stages=3):\n")


S_ROWS = "    s_rows = ws_ptr + e * stride_se + offs_n[None, :].to(tl.int64) * KB                       # [1, BN]\n"


def scales_kmajor(src):
    """The weight scales read from a k-major copy [E, KB, N] (`kmajor_scales`, made once at load time): a step's
    [NB, BLOCK_N] scales are NB runs of BLOCK_N contiguous fp16 instead of 8 bytes from each of BLOCK_N rows (v46's
    Nsight Compute: the row-major load fetches 4x the sectors it uses, and its wait is the loop's largest stall)."""
    src = sub(src, S_ROWS, "    s_rows = ws_ptr + e * stride_se + offs_n[None, :].to(tl.int64)   # [1, BN], k-major scales\n")
    src = sub(src, "wsc = tl.load(s_rows + kb[:, None], ", "wsc = tl.load(s_rows + kb[:, None] * N, ")
    return sub(src, "wsc_next = tl.load(s_rows + (kb + NB)[:, None], ", "wsc_next = tl.load(s_rows + (kb + NB)[:, None] * N, ")


def kmajor_scales(scales: torch.Tensor) -> torch.Tensor:
    """float16 [E, N, KB] -> the same values stored k-major ([E, KB, N] memory), viewed with the shape [E, N, KB]
    that the launcher checks (only scales_kmajor's kernel reads it correctly)."""
    return scales.transpose(-1, -2).contiguous().reshape(scales.shape)


STORE = "    tl.store(q_ptr + r * K + offs, q.to(tl.int8), mask=mask)\n"


def eo_quant(src):
    """quant.py with code k of each 8-group stored at 8t + 4h + i, k = 8t + 2i + h (a 32-block maps to itself)."""
    return sub(src, STORE, "    eo = (offs & ~7) | ((offs & 1) << 2) | ((offs >> 1) & 3)\n" + STORE.replace("+ offs,", "+ eo,"))


def eo_order(xq: torch.Tensor) -> torch.Tensor:
    """int8 codes [R, K] -> eo_quant's order."""
    k = torch.arange(xq.shape[1])
    pos = (k & ~7) | ((k & 1) << 2) | ((k >> 1) & 3)
    out = torch.empty_like(xq)
    out[:, pos] = xq
    return out


class Capped:
    """The tree's kernel launched with a register cap (Triton's `maxnreg` launch option) on tiles of `min_bm` rows
    or more, so more programs fit on an SM (v48); ptxas spills what does not fit."""
    def __init__(self, kern, cap, min_bm):
        self.kern, self.cap, self.min_bm = kern, cap, min_bm
        self.device_caches = getattr(kern, "device_caches", None)

    def __getitem__(self, grid):
        launch = self.kern[grid]

        def run(*args, **kw):
            return launch(*args, **kw, **({"maxnreg": self.cap} if kw["BLOCK_M"] >= self.min_bm else {}))
        return run


def kernels():
    from int4lab.kernels import grouped
    kord_kernel = load(kord(GMMA), "gmma_kord").grouped_mma_kernel
    out = {"tree": grouped.grouped_mma_kernel, "dec16": load(dec16(GMMA), "gmma_dec16").grouped_mma_kernel,
           "kord": kord_kernel, "eord": kord_kernel,
           "sc2": load(scales_ahead(GMMA, 2), "gmma_sc2").grouped_mma_kernel,
           "sc3": load(scales_ahead(GMMA, 3), "gmma_sc3").grouped_mma_kernel,
           "wsT": load(scales_kmajor(GMMA), "gmma_wst").grouped_mma_kernel,
           "scp": load(scales_piped(GMMA), "gmma_scp").grouped_mma_kernel,
           "r96": Capped(grouped.grouped_mma_kernel, 96, 16), "r128": Capped(grouped.grouped_mma_kernel, 128, 32)}
    only = [a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--variants=")]
    return {k: v for k, v in out.items() if not only or k in only[0]}


def quant_kernels():
    from int4lab.kernels import quant
    return {"tree": quant.quant_rows_kernel, "eo": load(eo_quant((SRC / "quant.py").read_text()), "quant_eo").quant_rows_kernel}


def use(label, kerns, qkerns):
    """Point the library at `label`'s grouped kernel and quantiser (the tree's for every label but eord)."""
    from int4lab.kernels import grouped, quant
    grouped.grouped_mma_kernel = kerns[label]
    quant.quant_rows_kernel = qkerns["eo" if label == "eord" else "tree"]


def check():
    """Interpreter: every variant gives the tree's bits (kord on kernel_order's bytes) on awkward shapes (N not a
    multiple of block_n, an expert with no rows, split-K, both block heights)."""
    os.environ["TRITON_INTERPRET"] = "1"
    from int4lab.kernels import grouped
    from int4lab.kernels.grouped import build_group_tiles, gemm_int4_b32_grouped
    from int4lab.kernels.plan import GroupedPlan
    from int4lab.format import pack_codes
    torch.manual_seed(0)
    q = torch.randint(-8, 8, (3, 5, 64))
    p = pack_codes(q)
    ko = kernel_order(p)
    assert not torch.equal(ko, p)
    k = torch.arange(32)
    t, h, i = k // 8, (k // 4) % 2, k % 4
    lo_hi = torch.stack((ko & 15, ko >> 4), -1).reshape(3, 5, 2, 16, 2)       # [.., block, byte, nibble]
    got = lo_hi[..., 4 * t + i, h].long() - 8                                         # codes in k order
    assert torch.equal(got.reshape(3, 5, 64), q), "kernel_order: byte 4t + i holds k = 8t + i and 8t + 4 + i"
    ok = True
    E, packed, scales, xq, xs, ids = grouped_case()                 # expert 1: no rows
    kerns = kernels()
    for bm, bk, sk in ((4, 128, 1), (8, 256, 2), (16, 128, 1)):
        pl = GroupedPlan(block_m=bm, block_n=32, block_k=bk, num_warps=1, num_stages=1, kind="mma", tile_major=True,
                         split_k=sk, half_tiles=bm >= 16)
        tiles = build_group_tiles(ids, E, bm)
        outs = {}
        for label, kern in kerns.items():
            grouped.grouped_mma_kernel = kern
            w = kernel_order(packed) if label == "kord" else packed
            sc = kmajor_scales(scales) if label == "wsT" else scales
            outs[label] = gemm_int4_b32_grouped(eo_order(xq) if label == "eord" else xq, xs, w, sc, tiles, plan=pl)
        grouped.grouped_mma_kernel = kerns["tree"]
        same = {k: torch.equal(o.view(torch.int16), outs["tree"].view(torch.int16)) for k, o in outs.items()}
        grouped.grouped_mma_kernel = kerns["kord"]      # the control: kord on int4-b32's own bytes must differ
        same["control_differs"] = not torch.equal(gemm_int4_b32_grouped(xq, xs, packed, scales, tiles, plan=pl),
                                                  outs["tree"])
        grouped.grouped_mma_kernel = kerns["tree"]
        print("grouped", pl, same)
        ok &= all(same.values())
    from int4lab.kernels import quant
    from int4lab.kernels.quant import quant_x_rows, swiglu_quant_rows
    qk = quant_kernels()
    x, h = torch.randn(3, 96).bfloat16(), torch.randn(3, 192).bfloat16()
    ref = (quant_x_rows(x), swiglu_quant_rows(h))
    quant.quant_rows_kernel = qk["eo"]
    got = (quant_x_rows(x), swiglu_quant_rows(h))
    quant.quant_rows_kernel = qk["tree"]
    same = all(torch.equal(eo_order(a[0]), b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ref, got))
    print("eo quantiser = the tree's codes in eo order", same, "; eo order is not the identity",
          not torch.equal(eo_order(ref[0][0]), ref[0][0]))
    ok &= same
    print("check", "passed" if ok else "FAILED")
    return 0 if ok else 1


def sass():
    """Loop instructions per K step of the table's tensor-core tiles (tree and variants, TMA weights), sm_90: the
    longest loop's opcodes, and ptxas's registers and spills (a Capped variant compiled with its cap)."""
    from int4lab.tune.resources import _tool, compile_grouped, loops, report
    import subprocess
    import tempfile
    kerns = kernels()
    out = {}
    for bm in (8, 16, 32):
        for label, fn in kerns.items():
            if label == "eord":                         # kord's kernel
                continue
            cap = fn.cap if isinstance(fn, Capped) and bm >= fn.min_bm else None
            kern = compile_grouped("mma", bm, 64, 128, 4, 1, 1, True, fn=getattr(fn, "kern", fn),
                                   w_tma="W_TMA" in GMMA, maxnreg=cap)
            with tempfile.TemporaryDirectory() as d:
                (Path(d) / "k.cubin").write_bytes(kern.asm["cubin"])
                text = subprocess.run([str(_tool("cuobjdump")), "--dump-sass", str(Path(d) / "k.cubin")],
                                      capture_output=True, text=True).stdout
            body = max(loops(text), key=len)
            c = Counter(body)
            r = report(kern)
            out[f"bm{bm} {label}"] = {"loop": len(body), "regs": r["registers"], "spill": r["spill_store_bytes"],
                                      **{op: c[op] for op in ("LOP3", "SHF", "VIADD", "IADD3", "PRMT", "IMAD", "IMMA",
                                                              "I2FP", "FMUL", "FFMA", "LDS", "LDSM", "LDL")}}
            print(f"bm{bm:2d} {label:6s}", out[f"bm{bm} {label}"], flush=True)
    return out


def rows(res, path):
    from int4lab.bench import timing
    from int4lab.bench.decide import median_ci
    from int4lab.kernels import grouped
    from int4lab.kernels.moe import moe_decode_grouped
    from int4lab.tune.sweep import grouped_probe_row
    dev = torch.device("cuda")
    l2 = timing.l2_bytes()
    kerns = kernels()
    only = [a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--rows=")]
    for model, T in ROWS:
        if only and f"{model}{T}" not in only[0]:
            continue
        torch.manual_seed(0)
        x, ids, tw, w, act, nbytes, pp = grouped_probe_row(model, T, dev, l2)
        row = {"model": model, "tokens": T, "copies": len(w), "bytes": nbytes, "plans": [str(p) for p in pp],
               "us": {}, "errors": {}}
        labels = [k for k in kerns if k not in ("kord", "eord", "wsT") or all(p.kind == "mma" for p in pp)]
        qkerns = quant_kernels()
        wk = [(kernel_order(a), b, kernel_order(c), d) for a, b, c, d in w] if "kord" in labels else None
        wt = [(a, kmajor_scales(b), c, kmajor_scales(d)) for a, b, c, d in w] if "wsT" in labels else None
        if not any(p.kind == "mma" for p in pp):
            continue
        outs = {}
        for _ in range(ROUNDS):
            for label in labels:
                if label in row["errors"]:
                    continue
                use(label, kerns, qkerns)
                ws = wk if label == "kord" else wt if label == "wsT" else w
                try:
                    outs.setdefault(label, moe_decode_grouped(x, ids, tw, *ws[0], plan=pp).clone())
                    s = timing.summarise(timing.time_calls(
                        [lambda i=i: moe_decode_grouped(x, ids, tw, *ws[i], plan=pp) for i in range(len(ws))]))
                    row["us"].setdefault(label, []).append(round(s["us"], 2))
                except Exception as e:                  # a variant that does not compile is a result too
                    row["errors"][label] = f"{type(e).__name__}: {str(e)[:300]}"
        use("tree", kerns, qkerns)
        row["same_bits"] = {k: torch.equal(o.view(torch.int16), outs["tree"].view(torch.int16)) for k, o in outs.items()}
        row["ratio_to_tree"] = {k: dict(zip(("median", "lo", "hi"), median_ci([a / b for a, b in zip(v, row["us"]["tree"])])))
                                for k, v in row["us"].items()}
        row["compiled"] = {k: compiled(kerns[k]) for k in labels if k != "eord"}
        res["rows"].append(row)
        print(model, T, row["same_bits"], {k: f"{sorted(v)[len(v) // 2]:.1f} us {row['ratio_to_tree'][k]['median']:.3f} "
                                              f"[{row['ratio_to_tree'][k]['lo']:.3f}, {row['ratio_to_tree'][k]['hi']:.3f}]"
                                           for k, v in row["us"].items()}, row["errors"], flush=True)
        Path(path).write_text(json.dumps(res, indent=1))
        del w, wk, wt
        torch.cuda.empty_cache()


def main(out_dir):
    from int4lab.receipts import provenance
    card = "h200" if "H200" in torch.cuda.get_device_name() else "h100"
    tag = ([a.split("=", 1)[1] for a in sys.argv if a.startswith("--tag=")] or ["v45_unpack"])[0]
    path = Path(out_dir) / f"probe_{tag}_{card}.json"
    res = {"provenance": provenance("python3 scripts/probe_unpack.py $OUT"), "tree_has_tma": "W_TMA" in GMMA,
           "method": f"int4lab.bench.timing (median of 20 replays) of the MoE step (moe_decode_grouped, table plans) "
                     f"per round; variants alternate within a round; {ROUNDS} rounds; ratio to the tree per round: "
                     f"median and 95 % interval (bench.decide.median_ci)", "rows": []}
    rows(res, path)


if __name__ == "__main__":
    if "--check" in sys.argv:
        sys.exit(check())
    if "--sass" in sys.argv:
        sass()
        sys.exit(0)
    sys.exit(main(sys.argv[1]))     # [--variants=tree,sc2] [--rows=mixtral16,qwen332] [--tag=v46_scales]
