"""The one-token MoE step's two GEMV plans, each varied alone (notes/perf.md v37).

v12 varied one plan shared by both GEMVs (bn16 / bn64 / bk512 / bk2048 / waves 1: within +-5 %); the table gives
gate_up and down different rows, and the down GEMV's split was never varied. Per model, the routed step
(`moe.moe_decode_routed`'s two launches, its PDL choice kept) under each (gate_up plan, down plan) pair, the pairs
alternating over ROUNDS rounds, the bench's timer, weights rotated past L2; ratio to the table per round.
    PYTHONPATH=$PWD python3 scripts/probe_one_token_plans.py $OUT     # -> $OUT/probe_v37_one_token_h200.json
--candidate (v37b): the routed step (moe_decode_routed, whatever it plans) under the committed GEMV table and under
CANDIDATE, alternating, at the token counts where the dispatcher takes the routed path:
    PYTHONPATH=$PWD python3 scripts/probe_one_token_plans.py $OUT --candidate   # -> probe_v37b_table_h200.json
"""
import dataclasses
import json
import statistics
import sys

import torch

from int4lab.bench import timing
from int4lab.bench.decide import median_ci
from int4lab.kernels import plan as P
from int4lab.kernels.gemv import X_FLOAT, X_SWIGLU, _launch_gemv
from int4lab.receipts import provenance
from int4lab.shapes import MODELS
from int4lab.tune.sweep import moe_setup

ROUNDS = 8


def step(x, ids, tw, gu_p, gu_s, dn_p, dn_s, p_gu, p_dn, pdl):
    """moe_decode_routed's two launches for one token, with a plan per GEMV."""
    E, two_i, H = gu_p.shape[0], gu_p.shape[1], x.shape[1]
    I, A = two_i // 2, ids.shape[1]
    L, eids = ids.numel(), ids.reshape(-1)
    h = _launch_gemv(x, None, gu_p, gu_s, eids, 2 * I, H, L, x_mode=X_FLOAT, rows_per_x=A, plan=p_gu,
                     pdl=1 if pdl else 0)
    return _launch_gemv(h, None, dn_p, dn_s, eids, H, I, L, x_mode=X_SWIGLU, topk_w=tw, plan=p_dn,
                        pdl=2 if pdl else 0)


