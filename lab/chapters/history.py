"""Earlier versions of a committed receipt, read from git history: chapters 05 and 07 set a receipt beside the run
it replaced, and the receipt tests name the sources that changed since a receipt's commit. A checkout without that
history (an archive, a shallow clone) gets None and the readers say so."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from lab.paths import ROOT
from lab.provenance.git import commit_reader
from lab.provenance.hashing import canonical_tree, tree_reader


def text_at(path: Path, commit: str) -> str | None:
    """The text of the file at `path` (under the repository root) as `commit` holds it; None where git, the commit
    or the file at that commit is missing."""
    try:
        raw = commit_reader(ROOT, commit)(str(Path(path).resolve().relative_to(ROOT)))
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return None if raw is None else raw.decode("utf-8", errors="replace")


def changed_since(receipt: dict, root=ROOT) -> list[str]:
    """The files among a receipt's measured sources whose syntax tree differs in the tree at `root` from the
    receipt's commit (or that are gone); ValueError / SubprocessError where that commit is not in the checkout."""
    src, prov = receipt["provenance"].get("sources") or {}, receipt["provenance"]
    then, now = commit_reader(root, prov["commit"]), tree_reader(root)
    out = []
    for f in src.get("files", []):
        a, b = then(f), now(f)
        if b is None or a is None or canonical_tree(a) != canonical_tree(b):
            out.append(f)
    return out


def receipt_at(path: Path, commit: str) -> dict | None:
    """The receipt at `path` (under the repository root) as `commit` holds it; None where git, the commit or the
    file at that commit is missing."""
    raw = text_at(path, commit)
    return None if raw is None else json.loads(raw)
