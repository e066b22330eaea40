"""`python -m lab.bench`: time every decode shape and MoE layer beside its peers and the read floor, one
run, one receipt (defaults in `main`; the method is in the package docstring)."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from lab.bench import __doc__ as PACKAGE_DOC
from lab.bench.harness import dry_run, run
from lab.paths import RUNS
from lab.bench.schema import DEFAULT_OUT, IMPLS, validate_receipt

# Start no new measurement after this many seconds: a full H200 run, the last measurement started before the
# budget included, takes under 6 minutes; what is left unstarted is listed as skipped.
DEFAULT_BUDGET_S = 300.0
# A user's run writes beside the repository's receipts, never over them: data/receipts/ only through --out.
DEFAULT_RUN_OUT = RUNS / DEFAULT_OUT.name


def check_args(args) -> list:
    """The --only subset as a list ([] = every impl); ValueError naming the flag and the rule."""
    only = [s.strip() for s in args.only.split(",") if s.strip()] if args.only is not None else []
    if args.only is not None and not only:
        raise ValueError(f"--only must name at least one of {','.join(IMPLS)}, got {args.only!r}")
    bad = sorted(set(only) - set(IMPLS))
    if bad:
        raise ValueError(f"--only must name impls from {','.join(IMPLS)}, got unknown {','.join(bad)}")
    if args.replays < 20:
        raise ValueError(f"--replays must be >= 20 (medians of at least 20 replays), got {args.replays}")
    if not (math.isfinite(args.budget_s) and args.budget_s >= 0):
        raise ValueError(f"--budget-s must be a finite number >= 0 (0 = no limit), got {args.budget_s}")
    return only


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.bench", description=PACKAGE_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="two GEMV shapes and Qwen3's MoE layer at 1 and 8 tokens: the same code path, < 1 min")
    ap.add_argument("--out", type=Path, default=DEFAULT_RUN_OUT,
                    help=f"receipt path (default runs/{DEFAULT_OUT.name}; data/receipts/ only when named here)")
    ap.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(IMPLS)} (the read floor "
                                               "is measured for every row whatever the subset)")
    ap.add_argument("--replays", type=int, default=20, help="timed graph replays per row; us = their median")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights, activations and MoE routings")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                    help="start no new measurement after this many seconds; the rest is recorded as skipped "
                         f"(default {DEFAULT_BUDGET_S:g}: a full H200 run fits 6 minutes; 0 = no limit)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print shapes, routed experts and bytes per call, read floors included; time nothing")
    args = ap.parse_args(argv)
    try:
        only = check_args(args)                                # with --dry-run too
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        for d in dry_run(args.quick, seed=args.seed):
            active = f" {d['n_active']:3d} experts" if "n_active" in d else " " * 12
            print(f"{d['model']:8s} {d['layer']:22s} {d['N']:6d}x{d['K']:<6d} R={d['rows']:<3d}{active} "
                  f"{d['impl']:17s} {d['bytes']:>12d} B")
        return 0
    from int4lab.files import check_out_path
    from lab.provenance import portable_command, write_receipt
    try:
        check_out_path(args.out)                              # before anything is timed
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("lab.bench: no CUDA device here; timing needs one (use --dry-run to list shapes and bytes)",
              file=sys.stderr)
        return 2
    cmd = portable_command("python -m lab.bench " + " ".join(argv if argv is not None else sys.argv[1:]))
    # after every measurement the receipt on disk is replaced (atomically: a whole JSON file, never part of one;
    # method.complete false until the end), so a run killed from outside still leaves what it measured
    payload = run(quick=args.quick, only=only, replays=args.replays, seed=args.seed,
                  budget_s=args.budget_s or None, checkpoint=lambda p: write_receipt(args.out, p, command=cmd))
    validate_receipt({"provenance": {}, **payload})
    path = write_receipt(args.out, payload, command=cmd)
    print(f"wrote {path} ({len(payload['rows'])} rows, {len(payload['floor'])} floors, "
          f"{len(payload['skipped'])} skipped)")
    return 0
