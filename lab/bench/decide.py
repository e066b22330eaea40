"""`python -m lab.bench.decide`: settle the targets the bench receipt leaves "undecided".

A target such as "int4_b32 <= 1.15x the read floor" compares two medians from one bench run. Where the
ratio lies closer to the limit than the run-to-run spread (`report.run_to_run`), that receipt cannot say
which side it is on. This re-measures only those pairs, paired and repeated:
- each round times every item of a spec back to back (the bench's timer, weights rotated past L2, the read
  floor as the bench defines it: best of its launch configurations), in an order that rotates by round, so a
  slow phase of the machine hits numerator and denominator alike;
- R rounds give R ratios; their median's distribution-free 95 % interval (order statistics of a
  binomial(R, 1/2), `median_ci`) is the uncertainty;
- the whole measurement repeats in P fresh processes (clocks, allocation and compilation differ between
  processes), and a target is decided only when the hull of the P intervals lies on one side of its limit.

Specs: `gemv:NxK` (int4_b32 and the read floor of its bytes) and `moe:MODEL:T` (our MoE paths, the bf16
per-expert loop and the read floor of the unique routed experts; at T > 1 also the grouped path and
grouped_mm). Write one file per run, `data/receipts/decide_h200_<commit>.json`: `report.paired_ratios` pools
every run whose kernel hash matches the receipt's (runs on two machines of the same model can differ by more than
one run's intervals) and lets a run of other kernel sources withhold, never grant, a verdict.
    python -m lab.bench.decide --spec gemv:14336x4096 --spec moe:mixtral:1 --rounds 15 --processes 3 \\
        --out data/receipts/decide_h200_<commit>.json
"""
from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path

ROUNDS_MIN = 6           # the fewest rounds whose order statistics give a >= 95 % interval for the median


