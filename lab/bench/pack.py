"""Pack-time benchmark: how long GPTQ and a lottery ticket (dithered round-to-nearest) take to pack one layer,
next to round-to-nearest.

    python -m lab.bench.pack                              # 1024x4096 on the CPU
    python -m lab.bench.pack --device cuda                # 14336x4096 (and 1024x4096) on the GPU
    python -m lab.bench.pack --shapes 4096x4096 --repeats 5 --no-write

Shape legend: N = out features, K = in features.

Each repeat times one call, from source weight and Hessian already on the device to packed bytes
(torch.cuda.synchronize() before stopping the clock). The Hessian is built from synthetic activations
(`lab.chapters.calib.synthetic_activations`, 2K rows), which does not change the work: GPTQ's cost is the Cholesky
factorisation of H (~K³/3 flops, twice) plus the column sweep (~2NK·blocksize flops and K small steps).
Writes runs/gptq_pack_<cpu|h200|gpu name>.json (data/receipts/ only when --out names it): rows of N, K, device,
impl, seconds (median wall time) with min/max and the median process CPU time (on a shared CPU, wall time swings
with the neighbours' load; CPU time much less), through `write_receipt`.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from lab.chapters.calib import synthetic_activations
from int4lab.format import pack_int4_b32
from int4lab.gate.arms import DITHER
from int4lab.gptq import HessianAccumulator, gptq_pack_int4_b32
from int4lab.quantize import dithered_pack
from lab.provenance import write_receipt

IMPLS = {
    "rtn": lambda w, H: pack_int4_b32(w),
    "rtn_dithered": lambda w, H: dithered_pack(w, DITHER, 1),      # a lottery ticket: target <= 1.5x rtn
    "gptq": lambda w, H: gptq_pack_int4_b32(w, H),
    "gptq_act_order": lambda w, H: gptq_pack_int4_b32(w, H, act_order=True),
}
DEFAULT_SHAPES = {"cpu": ((1024, 4096),), "cuda": ((1024, 4096), (14336, 4096))}


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def bench_pack(shapes, device: str = "cpu", impls=tuple(IMPLS), repeats: int = 3, seed: int = 0) -> list[dict]:
    """Time each impl on each (N, K) shape on `device`; one warm-up call first (CUDA init, allocator)."""
    rows = []
    for N, K in shapes:
        g = torch.Generator().manual_seed(seed)
        w = (torch.randn(N, K, generator=g) * 0.02).to(device)
        acc = HessianAccumulator(K, device=device)
        acc.add(synthetic_activations(2 * K, K, generator=g).to(device))
        for impl in impls:
            fn = IMPLS[impl]
            fn(w, acc.H)
            _sync(device)
            times, cpu = [], []
            for _ in range(repeats):
                t0, c0 = time.perf_counter(), time.process_time()
                fn(w, acc.H)
                _sync(device)
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            rows.append({"N": N, "K": K, "device": torch.device(device).type, "impl": impl,
                         "seconds": statistics.median(times), "min_s": min(times), "max_s": max(times),
                         "cpu_seconds": statistics.median(cpu), "repeats": repeats})
    return rows


def receipt_name(device: str) -> str:
    if torch.device(device).type != "cuda":
        return "gptq_pack_cpu.json"
    name = torch.cuda.get_device_name(torch.device(device))
    tag = "h200" if "H200" in name else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    return f"gptq_pack_{tag}.json"


def _shape(s: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)x(\d+)", s)
    if not m:
        raise argparse.ArgumentTypeError(f"shape must be NxK (e.g. 1024x4096), got {s!r}")
    return int(m.group(1)), int(m.group(2))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--shapes", nargs="+", type=_shape, default=None,
                    help="NxK weight shapes (default: 1024x4096 on cpu; also 14336x4096 on cuda)")
    ap.add_argument("--impls", nargs="+", choices=tuple(IMPLS), default=list(IMPLS),
                    help="rtn = pack_int4_b32 (the baseline), gptq = damp 0.01, blocksize 128")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per shape and impl (median reported)")
    ap.add_argument("--no-write", action="store_true", help="print the rows, write no receipt")
    ap.add_argument("--out", type=Path, default=None,
                    help="receipt path (default runs/gptq_pack_<device>.json; data/receipts/ only when named here)")
    args = ap.parse_args(argv)
    from int4lab.files import cli_out_ok
    from lab.paths import RUNS
    bad = [f"{N}x{K}" for N, K in args.shapes or () if N < 1 or K < 32 or K % 32]
    if bad or args.repeats < 1:
        print(f"error: --shapes {' '.join(bad)}: N must be >= 1 and K a positive multiple of 32 (int4-b32 blocks)"
              if bad else f"error: --repeats must be an int >= 1, got {args.repeats}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA device here", file=sys.stderr)
        return 2
    out = args.out or RUNS / receipt_name(args.device)
    if not args.no_write and not cli_out_ok(out):            # before anything is timed
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False     # GPTQ's updates in true fp32, as on the CPU
    shapes = args.shapes or DEFAULT_SHAPES[args.device]
    rows = bench_pack(shapes, args.device, args.impls, args.repeats)
    for r in rows:             # milliseconds to the microsecond: a pack on a GPU takes a few of them
        print(f"{r['N']:>6}x{r['K']:<6} {r['device']:>4} {r['impl']:>15}  {1e3 * r['seconds']:10.3f} ms "
              f"(min {1e3 * r['min_s']:.3f}, max {1e3 * r['max_s']:.3f}; process CPU {1e3 * r['cpu_seconds']:.3f} ms)")
    if not args.no_write:
        payload = {"config": {"shapes": [list(s) for s in shapes], "impls": args.impls, "repeats": args.repeats,
                              "seed": 0, "damp": 0.01, "blocksize": 128,
                              "threads": torch.get_num_threads()}, "rows": rows}
        if hasattr(os, "getloadavg"):     # a shared CPU slows every row: record how busy it was
            payload["loadavg_1m_after"] = os.getloadavg()[0]
        path = write_receipt(out, payload,
                             command="python -m lab.bench.pack " + " ".join(argv if argv is not None
                                                                               else sys.argv[1:]))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
