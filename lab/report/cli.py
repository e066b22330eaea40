"""`python -m lab.report`: rewrite the generated blocks of the pages named (see lab.report)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab.bench.schema import DEFAULT_OUT
from .decode import ANCHORS, anchor_rows, load, refuse_partial
from .layout import layout_block
from .pages import (DECODE_STEP_END, DECODE_STEP_START, LAYOUT_END, LAYOUT_START, MISSES_END, MISSES_START,
                    REALSCALE_END, REALSCALE_START, RESULTS_END, RESULTS_START, TARGETS_END, TARGETS_START,
                    decode_step_table, misses_block, realscale_table, render_results, rewrite_readme)
from .targets import paired_ratios, render, repeat_of, run_to_run, target_definitions


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--receipt", type=Path, default=DEFAULT_OUT, help="decode receipt to tabulate")
    ap.add_argument("--results", type=Path, default=None,
                    help="rewrite this file's generated blocks (RESULTS.md): the targets, the decode tables, the "
                         "real-width checkpoints, the models / gates / packing")
    ap.add_argument("--readme", type=Path, default=None,
                    help="rewrite this file's layout block (README.md): each folder and its size")
    ap.add_argument("--notes", type=Path, default=None,
                    help="rewrite this file's misses block (notes/kernels.md): the targets the receipt misses")
    ap.add_argument("--pages", type=Path, nargs="*", default=[],
                    help="other pages whose real-width and decode-step blocks to rewrite (notes/realscale.md)")
    ap.add_argument("--anchors", type=Path, default=ANCHORS, help="folder with recorded llama.cpp timings")
    args = ap.parse_args(argv)
    if not args.anchors.is_dir():
        ap.error(f"--anchors {str(args.anchors)!r} is not a folder (the recorded llama.cpp timings)")
    if args.readme:
        print(f"rewrote {rewrite_readme(args.readme, layout_block(), LAYOUT_START, LAYOUT_END)}")
        if not (args.results or args.notes or args.pages):
            return 0
    if not args.receipt.exists():
        print(f"no receipt at {args.receipt}: run `python -m lab.bench` on a CUDA machine first", file=sys.stderr)
        return 2
    rec = load(args.receipt)
    spread = (run_to_run(rec, load(repeat_of(rec))) if repeat_of(rec) else None) or 0.0
    anchors, paired = anchor_rows(args.anchors), paired_ratios(rec)
    block = render(rec, anchors, spread, paired)
    if args.results:
        try:                                     # whole runs only, checked before anything is rewritten
            refuse_partial(rec, args.receipt)
            text = Path(args.results).read_text()
            results = render_results() if RESULTS_START in text else None
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"rewrote {rewrite_readme(args.results, block)}")
        if TARGETS_START in text:                                # the named targets' definitions
            rewrite_readme(args.results, target_definitions(), TARGETS_START, TARGETS_END)
        if results is not None:                                  # the models / gates / packing block
            rewrite_readme(args.results, results, RESULTS_START, RESULTS_END)
        if REALSCALE_START in text:                              # the real-checkpoint block
            rewrite_readme(args.results, realscale_table(), REALSCALE_START, REALSCALE_END)
        if DECODE_STEP_START in text:                            # the whole decode step
            rewrite_readme(args.results, decode_step_table(), DECODE_STEP_START, DECODE_STEP_END)
    for page in args.pages:
        text = Path(page).read_text()
        for start, end, fn in ((REALSCALE_START, REALSCALE_END, realscale_table),
                               (DECODE_STEP_START, DECODE_STEP_END, decode_step_table)):
            if start in text:
                print(f"rewrote {rewrite_readme(page, fn(), start, end)}")
    if args.notes:
        misses = misses_block(rec, anchors, spread, paired)
        print(f"rewrote {rewrite_readme(args.notes, misses, MISSES_START, MISSES_END)}")
    if not (args.results or args.notes or args.pages):
        print(block)
    return 0
