"""Long documents in token space: encoding with bounded memory, centre truncation, chunking.

Encoding a 3.2M-token document in one call of a Hugging Face fast tokenizer peaks at ~2.2 GB (the
``Encoding`` keeps offsets, token strings and masks for every token; ~190 bytes a character). :func:`encode_long`
encodes in windows and keeps only the ids (4 bytes a token), and it is *exact*: every seam is checked against an
overlapping encoding, and if a tokenizer's seams do not agree (e.g. one that inserts a prefix space at the start of
every input) it falls back to one whole-text encode, with a warning. A seam is the start of a word (a pre-token:
BPE never merges across one); a text without them (no whitespace, no punctuation: one long "word") is cut at a token
boundary instead, which the overlapping encoding confirms as well (docs/serving.md, "Long requests").
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

TOKEN_DTYPE = np.int32
# No tokenizer's token is longer than this many characters: a text longer than this many characters per token of a
# budget cannot fit it (the endpoint's pass-through check), and a reply of N tokens holds at most N times this many
# characters (the chat client's bound on a reply's size).
MAX_CHARS_PER_TOKEN = 64


class SeamError(ValueError):
    """A tokenizer's window seams do not agree with an overlapping encoding: encode the whole text at once."""


def encode_long(text: str, tokenizer, window_chars: int = 64_000, margin_chars: int = 1_000) -> np.ndarray:
    """Token ids of ``text`` (no special tokens added), identical to ``tokenizer.encode(text)``, computed
    window by window so that peak memory is the ids plus one window's encoding."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or len(text) <= window_chars:
        return _encode_whole(text, tokenizer)
    try:
        return np.concatenate(list(encode_windows(text, backend, window_chars, margin_chars)))
    except SeamError as err:
        logger.warning("%s; encoding the whole text at once", err)
        return _encode_whole(text, tokenizer)


def encode_windows(
    text: Any, backend: Any, window_chars: int = 64_000, margin_chars: int = 1_000
) -> Iterator[np.ndarray]:
    """The ids of ``text`` as consecutive parts, one per window of ``window_chars`` characters: together they are
    ``backend.encode(text).ids``. ``text`` is anything with ``len()`` whose slices are strings (a document held
    on disk), ``backend`` a Hugging Face fast tokenizer's ``backend_tokenizer``. :class:`SeamError` when a seam
    cannot be made exact (the parts already yielded are then of no use: encode the whole text instead)."""
    if margin_chars * 4 > window_chars:
        raise ValueError(f"margin_chars={margin_chars} is too large for window_chars={window_chars}")
    start = 0  # char offset of the current window in ``text``
    expected: list[int] = []  # tokens the previous window predicts right after the seam
    while True:
        end = min(len(text), start + window_chars)
        enc = backend.encode(text[start:end], add_special_tokens=False)
        ids = np.asarray(enc.ids, dtype=TOKEN_DTYPE)
        if expected and ids[: len(expected)].tolist() != expected:
            raise SeamError("tokenizer seams do not agree")
        if end == len(text):
            yield ids
            return
        # Per-token accessors, not enc.offsets / enc.word_ids: those build Python lists of the whole window.
        cut = _seam(enc, len(ids), limit=(end - start) - 2 * margin_chars)
        if cut is None:
            raise SeamError("no safe seam found in a window")
        yield ids[:cut]
        # Tokens after the seam that end well before this window's edge are final: the next window must agree.
        stable_end = (end - start) - margin_chars
        expected = []
        for j in range(cut, min(len(ids), cut + 256)):
            if enc.token_to_chars(j)[1] > stable_end:
                break
            expected.append(int(ids[j]))
        start += enc.token_to_chars(cut)[0]


def end_token_ids(tokenizer: Any) -> frozenset[int]:
    """The ids that end or pad a response: the tokenizer's eos and pad tokens (those it has). A response that
    ends on one of them stopped on its own; the memory is a response without them."""
    return frozenset(i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None)


def _encode_whole(text: str, tokenizer) -> np.ndarray:
    return np.asarray(tokenizer.encode(text, add_special_tokens=False), dtype=TOKEN_DTYPE)


def _seam(enc, num_tokens: int, limit: int) -> int | None:
    """Index of the token to cut the window before: the last token that starts a new pre-token (word) at or before
    char ``limit`` (BPE never merges across pre-tokens, so a seam there cannot split a token) when it lies in the
    second half of ``limit``; else the last token that starts at or before ``limit``, inside a word: the next
    window starts there, and ``encode_windows`` checks that it encodes what follows as this window did. Either way
    a window moves the text on by at least ``limit / 2`` characters, so a long text costs a bounded number of
    windows (a word start near a window's beginning alone would move it a few characters at a time)."""
    inside = None
    for k in range(num_tokens - 1, 0, -1):
        begin = enc.token_to_chars(k)[0]
        if begin > limit:
            continue
        if inside is None and enc.token_to_chars(k - 1)[1] <= begin:  # not inside a character (byte-level BPE)
            inside = k
        if begin < limit // 2:
            break
        word = enc.token_to_word(k)
        if word is not None and word != enc.token_to_word(k - 1):
            return k
    return inside


def centre_truncate(ids: np.ndarray, max_tokens: int | None) -> np.ndarray:
    """Keep the first ``max_tokens // 2`` and the last ``max_tokens // 2`` tokens when ``ids`` is longer
    (MemAgent's ``truncation='center'``). ``None`` means no limit."""
    if max_tokens is None or len(ids) <= max_tokens:
        return ids
    half = max_tokens // 2
    return np.concatenate([ids[:half], ids[len(ids) - half :]])


def iter_chunks(ids: np.ndarray, chunk_size: int) -> Iterator[np.ndarray]:
    """Consecutive chunks of ``chunk_size`` tokens (the last may be shorter); views, no copies."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    for begin in range(0, len(ids), chunk_size):
        yield ids[begin : begin + chunk_size]


def num_chunks(num_tokens: int, chunk_size: int) -> int:
    """ceil(num_tokens / chunk_size): the number of memory turns for a context of ``num_tokens``."""
    return -(-num_tokens // chunk_size)
