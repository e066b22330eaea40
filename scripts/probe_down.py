"""Where the one-token MoE step's time goes, projection by projection (notes/perf.md v21): per model, the
routed step (with and without PDL), its gate_up GEMV alone, its down GEMV alone with the top-k combine and
without it (bf16 rows, no arrival counters), the down GEMV's plan variants, a dense GEMV of the same bytes as
the down projection, and the read floors of the gate_up, down and step bytes; all in one process, the bench's
timer, disjoint routings rotated so every call reads other experts.
Usage on the GPU machine: PYTHONPATH=$PWD python3 scripts/probe_down.py $OUT"""
import dataclasses
import json
import sys

import torch

from int4lab.bench import floor, timing
from int4lab.kernels.gemv import X_FLOAT, X_SWIGLU, _launch_gemv, int4_linear
from int4lab.kernels.moe import moe_decode_routed
from int4lab.kernels.plan import gemv_plan
from int4lab.receipts import provenance
from int4lab.shapes import MODELS
from int4lab.tune.sweep import dense_weights, int4_bytes, time_copies

DOWN_TILES = [(16, 1024, 4), (64, 1024, 4), (32, 512, 4), (16, 512, 4), (64, 1024, 8), (8, 1024, 4)]

out_dir = sys.argv[1]
dev = torch.device("cuda")
l2 = timing.l2_bytes()
torch.manual_seed(0)
res = {"provenance": provenance("python3 scripts/probe_down.py $OUT"), "method": "int4lab.bench.timing, median "
       "of 30 replays; random weight bytes; disjoint routings of one token", "models": []}
for model, m in MODELS.items():
    E, A, H, I = m.n_experts, m.top_k, m.hidden, m.intermediate
    gu, dn = dense_weights(2 * I, H, E, dev), dense_weights(H, I, E, dev)
    sets = E // A
    ids = torch.arange(E, device=dev, dtype=torch.int32)[torch.randperm(E, device=dev)].view(sets, A)
    tw = torch.softmax(torch.randn(1, A, device=dev), -1)
    x = torch.randn(1, H, device=dev).bfloat16()
    h = torch.randn(A, 2 * I, device=dev).bfloat16()
    b_gu, b_dn = A * int4_bytes(2 * I, H), A * int4_bytes(H, I)
    row = {"model": model, "E": E, "topk": A, "H": H, "I": I, "copies": sets, "bytes_gate_up": b_gu,
           "bytes_down": b_dn, "us": {}, "floor_us": {}}
    us = row["us"]
    us["step"] = time_copies(lambda i: moe_decode_routed(x, ids[i][None], tw, *gu, *dn), sets)
    us["step_no_pdl"] = time_copies(lambda i: moe_decode_routed(x, ids[i][None], tw, *gu, *dn, pdl=False), sets)
    us["gate_up"] = time_copies(lambda i: _launch_gemv(x, None, *gu, ids[i], 2 * I, H, A, x_mode=X_FLOAT,
                                                       rows_per_x=A), sets)
    us["down_combine"] = time_copies(lambda i: _launch_gemv(h, None, *dn, ids[i], H, I, A, x_mode=X_SWIGLU,
                                                            topk_w=tw), sets)
    us["down_rows"] = time_copies(lambda i: _launch_gemv(h, None, *dn, ids[i], H, I, A, x_mode=X_SWIGLU), sets)
    base = gemv_plan(H, I, A, dev)
    row["down_table_plan"] = dataclasses.asdict(base)
    for bn, bk, nw in DOWN_TILES:
        p = dataclasses.replace(base, block_n=bn, block_k=bk, num_warps=nw, split_k=None)
        us[f"down_combine_bn{bn}_bk{bk}_w{nw}"] = time_copies(
            lambda i: _launch_gemv(h, None, *dn, ids[i], H, I, A, x_mode=X_SWIGLU, topk_w=tw, plan=p), sets)
    # a dense GEMV reading the down projection's bytes: [H, A * I] with the dense table's plan
    dpk, dsc = dense_weights(H, A * I, timing.copies_for(b_dn, l2), dev)
    xd = torch.randn(1, A * I, device=dev).bfloat16()
    us["dense_same_bytes_as_down"] = time_copies(lambda i: int4_linear(xd, dpk[i], dsc[i]), dpk.shape[0])
    del dpk, dsc
    for name, nb in (("gate_up", b_gu), ("down", b_dn), ("step", b_gu + b_dn)):
        row["floor_us"][name] = floor.read_floor(nb, l2=l2)["us"]
    res["models"].append(row)
    print(model, {k: round(v, 2) for k, v in us.items()}, {k: round(v, 2) for k, v in row["floor_us"].items()},
          flush=True)
    json.dump(res, open(f"{out_dir}/probe_down_h200.json", "w"), indent=1)
    del gu, dn
    torch.cuda.empty_cache()
