"""A long request's body on disk, parsed incrementally (:func:`parse_spooled`): what :func:`json.loads` reads, except
that the request's long strings are decoded into a :class:`~taskutils.endpoint.spool.TextSpool` and stand in the
parsed request as :class:`~taskutils.endpoint.spool.LongText` (docs/serving.md, "Long requests")."""

from __future__ import annotations

import codecs
import json
import re
import threading
from typing import IO, Any

from taskutils.endpoint.spool import WRITE_CHARS, LongText, Stopped, TextSpool

READ_BLOCK = 1 << 18  # bytes of the body read at a time

_WHITESPACE = re.compile(rb"[ \t\n\r]*")
# A run of a string's bytes with no quote, backslash or control character, and the two-byte escapes among them:
# decoded in C (the UTF-8 decoder, then json's own string scanner); a \u escape is decoded in Python.
_RUN = re.compile(rb'(?:[^"\\\x00-\x1f]+|\\["\\/bfnrt])+')
_NUMBER = re.compile(rb"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_HEX4 = re.compile(rb"[0-9a-fA-F]{4}")
_ESCAPES = {b'"': '"', b"\\": "\\", b"/": "/", b"b": "\b", b"f": "\f", b"n": "\n", b"r": "\r", b"t": "\t"}
_LITERALS = ((b"true", True), (b"false", False), (b"null", None), (b"NaN", float("nan")),
             (b"Infinity", float("inf")), (b"-Infinity", float("-inf")))  # fmt: skip

# How deep a body's arrays and objects may nest (a request nests 5 deep), whatever its size: each level costs this
# parser a few Python frames, and past Python's recursion limit it would fail with RecursionError, a 500; a body
# parsed in memory is held to the same rule (check_depth), so that one request is refused or not whatever its
# size (docs/serving.md, "What a request costs").
MAX_DEPTH = 200
TOO_DEEP = f"the JSON nests too deep (over {MAX_DEPTH} levels)"
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
            raise self.error(TOO_DEEP)
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
            value = json.loads(source.read())
        except RecursionError:  # nested past Python's recursion limit: the client's 400, not a 500
            raise ValueError(TOO_DEEP) from None
        return check_depth(value)
    return _Parser(source, spool, string_chars, keys, stop).document()


def check_depth(value: Any) -> Any:
    """``value`` (parsed JSON) when no value in it lies deeper than :data:`MAX_DEPTH` (the top level is 0), as
    :func:`parse_spooled` reads a body; else ValueError. Iterative: its cost is one step per array or object."""
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        if children and depth >= MAX_DEPTH:
            raise ValueError(TOO_DEEP)
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return value
