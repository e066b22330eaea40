"""Where the library finds the data it ships with (the tiny models, tokenizer, corpus, lm-eval tasks) and where a
CLI run writes by default: resolved from the package, not the CWD."""
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"
RUNS = DATA.parent / "runs"   # a CLI's default output folder (git-ignored); elsewhere only through --out
