"""A long request held on disk, not in memory: the endpoint's memory stays flat in the document's length.

A request body over ``spool_bytes`` is read as a stream into a temporary file. It is then parsed incrementally
(:func:`parse_spooled`): every string value longer than ``string_chars`` characters (the document, a long message)
is decoded into a :class:`TextSpool`, a temporary file of 4 bytes a character that is read back by offset, and
stands in the parsed request as a :class:`LongText`; the other values are parsed as :func:`json.loads` parses them.
The question modes cut a :class:`LongText` without reading it whole; the service tokenizes it window by window
into a file of ids (:class:`IdsSpool`) that the memory agent reads a chunk at a time. Every file is unlinked when
it is made: nothing is left on disk however the request ends, and :meth:`Spools.close` closes them
(docs/serving.md, "Long requests").
"""

from __future__ import annotations

import bisect
import codecs
import contextlib
import itertools
import json
import mmap
import os
import re
import tempfile
import threading
from collections import deque
from collections.abc import Iterator
from typing import IO, Any

import numpy as np

from recurrent.tokens import TOKEN_DTYPE

# A request body over this many bytes (~170K tokens of English) is read into a temporary file and its long texts
# are kept on disk: the endpoint's memory does not grow with the document. A shorter body is parsed in memory,
# which costs ~4.5 times the body at its peak: ~5 MiB at most (docs/serving.md, "Long requests").
SPOOL_BYTES = 1 << 20
# A request body over this many bytes is refused (413) before it is read: the paper's longest documents, 3.5M
# tokens, are ~16 MB of English as JSON (and ~32 MB of CJK text written with \u escapes): room for both.
MAX_REQUEST_BYTES = 64 << 20
READ_BLOCK = 1 << 18  # bytes of the body read at a time
WRITE_CHARS = 1 << 18  # characters of a long string gathered before they are written
_UTF32 = "utf-32-le"

