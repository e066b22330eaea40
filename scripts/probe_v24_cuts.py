"""Which of v24's cuts made the tensor-core tile slower at 16 and 32 rows (notes/perf.md v24, v26)? Each cut
alone, built at run time from two sources by exact text substitutions (each asserted to match once):
  prev        the kernel before v24 (diag/grouped_mma_prev.py: commit 69cd54e's grouped_mma.py, carried, with
              unused EVEN_K / HALF_TILES parameters so the launcher can call it)
  tree        v24: 16 x codes, both operands in word order, unmasked loads where K splits evenly, the _tile body
  tree_masked v24 with the masked loads everywhere (EVEN_K ignored)
  refactor    the _tile body only: v24 with both decode cuts undone (codes n - 8, interleave, no 1/16)
  codes16     prev with 16 x codes only (still interleaved, masked)
  order       v24 with codes n - 8 (word order, unmasked where even)
`--set=v30` rewrites the kernel of commit 2fa94f8's tree, where it ran (its "prev" is that tree's kernel: the
loop's loads pipelined by tl.range, or the scale loads issued a step ahead; the latter is the kernel since v30). The sets other than `final` (v28) and `v30` rewrite the v24 kernel: they run on the tree of commit 5e98f8e, where
int4lab/kernels/grouped_mma.py is v24's (on a later tree their substitutions fail by assertion).
Per (model, tokens): the grouped MoE step with the table's plans, variants alternating, twice, same bits
checked; the bench's routing and timer, weights rotated past L2.
    PYTHONPATH=$PWD python3 scripts/probe_v24_cuts.py $OUT            # timing -> $OUT/probe_v24_cuts_h200.json
    ncu ... python3 scripts/probe_v24_cuts.py --ncu                   # one gate_up launch per variant, profiled
--set=leave_out (v26b) times the previous kernel with one of its loop's loads left out instead (x, x's scales,
the weights' scales, both scales, all three; the bits differ, so only the time is kept):
    PYTHONPATH=$PWD python3 scripts/probe_v24_cuts.py $OUT --set=leave_out   # -> probe_v26b_leave_out_h200.json
"""
import dataclasses
import json
import re
import sys
from pathlib import Path

import torch

from int4lab.bench import timing
from int4lab.kernels import grouped
from int4lab.kernels.moe import moe_decode_grouped
from int4lab.kernels.plan import grouped_plan
from int4lab.receipts import provenance
from int4lab.shapes import MODELS
from int4lab.tune import variants
from int4lab.tune.sweep import grouped_probe_row, moe_setup

sub = variants.sub
compiled = variants.compiled

PREV = Path("diag/grouped_mma_prev.py").read_text()
TREE = Path("int4lab/kernels/grouped_mma.py").read_text()


def fn_def(src, name):
    """The text of `@triton.jit def name` up to the next top-level definition."""
    m = re.search(rf"@triton\.jit\ndef {name}\(.*?(?=\n\n\n)", src, re.S)
    assert m, name
    return m.group(0)


def undo_codes16(src):
    src = sub(src, "@triton.jit\ndef _codes16", fn_def(PREV, "_codes") + "\n\n\n@triton.jit\ndef _codes16")
    src = sub(src, "lo = _codes16(wb, 0, USE_ASM)", "lo = _codes(wb, 0, USE_ASM)")
    src = sub(src, "hi = _codes16(wb, 4, USE_ASM)", "hi = _codes(wb, 4, USE_ASM)")
    return sub(src, "y = 0.0625 * fold_blocks(", "y = fold_blocks(")


def undo_order(src):
    src = sub(src, "w = _word_order(lo, hi, NB, BLOCK_N)", "w = tl.interleave(lo, hi)")
    return sub(src, "a = _x_word_order(a, NB, BLOCK_M)", "pass")


def masked(src):
    return sub(src, "        if EVEN_K:      #", "        if False:      #")


def codes16_on_prev(src):
    src = sub(src, "@triton.jit\ndef grouped_mma_kernel", fn_def(TREE, "_codes16") + "\n\n\n@triton.jit\ndef grouped_mma_kernel")
    src = sub(src, "lo = _codes(wb, 0, USE_ASM)", "lo = _codes16(wb, 0, USE_ASM)")
    src = sub(src, "hi = _codes(wb, 4, USE_ASM)", "hi = _codes16(wb, 4, USE_ASM)")
    return sub(src, "y = fold_blocks(", "y = 0.0625 * fold_blocks(")