def median_ci(xs, level: float = 0.95) -> tuple[float, float, float]:
    """(median, lo, hi) of xs: lo / hi are the k-th smallest and k-th largest values, k the largest rank with
    P(Binomial(n, 1/2) < k) * 2 <= 1 - level, which covers the population median with probability >= level
    whatever the distribution (independent rounds assumed). Needs n >= 6 at level 0.95."""
    xs = sorted(float(x) for x in xs)
    n = len(xs)
    if not 0.5 < level < 1:
        raise ValueError(f"level must be in (0.5, 1), got {level!r}")
    def below(k):                                               # P(Binomial(n, 1/2) < k)
        return sum(math.comb(n, i) for i in range(k)) / 2 ** n
    k = max((k for k in range(1, n // 2 + 1) if 2 * below(k) <= 1 - level), default=0)
    if k == 0:
        raise ValueError(f"{n} values give no {level:.0%} interval for the median (need at least {ROUNDS_MIN})")
    mid = n // 2
    med = xs[mid] if n % 2 else (xs[mid - 1] + xs[mid]) / 2
    return med, xs[k - 1], xs[n - k]


def parse_spec(spec: str) -> tuple:
    """"gemv:NxK" -> ("gemv", N, K); "moe:MODEL:T" -> ("moe", MODEL, T). ValueError naming the rule otherwise."""
    from .shapes import MODELS
    m = re.fullmatch(r"gemv:(\d+)x(\d+)", spec)
    if m:
        N, K = int(m.group(1)), int(m.group(2))
        if N <= 0 or K <= 0 or K % 32:
            raise ValueError(f"spec {spec!r}: N must be positive and K a positive multiple of 32")
        return ("gemv", N, K)
    m = re.fullmatch(r"moe:(\w+):(\d+)", spec)
    if m:
        if m.group(1) not in MODELS:
            raise ValueError(f"spec {spec!r}: model must be one of {sorted(MODELS)}")
        if int(m.group(2)) < 1:
            raise ValueError(f"spec {spec!r}: tokens must be >= 1")
        return ("moe", m.group(1), int(m.group(2)))
    raise ValueError(f"spec must be 'gemv:NxK' or 'moe:MODEL:TOKENS', got {spec!r}")


def ratios_of(key: tuple) -> list[tuple[str, str]]:
    """The (numerator, denominator) item pairs a spec's targets compare."""
    if key[0] == "gemv":
        return [("int4_b32", "floor")]
    ours = ("int4_b32_moe",) if key[2] == 1 else ("int4_b32_moe", "int4_b32_grouped")
    peers = ("bf16_loop",) if key[2] == 1 else ("bf16_loop", "grouped_mm")
    return [(o, "floor") for o in ours] + [(p, o) for o in ours for p in peers]


def _prepare(key: tuple, l2: int, gen) -> tuple[dict, int]:
    """{item: calls} (each call list checked against its reference once) and the floor's byte count."""
    from .shapes import MODELS
    from lab.bench import peers
    from lab.bench import timing
    from lab.bench.traffic import expert_bytes, gemv_bytes, gemv_floor_bytes, moe_floor_bytes
    import torch
    items = {}
    if key[0] == "gemv":
        _, N, K = key
        W = peers.weights(N, K, gen)
        x = torch.randn(1, K, generator=gen, device=gen.device).to(torch.bfloat16)
        p = peers.prep_gemv("int4_b32", W, x, timing.copies_for(gemv_bytes("int4_b32", N, K) - 2 * (K + N), l2))
        checks = {"int4_b32": p}
        nbytes = gemv_floor_bytes(N, K)
    else:
        _, name, T = key
        m = MODELS[name]
        inp = peers.moe_inputs(m, T, gen)
        active = peers.n_active(inp.ids)
        impls = {o for pair in ratios_of(key) for o in pair} - {"floor"}
        checks = {i: peers.prep_moe(i, m, inp, timing.copies_for(active * expert_bytes(i, m), l2))
                  for i in sorted(impls)}
        nbytes = moe_floor_bytes(m, T, active)
    for impl, p in checks.items():
        err = peers.rel_err(p.calls[0](), p.ref)
        if not err <= p.tol:
            raise RuntimeError(f"{key} {impl}: wrong result, max|y-ref|/max|ref| = {err:.3g} > {p.tol:.3g}")
        items[impl] = p.calls
    return items, nbytes


def measure(key: tuple, rounds: int, replays: int = 20, seed: int = 0) -> dict:
    """One process's paired rounds for one spec: {"us": {item: [per-round median]}, "floor_bytes"}."""
    import torch
    from lab.bench import floor
    from lab.bench import timing
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(seed)
    l2 = timing.l2_bytes()
    items, nbytes = _prepare(key, l2, gen)
    names = list(items) + ["floor"]
    us = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:      # the order rotates by round
            if n == "floor":
                us[n].append(floor.read_floor(nbytes, l2=l2, replays=replays)["us"])
            else:
                us[n].append(timing.summarise(timing.time_calls(items[n], replays=replays))["us"])
    return {"us": us, "floor_bytes": nbytes}


def combine(key: tuple, per_process: list[dict], level: float = 0.95) -> list[dict]:
    """Per ratio of the spec: each process's rounds -> median and interval; the pooled median of all rounds and
    the hull [min lo, max hi] of the processes' intervals (what `decided` compares with a limit)."""
    out = []
    for num, den in ratios_of(key):
        procs, pooled = [], []
        for p in per_process:
            rs = [a / b for a, b in zip(p["us"][num], p["us"][den])]
            med, lo, hi = median_ci(rs, level)
            procs.append({"ratios": rs, "median": med, "lo": lo, "hi": hi})
            pooled += rs
        out.append({"num": num, "den": den, "median": median_ci(pooled, level)[0],
                    "lo": min(p["lo"] for p in procs), "hi": max(p["hi"] for p in procs), "processes": procs})
    return out


def decided(lo: float, hi: float, limit: float, at_most: bool) -> str:
    """"pass" / "miss" when the interval [lo, hi] lies on one side of `limit`, else "undecided". at_most: the
    target is ratio <= limit (else ratio >= limit)."""
    if not lo <= hi:
        raise ValueError(f"need lo <= hi, got [{lo}, {hi}]")
    if hi < limit:
        return "pass" if at_most else "miss"
    if lo > limit:
        return "miss" if at_most else "pass"
    return "undecided"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.bench.decide", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", action="append", required=True, help="gemv:NxK or moe:MODEL:TOKENS (repeatable)")
    ap.add_argument("--rounds", type=int, default=15, help=f"paired rounds per process (>= {ROUNDS_MIN})")
    ap.add_argument("--processes", type=int, default=3, help="fresh processes, each running every spec's rounds")
    ap.add_argument("--replays", type=int, default=20, help="graph replays per timing (its median is one round)")
    ap.add_argument("--out", type=Path, help="receipt to write (the parent run); omitted in a child process")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:                                                   # every refusal before any process starts
        keys = [parse_spec(s) for s in args.spec]
        if args.rounds < ROUNDS_MIN:
            raise ValueError(f"--rounds must be >= {ROUNDS_MIN} (a 95 % interval for the median), got {args.rounds}")
        if args.processes < 1 or args.replays < 20:
            raise ValueError(f"--processes must be >= 1 and --replays >= 20, got {args.processes}, {args.replays}")
        if not args.child and args.out is None:
            raise ValueError("--out is required")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.child:
        print(json.dumps([measure(k, args.rounds, args.replays) for k in keys]))
        return 0
    from int4lab.files import cli_out_ok
    if not cli_out_ok(args.out):
        return 2
    import torch
    if not torch.cuda.is_available():
        print("lab.bench.decide: timing needs a CUDA device", file=sys.stderr)
        return 2
    child = [sys.executable, "-m", "lab.bench.decide", "--child", "--rounds", str(args.rounds),
             "--replays", str(args.replays)] + [a for s in args.spec for a in ("--spec", s)]
    runs = []
    for i in range(args.processes):
        done = subprocess.run(child, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"process {i + 1} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"process {i + 1} of {args.processes} done", flush=True)
    from lab.provenance import portable_command, write_receipt
    payload = {"method": {"rounds": args.rounds, "processes": args.processes, "replays": args.replays,
                          "interval": "95 % order-statistic interval of the median per process; decided when "
                                      "the hull of the processes' intervals lies on one side of the limit"},
               "specs": [{"spec": s, "key": list(k), "floor_bytes": runs[0][j]["floor_bytes"],
                          "us": [r[j]["us"] for r in runs], "ratios": combine(k, [r[j] for r in runs])}
                         for j, (s, k) in enumerate(zip(args.spec, keys))]}
    cmd = portable_command("python -m lab.bench.decide " + " ".join(argv if argv is not None else sys.argv[1:]))
    path = write_receipt(args.out, payload, command=cmd)
    for s in payload["specs"]:
        for r in s["ratios"]:
            print(f"{s['spec']:22s} {r['num']}/{r['den']}: {r['median']:.4f} [{r['lo']:.4f}, {r['hi']:.4f}]")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
