"""Where the repository keeps data, receipts and figures (resolved from the package, not the CWD)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
RECEIPTS = DATA / "receipts"
FIGURES = ROOT / "figures"
NOTEBOOKS = ROOT / "notebooks"


def figure_path(name: str) -> Path:
    FIGURES.mkdir(parents=True, exist_ok=True)
    return FIGURES / name
