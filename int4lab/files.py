"""Writing files so that a reader never sees half of one and nothing a user runs destroys what was there."""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_target(path, flag: str = "path") -> Path:
    """`path` as a Path when it names a regular file or nothing yet; else ValueError naming `flag`.

    The atomic writer replaces the directory entry itself: a symlink would lose its link, a device node or FIFO
    would become a regular file, so anything but a regular file or a new path is refused (write to the link's
    target by naming it)."""
    p = Path(path)
    try:
        mode = os.lstat(p).st_mode
    except FileNotFoundError:
        return p
    except NotADirectoryError:
        return p                     # a parent is a file: the caller's directory check names that
    if stat.S_ISDIR(mode):
        raise ValueError(f"{flag} {str(path)!r} is a directory; name a file")
    for test, kind in _KINDS:
        if test(mode):
            raise ValueError(f"{flag} {str(path)!r} is {kind}: name a regular file or a new path (it would be "
                             f"replaced by a regular file)")
    if not stat.S_ISREG(mode):
        raise ValueError(f"{flag} {str(path)!r} is not a regular file: name a regular file or a new path")
    return p


@contextlib.contextmanager
def atomic_path(path, flag: str = "path"):
    """Yield a temporary path beside `path` to write; on success it is fsynced and renamed over `path`
    (os.replace: readers see the old file or the whole new one, never a part). On any exception, a
    KeyboardInterrupt included, the temporary file is removed and `path` is left as it was.

    `path` must be a regular file or a new path (`check_target`), checked before anything is written and again
    just before the rename. The file keeps the mode of the one it replaces; a new one gets the umask's."""
    path = check_target(path, flag)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        yield Path(tmp)
        # the mode an in-place write would leave: the old file's, else the umask's (a writer that recreates
        # tmp, as safetensors does, and mkstemp itself would give 0600)
        os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode) if path.is_file() else 0o666 & ~umask)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        check_target(path, flag)               # something may have appeared there while the file was written
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


def write_text_atomic(path, text: str, flag: str = "path") -> Path:
    """`path.write_text(text)` through `atomic_path`: never a truncated file under the final name."""
    with atomic_path(path, flag) as tmp:
        tmp.write_text(text)
    return Path(path)


def check_out_path(path, *, flag: str = "--out", force: bool | None = None):
    """Check, before any work starts, that a file can be written at `path`; returns it as a Path.

    ValueError naming `flag` when `path` is not a regular file or a new path (a directory, a symlink, a device
    node, a FIFO: `check_target`), or when its nearest existing ancestor is not a writable directory (a missing
    parent is fine: the writer creates it; files are written beside their final name and renamed, so the
    directory, not the file, must be writable). With force=False an existing file is refused (FileExistsError:
    pass --force); force=None lets it be replaced.
    """
    p = check_target(path, flag)         # a regular file or a new path: no link, device, FIFO or directory
    if p.exists() and force is False:
        raise FileExistsError(f"{flag} {str(path)!r} exists; pass --force (force=True) to overwrite it")
    _check_creatable(p.absolute().parent, path, flag)
    return p


def cli_out_ok(path, *, flag: str = "--out", force: bool | None = None) -> bool:
    """`check_out_path` for a command line: False after printing its one-line refusal to stderr (the caller then
    exits 2 before any work)."""
    import sys
    try:
        check_out_path(path, flag=flag, force=force)
        return True
    except (ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return False


def check_dir_path(path, *, flag: str = "--workdir"):
    """Check, before any work starts, that `path` is a writable directory or can be created as one."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        kind = "a file" if p.is_file() else "not a regular file"
        raise ValueError(f"{flag} {str(path)!r} is {kind}, not a directory")
    _check_creatable(p.absolute(), path, flag)
    return p


def _check_creatable(folder, path, flag) -> None:
    """The nearest existing ancestor of `folder` (or itself) is a directory we may write into."""
    anc = folder
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir():
        raise ValueError(f"{flag} {str(path)!r} cannot be created: {str(anc)!r} is a file, not a directory")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {str(path)!r} cannot be written: directory {str(anc)!r} is not writable")
