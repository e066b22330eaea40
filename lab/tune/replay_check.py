"""Bit-identical outputs across CUDA-graph replays, and split-K counters left at zero: the one-launch
GEMV's determinism claim, checked on a GPU (and small enough to run under compute-sanitizer).

    python -m lab.tune.replay_check --out replay_check.json [--replays 100] [--small]
    compute-sanitizer --tool memcheck python -m lab.tune.replay_check --small --replays 3 --out m.json

Cases: a dense W4A8 GEMV per shape (table plan, and a forced split-K plan so the last-arriving finish runs), and a
MoE step per model at 1 token (the routed path: gate_up + down with the fused combine) and at 8 tokens (the path
moe_decode_step picks: at full width grouped for Mixtral only, since OLMoE's and Qwen3's 64 routed rows fall on up
to 64 experts, one mean row each; at --small every model's 8-token step is grouped); per model at 1 and 8 tokens
the fused decode pieces: the one-launch router (its last-arriving top-k) and RMSNorm (hidden size and head dim),
and the modules' entry (kernels.ops.moe). No W4A16 case (int4_linear(act="bf16")). Each case is captured once and
replayed `replays` times, alternating two input sets copied into the captured inputs, on a poisoned output and
NaN-poisoned split-K partials; every replay must equal the eager output of its own input set bit for bit
(`replays_match`). A partial read before this replay's store landed would see the other set's value or NaN, and
differ. What no replay can show: a race whose losing order never occurred in these replays, or an out-of-date read
of a value that happens to equal the fresh one.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys

import torch

from int4lab.kernels import launch as _launch
from int4lab.kernels import int4_linear, moe_decode_step, ops
from int4lab.kernels.norm import rms_norm
from int4lab.kernels.router import router_topk
from int4lab.kernels.plan import gemv_plan
from int4lab.format import pack_int4_b32
from int4lab.files import cli_out_ok, write_text_atomic
from lab.provenance import portable_command, provenance
from lab.bench.shapes import MODELS

DENSE = ((14336, 4096), (4096, 14336), (2048, 768), (512, 2048))
SMALL = ((512, 2048), (256, 1024))


def _cuda_capture(fn):
    """Eager once on a side stream (which also allocates the split-K workspace of the capture stream), then
    capture fn once; returns (replay, out): replay() reruns the graph, writing the captured output `out`."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        out = fn()

    def replay():
        g.replay()
        torch.cuda.synchronize()
    return replay, out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype in (torch.bfloat16, torch.float16) else \
        t.view(torch.int32) if t.dtype == torch.float32 else t


def _poison(t: torch.Tensor) -> None:
    t.fill_(float("nan") if t.is_floating_point() else -1)


def replays_match(fn, static, input_sets, replays: int, capture=_cuda_capture) -> dict:
    """fn() -> its output tensor, reading only the tensors `static` (list). `input_sets`: two or more lists of
    tensors shaped like `static`. Each set's eager output is its reference; then fn is captured once and replay
    i runs on set i % len(input_sets), copied into `static`, with the output and every split-K partial
    workspace (`launch.WORKSPACES`) poisoned first; each replay must equal its own set's reference bit for bit.
    A program that read a partial slot before this replay's store landed would read the poison (or, where two
    GEMVs share a workspace, the other's partial) and differ; consecutive replays see different inputs because an
    intermediate output read by a later kernel is not poisoned and holds the previous replay's values. `capture(fn)` ->
    (replay, out); the CUDA graph by default. Returns {"replays_identical", "inputs_differ"}: inputs_differ is
    False when two sets give the same reference bits (an out-of-date read between them would then be invisible)."""
    if len(input_sets) < 2 or replays < 1:
        raise ValueError(f"need at least 2 input sets and 1 replay, got {len(input_sets)} sets, {replays} replays")
    refs = []
    for inputs in input_sets:
        for dst, src in zip(static, inputs, strict=True):
            dst.copy_(src)
        refs.append(fn().clone())
    differ = all(not torch.equal(_bits(a), _bits(b)) for a, b in zip(refs, refs[1:] + refs[:1]))
    replay, out = capture(fn)
    same = True
    for r in range(replays):
        i = r % len(input_sets)
        for dst, src in zip(static, input_sets[i]):
            dst.copy_(src)
        _poison(out)
        for part, _ in _launch.WORKSPACES.values():
            part.fill_(float("nan"))
        replay()
        same &= torch.equal(_bits(out), _bits(refs[i]))
    return {"replays_identical": bool(same), "inputs_differ": bool(differ)}


def _row(case: str, fn, static, input_sets, replays: int) -> dict:
    return {"case": case, **replays_match(fn, static, input_sets, replays), "counters_zero": _counters_zero()}


