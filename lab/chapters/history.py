"""Earlier versions of a committed receipt, read from git history: chapters 05 and 07 set a receipt beside the run
it replaced. A checkout without that history (an archive, a shallow clone) gets None and the chapters say so."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from lab.paths import ROOT
from lab.provenance.git import commit_reader


def receipt_at(path: Path, commit: str) -> dict | None:
    """The receipt at `path` (under the repository root) as `commit` holds it; None where git, the commit or the
    file at that commit is missing."""
    try:
        raw = commit_reader(ROOT, commit)(str(Path(path).resolve().relative_to(ROOT)))
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return None if raw is None else json.loads(raw)
