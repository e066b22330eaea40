"""What a reader needs to know about a run: the device, the versions, the UTC date and the command."""
from __future__ import annotations

import datetime as _dt
import platform
import sys
from pathlib import Path


def device_name() -> str:
    import torch
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"cpu ({platform.processor() or platform.machine()})"


def run_info(command: str | None = None) -> dict:
    """{device, torch, triton, cuda, python, date, command}; command defaults to this process's argv."""
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
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command if command is not None else " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
    }
