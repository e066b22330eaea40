"""Receipts recorded when a receipt's hash covered the bytes of files named by glob patterns: re-hash the same
files, as they were at the receipt's commit, by the syntax-tree method, and record that beside the old hash.

    python -m lab.provenance.legacy data/receipts/NAME.json ...     # rewrites each receipt's sources block
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import sys
from pathlib import Path

from int4lab.files import write_text_atomic

from ..paths import ROOT
from .git import commit_reader, files_at
from .hashing import METHOD, code_hash

# The patterns receipts without a `sources` block measured: the kernels (their kernel_sources_sha256).
KERNEL_PATTERNS = ["int4lab/kernels/*.py"]


def _expand(patterns, paths) -> list[str]:
    """The paths matching any glob pattern as pathlib matched them ('*' does not cross '/')."""
    return sorted(p for p in paths for pat in patterns
                  if fnmatch.fnmatch(p, pat) and p.count("/") == pat.count("/"))


def rehash(prov: dict, root=ROOT) -> dict:
    """The "ast-v1" sources block for a byte-hashed provenance block: the recorded patterns' files at the recorded
    commit, checked first against the recorded byte hash (ValueError when those files do not reproduce it)."""
    commit = prov.get("commit", "")
    if not commit or commit == "unknown" or commit.endswith("+dirty"):
        raise ValueError(f"commit must be a clean recorded commit to re-hash at, got {commit!r}")
    old = prov.get("sources") or {"kind": "kernels", "files": KERNEL_PATTERNS, "sha256": prov["kernel_sources_sha256"]}
    files = _expand(old["files"], files_at(root, commit))
    read = commit_reader(root, commit)
    h = hashlib.sha256()
    for rel in files:
        h.update(rel.encode() + b"\0" + read(rel) + b"\0")
    if h.hexdigest() != old["sha256"]:
        raise ValueError(f"the files of {old['files']} at {commit[:12]} do not reproduce the recorded byte hash")
    return {"method": METHOD, "files": files, "sha256": code_hash(files, read),
            "rehashed": {"at_commit": commit, "from_patterns": list(old["files"]), "byte_sha256": old["sha256"]}}


def main(argv=None) -> int:
    for name in (sys.argv[1:] if argv is None else argv):
        path = Path(name)
        body = json.loads(path.read_text())
        body["provenance"]["sources"] = rehash(body["provenance"])
        write_text_atomic(path, json.dumps(body, indent=1) + "\n")
        src = body["provenance"]["sources"]
        print(f"{path.name}: {src['sha256'][:12]} ({len(src['files'])} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
