"""The grouped dp4a bm1 tile reading x as eo codes (the tree) or as k-order codes through
gemv_dp4a.x_words_from_codes (the kernel before v14, patched in; one process per order), on MoE steps of the
bench's routing, median of 20 graph replays. On the GPU machine:
    python3 scripts/eo_vs_k.py k $OUT; python3 scripts/eo_vs_k.py eo $OUT
(data/receipts/probe_eo_vs_k_h200.json; notes/perf.md, after v16). It runs on the tree that measured it,
commit 935f365: the eo order was removed after this comparison."""
import json, sys
import torch
import triton
import triton.language as tl
from int4lab.kernels import grouped_dp4a as gd
from int4lab.kernels.gemv_dp4a import x_words_from_codes
from int4lab.kernels.grouped import build_group_tiles, gemm_int4_b32_grouped
from int4lab.kernels.plan import GroupedPlan
from int4lab.kernels.quant import quant_x_rows, swiglu_quant_rows
from int4lab.bench.peers import n_active, routing
from int4lab.bench.timing import copies_for, l2_bytes

from int4lab.shapes import MODELS
from int4lab.tune.sweep import dense_weights, int4_bytes, time_copies

mode = sys.argv[1]
if mode == "k":
    @triton.jit
    def _x_words_k(x_row, xs_row, t, KW, KB, BLOCK_K: tl.constexpr, USE_ASM: tl.constexpr):
        one = tl.zeros([1], tl.int64)
        return x_words_from_codes(x_row + one, xs_row + one, t, KW, KB, BLOCK_K, USE_ASM)
    gd._x_words_eo = _x_words_k
lay = "k" if mode == "k" else "eo"
dev = torch.device("cuda")
plan = GroupedPlan(1, 32, 512, 4, 2, tile_major=True)
out = {}
for model, T in [("mixtral", 2), ("mixtral", 4), ("mixtral", 8), ("mixtral", 16), ("olmoe", 16), ("qwen3", 32)]:
    m = MODELS[model]
    E, A, H, I = m.n_experts, m.top_k, m.hidden, m.intermediate
    ids_c, tw_c = routing(m, T)
    ids, tw = ids_c.to(dev), tw_c.to(dev)
    copies = copies_for(n_active(ids_c) * (int4_bytes(2 * I, H) + int4_bytes(H, I)), l2_bytes(), cap=16)
    gu = dense_weights(2 * I, H, copies * E, dev)
    dn = dense_weights(H, I, copies * E, dev)
    x = torch.randn(T, H, device=dev).bfloat16()

    def step(i):
        tiles = build_group_tiles(ids, E, 1)
        xq, xs = quant_x_rows(x, layout=lay)
        h = gemm_int4_b32_grouped(xq, xs, gu[0][i * E:(i + 1) * E], gu[1][i * E:(i + 1) * E], tiles, rows_per_x=A,
                                  plan=plan, x_layout="eo")        # no reorder: the patched kernel reads k order
        aq, as_ = swiglu_quant_rows(h, layout=lay)
        return gemm_int4_b32_grouped(aq, as_, dn[0][i * E:(i + 1) * E], dn[1][i * E:(i + 1) * E], tiles, topk_w=tw,
                                     plan=plan, x_layout="eo")
    y = step(0)
    out[f"{model} T{T}"] = {"us": time_copies(step, copies, 20), "sum": float(y.float().sum())}
    print(mode, model, T, out[f"{model} T{T}"], flush=True)
    del gu, dn
    torch.cuda.empty_cache()
json.dump(out, open(f"{sys.argv[2]}/eo_vs_k_{mode}.json", "w"), indent=1)
