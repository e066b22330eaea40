"""Receipts: every published number is written with where, when and how it was measured."""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from .paths import ROOT


def git_commit() -> str:
    """HEAD's hash, with '+dirty' when the tree has uncommitted changes.

    Where the checkout travels without its .git (the lent GPU machine), the caller passes the hash in
    INT4LAB_GIT_COMMIT; 'unknown' when neither is available.
    """
    import os
    if os.environ.get("INT4LAB_GIT_COMMIT"):
        return os.environ["INT4LAB_GIT_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


KERNEL_SOURCES = "int4lab/kernels"


def kernel_sources_hash(root=ROOT) -> str:
    """sha256 over the kernel package's .py files (sorted by name, each as 'name\0bytes\0'): the code a GPU
    receipt measured. A receipt whose hash differs from the tree's is stale (notebooks and tests say so)."""
    import hashlib
    h = hashlib.sha256()
    for f in sorted((Path(root) / KERNEL_SOURCES).glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def device_name() -> str:
    import torch
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"cpu ({platform.processor() or platform.machine()})"


def provenance(command: str | None = None) -> dict:
    """Device, versions, commit, UTC date and the command that produced a result."""
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "device": device_name(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "commit": git_commit(),
        "kernel_sources_sha256": kernel_sources_hash(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command if command is not None else " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
    }


def portable_command(command) -> str:
    """`command` with the directories of absolute paths elided ("…/name"): where a file was written on the
    measuring machine says nothing about the measurement, and receipts carry no machine paths."""
    return " ".join("…/" + Path(t).name if t.startswith("/") else t for t in str(command).split())


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path beside `path` to write; on success it is fsynced and renamed over `path`
    (os.replace: readers see the old file or the whole new one, never a part). On any exception, a
    KeyboardInterrupt included, the temporary file is removed and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)              # mkstemp's 0600 would follow the file to its final name
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):          # the rename itself is durable once the directory is synced
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def write_text_atomic(path, text: str) -> Path:
    """`path.write_text(text)` through `atomic_path`: never a truncated file under the final name."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_receipt(path, payload: dict, command: str | None = None) -> Path:
    """Write payload plus a `provenance` block as JSON, atomically (`atomic_path`); returns the path.
    The JSON is built before anything touches the disk, so a payload that cannot be serialised leaves
    the old receipt in place."""
    path = Path(path)
    body = {"provenance": provenance(command), **payload}
    text = json.dumps(body, indent=1) + "\n"
    return write_text_atomic(path, text)


def read_receipt(path) -> dict:
    return json.loads(Path(path).read_text())
