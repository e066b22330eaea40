"""`python -m lab.report`: rewrite the generated blocks of the pages named (see lab.report)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab.bench.schema import DEFAULT_OUT
from .decode import ANCHORS, END, START, anchor_rows, load, reading, refuse_partial
from .generate import GENERATE_END, GENERATE_START, generate_text
from .layout import layout_block
from .pages import (DECODE_STEP_END, DECODE_STEP_START, LAYOUT_END, LAYOUT_START, MISSES_END, MISSES_START,
                    REALSCALE_END, REALSCALE_START, RESULTS_END, RESULTS_START, TARGETS_END, TARGETS_START,
                    decode_step_table, misses_block, realscale_table, render_results, replace_block)
from .targets import paired_ratios, render, repeat_of, run_to_run, target_definitions

# the blocks any page may hold, each rewritten where its start marker is found
PAGE_BLOCKS = ((REALSCALE_START, REALSCALE_END, realscale_table),
               (DECODE_STEP_START, DECODE_STEP_END, decode_step_table),
               (GENERATE_START, GENERATE_END, generate_text))


class Pages:
    """The pages a run rewrites, edited in memory: every input is read and every block rendered before the first
    write (`write_all`), so a bad receipt or a page without its markers leaves every page as it was."""

    def __init__(self):
        self.text: dict[Path, str] = {}
        self.flag: dict[Path, str] = {}

    def get(self, path, flag: str) -> str:
        from int4lab.files import check_out_path
        path = Path(path)
        if path not in self.text:
            check_out_path(path, flag=flag)                     # a regular file we may replace
            if not path.is_file():
                raise FileNotFoundError(f"{flag} {str(path)!r} does not exist")
            with reading(path):
                self.text[path], self.flag[path] = path.read_text(), flag
        return self.text[path]

    def put(self, path, flag: str, block: str, start: str, end: str) -> None:
        self.text[Path(path)] = replace_block(self.get(path, flag), block, start, end, f"{flag} {str(path)!r}")

    def write_all(self) -> None:
        from int4lab.files import write_text_atomic
        for path, text in self.text.items():
            write_text_atomic(path, text, self.flag[path])
            print(f"rewrote {path}")


def plan(args, pages: Pages) -> str | None:
    """Fill `pages` with every rewrite `args` asks for; returns the decode block to print (None: --readme only).
    Raises ValueError / FileNotFoundError naming the flag or file; writes nothing."""
    if args.readme:
        pages.put(args.readme, "--readme", layout_block(), LAYOUT_START, LAYOUT_END)
        if not (args.results or args.notes or args.pages):
            return None
    if not args.receipt.exists():
        raise FileNotFoundError(f"--receipt: no receipt at {args.receipt}: run `python -m lab.bench` on a CUDA "
                                f"machine first")
    rec = load(args.receipt)
    spread = (run_to_run(rec, load(repeat_of(rec))) if repeat_of(rec) else None) or 0.0
    anchors, paired = anchor_rows(args.anchors), paired_ratios(rec)
    with reading(args.receipt):
        block = render(rec, anchors, spread, paired)
    if args.results:
        refuse_partial(rec, args.receipt)                # whole runs only
        text = pages.get(args.results, "--results")
        pages.put(args.results, "--results", block, START, END)
        for start, end, fn in ((TARGETS_START, TARGETS_END, target_definitions),
                               (RESULTS_START, RESULTS_END, render_results), *PAGE_BLOCKS):
            if start in text:
                pages.put(args.results, "--results", fn(), start, end)
    for page in args.pages:
        text = pages.get(page, "--pages")
        for start, end, fn in PAGE_BLOCKS:
            if start in text:
                pages.put(page, "--pages", fn(), start, end)
    if args.notes:
        with reading(args.receipt):
            misses = misses_block(rec, anchors, spread, paired)
        pages.put(args.notes, "--notes", misses, MISSES_START, MISSES_END)
    return block


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
                    help="other pages whose real-width, decode-step and generate blocks to rewrite "
                         "(notes/realscale.md, notes/decode_step.md)")
    ap.add_argument("--anchors", type=Path, default=ANCHORS, help="folder with recorded llama.cpp timings")
    args = ap.parse_args(argv)
    if not args.anchors.is_dir():
        ap.error(f"--anchors {str(args.anchors)!r} is not a folder (the recorded llama.cpp timings)")
    pages = Pages()
    try:                                  # every input read, every block rendered, before any page is written
        block = plan(args, pages)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pages.write_all()
    if block is not None and not (args.results or args.notes or args.pages):
        print(block)
    return 0
