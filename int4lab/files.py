"""Writing files so that a reader never sees half of one and nothing a user runs destroys what was there."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


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
