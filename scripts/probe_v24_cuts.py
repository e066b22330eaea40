"""Which of v24's cuts made the tensor-core tile slower at 16 and 32 rows (notes/perf.md v24, v26)? Each cut
alone, built at run time from two sources by exact text substitutions (each asserted to match once):
  prev        the kernel before v24 (diag/grouped_mma_prev.py: commit 69cd54e's grouped_mma.py, carried, with
              unused EVEN_K / HALF_TILES parameters so the launcher can call it)
  tree        v24: 16 x codes, both operands in word order, unmasked loads where K splits evenly, the _tile body
  tree_masked v24 with the masked loads everywhere (EVEN_K ignored)
  refactor    the _tile body only: v24 with both decode cuts undone (codes n - 8, interleave, no 1/16)
  codes16     prev with 16 x codes only (still interleaved, masked)
  order       v24 with codes n - 8 (word order, unmasked where even)
Per (model, tokens): the grouped MoE step with the table's plans, variants alternating, twice, same bits
checked; the bench's routing and timer, weights rotated past L2.
    PYTHONPATH=$PWD python3 scripts/probe_v24_cuts.py $OUT            # timing -> $OUT/probe_v24_cuts_h200.json
    ncu ... python3 scripts/probe_v24_cuts.py --ncu                   # one gate_up launch per variant, profiled
"""
import importlib.util
import json
import re
import sys
import tempfile
from pathlib import Path

import torch

from int4lab.bench import timing
from int4lab.kernels import grouped
from int4lab.kernels.moe import moe_decode_grouped
from int4lab.kernels.plan import grouped_plan
from int4lab.receipts import provenance
from int4lab.shapes import MODELS
from int4lab.tune.sweep import moe_setup

PREV = Path("diag/grouped_mma_prev.py").read_text()
TREE = Path("int4lab/kernels/grouped_mma.py").read_text()


def sub(src, old, new):
    assert src.count(old) == 1, (old, src.count(old))
    return src.replace(old, new)


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


SOURCES = {"prev": PREV, "tree": TREE, "tree_masked": masked(TREE), "refactor": undo_order(undo_codes16(TREE)),
           "codes16": codes16_on_prev(PREV), "order": undo_codes16(TREE)}


def load(label, src):
    d = Path(tempfile.mkdtemp())
    (d / f"gmma_{label}.py").write_text(src)
    spec = importlib.util.spec_from_file_location(f"int4lab.kernels._gmma_{label}", d / f"gmma_{label}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.grouped_mma_kernel


def compiled(kern):
    """What the run-time compiler made of each specialisation: registers, spills, shared bytes."""
    out = []
    try:
        for key, c in kern.device_caches[torch.cuda.current_device()][0].items():
            c._init_handles()
            out.append({"regs": c.n_regs, "spills": c.n_spills, "shared": c.metadata.shared,
                        "num_warps": c.metadata.num_warps, "num_stages": c.metadata.num_stages,
                        "key": str(key)[:300]})
    except Exception as e:       # a probe of what was timed: never lose the timings to the introspection
        out.append({"error": repr(e)})
    return out


KERNELS = {k: load(k, s) for k, s in SOURCES.items()}
dev = torch.device("cuda")
l2 = timing.l2_bytes()
torch.manual_seed(0)

if sys.argv[1:] == ["--ncu"]:
    # Mixtral gate_up at 32 tokens (bm16): each variant twice (compile, warm), then once each, profiled:
    # ncu --launch-skip 12 --launch-count 6 in this order of SOURCES
    from int4lab.kernels.grouped import build_group_tiles, gemm_int4_b32_grouped
    from int4lab.kernels.quant import quant_x_rows
    m = MODELS["mixtral"]
    x, ids, tw, w, act, nbytes = moe_setup(m, 32, dev, l2)
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
res = {"provenance": provenance("python3 scripts/probe_v24_cuts.py $OUT"),
       "method": "int4lab.bench.timing (median of 20 replays, p10 / p90); variants alternate, twice",
       "variants": list(SOURCES), "rows": []}
for model, T in (("mixtral", 32), ("olmoe", 64), ("mixtral", 64), ("olmoe", 32), ("mixtral", 16)):
    m = MODELS[model]
    E, A, H, I = m.n_experts, m.top_k, m.hidden, m.intermediate
    x, ids, tw, w, act, nbytes = moe_setup(m, T, dev, l2)
    copies = len(w)
    pp = (grouped_plan(2 * I, H, T * A, E, dev), grouped_plan(H, I, T * A, E, dev))
    row = {"model": model, "tokens": T, "copies": copies, "bytes": nbytes, "n_active": act,
           "plans": [str(p) for p in pp], "us": {}}
    outs = {}
    for rep in range(2):
        for label, kern in KERNELS.items():
            grouped.grouped_mma_kernel = kern
            outs[label] = moe_decode_grouped(x, ids, tw, *w[0], plan=pp)
            s = timing.summarise(timing.time_calls(
                [lambda i=i: moe_decode_grouped(x, ids, tw, *w[i], plan=pp) for i in range(copies)]))
            row["us"].setdefault(label, []).append([round(s["us"], 2), round(s["p10_us"], 2), round(s["p90_us"], 2)])
    row["compiled"] = {k: compiled(kern) for k, kern in KERNELS.items()}
    row["same_bits"] = {k: torch.equal(outs["prev"].view(torch.int16), o.view(torch.int16)) for k, o in outs.items()}
    res["rows"].append(row)
    print(model, T, all(row["same_bits"].values()), {k: [v[0] for v in vs] for k, vs in row["us"].items()},
          flush=True)
    json.dump(res, open(f"{out_dir}/probe_v24_cuts_h200.json", "w"), indent=1)
    del w
    torch.cuda.empty_cache()
