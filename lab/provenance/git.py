"""The commit a measurement ran at, and files as they were at a commit."""
from __future__ import annotations

import os
import subprocess


def git_commit(root) -> str:
    """HEAD's hash, with '+dirty' when the tree has uncommitted changes.

    Where the checkout is copied without its .git (e.g. to a GPU machine), the caller passes the hash in
    INT4LAB_GIT_COMMIT; 'unknown' when neither is available.
    """
    if os.environ.get("INT4LAB_GIT_COMMIT"):
        return os.environ["INT4LAB_GIT_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def files_at(root, commit: str) -> list[str]:
    """Every tracked path at `commit` (ValueError when git does not know the commit)."""
    r = subprocess.run(["git", "ls-tree", "-r", "--name-only", commit], cwd=root, capture_output=True, text=True)
    if r.returncode:
        raise ValueError(f"commit {commit!r} is not in this repository: {r.stderr.strip()}")
    return r.stdout.split()


def commit_reader(root, commit: str):
    """read(path) -> the file's bytes at `commit`, or None where it did not exist (for hashing.code_hash)."""
    known = set(files_at(root, commit))

    def read(rel):
        if rel not in known:
            return None
        return subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=root, capture_output=True,
                              check=True).stdout
    return read
