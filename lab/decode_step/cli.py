"""python -m lab.decode_step: the decode-step receipt (see bench.py for what is measured).

The receipt goes to runs/decode_step_<card>.json unless --out names another path (data/receipts/ for one the
chapter reads). An existing receipt at that path keeps what this call does not measure (other architectures, and
within one the rows and parts of other runs), so a long run can be split across calls, e.g.
    python -m lab.decode_step --runs eager graphed --out R.json           # everything but the compiles
    python -m lab.decode_step --runs compiled --parts times --out R.json  # then the compiled rows
(--prior names the earlier receipt when it lies elsewhere than --out.)

The receipt says whether this call finished: top-level "complete" is false while it runs (the receipt is
rewritten after every part) and when it stopped early, with "interrupted" naming why (Ctrl-C, an error); the
report refuses such a receipt for the published pages.
"""
from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from pathlib import Path

import torch

from lab.paths import ROOT
from lab.provenance import portable_command, write_receipt
from lab.synth import ARCHS, WIDTHS

from . import bench
from .model import EXPERTS_IMPLS

ORDER = ("olmoe", "qwen3_moe", "mixtral")       # small experts first: their layers are furthest from the floor


def card() -> str:
    """'h100', 'h200', ... from the CUDA device name; 'cpu' without one."""
    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name().lower()
    for tag in ("h200", "h100", "a100", "l40s", "l4", "b200"):
        if tag in name:
            return tag
    return name.split()[-1].replace("/", "-")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lab.decode_step", description=bench.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", nargs="+", choices=ARCHS, default=list(ORDER))
    ap.add_argument("--width", choices=WIDTHS, default="real", help="real: the published widths; tiny: CPU tests")
    ap.add_argument("--layers", nargs="+", type=int, default=[1, 2],
                    help="decoder layers measured; per layer = slope between the smallest and the largest")
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 4, 16], help="sequences decoded at once")
    ap.add_argument("--contexts", nargs="+", type=int, default=[256, 4096],
                    help="positions of the static KV cache every step attends over")
    ap.add_argument("--states", nargs="+", choices=bench.STATES, default=list(bench.STATES))
    ap.add_argument("--runs", nargs="+", choices=bench.RUNS, default=list(bench.RUNS))
    ap.add_argument("--impls", nargs="+", choices=EXPERTS_IMPLS, default=list(EXPERTS_IMPLS),
                    help="transformers experts implementations tried for bf16")
    ap.add_argument("--replays", type=int, default=16, help="graph replays back to back per timed sample")
    ap.add_argument("--samples", type=int, default=15, help="timed samples per graphed depth (median kept)")
    ap.add_argument("--eager-steps", type=int, default=8)
    ap.add_argument("--eager-warmup", type=int, default=2)
    ap.add_argument("--eager-samples", type=int, default=3)
    ap.add_argument("--floor-replays", type=int, default=10)
    ap.add_argument("--greedy-steps", type=int, default=64, help="greedy tokens compared, eager against graphed int4")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens before the greedy steps")
    ap.add_argument("--parts", nargs="+", choices=bench.PARTS, default=list(bench.PARTS),
                    help="what to measure: step times, floors, the greedy check, host cost per call, the breakdown "
                         "(profile of the graphed step of batch 1 at the first context); an earlier call's parts "
                         "stay in the receipt")
    ap.add_argument("--compile-states", nargs="+", choices=bench.STATES, default=["bf16", "int4"],
                    help="states measured compiled (batch 1, the first context)")
    ap.add_argument("--breakdown-states", nargs="+", choices=bench.STATES, default=list(bench.STATES),
                    help="states whose graphed step is profiled (the breakdown part)")
    ap.add_argument("--compile-backend", default="inductor", help="torch.compile backend of the compiled run")
    ap.add_argument("--compile-reserve-s", type=float, default=60.0,
                    help="budget a compiled run needs left before it starts")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="wall-clock budget, shared evenly by the architectures; parts past it are skipped")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="receipt path (default runs/decode_step_<card>.json)")
    ap.add_argument("--prior", default=None,
                    help="an earlier call's receipt to continue from (default: --out when it exists)")
    return ap


