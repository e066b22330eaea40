"""v41 probe: the grouped W4A8 tile hand-written in CUDA (probe_cuda_w4a8.cu), beside the Triton tile of the table.

Why: every lever of the Triton tile is measured (notes/perf.md v24-v40), and issue 14's unique-floor target is still
missed from 8 tokens up. The closing notes named one lever left, a hand-written kernel with the weight decode in the
MMA's register layout, and asked the maintainers whether CUDA is in scope. This probe gives that decision a number:
the same W4A8 numerics (bit-identical to the Triton tile at block_k 128, split 1), the same tiles, the same timer.
It is not a kernel of the library: it is built on the GPU by torch.utils.cpp_extension and nothing imports it.

Rows: Mixtral, OLMoE and Qwen3 at 8, 16, 32 and 64 tokens, the bench's routing and random bytes. Per row, each
projection alone (the table's Triton launch against the CUDA tile in several shapes), then the whole grouped step:
the table's (moe_decode_grouped) against the same launches with the two projections in CUDA, the activations put in
quad order by torch and the top-k combine by torch (a few launches more than a quantiser and an epilogue for this
kernel would need). The read floor of the row's unique experts is measured in the same run.

    PYTHONPATH=$PWD python3 scripts/probe_cuda_w4a8.py $OUT        # on the GPU -> $OUT/probe_cuda_w4a8_h200.json
    PYTHONPATH=$PWD python3 scripts/probe_cuda_w4a8.py --check     # CPU: the lane mapping, emulated
    PYTHONPATH=$PWD python3 scripts/probe_cuda_w4a8.py --sass      # compiler report: nvcc here, no GPU
"""
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

SRC = Path(__file__).with_suffix(".cu")
# (MI, NI, WARPS, STAGES): weight fragments of 16 rows per warp, row fragments of 8 per tile, warps per program,
# chunks in the cp.async ring (0: one chunk ahead in registers). The .cu's V41_CONFIGS instantiates exactly these.
# The first call (receipt probe_cuda_w4a8_h200.json) timed STAGES 0 only, with (1, 2, 4), (1, 2, 2), (2, 2, 2) and
# (1, 4, 4) beside the first four here: every NI 2 or 4 tile lost to NI 1, so the second call drops them.
CONFIGS = [(1, 1, 4, 0), (2, 1, 4, 0), (2, 2, 4, 0), (2, 1, 2, 0), (2, 1, 4, 4), (2, 1, 4, 6), (2, 1, 2, 8),
           (1, 1, 4, 6), (1, 1, 8, 4), (2, 2, 4, 4), (2, 2, 4, 6), (1, 2, 4, 6)]