A_LOAD = "a = tl.load(a_rows + kb[:, None, None] * 32, mask=live[:, None, None] & m_mask[None, :, None], other=0)"
AS_LOAD = "asc = tl.load(as_rows + kb[:, None], mask=live[:, None] & m_mask[None, :], other=0.0)"
WS_LOAD = "wsc = tl.load(s_rows + kb[:, None], mask=live[:, None] & n_mask[None, :], other=0.0).to(tl.float32)"


def no_x(src):
    """x loaded once before the loop (the first step's blocks reused): the loop reads no x."""
    src = sub(src, "        for i in range(0, TILES_PER_SPLIT):",
              "        a0 = tl.load(a_rows + offs_b[:, None, None] * 32, mask=m_mask[None, :, None], other=0)\n"
              "        for i in range(0, TILES_PER_SPLIT):")
    return sub(src, A_LOAD, "a = a0")


def no_asc(src):
    return sub(src, AS_LOAD, "asc = tl.full([NB, BLOCK_M], 1.0, tl.float32)")


def no_wsc(src):
    return sub(src, WS_LOAD, "wsc = tl.full([NB, BLOCK_N], 1.0, tl.float32)")


def hint(src, load, **kw):
    """A cache hint on one of the loop's scale loads (same bits)."""
    args = "".join(f", {k}={v!r}" for k, v in kw.items())
    return sub(src, load, load.replace(", other=0.0)", f", other=0.0{args})"))


def dead_rows_read(src):
    """x and its scales loaded for the tile's dead rows too (their order entry is 0: x row 0), as v24 does."""
    src = sub(src, A_LOAD, A_LOAD.replace("live[:, None, None] & m_mask[None, :, None]", "live[:, None, None]"))
    return sub(src, AS_LOAD, AS_LOAD.replace("live[:, None] & m_mask[None, :]", "live[:, None]"))


def n_clamped(src):
    """Weight and scale addresses from min(n, N - 1), as v24 computes them (the masks kept)."""
    src = sub(src, "offs_n[None, :, None].to(tl.int64) * KH", "tl.minimum(offs_n, N - 1)[None, :, None].to(tl.int64) * KH")
    return sub(src, "offs_n[None, :].to(tl.int64) * KB", "tl.minimum(offs_n, N - 1)[None, :].to(tl.int64) * KB")


def rows_masked(src):
    """v24 with the tile's dead rows masked out of the x and x-scale loads again (not read), EVEN_K or not."""
    src = sub(src, "a = tl.load(a_rows + kb[:, None, None] * 32)\n",
              "a = tl.load(a_rows + kb[:, None, None] * 32, mask=m_mask[None, :, None], other=0)\n")
    src = sub(src, "asc = tl.load(as_rows + kb[:, None])\n", "asc = tl.load(as_rows + kb[:, None], mask=m_mask[None, :], other=0.0)\n")
    src = sub(src, "a = tl.load(a_rows + kb[:, None, None] * 32, mask=live[:, None, None], other=0)",
              "a = tl.load(a_rows + kb[:, None, None] * 32, mask=live[:, None, None] & m_mask[None, :, None], other=0)")
    return sub(src, "asc = tl.load(as_rows + kb[:, None], mask=live[:, None], other=0.0)",
               "asc = tl.load(as_rows + kb[:, None], mask=live[:, None] & m_mask[None, :], other=0.0)")


