"""A user's text file read with a bound on what it may cost: one line naming the file, its option and the bound, or
the first byte that is not UTF-8, before more than the bound is held in memory."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def read_text(path: Path, limit: int, option: str, bound: str) -> str:
    """The text of ``path``, read with a bound: ``ValueError`` in one line naming ``option`` and the file when it is
    over ``limit`` bytes (a regular file by its size, before a byte is read; a device or a pipe such as /dev/zero,
    which never ends, once ``limit + 1`` bytes have come) or when it is not UTF-8 text (naming the first bad byte's
    offset). ``bound`` names the limit in the message. Line ends are read as ``Path.read_text`` reads them
    (``\\r\\n`` and ``\\r`` become ``\\n``)."""
    too_long = f"{option} {path}: over {bound} of {limit:,} bytes"
    with path.open("rb") as file:
        info = os.fstat(file.fileno())
        if stat.S_ISREG(info.st_mode) and info.st_size > limit:
            raise ValueError(f"{too_long} ({info.st_size:,} bytes)")
        data = file.read(limit + 1)
    if len(data) > limit:  # not a regular file, or one that grew while it was read
        raise ValueError(f"{too_long} (it went on past {limit:,} bytes: the rest was not read)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{option} {path}: not UTF-8 text: byte 0x{data[err.start]:02x} at offset {err.start:,} ({err.reason})"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")