def _check(args) -> None:
    if min(args.layers) < 1 or len(set(args.layers)) < 2:
        raise ValueError(f"--layers needs at least two distinct depths >= 1, got {args.layers}")
    if min(args.batches) < 1:
        raise ValueError(f"--batches must be >= 1, got {args.batches}")
    if min(args.contexts) <= 32 + args.prompt:
        raise ValueError(f"--contexts must exceed 32 positions of headroom and the prompt, got {args.contexts}")
    for flag in ("replays", "samples", "eager_steps", "eager_samples", "floor_replays", "prompt"):
        v = getattr(args, flag)
        if v < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be an int >= 1, got {v}")
    for flag in ("eager_warmup", "greedy_steps", "seed"):
        if getattr(args, flag) < 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be an int >= 0, got {getattr(args, flag)}")
    if not (math.isfinite(args.budget_s) and args.budget_s > 0):
        raise ValueError(f"--budget-s must be a positive finite number of seconds, got {args.budget_s}")
    if set(args.runs) == {"graphed"} and not torch.cuda.is_available():
        raise ValueError("--runs graphed needs a CUDA device (a captured CUDA graph) and torch sees none: add eager")
    if not (math.isfinite(args.compile_reserve_s) and args.compile_reserve_s >= 0):
        raise ValueError(f"--compile-reserve-s must be a finite number >= 0, got {args.compile_reserve_s}")


def _prior(path, flag) -> dict:
    """The earlier receipt this call continues from ({} when there is none); ValueError naming it when unusable."""
    if not path.exists():
        if flag == "--prior":
            raise ValueError(f"--prior {str(path)!r} does not exist")
        return {}
    try:
        before = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{flag} {str(path)!r} is not a readable JSON receipt ({e}); it is continued from") from None
    if not isinstance(before, dict) or before.get("kind") != "decode_step":
        raise ValueError(f"{flag} {str(path)!r} is not a decode_step receipt (no kind 'decode_step')")
    return before


def main(argv=None) -> int:
    from int4lab.files import check_out_path
    args = parser().parse_args(argv)
    out = Path(args.out) if args.out else ROOT / "runs" / f"decode_step_{card()}.json"
    src = Path(args.prior) if args.prior else out
    try:                                         # before anything is measured
        _check(args)
        check_out_path(out)
        before = _prior(src, "--prior" if args.prior else "--out")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t0 = time.time()
    deadline = t0 + args.budget_s
    prior = before.get("archs", {})
    archs = dict(prior)
    import transformers
    command = portable_command(" ".join(["python -m lab.decode_step"] + (argv if argv is not None else sys.argv[1:])))

    state = {"complete": False}             # until the last architecture is done; a stop records why

    def save():
        this = {"command": command, "settings": {k: v for k, v in vars(args).items() if k not in ("out", "prior")},
                "seconds": time.time() - t0, **state}
        write_receipt(out, {"kind": "decode_step", "card": card(), "transformers": transformers.__version__,
                            **this, "calls": before.get("calls", []) + [this], "archs": archs}, command=command)

    def log(msg):
        print(f"[{time.time() - t0:6.1f} s] {msg}", flush=True)

    ok = True
    old_handler = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))    # `timeout` stops with SIGTERM
    try:
        todo = [a for a in ORDER if a in args.arch] + [a for a in args.arch if a not in ORDER]
        for n, arch in enumerate(todo):
            # an even share of what is left: an architecture that finishes early leaves its time to the next ones
            share = time.time() + (deadline - time.time()) / (len(todo) - n)
            r = bench.Run(arch, args, save, log, share, prior=prior.get(arch))
            archs[arch] = r.rec
            r.run()
            save()
            g = r.rec.get("greedy") or {}
            ok &= g.get("equal") is not False
            log(f"{arch} summary: {json.dumps(r.rec.get('summary', {}), indent=None)[:2000]}")
            del r
            bench._free()
    except BaseException as e:               # Ctrl-C, a timeout's SIGTERM, an error: the receipt says it stopped
        state["interrupted"] = f"{type(e).__name__}: {e}"[:500]
        save()
        log(f"stopped ({state['interrupted']}); partial receipt: {out}")
        raise
    finally:
        signal.signal(signal.SIGTERM, old_handler)
    # an earlier call's architectures that it left unfinished and this call did not run again stay partial
    left = sorted({a for c in before.get("calls", []) if c.get("complete") is False
                   for a in (c.get("settings") or {}).get("arch", []) if a not in args.arch})
    state.update({"complete": True} if not left else
                 {"interrupted": f"an earlier call stopped before finishing {left}: run them again"})
    save()
    log(f"receipt: {out}")
    return 0 if ok else 1