SETS = {  # v26: v24's cuts one at a time
        "cuts": lambda: {"prev": PREV, "tree": TREE, "tree_masked": masked(TREE),
                         "refactor": undo_order(undo_codes16(TREE)), "codes16": codes16_on_prev(PREV),
                         "order": undo_codes16(TREE)},
        # v26b: the previous kernel with one of its loop's loads left out (timing only: the bits differ)
        "leave_out": lambda: {"prev": PREV, "no_x": no_x(PREV), "no_asc": no_asc(PREV), "no_wsc": no_wsc(PREV),
                              "no_scales": no_wsc(no_asc(PREV)), "no_x_no_scales": no_x(no_wsc(no_asc(PREV)))},
        # v26c: the previous kernel with its scale loads asked to stay in L1 / L2 (same bits)
        "hints": lambda: {"prev": PREV, "wsc_evict_last": hint(PREV, WS_LOAD, eviction_policy="evict_last"),
                          "scales_evict_last": hint(hint(PREV, WS_LOAD, eviction_policy="evict_last"), AS_LOAD,
                                                    eviction_policy="evict_last"),
                          "scales_ca": hint(hint(PREV, WS_LOAD, cache_modifier=".ca"), AS_LOAD, cache_modifier=".ca")},
        # v26d: the previous kernel with one part of v24's _tile body each (same bits)
        "parts": lambda: {"prev": PREV, "dead_rows_read": dead_rows_read(PREV), "n_clamped": n_clamped(PREV),
                          "refactor": undo_order(undo_codes16(TREE))},
        # v27: v24 and v25 with the dead rows not read; "+half" runs the table's plans with half_tiles (block_m
        # 16 where the table has 8)
        "v27": lambda: {"prev": PREV, "rows_masked": rows_masked(TREE), "rows_masked+half": rows_masked(TREE),
                        "codes16": codes16_on_prev(PREV)},
        # v28: the landed kernel (v27's half loops on the previous decode) against the previous one, both under
        # the table's plans (which now ask for half loops; the previous kernel ignores the flag)
        "final": lambda: {"prev": PREV, "tree": TREE}}
AS_NEXT = ("        asc = tl.load(as_rows + kb[:, None], mask=live[:, None] & m_mask[None, :], other=0.0)\n", "")
WS_NEXT = ("        wsc = tl.load(s_rows + kb[:, None], mask=live[:, None] & n_mask[None, :], other=0.0).to(tl.float32)\n", "")


def staged(src, stages):
    """v30: the K loop as tl.range(num_stages=stages): Triton then pipelines every load of the loop through
    shared memory (cp.async), the scale loads included, not only the dot's operands (same bits)."""
    return sub(src, "    for i in range(0, TILES_PER_SPLIT):", f"    for i in tl.range(0, TILES_PER_SPLIT, num_stages={stages}):")


def scales_ahead(src):
    """v30: both scale loads issued one step ahead into registers (same bits)."""
    src = sub(src, *AS_NEXT)
    src = sub(src, *WS_NEXT)
    src = sub(src, "    for i in range(0, TILES_PER_SPLIT):\n        kb = (split * TILES_PER_SPLIT + i) * NB + offs_b"
                   "                                      # [NB]\n        live = kb < KB\n",
              "    kb0 = split * TILES_PER_SPLIT * NB + offs_b\n"
              "    asc = tl.load(as_rows + kb0[:, None], mask=(kb0 < KB)[:, None] & m_mask[None, :], other=0.0)\n"
              "    wsc = tl.load(s_rows + kb0[:, None], mask=(kb0 < KB)[:, None] & n_mask[None, :], other=0.0)\n"
              "    for i in range(0, TILES_PER_SPLIT):\n"
              "        kb = (split * TILES_PER_SPLIT + i) * NB + offs_b\n"
              "        live = kb < KB\n"
              "        kbn = kb + NB\n"
              "        nxt = (kbn < KB) & (i + 1 < TILES_PER_SPLIT)\n"
              "        asc_next = tl.load(as_rows + kbn[:, None], mask=nxt[:, None] & m_mask[None, :], other=0.0)\n"
              "        wsc_next = tl.load(s_rows + kbn[:, None], mask=nxt[:, None] & n_mask[None, :], other=0.0)\n")
    return sub(src, "        acc += d.to(tl.float32) * (wsc[:, :, None] * asc[:, None, :])\n",
               "        acc += d.to(tl.float32) * (wsc.to(tl.float32)[:, :, None] * asc[:, None, :])\n"
               "        asc, wsc = asc_next, wsc_next\n")


SETS["v30"] = lambda: {"prev": TREE, "staged3": staged(TREE, 3), "staged2": staged(TREE, 2), "staged4": staged(TREE, 4),
                       "scales_ahead": scales_ahead(TREE)}
