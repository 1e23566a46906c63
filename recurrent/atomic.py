"""Write under a temporary name beside the target, then rename: readers (and a rerun after a kill) see the old
file or folder or the new one, never half of one. The one place this project does it."""

from __future__ import annotations

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
