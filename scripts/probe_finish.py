"""What the one-launch split-K finish costs, and whether a cheaper ordering buys any of it back (notes/perf.md v44).

epilogue.finish_rows ends every program of a split or combined tile with: store the float32 partial, a block
barrier, one `atom.acq_rel.gpu` on the tile's counter, and, in the last program only, the SPLIT_K * TOPK partial
reads and the bf16 store. On sm_90 ptxas turns the acq_rel atomic into MEMBAR.ALL.GPU (wait until this program's
stores are acknowledged by L2), the ATOMG, and CCTL.IVALL (drop the L1). So the tail of a one-wave launch is
three dependent L2 round trips: the stores' acknowledgement, the atomic, the partial reads. Variants, each the
tree's gemv_dp4a.py with finish_rows rewritten by asserted text substitutions (tune.variants). The last program's
counter reset (atomic_xchg, acq_rel by default) adds a fourth: MEMBAR waits for its bf16 stores before the exchange.
  reset_relaxed  the reset as a relaxed exchange (the kernel boundary orders it before the next launch). Same bits.
  rel        reset_relaxed, and the arrival as release; the last program alone runs fence.acq_rel.gpu before its
             reads (every other program skips the CCTL.IVALL). Legal under the PTX memory model; same bits.
  rel_own    rel, and the last program takes its own partial from registers instead of reading it back.
  relaxed    timing only, not legal: a relaxed atomic and no fence. What the MEMBAR (the release) costs.
  no_finish  timing only (split plans): each program stores its partial and stops. What the whole finish costs.
Rows: every dense decode shape whose table plan splits K, and the one-token MoE step of each model (its down GEMV
combines the top-k rows through the same finish). Variants alternate within each round.
    PYTHONPATH=$PWD python3 scripts/probe_finish.py $OUT        # -> $OUT/probe_v44_finish_<card>.json
It rewrites the tree as of commit b26ff2f. The relaxed reset has since landed (with the TMA tile, merge f98b576), so
on later trees the reset's substitution no longer matches and the probe stops with an AssertionError rather than
timing the tree twice.
"""
import json
import sys
from pathlib import Path

import torch

from int4lab.tune.variants import load, sub

SRC = Path(__file__).resolve().parents[1] / "int4lab" / "kernels"
DP4A, EPI = (SRC / "gemv_dp4a.py").read_text(), (SRC / "epilogue.py").read_text()
DENSE_ROUNDS, MOE_ROUNDS = 6, 6   # median_ci needs 6 rounds for a 95 % interval
ATOMIC = '        seen = tl.atomic_add(cnt_ptr + tile, 1, mask=m_mask, sem="acq_rel", scope="gpu")\n'
LAST = "            lmask = last[:, None] & n_mask[None, :]\n"
RESET = "            tl.atomic_xchg(cnt_ptr + tile, 0, mask=last)   # ready for the next launch (graph replay)\n"
READ = ("                    yj += tl.load(part_ptr + (s * R + row)[:, None] * N + offs_n[None, :], mask=lmask, "
        "other=0.0,\n                                  cache_modifier=\".cg\")\n")


def reset_relaxed(src):
    """The counter's reset as a relaxed exchange: nothing in this launch reads it, and the kernel boundary orders it
    before the next launch's arrivals. The tree's default (acq_rel) first waits for the bf16 stores' acknowledgement."""
    return sub(src, RESET, RESET.replace("mask=last)", 'mask=last, sem="relaxed")'))


def rel(src):
    src = sub(reset_relaxed(src), ATOMIC, ATOMIC.replace('"acq_rel"', '"release"'))
    return sub(src, LAST, "            ok = tl.inline_asm_elementwise(\"fence.acq_rel.gpu; mov.b32 $0, $1;\", \"=r,r\", "
                          "[tl.max(last.to(tl.int32), axis=0)],\n                                           dtype=tl.int32, "
                          "is_pure=False, pack=1)\n            lmask = (last & (ok != 0))[:, None] & n_mask[None, :]\n")


def rel_own(src):
    return sub(rel(src), READ,
               "                    own = ((row == rr) & (s == split))[:, None]\n"
               "                    yj += tl.where(own, y, tl.load(part_ptr + (s * R + row)[:, None] * N + offs_n[None, :],"
               "\n                                                   mask=lmask & ~own, other=0.0, cache_modifier=\".cg\"))\n")


def relaxed(src):
    return sub(reset_relaxed(src), ATOMIC, ATOMIC.replace('"acq_rel"', '"relaxed"'))


def no_finish(src):
    return sub(src, "    finish_rows(y[None, :], valid, rows, rows >= 0, out_ptr, part_ptr, cnt_ptr, tw_ptr,\n"
                    "                split, R, N, pid_n, tl.cdiv(N, BLOCK_N), offs_n, n_mask, SPLIT_K, TOPK, HAS_W)\n",
               "    tl.store(part_ptr + (split * R + r) * N + offs_n, y, mask=n_mask)\n")


def with_epilogue(epi_src, name, dp4a_src=DP4A):
    """gemv_dp4a.py with finish_rows (and the rest of epilogue.py) from epi_src, as one loaded module."""
    body = epi_src.split("import triton\nimport triton.language as tl\n", 1)[1]
    src = sub(dp4a_src, "from .epilogue import finish_rows, fold_blocks, grid_ids, routed_expert\n", body)
    return load(src, name).gemv_dp4a_kernel