def quad_order_w(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [E, N, K/2] int4-b32 -> the same bytes in quad order (the .cu's header): per row and 128-wide chunk,
    word t of blocks 4c .. 4c + 3 side by side for t = 0..3. A 4 x 4 word transpose: its own inverse (--check)."""
    E, N, KH = packed.shape
    if KH % 64:
        raise ValueError(f"packed must have K % 128 == 0 for quad order, got K = {2 * KH}")
    return packed.view(E, N, KH // 64, 4, 4, 4).transpose(3, 4).contiguous().view(E, N, KH)


def quad_order_x(xq: torch.Tensor, xs: torch.Tensor):
    """int8 codes [R, K] and float32 scales [R, K/32] -> (codes in quad order, scales / 16): per 128-wide chunk,
    lane t's 32 bytes contiguous, for blocks b = 0..3 the 4 even-k then the 4 odd-k codes of 8t .. 8t + 7."""
    R, K = xq.shape
    q = xq.reshape(R, K // 128, 4, 4, 4, 2).permute(0, 1, 3, 2, 5, 4).reshape(R, K)
    return q, xs * 0.0625


_EXT = None


def build():
    """Compile the .cu for sm_90 with its torch launcher (once per process)."""
    global _EXT
    if _EXT is None:
        from torch.utils.cpp_extension import load_inline
        decl = ("void grouped_w4a8(torch::Tensor xq, torch::Tensor xs, torch::Tensor w, torch::Tensor ws, "
                "torch::Tensor order, torch::Tensor row0, torch::Tensor rows, torch::Tensor group, torch::Tensor out, "
                "int64_t rows_per_x, int64_t mi, int64_t ni, int64_t warps, int64_t stages);")
        _EXT = load_inline(name="v41_grouped_w4a8", cpp_sources=decl, cuda_sources="#define V41_TORCH\n" + SRC.read_text(),
                           functions=["grouped_w4a8"], extra_cuda_cflags=["-O3", "-gencode=arch=compute_90,code=sm_90"],
                           verbose=False)
    return _EXT


def grouped_cuda(xq4, xs16, wq, ws, tiles, cfg, rows_per_x=1, out=None):
    """bf16 [L, N]: gemm_int4_b32_grouped's rows (no split-K, no combine) by the CUDA tile. xq4, xs16 from
    quad_order_x; wq from quad_order_w; tiles.block_m must be 8 * NI."""
    mi, ni, warps, stages = cfg
    N, KH = wq.shape[1:]
    if tiles.block_m != 8 * ni:
        raise ValueError(f"tiles.block_m must be 8 * NI = {8 * ni}, got {tiles.block_m}")
    if N % (16 * mi * warps):
        raise ValueError(f"N = {N} must be a multiple of 16 * MI * WARPS = {16 * mi * warps}")
    if xq4.stride(0) % 16 or xs16.stride(0) % 4 or xq4.shape[1] != 2 * KH:
        raise ValueError("xq4 rows must be K codes at a 16-byte stride, xs16 rows at a 16-byte stride")
    L = tiles.order.shape[0]
    out = torch.empty(L, N, dtype=torch.bfloat16, device=wq.device) if out is None else out
    build().grouped_w4a8(xq4, xs16, wq, ws, tiles.order, tiles.row0, tiles.rows, tiles.group, out, rows_per_x,
                         mi, ni, warps, stages)
    return out


def moe_step_cuda(x, ids, tw, gu_q, gu_s, dn_q, dn_s, cfg_gu, cfg_dn):
    """The grouped MoE step with both projections on the CUDA tile (the library's routing, quantisers; torch's
    quad order and combine). bf16 [T, H]."""
    from int4lab.kernels.grouped import build_group_tiles
    from int4lab.kernels.quant import quant_x_rows, swiglu_quant_rows
    T, A = ids.shape
    tiles = build_group_tiles(ids, gu_q.shape[0], 8 * cfg_gu[1])
    tiles_dn = tiles if cfg_dn[1] == cfg_gu[1] else build_group_tiles(ids, gu_q.shape[0], 8 * cfg_dn[1])
    h = grouped_cuda(*quad_order_x(*quant_x_rows(x)), gu_q, gu_s, tiles, cfg_gu, rows_per_x=A)
    y = grouped_cuda(*quad_order_x(*swiglu_quant_rows(h)), dn_q, dn_s, tiles_dn, cfg_dn)
    return (y.view(T, A, -1).float() * tw.float()[:, :, None]).sum(1).bfloat16()


def source_hash() -> str:
    return hashlib.sha256(SRC.read_bytes()).hexdigest()


def main(out_dir):
    import dataclasses
    from int4lab.bench.floor import read_floor
    from int4lab.bench.timing import summarise, time_calls
    from int4lab.kernels.grouped import build_group_tiles, gemm_int4_b32_grouped
    from int4lab.kernels.moe import moe_decode_grouped
    from int4lab.kernels.plan import GroupedPlan, grouped_plan
    from int4lab.kernels.quant import quant_x_rows, swiglu_quant_rows
    from int4lab.receipts import provenance
    from int4lab.shapes import MODELS
    from int4lab.tune.sweep import moe_setup
    dev = torch.device("cuda")
    l2 = 60 * 2**20
    res = {"probe": "v41 grouped W4A8 tile hand-written in CUDA against the table's Triton tile",
           "provenance": {**provenance(command="scripts/probe_cuda_w4a8.py"), "cuda_source": SRC.name,
                          "cuda_source_sha256": source_hash()},
           "configs": [list(c) for c in CONFIGS], "rows": []}
    path = Path(out_dir, "probe_cuda_w4a8_h200.json")
    build()
    rows = [(m, t) for m in ("mixtral", "olmoe", "qwen3") for t in (8, 16, 32, 64)]
    for model, tokens in rows:
        m = MODELS[model]
        E, A, H, I = m.n_experts, m.top_k, m.hidden, m.intermediate
        x, ids, tw, w, act, nbytes = moe_setup(m, tokens, dev, l2)
        wq = [(quad_order_w(a), b, quad_order_w(c), d) for a, b, c, d in w]
        L = tokens * A
        p_gu, p_dn = grouped_plan(2 * I, H, L, E, dev), grouped_plan(H, I, L, E, dev)
        tiles_lib = build_group_tiles(ids, E, p_gu.block_m)
        xq, xs = quant_x_rows(x)
        h = gemm_int4_b32_grouped(xq, xs, *w[0][:2], tiles_lib, rows_per_x=A, plan=p_gu)
        aq, as_ = swiglu_quant_rows(h)
        xq4, xs16 = quad_order_x(xq, xs)
        aq4, as16 = quad_order_x(aq, as_)
        tiles = {ni: build_group_tiles(ids, E, 8 * ni) for ni in sorted({c[1] for c in CONFIGS})}
        row = {"model": model, "tokens": tokens, "n_active": act, "bytes_int4_b32": nbytes, "copies": len(w),
               "plan_gate_up": dataclasses.asdict(p_gu), "plan_down": dataclasses.asdict(p_dn), "us": {},
               "bit_identical": {}}
        # Correctness: the CUDA tile against the Triton tile with the same tiles, block_k 128 and no split.
        for cfg in CONFIGS:
            ni = cfg[1]
            same = GroupedPlan(block_m=8 * ni, block_n=64, block_k=128, num_warps=4, num_stages=3, kind="mma",
                               tile_major=True, split_k=1)
            for proj, (q, s, tq, ts, pk, wq_, sc, rpx) in {
                    "gate_up": (xq4, xs16, xq, xs, w[0][0], wq[0][0], w[0][1], A),
                    "down": (aq4, as16, aq, as_, w[0][2], wq[0][2], w[0][3], 1)}.items():
                if pk.shape[1] % (16 * cfg[0] * cfg[2]):
                    continue
                got = grouped_cuda(q, s, wq_, sc, tiles[ni], cfg, rows_per_x=rpx)
                ref = gemm_int4_b32_grouped(tq, ts, pk, sc, tiles[ni], rows_per_x=rpx, plan=same)
                key = f"{proj} {cfg}"
                row["bit_identical"][key] = bool(torch.equal(got.view(torch.int16), ref.view(torch.int16)))
                if not row["bit_identical"][key]:
                    row.setdefault("max_rel_diff", {})[key] = float((got.float() - ref.float()).abs().max()
                                                                   / ref.float().abs().max())
        variants = {
            "triton_gate_up": lambda i: gemm_int4_b32_grouped(xq, xs, *w[i][:2], tiles_lib, rows_per_x=A, plan=p_gu),
            "triton_down": lambda i: gemm_int4_b32_grouped(aq, as_, *w[i][2:], tiles_lib, plan=p_dn),
            "triton_step": lambda i: moe_decode_grouped(x, ids, tw, *w[i]),
        }
        for cfg in CONFIGS:
            if (2 * I) % (16 * cfg[0] * cfg[2]) == 0:
                variants[f"cuda_gate_up {cfg}"] = (lambda i, c=cfg: grouped_cuda(xq4, xs16, *wq[i][:2], tiles[c[1]], c,
                                                                                  rows_per_x=A))
            if H % (16 * cfg[0] * cfg[2]) == 0:
                variants[f"cuda_down {cfg}"] = lambda i, c=cfg: grouped_cuda(aq4, as16, *wq[i][2:], tiles[c[1]], c)

        def timed(label, f):
            s = summarise(time_calls([lambda i=i: f(i) for i in range(len(w))]))
            row["us"].setdefault(label, []).append([round(s["us"], 2), round(s["p10_us"], 2), round(s["p90_us"], 2)])

        for label, f in variants.items():
            timed(label, f)
        best = {p: min((k for k in row["us"] if k.startswith(f"cuda_{p} ")), key=lambda k: row["us"][k][0][0])
                for p in ("gate_up", "down")}
        cfg_gu, cfg_dn = (tuple(int(v) for v in re.findall(r"\d+", best[p])) for p in ("gate_up", "down"))
        row["cuda_step_configs"] = [list(cfg_gu), list(cfg_dn)]
        step = lambda i: moe_step_cuda(x, ids, tw, *wq[i], cfg_gu, cfg_dn)
        ystep, yref = step(0), moe_decode_grouped(x, ids, tw, *w[0])
        row["step_max_rel_diff"] = float((ystep.float() - yref.float()).abs().max() / yref.float().abs().max())
        for _ in range(2):                        # alternate, so a drift of the GPU hits both alike
            timed("triton_step_b", lambda i: moe_decode_grouped(x, ids, tw, *w[i]))
            timed("cuda_step", step)
        row["floor"] = {k: v for k, v in read_floor(nbytes, l2=l2).items() if k != "configs"}
        res["rows"].append(row)
        fl = row["floor"]["us"]
        print(model, tokens, "floor", round(fl, 1),
              {k: v[0][0] for k, v in row["us"].items() if not k.startswith("cuda_gate_up") and not k.startswith("cuda_down")},
              "best", best, {b: row["us"][best[b]][0][0] for b in best},
              "all bit-identical" if all(row["bit_identical"].values()) else row.get("max_rel_diff"), flush=True)
        path.write_text(json.dumps(res, indent=1))
        del x, ids, tw, w, wq
        torch.cuda.empty_cache()


def check_mapping():
    """CPU: emulate the .cu's lane mapping for one chunk (16 weight rows, 8 x rows, 4 blocks): the words each lane
    loads in quad order, the decode to 16 (n - 8), and m16n8k32's fragments (lane g, t: A rows g and g + 8 at logical
    k 4t..4t+3 and 4t+16..4t+19, B column g at the same k). Every block's dot must be 16 times the true one."""
    torch.manual_seed(0)
    N, K, R = 16, 128, 8
    packed = torch.randint(0, 256, (1, N, K // 2), dtype=torch.uint8)
    xq = torch.randint(-127, 128, (R, K), dtype=torch.int8)
    codes = torch.stack([(packed[0] & 15).long() - 8, (packed[0] >> 4).long() - 8], -1).reshape(N, K)
    true = torch.einsum("nbk,rbk->nrb", codes.view(N, 4, 32), xq.long().view(R, 4, 32))
    w = quad_order_w(packed)[0].view(torch.int32).view(N, 4, 4).long() & 0xFFFFFFFF     # [row, t, block] words
    xw = quad_order_x(xq, torch.ones(R, 4))[0].view(torch.int32).view(R, 4, 4, 2).long() & 0xFFFFFFFF  # [r, t, b, par]

    def bytes_s8(v):                                  # int64 words -> [..., 4] signed bytes
        b = (v[..., None] >> (8 * torch.arange(4))) & 255
        return b - 256 * (b > 127)

    def top(v):                                       # the .cu's top_nibbles_signed
        return (v & 0xF0F0F0F0) ^ 0x80808080
    lo, hi = bytes_s8(top((w << 4) & 0xFFFFFFFF)), bytes_s8(top(w))            # [row, t, block, 4]: a0|a1, a2|a3
    b0, b1 = bytes_s8(xw[..., 0]), bytes_s8(xw[..., 1])                         # [r, t, block, 4]
    dot = torch.einsum("ntbi,rtbi->nrb", lo, b0) + torch.einsum("ntbi,rtbi->nrb", hi, b1)
    assert torch.equal(dot, 16 * true), "lane mapping"
    p = torch.randint(0, 256, (2, 3, 256), dtype=torch.uint8)
    assert torch.equal(quad_order_w(quad_order_w(p)), p), "quad order round trip"
    print("lane mapping and quad order: ok")


def sass_report():
    """Instructions in each configuration's K loop (STAGES 0: two chunks of 128 per iteration, else one) and its
    registers, from nvcc for sm_90 on this machine."""
    from int4lab.tune import resources
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d, "v41.cubin")
        info = subprocess.run(["nvcc", "-O3", "-gencode=arch=compute_90,code=sm_90", "-cubin", "-Xptxas", "-v",
                               "-o", str(cubin), str(SRC)], capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([str(resources._tool("cuobjdump")), "--dump-sass", str(cubin)], capture_output=True,
                              text=True).stdout
    regs = {m.group(1, 2, 3, 4): m.group(5) for m in
            re.finditer(r"Compiling entry function '[^']*tileILi(\d)ELi(\d)ELi(\d)ELi(\d)E[^']*'[\s\S]*?Used (\d+) registers", info)}
    for fn in re.split(r"\n\s*Function : ", sass)[1:]:
        cfg = re.search(r"tileILi(\d)ELi(\d)ELi(\d)ELi(\d)E", fn.split("\n")[0]).groups()
        for body in resources.loops(fn):
            mi, ni = int(cfg[0]), int(cfg[1])
            per = 2 if cfg[3] == "0" else 1       # the register path's loop holds two chunks
            print(f"MI {mi} NI {ni} WARPS {cfg[2]} STAGES {cfg[3]}: regs {regs.get(cfg)}, {len(body) / per:.1f} "
                  f"instructions per chunk of 128 x {16 * mi} weights ({len(body) / per / mi:.1f} per KB), "
                  f"{dict(Counter(body).most_common(6))}")


if __name__ == "__main__":
    if "--check" in sys.argv:
        check_mapping()
    elif "--sass" in sys.argv:
        sass_report()
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/out"))
