"""TokenTemplate and the chat template trick, on the tiny model's byte-level BPE tokenizer.

Where token-level formatting differs from "render the string, then encode it", exactly:

- Every literal piece and every value is tokenized on its own, so no BPE merge and no pre-tokenizer split
  ever crosses a seam between a literal and a value.
- (a) When each seam is also a pre-tokenizer boundary of the rendered string (e.g. a value right after a
  newline and right before one, as in the MemAgent prompts' ``<memory>\\n{memory}\\n</memory>``), and the
  value's ids are the canonical encoding of its text, the ids are identical.
- (b) They differ when a merge would cross a seam (a literal ending in a space, then a value starting with
  a letter: the rendered string merges ``" the"`` into one token) or when a value's ids are not the
  canonical encoding of its text (e.g. ``and`` given as ``a``, ``n``, ``d``; a memory is generated ids,
  never re-encoded, so this happens in training).
- (c) The decoded text never differs: decode(format(values)) == the template rendered with decode(values).
"""

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from recurrent.templating import TokenTemplate, chat_prompt_template, chat_token_template


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


def render(template: str, values: dict[str, str]) -> str:
    for key, text in values.items():
        template = template.replace("{" + key + "}", text)
    return template


# --- the basics ------------------------------------------------------------------------------------------


def test_keys_length_and_repeated_slots(tok):
    tt = TokenTemplate("Q {q}\nA {a} / {q}", tok)
    assert tt.keys == ["q", "a", "q"]
    literal = ["Q ", "\nA ", " / ", ""]
    assert tt.length == sum(len(enc(tok, piece)) for piece in literal)
    ids = tt.format(q=[5, 6], a=[7])
    assert ids == enc(tok, "Q ") + [5, 6] + enc(tok, "\nA ") + [7] + enc(tok, " / ") + [5, 6]


def test_value_types(tok):
    tt = TokenTemplate("x{v}y", tok)
    expected = enc(tok, "x") + [10, 11] + enc(tok, "y")  # the literal pieces encoded apart, the ids in between
    assert tt.format(v=[10, 11]) == expected
    assert tt.format(v=(10, 11)) == expected
    assert tt.format(v=np.array([10, 11])) == expected
    assert tt.format(v=torch.tensor([10, 11])) == expected
    assert tt.format(v=[]) == enc(tok, "x") + enc(tok, "y")
    with pytest.raises(ValueError, match="1-D"):
        tt.format(v=torch.tensor([[10, 11]]))
    with pytest.raises(TypeError):
        tt.format(v="text is not ids")


def test_missing_and_unexpected_keys_are_named(tok):
    tt = TokenTemplate("{prompt} {memory}", tok)
    with pytest.raises(KeyError, match="memory"):
        tt.format(prompt=[1])
    with pytest.raises(TypeError, match="chunk"):
        tt.format(prompt=[1], memory=[2], chunk=[3])


def test_only_letter_names_are_slots(tok):
    # \boxed{} and {{}} stay literal, braces and all, as in the fork; so do {1} and {with_underscore}.
    text = "put it in \\boxed{} or \\boxed{{}} {1} {with_underscore} {ok}"
    tt = TokenTemplate(text, tok)
    assert tt.keys == ["ok"]
    assert tok.decode(tt.format(ok=enc(tok, "yes"))) == text.replace("{ok}", "yes")


def test_special_tokens_in_text_map_to_single_ids(tok):
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    tt = TokenTemplate("<|im_start|>user\n{m}<|im_end|>", tok)
    assert tt.sections[0][0] == im_start
    assert tt.sections[1] == [im_end]


def test_split_special_tokens_is_refused(tiny_model_dir):
    splitting = AutoTokenizer.from_pretrained(tiny_model_dir, split_special_tokens=True)
    with pytest.raises(ValueError, match="im_start"):
        TokenTemplate("<|im_start|>user\n{m}", splitting)


# --- token-level formatting vs render-then-encode --------------------------------------------------------