# v34: the tree's kernel against v30's (diag/grouped_mma_v30.py, carried: commit a7a3711's grouped_mma.py), both
# under the table's plans (same bits); timed on commit 59072b5 (branch next/v34-three-quarter-record), whose kernel
# runs a 32-row tile of 17-24 live rows as 16 + 8 rows
SETS["v34"] = lambda: {"prev": Path("diag/grouped_mma_v30.py").read_text(), "tree": TREE}


PAIRS = """@triton.jit
def _pairs(ptrs, mask, NB: tl.constexpr, BM: tl.constexpr):
    \"\"\"tl.load of a [NB, BM] tensor as two [NB, BM / 2] loads (even, odd columns) joined back: Triton loads a
    tensor of fewer elements than threads straight into the layout its user wants (here the MMA accumulator's,
    which holds column pairs), where a bigger one goes through shared memory and barriers (v35).\"\"\"
    pe, po = tl.split(tl.reshape(ptrs, [NB, BM // 2, 2]))
    me, mo = tl.split(tl.reshape(mask, [NB, BM // 2, 2]))
    return tl.reshape(tl.join(tl.load(pe, mask=me, other=0.0), tl.load(po, mask=mo, other=0.0)), [NB, BM])


@triton.jit
def _eighths(ptrs, mask, NB: tl.constexpr, BN: tl.constexpr):
    \"\"\"The same for [NB, BN] (BN = 64) in the accumulator's row order n = g + 8 h + 16 i: eight [NB, 8] loads.\"\"\"
    p = tl.permute(tl.reshape(ptrs, [NB, 2, 2, 2, 8]), (0, 4, 1, 2, 3))
    mk = tl.permute(tl.reshape(mask, [NB, 2, 2, 2, 8]), (0, 4, 1, 2, 3))
    p0, p1 = tl.split(p)
    m0, m1 = tl.split(mk)
    p00, p01 = tl.split(p0)
    p10, p11 = tl.split(p1)
    m00, m01 = tl.split(m0)
    m10, m11 = tl.split(m1)
    a0, a1 = tl.split(p00)
    b0, b1 = tl.split(p01)
    c0, c1 = tl.split(p10)
    d0, d1 = tl.split(p11)
    ma0, ma1 = tl.split(m00)
    mb0, mb1 = tl.split(m01)
    mc0, mc1 = tl.split(m10)
    md0, md1 = tl.split(m11)
    va = tl.join(tl.load(a0, mask=ma0, other=0.0), tl.load(a1, mask=ma1, other=0.0))
    vb = tl.join(tl.load(b0, mask=mb0, other=0.0), tl.load(b1, mask=mb1, other=0.0))
    vc = tl.join(tl.load(c0, mask=mc0, other=0.0), tl.load(c1, mask=mc1, other=0.0))
    vd = tl.join(tl.load(d0, mask=md0, other=0.0), tl.load(d1, mask=md1, other=0.0))
    v = tl.join(tl.join(va, vb), tl.join(vc, vd))
    return tl.reshape(tl.permute(v, (0, 2, 3, 4, 1)), [NB, BN])


"""


def asc_direct(src):
    """v35: x's scales loaded as two half-size loads, so they reach the accumulator's layout without a shared-memory
    round trip (two of the loop's four barriers go; same bits)."""
    src = sub(src, "@triton.jit\ndef _tile(", PAIRS + "@triton.jit\ndef _tile(")
    src = sub(src, "asc = tl.load(as_rows + kb[:, None], mask=(kb < KB)[:, None] & m_mask[None, :], other=0.0)",
              "asc = _pairs(as_rows + kb[:, None], (kb < KB)[:, None] & m_mask[None, :], NB, BLOCK_M)")
    return sub(src, "asc_next = tl.load(as_rows + (kb + NB)[:, None], mask=ahead[:, None] & m_mask[None, :], other=0.0)",
               "asc_next = _pairs(as_rows + (kb + NB)[:, None], ahead[:, None] & m_mask[None, :], NB, BLOCK_M)")