def kernels():
    from int4lab.kernels import gemv
    return {"tree": gemv.gemv_dp4a_kernel, "reset_relaxed": with_epilogue(reset_relaxed(EPI), "dp4a_reset"),
            "rel": with_epilogue(rel(EPI), "dp4a_rel"),
            "rel_own": with_epilogue(rel_own(EPI), "dp4a_rel_own"), "relaxed": with_epilogue(relaxed(EPI), "dp4a_relaxed"),
            "no_finish": load(no_finish(DP4A), "dp4a_no_finish").gemv_dp4a_kernel}


LEGAL = ("tree", "reset_relaxed", "rel", "rel_own")


def summary(row):
    from int4lab.bench.decide import median_ci
    row["ratio_to_tree"] = {k: dict(zip(("median", "lo", "hi"), median_ci([a / b for a, b in zip(v, row["us"]["tree"])])))
                            for k, v in row["us"].items()}
    print(row.get("shape") or row.get("model"), row["same_bits"],
          {k: f"{sorted(v)[len(v) // 2]:.2f} us {row['ratio_to_tree'][k]['median']:.3f} "
              f"[{row['ratio_to_tree'][k]['lo']:.3f}, {row['ratio_to_tree'][k]['hi']:.3f}]" for k, v in row["us"].items()},
          row["errors"], flush=True)


def rounds(row, kerns, labels, n, call, copies):
    """n rounds of every label in turn: row["us"][label] gets one median per round; first outputs kept."""
    from int4lab.bench.timing import summarise, time_calls
    from int4lab.kernels import gemv
    outs = {}
    for _ in range(n):
        for label in labels:
            if label in row["errors"]:
                continue
            gemv.gemv_dp4a_kernel = kerns[label]
            try:
                outs.setdefault(label, call(0).clone())
                row["us"].setdefault(label, []).append(
                    summarise(time_calls([lambda i=i: call(i) for i in range(copies)]))["us"])
            except Exception as e:                  # a variant that does not compile is a result too
                row["errors"][label] = f"{type(e).__name__}: {str(e)[:300]}"
    gemv.gemv_dp4a_kernel = kerns["tree"]
    row["same_bits"] = {k: torch.equal(o.view(torch.int16), outs["tree"].view(torch.int16)) for k, o in outs.items()
                        if k in LEGAL}
    if "relaxed" in outs:
        row["relaxed_same_bits"] = torch.equal(outs["relaxed"].view(torch.int16), outs["tree"].view(torch.int16))


def main(out_dir):
    from int4lab.bench.timing import copies_for, l2_bytes
    from int4lab.kernels import int4_linear
    from int4lab.kernels.moe import moe_decode_routed
    from int4lab.kernels.plan import gemv_plan
    from int4lab.receipts import provenance
    from int4lab.shapes import MODELS
    from int4lab.tune.sweep import dense_weights, int4_bytes, moe_setup, sweep_shapes
    dev = torch.device("cuda")
    card = "h200" if "H200" in torch.cuda.get_device_name() else "h100"
    path = Path(out_dir) / f"probe_v44_finish_{card}.json"
    res = {"provenance": provenance("python3 scripts/probe_finish.py $OUT"),
           "method": f"int4lab.bench.timing (median of 20 replays) per round; variants alternate within a round; "
                     f"{DENSE_ROUNDS} rounds (dense), {MOE_ROUNDS} (MoE); ratio to the tree per round: median and "
                     f"95 % interval (bench.decide.median_ci)", "dense": [], "moe": []}
    kerns = kernels()
    l2 = l2_bytes()
    for name, N, K in sweep_shapes():
        p = gemv_plan(N, K, 1, dev)
        if (p.split_k or 1) == 1:
            continue
        torch.manual_seed(0)
        copies = copies_for(int4_bytes(N, K), l2)
        packed, scales = dense_weights(N, K, copies, dev)
        x = torch.randn(1, K, device=dev).bfloat16()
        row = {"shape": f"{N}x{K}", "name": name, "copies": copies, "plan": str(p), "us": {}, "errors": {}}
        rounds(row, kerns, list(kerns), DENSE_ROUNDS, lambda i: int4_linear(x, packed[i], scales[i], plan=p), copies)
        summary(row)
        res["dense"].append(row)
        path.write_text(json.dumps(res, indent=1))
        del packed, scales
        torch.cuda.empty_cache()
    for model, m in MODELS.items():
        torch.manual_seed(0)
        x, ids, tw, w, _, nbytes = moe_setup(m, 1, dev, l2)
        row = {"model": model, "tokens": 1, "copies": len(w), "bytes": nbytes, "us": {}, "errors": {}}
        rounds(row, kerns, ["tree", "reset_relaxed", "rel", "rel_own", "relaxed"], MOE_ROUNDS,
               lambda i: moe_decode_routed(x, ids, tw, *w[i]), len(w))
        summary(row)
        res["moe"].append(row)
        path.write_text(json.dumps(res, indent=1))
        del w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