@pytest.mark.parametrize("value", ["hello world", "The answer is 42.", "two  spaces\n\nnew para", "No previous memory"])
def test_a_same_ids_when_seams_are_pretokenizer_boundaries(tok, value):
    template = "<memory>\n{memory}\n</memory>\n"
    tt = TokenTemplate(template, tok)
    assert tt.format(memory=enc(tok, value)) == enc(tok, render(template, {"memory": value}))


def test_b_merge_across_a_seam_differs(tok):
    tt = TokenTemplate("Answer: {x}", tok)
    assert enc(tok, "the") == [266, 71]  # 'th', 'e'
    token_level = tt.format(x=enc(tok, "the"))
    string_level = enc(tok, "Answer: the")
    assert token_level == [2060, 28, 223, 266, 71]  # 'Answer', ':', 'Ġ' | 'th', 'e'
    assert string_level == [2060, 28, 881]  # 'Answer', ':', 'Ġthe'
    assert tok.decode(token_level) == tok.decode(string_level) == "Answer: the"


def test_b_non_canonical_value_ids_differ(tok):
    tt = TokenTemplate("<memory>\n{memory}\n</memory>", tok)
    spelled = enc(tok, "a") + enc(tok, "n") + enc(tok, "d")
    assert spelled == [67, 80, 70]
    assert enc(tok, "and") == [330]
    token_level = tt.format(memory=spelled)
    assert token_level == [30, 3084, 32, 201, 67, 80, 70, 201, 30, 17, 3084, 32]
    assert enc(tok, "<memory>\nand\n</memory>") == [30, 3084, 32, 201, 330, 201, 30, 17, 3084, 32]
    assert tok.decode(token_level) == "<memory>\nand\n</memory>"


@pytest.mark.parametrize(
    "values",
    [
        {"prompt": "what is it?", "memory": "No previous memory", "chunk": "hello world"},
        {"prompt": "the", "memory": "and", "chunk": "Answer: the end.  "},
        {"prompt": "café ü", "memory": "", "chunk": "x\n\n<|im_end|> inside a document"},
    ],
)
def test_c_decode_of_format_equals_rendered_string(tok, values):
    message = "<problem> \n{prompt}\n</problem>\n\n<memory>\n{memory}\n</memory>\n\n<section>\n{chunk}\n</section>\n"
    tt = chat_token_template(tok, message)
    ids = tt.format(**{k: enc(tok, v) for k, v in values.items()})
    # The tiny model's ChatML written out by hand (default system prompt), not derived from the code under test.
    head = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    expected = render(head + message + "<|im_end|>\n<|im_start|>assistant\n", values)
    assert tok.decode(ids) == expected
    # also with the non-canonical spelling of the same text, one token per character
    spelled = {k: [i for ch in v for i in enc(tok, ch)] for k, v in values.items() if v.isascii()}
    assert spelled  # every case has an ASCII value to spell out
    ids = tt.format(**{k: spelled.get(k, enc(tok, v)) for k, v in values.items()})
    assert tok.decode(ids) == expected


# --- the chat template trick -----------------------------------------------------------------------------


def test_chat_prompt_template_default_system(tok):
    assert chat_prompt_template(tok) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_prompt_template_with_system(tok):
    assert chat_prompt_template(tok, system="Be brief.") == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_prompt_template_rejects_slot_lookalikes(tok):
    with pytest.raises(ValueError, match="oops"):
        chat_prompt_template(tok, system="Answer in {oops} form.")


def test_chat_token_template_matches_apply_chat_template(tok):
    message = "Problem:\n{prompt}\nPut it in \\boxed{{}}.\n"
    tt = chat_token_template(tok, message)
    assert tt.keys == ["prompt"]
    ids = tt.format(prompt=enc(tok, "what is it?"))
    content = "Problem:\nwhat is it?\nPut it in \\boxed{{}}.\n"  # doubled braces survive, as in the fork
    chat = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False)
    assert tok.decode(ids) == chat
    assert ids == enc(tok, chat)  # every seam here is a newline boundary
