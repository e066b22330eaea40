"""Receipts: every published number is written with where, when, at which commit and from which code it was
measured. The code is the repository modules the measuring process imported (hashing.imported_files), hashed
by their syntax trees (hashing.code_hash); a receipt is current while today's files hash the same."""
from __future__ import annotations

import json
from pathlib import Path

from int4lab.files import write_text_atomic
from int4lab.runinfo import run_info

from ..paths import ROOT
from .git import git_commit
from .hashing import METHOD, code_hash, imported_files, tree_reader


def measured_sources(root=ROOT, modules=None) -> dict:
    """{method, files, sha256}: the repository files this process imported and their hash, as of now."""
    files = imported_files(root, modules)
    return {"method": METHOD, "files": files, "sha256": code_hash(files, tree_reader(root))}


def kernel_sources_hash(root=ROOT) -> str:
    """The hash of int4lab/kernels/*.py alone: the kernel code a GPU receipt timed (the bench groups rounds by it)."""
    root = Path(root)
    files = [p.relative_to(root).as_posix() for p in sorted((root / "int4lab" / "kernels").glob("*.py"))]
    return code_hash(files, tree_reader(root))


def stamp(info: dict, root=ROOT) -> dict:
    """`info` (a run_info block) plus the commit, the kernel sources' hash and the measured sources."""
    return {**info, "commit": git_commit(root), "kernel_sources_sha256": kernel_sources_hash(root),
            "sources": measured_sources(root)}


def provenance(command: str | None = None) -> dict:
    """Device, versions, UTC date and command (int4lab.runinfo.run_info), commit and the measured sources."""
    return stamp(run_info(command))


def portable_command(command) -> str:
    """`command` with the directories of absolute paths elided ("…/name"): where a file was written on the
    measuring machine says nothing about the measurement, and receipts carry no machine paths."""
    return " ".join("…/" + Path(t).name if t.startswith("/") else t for t in str(command).split())


def write_receipt(path, payload: dict, command: str | None = None) -> Path:
    """Write payload plus a `provenance` block as JSON, atomically; returns the path. The JSON is built before
    anything touches the disk, so a payload that cannot be serialised leaves the old receipt in place."""
    body = {"provenance": provenance(command), **payload}
    return write_text_atomic(Path(path), json.dumps(body, indent=1) + "\n")


def read_receipt(path) -> dict:
    return json.loads(Path(path).read_text())


def is_current(receipt: dict, root=ROOT) -> bool:
    """Whether the files a receipt measured hash today as they did then (method "ast-v1")."""
    src = receipt.get("provenance", {}).get("sources") or {}
    if src.get("method", "").split(" ")[0] != METHOD or not src.get("files"):
        return False
    return code_hash(src["files"], tree_reader(root)) == src["sha256"]
