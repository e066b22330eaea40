"""Execute every notebook in notebooks/ in name order, headlessly; write outputs back in place.

    python -m lab.notebooks              # the main job: all notebooks, outputs written back
    python -m lab.notebooks --quick      # INT4LAB_QUICK=1: smaller problems, same code path
    python -m lab.notebooks --no-write 01_format

Figures are written by the notebooks themselves into figures/ (with --no-write or --quick into a temporary
folder, so such a run leaves every committed file as it was). A cell that raises stops the run with
the notebook name and cell index.
"""
from __future__ import annotations

import argparse
import os
import sys
import shutil
import tempfile
import time
from pathlib import Path

from lab.paths import FIGURES, NOTEBOOKS, ROOT


class NotebookError(RuntimeError):
    pass


def quick() -> bool:
    """True when notebooks should run their small, fast setting (tests set INT4LAB_QUICK=1)."""
    return os.environ.get("INT4LAB_QUICK", "0") not in ("", "0")


LIGHTEN = "--IPKernelApp.exec_lines=['import int4lab, lab.interpreter; lab.interpreter.lighten()']"


def find_notebooks(patterns=()) -> list[Path]:
    nbs = sorted(NOTEBOOKS.glob("*.ipynb"))
    if patterns:
        nbs = [p for p in nbs if any(pat in p.name for pat in patterns)]
    return nbs


def run_notebook(path: Path, *, write: bool = True, quick_mode: bool = False, timeout: int = 3600) -> float:
    """Execute one notebook top to bottom in its own directory; returns seconds taken."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    old = os.environ.get("INT4LAB_QUICK")
    os.environ["INT4LAB_QUICK"] = "1" if quick_mode else "0"
    # outputs not written back: the figures the chapter rewrites must not be either (figures/ kept aside, put back)
    fig_tmp = None if write or quick_mode else tempfile.TemporaryDirectory(prefix="int4lab_figures_")
    if fig_tmp is not None:
        kept = {f.name for f in FIGURES.glob("*") if f.is_file()}
        for name in kept:
            shutil.copy2(FIGURES / name, Path(fig_tmp.name) / name)
    # the kernel runs in notebooks/: the checkout goes on its path so that `import lab` finds the lab
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in paths if p])
    # before the first cell the kernel lightens Triton's interpreter (lab/interpreter.py: speed only, same results)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}, extra_arguments=[LIGHTEN])
    t0 = time.time()
    try:
        client.execute()
    except CellExecutionError as e:
        idx = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code" and any(
            o.get("output_type") == "error" for o in c.get("outputs", []))), "?")
        raise NotebookError(f"{path.name}: cell {idx} raised:\n{str(e)[-3000:]}") from None
    finally:
        if old is None:
            os.environ.pop("INT4LAB_QUICK", None)
        else:
            os.environ["INT4LAB_QUICK"] = old
        if fig_tmp is not None:
            for f in FIGURES.glob("*"):
                if f.is_file() and f.name not in kept:
                    f.unlink()                   # a figure this run added
            for name in kept:
                os.replace(Path(fig_tmp.name) / name, FIGURES / name)
            fig_tmp.cleanup()
    if write:
        nbformat.write(nb, path)
    return time.time() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("patterns", nargs="*", help="run only notebooks whose file name contains one of these")
    ap.add_argument("--quick", action="store_true", help="set INT4LAB_QUICK=1 (smaller problems, same code)")
    ap.add_argument("--no-write", action="store_true", help="execute but do not write outputs back")
    args = ap.parse_args(argv)
    if any(not p.strip() for p in args.patterns):
        print(f"error: a notebook pattern must be a non-empty part of a file name, got {args.patterns}",
              file=sys.stderr)
        return 2
    nbs = find_notebooks(args.patterns)
    if not nbs:
        print(f"no notebooks match {args.patterns} in {NOTEBOOKS}", file=sys.stderr)
        return 2
    total = time.time()
    for i, p in enumerate(nbs, 1):
        print(f"[{i}/{len(nbs)}] {p.name} ...", flush=True)
        try:
            dt = run_notebook(p, write=not args.no_write, quick_mode=args.quick)
        except NotebookError as e:
            print(f"FAILED {e}", file=sys.stderr, flush=True)
            return 1
        print(f"[{i}/{len(nbs)}] {p.name} done in {dt:.1f} s", flush=True)
    print(f"all {len(nbs)} notebooks executed in {time.time() - total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