def scales_direct(src):
    """v35: both scales without the shared-memory round trip (the weights' scales as eight loads; BLOCK_N 64)."""
    src = asc_direct(src)
    src = sub(src, "wsc = tl.load(s_rows + kb[:, None], mask=(kb < KB)[:, None] & n_mask[None, :], other=0.0)",
              "wsc = _eighths(s_rows + kb[:, None], (kb < KB)[:, None] & n_mask[None, :], NB, BLOCK_N)")
    return sub(src, "wsc_next = tl.load(s_rows + (kb + NB)[:, None], mask=ahead[:, None] & n_mask[None, :], other=0.0)",
               "wsc_next = _eighths(s_rows + (kb + NB)[:, None], ahead[:, None] & n_mask[None, :], NB, BLOCK_N)")


# v35: the tree's kernel (v30) with its scale loads reaching the accumulator's layout without shared memory
SETS["v35"] = lambda: {"prev": TREE, "asc_direct": asc_direct(TREE), "scales_direct": scales_direct(TREE)}
# v36: the tree's kernel under a register cap per tile height (Triton's `maxnreg`), so one more program fits an SM:
# 32 rows 168 -> 128 (3 -> 4 programs), 16 rows 122 -> 96 (4 -> 5), 8 rows 76 -> 64 (6 -> 8); the compiler spills
# 20 / 28 / 12 bytes per thread (same bits: the cap moves registers, not arithmetic)
SETS["v36"] = lambda: {"prev": TREE, "cap": TREE, "cap32": TREE}
CAPS = {"cap": {32: 128, 16: 96, 8: 64}, "cap32": {32: 128}}



def row_scale(src):
    """v40 (timing only, other numerics): one activation scale per row instead of one per 32-block, applied once
    after the fold, so the loop scales each (row, column, block) by the weight's scale alone (I2FP, FFMA instead of
    I2FP, FMUL, FFMA) and loads no x scales. The probe takes each row's block-0 scale as its row scale."""
    src = sub(src, "asc = tl.load(as_rows + kb[:, None], mask=(kb < KB)[:, None] & m_mask[None, :], other=0.0)",
              "rsc = tl.load(as_rows, mask=m_mask[None, :], other=0.0)                                  # [1, BM]")
    src = sub(src, "        asc_next = tl.load(as_rows + (kb + NB)[:, None], mask=ahead[:, None] & m_mask[None, :], other=0.0)\n",
              "")
    src = sub(src, "acc += d.to(tl.float32) * (wsc.to(tl.float32)[:, :, None] * asc[:, None, :])",
              "acc += d.to(tl.float32) * wsc.to(tl.float32)[:, :, None]")
    src = sub(src, "asc, wsc = asc_next, wsc_next", "wsc = wsc_next")
    return sub(src, "finish_rows(tl.reshape(y, [BLOCK_M, BLOCK_N]),",
               "finish_rows(tl.reshape(y, [BLOCK_M, BLOCK_N]) * tl.reshape(rsc, [BLOCK_M])[:, None],")


# v40: the tree's kernel against the same tile with one activation scale per row (a change of the W4A8 numerics)
SETS["v40"] = lambda: {"prev": TREE, "row_scale": row_scale(TREE)}

class Capped:
    """A kernel launched with maxnreg chosen by its BLOCK_M (the half loop shares its kernel's cap)."""
    def __init__(self, kern, caps):
        self.kern, self.caps, self.device_caches = kern, caps, kern.device_caches

    def __getitem__(self, grid):
        launch = self.kern[grid]

        def run(*args, **kw):
            cap = self.caps.get(kw["BLOCK_M"])
            return launch(*args, **kw) if cap is None else launch(*args, maxnreg=cap, **kw)
        return run


SET = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--set=")), "cuts")
SOURCES = SETS[SET]()


def load(label, src):
    return variants.load(src, f"gmma_{label}").grouped_mma_kernel


KERNELS = {k: Capped(load(k, s), CAPS[k]) if k in CAPS else load(k, s) for k, s in SOURCES.items()}
dev = torch.device("cuda")
l2 = timing.l2_bytes()
torch.manual_seed(0)