def pairs(m, dev):
    """(gate_up plan, down plan) by label: the table's pair, then one GEMV's plan changed at a time (block_n
    halved or doubled at the table's split, num_warps 8; the down GEMV's split halved, doubled, or 7)."""
    H, I, L = m.hidden, m.intermediate, m.top_k
    gu, dn = P.resolve(None, 2 * I, H, L, dev), P.resolve(None, H, I, L, dev)
    out = {"table": (gu, dn)}
    for tag, base, N, K in (("gate_up", gu, 2 * I, H), ("down", dn, H, I)):
        for bn in (base.block_n // 2, base.block_n * 2):
            if bn >= 8:
                v = P.resolve(dataclasses.replace(base, block_n=bn), N, K, L, dev, base.split_k)
                out[f"{tag}_bn{bn}"] = (v, dn) if tag == "gate_up" else (gu, v)
        v = P.resolve(dataclasses.replace(base, num_warps=8), N, K, L, dev, base.split_k)
        out[f"{tag}_w8"] = (v, dn) if tag == "gate_up" else (gu, v)
    k_tiles = -(-I // dn.block_k)
    for sk in sorted({dn.split_k * 2, dn.split_k // 2, 7 if k_tiles % 7 == 0 else 0} - {0, dn.split_k}):
        if sk <= min(k_tiles, P.MAX_SPLIT_K):
            out[f"down_split{sk}"] = (gu, P.resolve(dn, H, I, L, dev, sk))
    return out


def _start(flags: str, method: str):
    """(device, L2 bytes, the receipt payload with provenance and method) of one probe run."""
    torch.manual_seed(0)
    res = {"provenance": provenance(f"python3 scripts/probe_one_token_plans.py $OUT{flags}"), "method": method,
           "rows": []}
    return torch.device("cuda"), timing.l2_bytes(), res


def main(out_dir):
    dev, l2, res = _start("", f"int4lab.bench.timing medians; the pairs alternate over {ROUNDS} rounds; ratio to the "
                              "table per round, its median and 95 % order-statistic interval (bench.decide.median_ci)")
    for name in ("mixtral", "olmoe", "qwen3"):
        m = MODELS[name]
        x, ids, tw, w, act, nbytes = moe_setup(m, 1, dev, l2)
        pdl = P.moe_pdl(dev, m.hidden * m.intermediate)
        variants = pairs(m, dev)
        us = {k: [] for k in variants}
        outs = {k: step(x, ids, tw, *w[0], *pr, pdl) for k, pr in variants.items()}
        for r in range(ROUNDS):
            for k, (pg, pd) in variants.items():
                us[k].append(timing.summarise(timing.time_calls(
                    [lambda i=i, pg=pg, pd=pd: step(x, ids, tw, *w[i], pg, pd, pdl) for i in range(len(w))]))["us"])
        ref = outs["table"].float()
        row = {"model": name, "pdl": pdl, "bytes": nbytes, "plans": {k: [str(p) for p in v] for k, v in variants.items()},
               "us": us, "max_rel_diff_vs_table": {k: float((o.float() - ref).abs().max() / ref.abs().max())
                                                    for k, o in outs.items()},
               "ratio_to_table": {}}
        for k in variants:
            rs = [a / b for a, b in zip(us[k], us["table"])]
            row["ratio_to_table"][k] = dict(zip(("median", "lo", "hi"), median_ci(rs)))
        res["rows"].append(row)
        print(name, "table", round(statistics.median(us["table"]), 2), "us;",
              {k: [round(v, 3) for v in r.values()] for k, r in row["ratio_to_table"].items() if k != "table"},
              flush=True)
        json.dump(res, open(f"{out_dir}/probe_v37_one_token_h200.json", "w"), indent=1)
        del w
        torch.cuda.empty_cache()


# v37b: routed rows (R >= 2) with K < N (the small models' down GEMV) on bn64 tiles; K >= N keeps bn32
TABLE = P.GEMV_TABLE["sm90"]
CANDIDATE = TABLE[:2] + (
    (0, 2, 1.0, P.GemvPlan(block_n=32, block_k=1024, num_warps=4, num_stages=2, waves=0.25)),
    (0, 2, 0.0, P.GemvPlan(block_n=64, block_k=1024, num_warps=4, num_stages=2, waves=0.25))) + TABLE[3:]
ROUTED_ROWS = (("qwen3", 1), ("olmoe", 1), ("qwen3", 8), ("qwen3", 16), ("olmoe", 8), ("mixtral", 1))


def candidate(out_dir):
    from int4lab.kernels.moe import moe_decode_routed
    # ran on commit 8b691f7's table; on a later tree (the row landed) this assertion stops it
    assert TABLE[2][:3] == (0, 2, 0.0) and len(CANDIDATE) == len(TABLE) + 1
    dev, l2, res = _start(" --candidate", f"moe_decode_routed under the committed table and the candidate, "
                          f"alternating over {ROUNDS} rounds; ratio candidate / table per round, its median and 95 % "
                          "order-statistic interval")
    res["candidate_rows"] = [str(r) for r in CANDIDATE]
    tables = {"table": TABLE, "candidate": CANDIDATE}
    for name, T in ROUTED_ROWS:
        m = MODELS[name]
        x, ids, tw, w, act, nbytes = moe_setup(m, T, dev, l2)
        us, outs = {k: [] for k in tables}, {}
        for k, t in tables.items():
            P.GEMV_TABLE["sm90"] = t
            outs[k] = moe_decode_routed(x, ids, tw, *w[0])
        for r in range(ROUNDS):
            for k, t in tables.items():
                P.GEMV_TABLE["sm90"] = t
                us[k].append(timing.summarise(timing.time_calls(
                    [lambda i=i: moe_decode_routed(x, ids, tw, *w[i]) for i in range(len(w))]))["us"])
        P.GEMV_TABLE["sm90"] = TABLE
        ratio = dict(zip(("median", "lo", "hi"), median_ci([a / b for a, b in zip(us["candidate"], us["table"])])))
        row = {"model": name, "tokens": T, "us": us, "ratio": ratio,
               "same_bits": torch.equal(outs["table"].view(torch.int16), outs["candidate"].view(torch.int16))}
        res["rows"].append(row)
        print(name, T, "table", round(statistics.median(us["table"]), 2), "us; candidate / table",
              [round(v, 3) for v in ratio.values()], "same bits", row["same_bits"], flush=True)
        json.dump(res, open(f"{out_dir}/probe_v37b_table_h200.json", "w"), indent=1)
        del w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    candidate(sys.argv[1]) if "--candidate" in sys.argv else main(sys.argv[1])
