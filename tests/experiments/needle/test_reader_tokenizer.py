"""The reader tokenizer's round trip through a reader folder: the warm start saves the tokenizer beside the model,
and every later stage (data, RL, evaluation) loads it from there with ``AutoTokenizer``, which for a Qwen2 folder
is transformers' Qwen2 tokenizer. If the loaded tokenizer split the task's text differently from the one the warm
start trained on, every stage after it would feed the reader tokens it never saw, silently
(docs/replication_cpu_notebook.md, "Numbers a small reader can copy")."""

import random

import pytest
from transformers import AutoTokenizer

from experiments.needle.needle import SPLITS, make_document
from experiments.needle.reader import build_tokenizer
from experiments.small_reader import reader_config
from recurrent.impls.memory import FINAL_TEMPLATE_BOXED, MEMORY_TEMPLATE, NO_MEMORY


def save_reader_folder(tokenizer, folder):
    """What the warm start writes that decides how the folder's tokenizer loads: the tokenizer and a Qwen2 config."""
    tokenizer.save_pretrained(folder)
    reader_config(tokenizer).save_pretrained(folder)


def fill(template: str, **fields: str) -> str:
    """The template with its ``{field}``s filled (its ``\\boxed{}`` is literal, so not ``str.format``)."""
    for name, value in fields.items():
        template = template.replace("{" + name + "}", value)
    return template


def task_texts(tokenizer) -> list[str]:
    """The texts every stage encodes: documents of each split (contexts with their needles, questions), the memory
    agent's two prompts filled in, and answers."""
    texts = []
    for split in SPLITS:
        rng = random.Random(f"round-trip-{split}")
        for n in (1, 2, 4):
            doc = make_document(rng, tokenizer, n, split)
            texts += [doc["context"], doc["question"], doc["needle"], f"\\boxed{{{doc['value']}}}"]
            texts.append(fill(MEMORY_TEMPLATE, prompt=doc["question"], memory=NO_MEMORY, chunk=doc["context"]))
            texts.append(fill(FINAL_TEMPLATE_BOXED, prompt=doc["question"], memory=doc["needle"]))
    return texts


@pytest.fixture(scope="module")
def in_memory():
    return build_tokenizer()


def test_the_folders_tokenizer_encodes_the_task_texts_as_the_built_one_does(in_memory, tmp_path):
    save_reader_folder(in_memory, tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    texts = task_texts(in_memory)
    assert len(texts) == 54
    for text in texts:
        assert loaded.encode(text, add_special_tokens=False) == in_memory.encode(text, add_special_tokens=False), text
    # the chat template too: the exact prompt ids of a memory turn
    messages = [{"role": "user", "content": texts[4]}]
    both = (in_memory, loaded)
    rendered = [t.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) for t in both]
    assert rendered[0] == rendered[1]
    ids = [t.encode(text, add_special_tokens=False) for t, text in zip(both, rendered, strict=True)]
    assert ids[0] == ids[1]
    # and the numbers are pairs after loading as well
    assert loaded.tokenize(" 7445.") == ["Ġ", "74", "45", "."]
    assert len(loaded) == len(in_memory)


def test_pairs_made_by_a_pre_tokenizer_would_not_survive_the_folder(tmp_path):
    """The trap this guards against, shown: pairs made by a pre-tokenizer rule (a ``Split`` on two digits, instead of
    added tokens) encode as pairs in memory and as single digits from the folder, so the round trip above is what
    tells the two kinds of tokenizer apart."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from recurrent.models import TINY_CHAT_TEMPLATE, TINY_SPECIAL_TOKENS

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"\d{2}"), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=TINY_SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator([f"The special magic number is {v}." for v in range(1000, 10000)], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=TINY_CHAT_TEMPLATE
    )
    assert tokenizer.tokenize(" 7445.") == ["Ġ", "74", "45", "."]
    save_reader_folder(tokenizer, tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).tokenize(" 7445.") == ["Ġ", "7", "4", "4", "5", "."]


def test_the_keys_corpus_changes_the_ids_not_the_words(in_memory):
    """The default tokenizer, trained with the digit pairs and the keys in its corpus, and the one trained on the
    task's text alone (the corpus before recipe 4) cut the task's texts into the same strings, whole words, and
    number them differently."""
    task = build_tokenizer(corpus="task")
    assert in_memory.get_vocab() == build_tokenizer(corpus="keys").get_vocab()  # in_memory: the default
    for text in task_texts(in_memory)[:6]:
        assert task.tokenize(text) == in_memory.tokenize(text)
    needle = "The special magic number for brave-otter is 7445."
    assert in_memory.tokenize(needle)[5:8] == ["Ġbrave", "-", "otter"]
    assert task.encode(needle, add_special_tokens=False) != in_memory.encode(needle, add_special_tokens=False)
