"""Bit-identical outputs across CUDA-graph replays, and split-K counters left at zero: the one-launch
GEMV's determinism claim, checked on a GPU (and small enough to run under compute-sanitizer).

    python -m lab.tune.replay_check --out replay_check.json [--replays 100] [--small]
    compute-sanitizer --tool memcheck python -m lab.tune.replay_check --small --replays 3 --out m.json

Cases: a dense W4A8 GEMV per shape (table plan, and a forced split-K plan so the last-arriving finish
runs), and a MoE step per model at 1 token (the routed path: gate_up + down with the fused combine) and at
8 tokens (the grouped path: routing tiles, grouped gate_up and down); per model at 1 and 8 tokens the fused
decode pieces: the one-launch router (its last-arriving top-k) and RMSNorm (hidden size and head dim), and the
modules' entry (kernels.ops.moe). Each case is captured once, replayed `replays` times on fresh poison, and
every replay must equal the eager call bit for bit.
"""
from __future__ import annotations

import argparse
import json

import torch

from int4lab.kernels import launch as _launch
from int4lab.kernels import int4_linear, moe_decode_step, ops
from int4lab.kernels.norm import rms_norm
from int4lab.kernels.router import router_topk
from int4lab.kernels.plan import gemv_plan
from int4lab.format import pack_int4_b32
from int4lab.files import cli_out_ok, write_text_atomic
from lab.provenance import provenance
from lab.bench.shapes import MODELS

DENSE = ((14336, 4096), (4096, 14336), (2048, 768), (512, 2048))
SMALL = ((512, 2048), (256, 1024))


def _replays_identical(fn, replays: int) -> bool:
    """fn() -> its output tensor. Eager once (which also allocates the split-K workspace on the capture
    stream), capture once, then every replay on a poisoned output must give the eager bits."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        eager = fn().clone()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        out = fn()
    same = True
    for _ in range(replays):
        out.fill_(float("nan") if out.is_floating_point() else -1)
        g.replay()
        torch.cuda.synchronize()
        same &= torch.equal(out.view(torch.int16), eager.view(torch.int16)) if out.is_floating_point() else \
            torch.equal(out, eager)
    return bool(same)


def _counters_zero() -> bool:
    return all(int(c.abs().sum()) == 0 for _, c in _launch.WORKSPACES.values())


def run(replays: int = 100, small: bool = False) -> dict:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    rows = []
    for N, K in SMALL if small else DENSE:
        p, s = pack_int4_b32(torch.randn(N, K, device=dev))
        x = torch.randn(1, K, device=dev, dtype=torch.bfloat16)
        out = torch.empty(1, N, device=dev, dtype=torch.bfloat16)
        for label, plan in (("table", None), ("split4", gemv_plan(N, K, 1, dev, split_k=4))):
            ok = _replays_identical(lambda: int4_linear(x, p, s, out=out, plan=plan), replays)
            rows.append({"case": f"dense {N}x{K} {label}", "replays_identical": ok, "counters_zero": _counters_zero()})
    for name, m in MODELS.items():
        H, I, E, A = (m.hidden // 4, m.intermediate // 4, min(m.n_experts, 8), m.top_k) if small else \
            (m.hidden, m.intermediate, m.n_experts, m.top_k)
        A = min(A, E)
        gu = pack_int4_b32(torch.randn(E, 2 * I, H, device=dev))
        dn = pack_int4_b32(torch.randn(E, H, I, device=dev))
        for T in (1, 8):                  # one token: the routed path; 8: the grouped one (moe_decode_step)
            x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
            ids = torch.stack([torch.randperm(E, device=dev)[:A] for _ in range(T)]).int()
            tw = torch.softmax(torch.randn(T, A, device=dev), -1)
            same = _replays_identical(lambda: moe_decode_step(x, ids, tw, *gu, *dn), replays)
            rows.append({"case": f"moe {name} T{T} (H {H}, I {I}, E {E}, top-{A})", "replays_identical": bool(same),
                         "counters_zero": _counters_zero()})
            same = _replays_identical(lambda: ops.moe(x, ids, tw, *gu, *dn), replays)
            rows.append({"case": f"ops.moe {name} T{T}", "replays_identical": bool(same),
                         "counters_zero": _counters_zero()})
    for name, m in MODELS.items():
        H, E, A = (m.hidden // 4, min(m.n_experts, 8), m.top_k) if small else (m.hidden, m.n_experts, m.top_k)
        A = min(A, E)
        rw = (torch.randn(E, H, device=dev) * 0.02).bfloat16()
        nw = (torch.rand(H, device=dev) + 0.5).bfloat16()
        hw = (torch.rand(m.head_dim, device=dev) + 0.5).bfloat16()
        for T in (1, 8):
            x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
            heads = torch.randn(T * m.n_heads, m.head_dim, device=dev, dtype=torch.bfloat16)
            cases = {"router logits": lambda: router_topk(x, rw, A, True, torch.float32)[0],
                     "router weights": lambda: router_topk(x, rw, A, True, torch.float32)[1],
                     "router ids": lambda: router_topk(x, rw, A, False)[2],
                     "rms_norm hidden": lambda: rms_norm(x, nw, 1e-5),
                     "rms_norm heads": lambda: rms_norm(heads, hw, 1e-6)}
            for label, fn in cases.items():
                rows.append({"case": f"{label} {name} T{T} (H {H}, E {E}, top-{A})",
                             "replays_identical": _replays_identical(fn, replays), "counters_zero": _counters_zero()})
    return {"replays": replays, "rows": rows, "all_pass": all(r["replays_identical"] and r["counters_zero"]
                                                               for r in rows)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--small", action="store_true", help="small shapes (for compute-sanitizer)")
    args = ap.parse_args(argv)
    if not cli_out_ok(args.out):                        # before anything runs
        return 2
    rec = {"provenance": provenance(command="python -m lab.tune.replay_check"), **run(args.replays, args.small)}
    write_text_atomic(args.out, json.dumps(rec, indent=1), "--out")
    for r in rec["rows"]:
        print(r)
    print("all_pass:", rec["all_pass"])
    return 0 if rec["all_pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
