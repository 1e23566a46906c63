"""A long request held on disk, not in memory: the endpoint's memory stays flat in the document's length.

A request body over ``spool_bytes`` is read as a stream into a temporary file. It is then parsed incrementally
(:func:`taskutils.endpoint.spooled_body.parse_spooled`): every string value longer than ``string_chars`` characters
(the document, a long message) is decoded into a :class:`TextSpool`, a temporary file of 4 bytes a character that is
read back by offset, and stands in the parsed request as a :class:`LongText`; the other values are parsed as
:func:`json.loads` parses them. The question modes cut a :class:`LongText` without reading it whole; the service
tokenizes it window by window into a file of ids (:class:`IdsSpool`) that the memory agent reads a chunk at a time.
Every file is unlinked when it is made: nothing is left on disk however the request ends, and :meth:`Spools.close`
closes them (docs/serving.md, "Long requests").
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import mmap
import os
import re
import tempfile
from collections import deque
from collections.abc import Iterator
from typing import IO

import numpy as np

from recurrent.tokens import TOKEN_DTYPE

# A request body over this many bytes (~170K tokens of English) is read into a temporary file and its long texts
# are kept on disk: the endpoint's memory does not grow with the document. A shorter body is parsed in memory,
# which costs ~4.5 times the body at its peak: ~5 MiB at most (docs/serving.md, "Long requests").
SPOOL_BYTES = 1 << 20
# A request body over this many bytes is refused (413) before it is read: the paper's longest documents, 3.5M
# tokens, are ~16 MB of English as JSON (and ~32 MB of CJK text written with \u escapes): room for both.
MAX_REQUEST_BYTES = 64 << 20
WRITE_CHARS = 1 << 18  # characters of a long string gathered before they are written
_UTF32 = "utf-32-le"


class Stopped(Exception):
    """The work of a request stopped half-way because its document was cancelled (its client left)."""


def _temporary(directory: str | None) -> IO[bytes]:
    """A temporary file with no name on disk (unlinked at once: nothing outlives the process)."""
    return tempfile.TemporaryFile(dir=directory)


class TextSpool:
    """Decoded text on disk, UTF-32 (4 bytes a character, lone surrogates kept), read back by character offset."""

    def __init__(self, directory: str | None = None) -> None:
        self.file = _temporary(directory)
        self.chars = 0
        self.unwritten = False

    def append(self, text: str) -> None:
        self.file.write(text.encode(_UTF32, "surrogatepass"))
        self.chars += len(text)
        self.unwritten = True

    def read(self, start: int, stop: int) -> str:
        if self.unwritten:
            self.file.flush()
            self.unwritten = False
        return os.pread(self.file.fileno(), 4 * (stop - start), 4 * start).decode(_UTF32, "surrogatepass")

    def close(self) -> None:
        self.file.close()


class LongText:
    """A text too long to hold: pieces that are character ranges of a :class:`TextSpool` or short strings. Its
    slices (``text[a:b]``) are strings read from disk; :meth:`view` is a slice that stays on disk."""

    def __init__(self, spool: TextSpool, pieces: list[tuple[int, int] | str]) -> None:
        self.spool = spool
        self.pieces = [p for p in pieces if (p[1] > p[0] if isinstance(p, tuple) else p)]
        # Where each piece ends: a slice finds its first piece by bisection, not by a walk over all of them (a
        # document joined from 60,000 messages is 120,000 pieces).
        self.ends = list(itertools.accumulate(p[1] - p[0] if isinstance(p, tuple) else len(p) for p in self.pieces))
        self.length = self.ends[-1] if self.ends else 0

    def __len__(self) -> int:
        return self.length

    def __str__(self) -> str:
        return self[0 : self.length]

    def _ranges(self, start: int, stop: int) -> Iterator[tuple[int, int] | str]:
        first = bisect.bisect_right(self.ends, start)
        at = self.ends[first - 1] if first else 0
        for piece in itertools.islice(self.pieces, first, None):
            size = piece[1] - piece[0] if isinstance(piece, tuple) else len(piece)
            lo, hi = max(start, at), min(stop, at + size)
            if lo < hi:
                yield (piece[0] + lo - at, piece[0] + hi - at) if isinstance(piece, tuple) else piece[lo - at : hi - at]
            at += size
            if at >= stop:
                return

    def __getitem__(self, key: slice) -> str:
        start, stop, step = key.indices(self.length)
        if step != 1:
            raise ValueError("a LongText is sliced with step 1")
        parts = [self.spool.read(*r) if isinstance(r, tuple) else r for r in self._ranges(start, stop)]
        return "".join(parts)

    def view(self, start: int, stop: int) -> LongText:
        return LongText(self.spool, list(self._ranges(max(0, start), min(stop, self.length))))

    def blocks(self, start: int = 0, stop: int | None = None, size: int = WRITE_CHARS) -> Iterator[tuple[int, str]]:
        """(offset, text) of consecutive blocks of ``text[start:stop]``."""
        stop = self.length if stop is None else stop
        for at in range(start, stop, size):
            yield at, self[at : min(stop, at + size)]

    def strip(self) -> LongText:
        """As ``str.strip()``: without the white space (``str.isspace``) at both ends."""
        start = self.length
        for at, block in self.blocks():
            kept = block.lstrip()
            if kept:
                start = at + len(block) - len(kept)
                break
        return self.view(start, self.rstrip_end())

    def rstrip_end(self) -> int:
        """``len(self.rstrip())``: where the text ends without its trailing white space."""
        end = self.length
        while end > 0:
            begin = max(0, end - WRITE_CHARS)
            block = self[begin:end].rstrip()
            if block:
                return begin + len(block)
            end = begin
        return 0

    def rpartition(self, marker: str) -> tuple[LongText, str, str]:
        """As ``str.rpartition``: (the text before the last ``marker``, the marker, the text after it, read); without
        the marker, the text is not read: (empty, "", "")."""
        end = self.length
        while end > 0:
            begin = max(0, end - WRITE_CHARS)
            found = self[begin:end].rfind(marker)
            if found >= 0:
                at = begin + found
                return self.view(0, at), marker, self[at + len(marker) : self.length]
            if begin == 0:
                break
            end = begin + len(marker) - 1  # the next block overlaps this one by all a marker could straddle
        return self.view(0, 0), "", ""

    def last_match(self, pattern: re.Pattern, end: int) -> tuple[int, int] | None:
        """(start, end) of the last match of ``pattern`` in ``text[:end]`` found by ``finditer``, read from the end
        in growing windows; a match that touches a window's start may reach further back, so it widens the window.
        Within a run of the pattern's characters the match found may sit elsewhere than ``finditer`` over the
        whole text would put it (the caller strips what lies around it)."""
        size = WRITE_CHARS
        while True:
            begin = max(0, end - size)
            last = deque(pattern.finditer(self[begin:end]), maxlen=1)
            if last and (last[0].start() > 0 or begin == 0):
                return begin + last[0].start(), begin + last[0].end()
            if begin == 0:
                return None
            size *= 4


def join_texts(separator: str, texts: list[str | LongText]) -> str | LongText:
    """``separator.join(texts)``: a string when every text is one, else a :class:`LongText` over the same pieces."""
    spools = {t.spool for t in texts if isinstance(t, LongText)}
    if not spools:
        return separator.join(texts)
    if len(spools) > 1:
        raise ValueError("texts of different spools cannot be joined (a request's texts share one)")
    pieces: list[tuple[int, int] | str] = []
    for k, text in enumerate(texts):
        if k:
            pieces.append(separator)
        pieces.extend(text.pieces if isinstance(text, LongText) else [text])
    return LongText(spools.pop(), pieces)


def as_str(text: str | LongText) -> str:
    return text if isinstance(text, str) else str(text)


class IdsSpool:
    """A document's token ids written to a temporary file as they come, then mapped (read-only) as one array:
    the agent slices a chunk at a time, and :meth:`release` drops the pages read so far from the process."""

    def __init__(self, directory: str | None = None) -> None:
        self.file = _temporary(directory)
        self.count = 0
        self.map: mmap.mmap | None = None

    def write(self, ids: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(ids, dtype=TOKEN_DTYPE).tobytes())
        self.count += len(ids)

    def array(self) -> np.ndarray:
        if self.count == 0:
            return np.zeros(0, dtype=TOKEN_DTYPE)
        self.file.flush()
        self.map = mmap.mmap(self.file.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(self.map, dtype=TOKEN_DTYPE)

    def release(self) -> None:
        """Pages of the map that were read leave the process's resident memory (they stay in the page cache)."""
        if self.map is not None and not self.map.closed:
            self.map.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        if self.map is not None:
            with contextlib.suppress(BufferError):  # an array still uses it: the map closes when that array goes
                self.map.close()
        self.file.close()


class Spools:
    """The temporary files of one request: its body, its long strings, its ids. :meth:`close` closes them all."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory
        self.body: IO[bytes] | None = None
        self.text: TextSpool | None = None
        self.ids: IdsSpool | None = None

    def new_body(self) -> IO[bytes]:
        self.body = _temporary(self.directory)
        return self.body

    def new_text(self) -> TextSpool:
        self.text = TextSpool(self.directory)
        return self.text

    def new_ids(self) -> IdsSpool:
        self.ids = IdsSpool(self.directory)
        return self.ids

    def close_body(self) -> None:
        if self.body is not None:
            self.body.close()
            self.body = None

    def close(self) -> None:
        self.close_body()
        for spool in (self.text, self.ids):
            if spool is not None:
                spool.close()
        self.text = self.ids = None