_WHITESPACE = re.compile(rb"[ \t\n\r]*")
# A run of a string's bytes with no quote, backslash or control character, and the two-byte escapes among them:
# decoded in C (the UTF-8 decoder, then json's own string scanner); a \u escape is decoded in Python.
_RUN = re.compile(rb'(?:[^"\\\x00-\x1f]+|\\["\\/bfnrt])+')
_NUMBER = re.compile(rb"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_HEX4 = re.compile(rb"[0-9a-fA-F]{4}")
_ESCAPES = {b'"': '"', b"\\": "\\", b"/": "/", b"b": "\b", b"f": "\f", b"n": "\n", b"r": "\r", b"t": "\t"}
_LITERALS = ((b"true", True), (b"false", False), (b"null", None), (b"NaN", float("nan")),
             (b"Infinity", float("inf")), (b"-Infinity", float("-inf")))  # fmt: skip


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


# ---------------------------------------------------------------------------------------------------------------
# the incremental JSON parser
# ---------------------------------------------------------------------------------------------------------------


# How deep a long body's arrays and objects may nest (a request nests 5 deep): each level costs this parser a few
# Python frames, and past Python's recursion limit it would fail with RecursionError, a 500 (docs/serving.md).
MAX_DEPTH = 200
# How many JSON values (objects, arrays, strings, numbers, literals) a long body may hold: each costs the parsed
# request about 300 bytes of memory however short its text (60,000 one-KB messages, 180,000 values: 54 MiB), so
# this bounds a running request's memory at about 90 MiB whatever its shape (docs/serving.md, "What a request
# costs"). A chat request holds 3-4 values a message: 75,000 messages and more.
MAX_VALUES = 300_000


class _Parser:
    def __init__(
        self,
        source: IO[bytes],
        spool: TextSpool,
        string_chars: int,
        keys: frozenset[str],
        stop: threading.Event | None = None,
    ) -> None:
        self.source = source
        self.keys = keys
        self.spool = spool
        self.string_chars = string_chars
        self.stop = stop
        self.held = 0  # characters of the keys' strings kept in memory so far
        self.values = 0  # JSON values parsed so far (MAX_VALUES)
        self.buf = b""
        self.pos = 0
        self.base = 0  # offset in the body of buf[0]
        self.eof = False

    def error(self, message: str, at: int | None = None) -> ValueError:
        return ValueError(f"{message} at byte {self.base + self.pos if at is None else at}")

    def decode(self, decoder: codecs.IncrementalDecoder, raw: bytes, final: bool = False) -> str:
        """``raw`` (the bytes at ``pos``) decoded; bytes that are not UTF-8 are named by their offset in the body,
        as :func:`json.loads` names them (the decoder's own offset counts from this piece, less the bytes of a
        character it holds from the piece before)."""
        held = len(decoder.getstate()[0])
        try:
            return decoder.decode(raw, final)
        except UnicodeDecodeError as err:
            at = self.base + self.pos - held + err.start
            raise ValueError(
                f"'utf-8' codec can't decode byte 0x{err.object[err.start]:02x} in position {at}: {err.reason}"
            ) from None

    def fill(self, need: int) -> None:
        """At least ``need`` bytes from ``pos`` in the buffer, unless the body ends first."""
        while len(self.buf) - self.pos < need and not self.eof:
            if self.stop is not None and self.stop.is_set():  # its client left: the rest is not read
                raise Stopped(f"parsing stopped at byte {self.base + self.pos}")
            data = self.source.read(max(READ_BLOCK, need))
            if not data:
                self.eof = True
                break
            self.base += self.pos
            self.buf = self.buf[self.pos :] + data
            self.pos = 0

    def skip_whitespace(self) -> None:
        while True:
            self.pos = _WHITESPACE.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or self.eof:
                return
            self.fill(1)

    def document(self) -> Any:
        value = self.value(0, False)
        self.skip_whitespace()
        if self.pos < len(self.buf):
            raise self.error("Extra data")
        return value

    def value(self, depth: int, long: bool) -> Any:
        if depth > MAX_DEPTH:
            raise self.error(f"the JSON nests too deep (over {MAX_DEPTH} levels)")
        self.values += 1
        if self.values > MAX_VALUES:
            raise self.error(f"the JSON holds too many values (over {MAX_VALUES:,}: objects, arrays, strings, numbers)")
        self.skip_whitespace()
        self.fill(1)
        if self.pos >= len(self.buf):
            raise self.error("Expecting value")
        c = self.buf[self.pos : self.pos + 1]
        if c == b"{":
            return self.object(depth)
        if c == b"[":
            return self.array(depth)
        if c == b'"':
            if not long:
                return self.string(None)
            # The keys' strings kept in memory add up to string_chars at most; past that every one goes to disk,
            # however short: many short messages cost what one long one does (docs/serving.md, "Long requests").
            text = self.string(self.string_chars if self.held < self.string_chars else 0)
            if isinstance(text, str):
                self.held += len(text)
            return text
        self.fill(4096)
        match = _NUMBER.match(self.buf, self.pos)
        if match:
            self.pos = match.end()
            integer, fraction, exponent = match.groups()
            if fraction or exponent:
                return float(match.group())
            return int(integer)
        for word, value in _LITERALS:
            if self.buf.startswith(word, self.pos):
                self.pos += len(word)
                return value
        raise self.error("Expecting value")

    def expect(self, what: bytes, message: str) -> None:
        self.skip_whitespace()
        if self.buf[self.pos : self.pos + 1] != what:
            raise self.error(message)
        self.pos += 1

    def object(self, depth: int) -> dict[str, Any]:
        self.pos += 1
        result: dict[str, Any] = {}
        self.skip_whitespace()
        if self.buf[self.pos : self.pos + 1] == b"}":
            self.pos += 1
            return result
        while True:
            self.skip_whitespace()
            if self.buf[self.pos : self.pos + 1] != b'"':
                raise self.error("Expecting property name enclosed in double quotes")
            key = self.string(None)
            self.expect(b":", "Expecting ':' delimiter")
            result[key] = self.value(depth + 1, key in self.keys)
            self.skip_whitespace()
            c = self.buf[self.pos : self.pos + 1]
            self.pos += 1
            if c == b"}":
                return result
            if c != b",":
                self.pos -= 1
                raise self.error("Expecting ',' delimiter")

    def array(self, depth: int) -> list[Any]:
        self.pos += 1
        result: list[Any] = []
        self.skip_whitespace()
        if self.buf[self.pos : self.pos + 1] == b"]":
            self.pos += 1
            return result
        while True:
            result.append(self.value(depth + 1, False))
            self.skip_whitespace()
            c = self.buf[self.pos : self.pos + 1]
            self.pos += 1
            if c == b"]":
                return result
            if c != b",":
                self.pos -= 1
                raise self.error("Expecting ',' delimiter")

    def string(self, limit: int | None) -> str | LongText:
        """The string at ``pos`` (its opening quote): a :class:`LongText` once it passes ``limit`` characters."""
        opened = self.base + self.pos
        self.pos += 1
        decoder = codecs.getincrementaldecoder("utf-8")("surrogatepass")  # as json.loads decodes a body
        parts: list[str] = []
        gathered = 0
        spooled: int | None = None  # where the string starts in the spool, once it is there

        def add(text: str) -> None:
            nonlocal gathered, spooled
            if not text:
                return
            parts.append(text)
            gathered += len(text)
            if limit is not None and (gathered >= WRITE_CHARS if spooled is not None else gathered > limit):
                if spooled is None:
                    spooled = self.spool.chars
                self.spool.append("".join(parts))
                parts.clear()
                gathered = 0

        while True:
            self.fill(2)
            run = _RUN.match(self.buf, self.pos)
            if run:
                raw = self.buf[self.pos : run.end()]
                text = self.decode(decoder, raw)
                self.pos = run.end()
                if b"\\" in raw:
                    text = json.decoder.scanstring(text + '"', 0)[0]
                add(text)
                continue
            if self.pos >= len(self.buf):
                raise self.error("Unterminated string starting", opened)
            c = self.buf[self.pos : self.pos + 1]
            add(self.decode(decoder, b"", final=True))  # an incomplete character before a quote or escape is an error
            if c == b'"':
                self.pos += 1
                break
            if c != b"\\":
                raise self.error("Invalid control character")
            self.fill(12)
            kind = self.buf[self.pos + 1 : self.pos + 2]
            if kind in _ESCAPES:
                add(_ESCAPES[kind])
                self.pos += 2
                continue
            if kind != b"u" or not _HEX4.match(self.buf, self.pos + 2):
                raise self.error("Invalid \\escape" if kind != b"u" else "Invalid \\uXXXX escape")
            code = int(self.buf[self.pos + 2 : self.pos + 6], 16)
            self.pos += 6
            # A high surrogate escape followed by a low one is one character (json's scanner does the same).
            if 0xD800 <= code <= 0xDBFF and self.buf.startswith(b"\\u", self.pos):
                low = self.buf[self.pos + 2 : self.pos + 6]
                if _HEX4.fullmatch(low) and 0xDC00 <= int(low, 16) <= 0xDFFF:
                    code = 0x10000 + (((code - 0xD800) << 10) | (int(low, 16) - 0xDC00))
                    self.pos += 6
            add(chr(code))
        if spooled is None:
            return "".join(parts)
        self.spool.append("".join(parts))
        return LongText(self.spool, [(spooled, self.spool.chars)])


def parse_spooled(
    source: IO[bytes],
    spool: TextSpool,
    string_chars: int,
    keys: frozenset[str],
    stop: threading.Event | None = None,
) -> Any:
    """A JSON body read from ``source`` as :func:`json.loads` reads it, except that the strings that are the value
    of one of ``keys`` in an object (where the request holds its texts) are decoded into ``spool`` as
    :class:`LongText`: one longer than ``string_chars`` characters, and every one once those kept in memory add up
    to ``string_chars``. ``stop`` set (its client left) ends the parse with :class:`Stopped`.
    A body that is not UTF-8 (JSON allows UTF-16 and UTF-32) is read whole and parsed by :func:`json.loads`.
    ValueError (UnicodeDecodeError among them) names what is wrong and where."""
    head = source.read(4)
    source.seek(0)
    if json.detect_encoding(head) != "utf-8":
        try:
            return json.loads(source.read())
        except RecursionError:  # nested past Python's recursion limit: the client's 400, not a 500
            raise ValueError("the JSON nests too deep") from None
    return _Parser(source, spool, string_chars, keys, stop).document()


# ---------------------------------------------------------------------------------------------------------------
# a request's files
# ---------------------------------------------------------------------------------------------------------------


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
