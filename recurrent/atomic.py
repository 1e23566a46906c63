"""Write under a temporary name beside the target, then rename: readers (and a rerun after a kill) see the old
file or folder or the new one, never half of one. The one place this project does it."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(dest: str | Path, folder: bool = False) -> Iterator[Path]:
    """A temporary path beside ``dest`` to write into (with ``folder``, an empty folder made for the block).
    It replaces ``dest`` when the block ends without error, and is removed when the block raises."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if folder:
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
        tmp.chmod(0o755)  # mkdtemp makes it private; the published folder is an ordinary one
    else:  # the pid keeps two processes writing the same file apart
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        if folder and dest.exists():
            shutil.rmtree(dest)  # a rename cannot replace a folder that has files in it
        os.replace(tmp, dest)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, data: bytes | str) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8) in one rename."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


def os_error_text(err: OSError, path: str | Path | None = None) -> str:
    """An OSError in one line, ``PATH: cause (ENAME)``, for a command's error message: ``path`` names the file when
    the error does not (a write to an open file, a library's writer)."""
    where = err.filename if err.filename is not None else path
    cause = err.strerror or str(err) or type(err).__name__
    name = errno.errorcode.get(err.errno) if isinstance(err.errno, int) else None
    text = f"{cause} ({name})" if name else cause
    return f"{where}: {text}" if where is not None else text


def os_error_remedy(err: OSError, elsewhere: str = "write elsewhere") -> str:
    """What to do about the commonest faults of a machine that cannot write: a full disk, a folder not ours."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free some space, then run the same command again"
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"make the folder writable or {elsewhere}"
    return "fix the cause, then run the same command again"