def _counters_zero() -> bool:
    return all(int(c.abs().sum()) == 0 for _, c in _launch.WORKSPACES.values())


def run(replays: int = 100, small: bool = False) -> dict:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    rows = []
    for N, K in SMALL if small else DENSE:
        p, s = pack_int4_b32(torch.randn(N, K, device=dev))
        x = torch.empty(1, K, device=dev, dtype=torch.bfloat16)
        xs = [torch.randn(1, K, device=dev, dtype=torch.bfloat16) for _ in range(2)]
        out = torch.empty(1, N, device=dev, dtype=torch.bfloat16)
        for label, plan in (("table", None), ("split4", gemv_plan(N, K, 1, dev, split_k=4))):
            rows.append(_row(f"dense {N}x{K} {label}", lambda: int4_linear(x, p, s, out=out, plan=plan),
                             [x], [[x_] for x_ in xs], replays))
    for name, m in MODELS.items():
        H, I, E, A = (m.hidden // 4, m.intermediate // 4, min(m.n_experts, 8), m.top_k) if small else \
            (m.hidden, m.intermediate, m.n_experts, m.top_k)
        A = min(A, E)
        gu = pack_int4_b32(torch.randn(E, 2 * I, H, device=dev))
        dn = pack_int4_b32(torch.randn(E, H, I, device=dev))
        for T in (1, 8):                  # one token: the routed path; 8: whichever moe_decode_step picks (doc)
            x = torch.empty(T, H, device=dev, dtype=torch.bfloat16)
            tw = torch.empty(T, A, device=dev)
            ids = torch.stack([torch.randperm(E, device=dev)[:A] for _ in range(T)]).int()
            sets = [[torch.randn(T, H, device=dev, dtype=torch.bfloat16),
                     torch.softmax(torch.randn(T, A, device=dev), -1)] for _ in range(2)]
            rows.append(_row(f"moe {name} T{T} (H {H}, I {I}, E {E}, top-{A})",
                             lambda: moe_decode_step(x, ids, tw, *gu, *dn), [x, tw], sets, replays))
            rows.append(_row(f"ops.moe {name} T{T}", lambda: ops.moe(x, ids, tw, *gu, *dn), [x, tw], sets, replays))
    for name, m in MODELS.items():
        H, E, A = (m.hidden // 4, min(m.n_experts, 8), m.top_k) if small else (m.hidden, m.n_experts, m.top_k)
        A = min(A, E)
        rw = (torch.randn(E, H, device=dev) * 0.02).bfloat16()
        nw = (torch.rand(H, device=dev) + 0.5).bfloat16()
        hw = (torch.rand(m.head_dim, device=dev) + 0.5).bfloat16()
        for T in (1, 8):
            x = torch.empty(T, H, device=dev, dtype=torch.bfloat16)
            heads = torch.empty(T * m.n_heads, m.head_dim, device=dev, dtype=torch.bfloat16)
            x0 = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
            h0 = torch.randn(T * m.n_heads, m.head_dim, device=dev, dtype=torch.bfloat16)
            sets = [[x0, h0], [-x0, -h0]]     # negated: the top-k ids differ too (E > A, or the order reverses)
            cases = {"router logits": lambda: router_topk(x, rw, A, True, torch.float32)[0],
                     "router weights": lambda: router_topk(x, rw, A, True, torch.float32)[1],
                     "router ids": lambda: router_topk(x, rw, A, False)[2],
                     "rms_norm hidden": lambda: rms_norm(x, nw, 1e-5),
                     "rms_norm heads": lambda: rms_norm(heads, hw, 1e-6)}
            for label, fn in cases.items():
                rows.append(_row(f"{label} {name} T{T} (H {H}, E {E}, top-{A})", fn, [x, heads], sets, replays))
    return {"replays": replays, "input_sets": 2, "rows": rows,
            "all_pass": all(r["replays_identical"] and r["inputs_differ"] and r["counters_zero"] for r in rows)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--small", action="store_true", help="small shapes (for compute-sanitizer)")
    args = ap.parse_args(argv)
    if args.replays < 1:
        print(f"--replays must be >= 1, got {args.replays}", file=sys.stderr)
        return 2
    if not cli_out_ok(args.out):                        # before anything runs
        return 2
    argv = sys.argv[1:] if argv is None else argv
    command = portable_command("python -m lab.tune.replay_check " + " ".join(shlex.quote(a) for a in argv))
    rec = {"provenance": provenance(command=command), **run(args.replays, args.small)}
    write_text_atomic(args.out, json.dumps(rec, indent=1), "--out")
    for r in rec["rows"]:
        print(r)
    print("all_pass:", rec["all_pass"])
    return 0 if rec["all_pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
