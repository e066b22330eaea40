"""Where the repository keeps receipts, figures, chapters and user runs (resolved from the package, not the CWD)."""
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
RECEIPTS = DATA / "receipts"
FIGURES = ROOT / "figures"
NOTEBOOKS = ROOT / "notebooks"
RUNS = ROOT / "runs"          # where a CLI run writes by default (git-ignored); data/receipts/ only through --out


def figure_path(name: str) -> Path:
    """figures/NAME; in quick mode (INT4LAB_QUICK=1, as the tests run notebooks) a temporary folder,
    so a quick run never overwrites the committed full-size figures; INT4LAB_FIGURES_DIR, when set, names
    the folder instead (`lab.notebooks --no-write` points it at a temporary one)."""
    quick = os.environ.get("INT4LAB_QUICK", "0") not in ("", "0")
    folder = Path(tempfile.gettempdir()) / "int4lab_quick_figures" if quick else FIGURES
    folder = Path(os.environ.get("INT4LAB_FIGURES_DIR") or folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name
