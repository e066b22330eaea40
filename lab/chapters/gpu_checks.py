"""The text receipts of `lab/gpu_run.sh`'s stage `checks`, read for chapter 03: the CUDA suite's output
(cuda_tests_<card>.txt) and compute-sanitizer's summary lines (sanitizer_<card>.txt).

Each file's first line names the stage's settings, the commit, the card and the software. `read_checks` returns
what each tool and the suite reported, which of the four tools ran, and whether the kernel code at the receipts'
commit is this checkout's (int4lab/kernels/*.py compared as syntax trees, docstrings and comments aside, as the
receipts' kernel-source hash compares them). A tool's exit status of 124 is `timeout`'s: it ran past the stage's
limit (SANITIZER_S seconds) and reported no summary.
"""
from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from lab.bench.checks import SANITIZERS, cuda_tests_outcome
from lab.paths import RECEIPTS, ROOT
from lab.provenance.git import commit_reader, files_at
from lab.provenance.hashing import code_hash, tree_reader

KERNELS = "int4lab/kernels/"
TIMEOUT_RC = 124          # `timeout`'s exit status when it stopped the command


def read_header(line: str) -> dict:
    """'# lab/gpu_run.sh, stage checks (K=V ...), commit SHA, CARD, ...' -> {settings, commit, card}."""
    m = re.match(r"# lab/gpu_run\.sh, stage (\w+) \(([^)]*)\), commit ([0-9a-f]{7,40}), ([^,]+),", line)
    if m is None:
        raise ValueError(f"not a lab/gpu_run.sh receipt header: {line[:120]!r}")
    settings = dict(kv.split("=", 1) for kv in shlex.split(m.group(2)))
    return {"stage": m.group(1), "settings": settings, "commit": m.group(3), "card": m.group(4).strip()}


def kernels_same(commit: str, root=ROOT) -> bool | None:
    """Whether int4lab/kernels/*.py at `commit` equal the working tree's as syntax trees; None where git or the
    commit is not available (a copy without .git, a shallow clone)."""
    try:
        then = [f for f in files_at(root, commit) if f.startswith(KERNELS) and f.endswith(".py")]
        now = [str(p.relative_to(root)) for p in Path(root, KERNELS).glob("*.py")]
        files = sorted(set(then) | set(now))
        return code_hash(files, commit_reader(root, commit)) == code_hash(files, tree_reader(root))
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def read_checks(card: str = "h100", receipts: Path = RECEIPTS, root=ROOT) -> dict:
    """The stage's receipts for `card`: header fields of each, per tool {rc, summary} (a file that repeats a tool's
    line must repeat it unchanged), the tools not run, the suite's summary, failed ids with their reasons and
    skip lines, whether the replay check's receipt is in `receipts`, and kernels_same at the sanitizer's commit."""
    san_lines = (Path(receipts) / f"sanitizer_{card}.txt").read_text().splitlines()
    suite_text = (Path(receipts) / f"cuda_tests_{card}.txt").read_text()
    san, suite = read_header(san_lines[0]), read_header(suite_text.splitlines()[0])
    tools = {}
    for ln in san_lines:
        m = re.match(rf"({'|'.join(SANITIZERS)}) rc=(\d+)\s*(.*)$", ln)
        if m is None:
            continue
        row = {"rc": int(m.group(2)), "summary": m.group(3).strip() or None}
        if tools.setdefault(m.group(1), row) != row:
            raise ValueError(f"sanitizer_{card}.txt reports {m.group(1)} twice, differently: "
                             f"{tools[m.group(1)]}, {row}")
    reasons = dict(re.findall(r"^FAILED (\S+) - (.*)$", suite_text, flags=re.M))
    return {"sanitizer": san, "tools": tools, "not_run": [t for t in SANITIZERS if t not in tools],
            "suite": {**suite, **cuda_tests_outcome(suite_text), "reasons": reasons,
                      "skipped": re.findall(r"^SKIPPED \[\d+\] (\S+?):", suite_text, flags=re.M)},
            "replay_receipt": (Path(receipts) / "replay_check.json").exists(),
            "kernels_same": kernels_same(san["commit"], root)}
