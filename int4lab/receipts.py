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

from .files import atomic_path, write_text_atomic  # noqa: F401  (re-exported)
from .paths import ROOT


def git_commit() -> str:
    """HEAD's hash, with '+dirty' when the tree has uncommitted changes.

    Where the checkout is copied without its .git (e.g. to a GPU machine), the caller passes the hash in
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


# What each kind of receipt measured: the files whose change makes such a receipt stale, declared here once.
# provenance(sources=KIND) writes their hash into the receipt; tests/test_receipts.py fails on a committed receipt
# whose hash no longer matches the tree, or that was made from a dirty tree. Patterns are relative to ROOT.
_KERNELS = ("int4lab/kernels/*.py",)
_QUANTISER = ("int4lab/format.py", "int4lab/gptq.py", "int4lab/quantize/*.py", "int4lab/models/*.py",
              "int4lab/corpus.py")                                     # the packs a quantised model holds
SOURCES = {
    "kernels": _KERNELS,                                               # decode bench, paired rounds, CUDA suite
    "gate": ("int4lab/gate/*.py",) + _QUANTISER + _KERNELS,            # python -m int4lab.gate (parity: kernels)
    "llamacpp": ("int4lab/export.py", "int4lab/q4_0.py", "lab/llamacpp.py") + _QUANTISER,   # no kernel runs
    "realscale": ("int4lab/gate/*.py", "lab/realscale.py", "lab/synth.py") + _QUANTISER + _KERNELS,
    "realscale_gate": ("int4lab/gate/*.py", "lab/realscale.py", "lab/realscale_gate.py", "lab/synth.py")
    + _QUANTISER + _KERNELS,                                           # the README's gate command at real width
    "decode_step": ("lab/decode_step/*.py", "lab/bench/floor.py", "lab/bench/timing.py") + _QUANTISER + _KERNELS,
    "prefill": ("lab/prefill_bench.py",) + _QUANTISER + _KERNELS,      # many-row int4 scoring against bf16
}
KERNEL_SOURCES = "int4lab/kernels"      # the folder of SOURCES["kernels"], named in messages
# Receipts kept although files they measured changed after them, each with what changed since: the report and the
# chapters print this beside every number they take from such a receipt, and tests/test_receipts.py fails on any
# other stale receipt and on an entry here that is current again. `python -m ...` in each receipt's provenance
# regenerates it.
_ROUTER = ("int4lab/kernels/norm.py: the output dtype codes became tl.constexpr, so that the router kernel compiles on "
           "CUDA (it did not at the measured commit); no bench row runs the norm or router kernels")
_PREFILL_OFF = ("int4lab/quantize/prefill.py and modules.py: the prefill path is off by default since, and the MoE "
                "modules' loop path builds its index on the tensor's device; this run had the prefill path on for "
                "many-row forwards")
_DOCSTRING = "int4lab/quantize/prefill.py: its module docstring only (it now reports this run and the tests' outcome)"
STALE = {
    "prefill_h100.json": _DOCSTRING,
    "decode_step_h100.json": ("lab/decode_step/cli.py: the CLI now writes the receipt's sources hash itself (this "
                              "receipt's was computed afterwards from a clean checkout of the commit it names); "
                              + _DOCSTRING),
    "realscale_gate_olmoe_h100.json": _ROUTER + "; " + _PREFILL_OFF + ": the gate scored through it, so its time and "
                                      "memory are the prefill path's",
}



def source_files(kind: str, root=ROOT) -> list[Path]:
    """The files SOURCES[kind] names under root, sorted by their path relative to root."""
    if kind not in SOURCES:
        raise ValueError(f"sources must be one of {tuple(SOURCES)}, got {kind!r}")
    root = Path(root)
    files = {f for pattern in SOURCES[kind] for f in root.glob(pattern) if f.is_file()}
    return sorted(files, key=lambda f: f.relative_to(root).as_posix())


def sources_hash(kind: str, root=ROOT) -> str:
    """sha256 over SOURCES[kind]'s files (sorted by relative path, each as 'path\0bytes\0'): the code a receipt of
    that kind measured. Any file changed, added, removed or renamed changes it."""
    import hashlib
    h = hashlib.sha256()
    for f in source_files(kind, root):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def kernel_sources_hash(root=ROOT) -> str:
    """sources_hash("kernels"): the kernel code a GPU receipt measured (bench.decide groups its rounds by it)."""
    return sources_hash("kernels", root)


def device_name() -> str:
    import torch
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"cpu ({platform.processor() or platform.machine()})"


def provenance(command: str | None = None, sources: str | None = None) -> dict:
    """Device, versions, commit, UTC date and the command that produced a result; with `sources` (a key of
    SOURCES) also the hash of the files that kind of receipt measured, so a stale receipt can be detected."""
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    out = {
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
    if sources is not None:
        out["sources"] = {"kind": sources, "files": list(SOURCES[sources]), "sha256": sources_hash(sources)}
    return out


def portable_command(command) -> str:
    """`command` with the directories of absolute paths elided ("…/name"): where a file was written on the
    measuring machine says nothing about the measurement, and receipts carry no machine paths."""
    return " ".join("…/" + Path(t).name if t.startswith("/") else t for t in str(command).split())


def write_receipt(path, payload: dict, command: str | None = None, sources: str | None = None) -> Path:
    """Write payload plus a `provenance` block (with the `sources` hash of that receipt kind) as JSON,
    atomically (`atomic_path`); returns the path. The JSON is built before anything touches the disk, so a
    payload that cannot be serialised leaves the old receipt in place."""
    path = Path(path)
    body = {"provenance": provenance(command, sources), **payload}
    text = json.dumps(body, indent=1) + "\n"
    return write_text_atomic(path, text)


def read_receipt(path) -> dict:
    return json.loads(Path(path).read_text())