if "--ncu" in sys.argv:
    # Mixtral gate_up at 32 tokens (bm16; --ncu-tokens=T for another batch): each variant twice (compile, warm),
    # then once each, profiled:
    # ncu --launch-skip 12 --launch-count 6 in this order of SOURCES
    from int4lab.kernels.grouped import build_group_tiles, gemm_int4_b32_grouped
    from int4lab.kernels.quant import quant_x_rows
    m = MODELS["mixtral"]
    NCU_T = int(next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--ncu-tokens=")), "32"))
    x, ids, tw, w, act, nbytes = moe_setup(m, NCU_T, dev, l2)
    L = ids.numel()
    p = grouped_plan(2 * m.intermediate, m.hidden, L, m.n_experts, dev)
    tiles = build_group_tiles(ids.view(-1), m.n_experts, p.block_m)
    xq, xs = quant_x_rows(x)
    print("plan", p, flush=True)
    for rep in range(3):
        for label, kern in KERNELS.items():
            grouped.grouped_mma_kernel = kern
            gemm_int4_b32_grouped(xq, xs, w[0][0], w[0][1], tiles, rows_per_x=m.top_k, plan=p)
            torch.cuda.synchronize()
    sys.exit(0)

out_dir = sys.argv[1]
name = {"cuts": "probe_v24_cuts_h200.json", "final": "probe_v28_final_h200.json", "v30": "probe_v30_staged_h200.json",
        "v34": "probe_v34_three_quarter_h200.json", "v35": "probe_v35_scales_direct_h200.json",
        "v36": "probe_v36_maxnreg_h200.json", "v40": "probe_v40_row_scale_h200.json"}.get(SET, f"probe_v26b_{SET}_h200.json")
res = {"provenance": provenance(f"python3 scripts/probe_v24_cuts.py $OUT --set={SET}"), "set": SET,
       "method": "int4lab.bench.timing (median of 20 replays, p10 / p90); variants alternate, twice",
       "variants": list(SOURCES), "rows": []}
ROWS = {"cuts": (("mixtral", 32), ("olmoe", 64), ("mixtral", 64), ("olmoe", 32), ("mixtral", 16)),
        "leave_out": (("mixtral", 32), ("mixtral", 64), ("olmoe", 64), ("olmoe", 32))}
ROWS["hints"] = ROWS["parts"] = ROWS["leave_out"]
ROWS["final"] = ROWS["cuts"] + (("qwen3", 64),)
ROWS["v27"] = ROWS["cuts"] + (("qwen3", 64),)
ROWS["v30"] = ROWS["v34"] = ROWS["v35"] = ROWS["v36"] = ROWS["v40"] = ROWS["final"]
for model, T in ROWS[SET]:
    x, ids, tw, w, act, nbytes, pp = grouped_probe_row(model, T, dev, l2)
    copies = len(w)
    pp_half = tuple(dataclasses.replace(p, block_m=max(16, p.block_m), half_tiles=True) if p.kind == "mma" else p
                    for p in pp)
    row = {"model": model, "tokens": T, "copies": copies, "bytes": nbytes, "n_active": act,
           "plans": [str(p) for p in pp], "us": {}}
    outs = {}
    for rep in range(2):
        for label, kern in KERNELS.items():
            grouped.grouped_mma_kernel = kern
            plans = pp_half if label.endswith("+half") else pp
            outs[label] = moe_decode_grouped(x, ids, tw, *w[0], plan=plans)
            s = timing.summarise(timing.time_calls(
                [lambda i=i: moe_decode_grouped(x, ids, tw, *w[i], plan=plans) for i in range(copies)]))
            row["us"].setdefault(label, []).append([round(s["us"], 2), round(s["p10_us"], 2), round(s["p90_us"], 2)])
    row["compiled"] = {k: compiled(kern) for k, kern in KERNELS.items()}
    row["same_bits"] = {k: torch.equal(outs["prev"].view(torch.int16), o.view(torch.int16)) for k, o in outs.items()}
    res["rows"].append(row)
    print(model, T, all(row["same_bits"].values()), {k: [v[0] for v in vs] for k, vs in row["us"].items()},
          flush=True)
    json.dump(res, open(f"{out_dir}/{name}", "w"), indent=1)
    del w
    torch.cuda.empty_cache()
