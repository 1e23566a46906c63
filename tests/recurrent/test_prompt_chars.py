"""A call's prompt whose text is over its token budget x MAX_CHARS_PER_TOKEN characters is refused before it is
tokenized (recurrent/templating.py, chat_prompt_ids): it could not fit whatever its tokens. What the chat template
leaves out of the rendered text is not held against a prompt."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from recurrent.templating import PromptTooLongError, chat_prompt_ids
from recurrent.tokens import MAX_CHARS_PER_TOKEN

# A template that renders user turns and leaves every assistant turn out (as templates that drop an earlier turn's
# reasoning do, in part).
USERS_ONLY = (
    "{%- for m in messages %}{%- if m.role == 'user' %}<|im_start|>user\n{{ m.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = USERS_ONLY
    return tokenizer


class Counting:
    """The tokenizer, counting the conversations it is asked to turn into ids."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.tokenized = tokenizer, 0

    def apply_chat_template(self, messages, **kwargs):
        self.tokenized += kwargs.get("tokenize", True)
        return self.tokenizer.apply_chat_template(messages, **kwargs)


@pytest.mark.timeout(60)
def test_a_prompt_over_the_bound_by_its_text_is_refused_untokenized(tokenizer):
    # the template's own characters, by hand ({%- trims the new lines after each turn)
    wrap = len("<|im_start|>user\n<|im_end|><|im_start|>assistant")
    budget = 4
    fits = "a" * (budget * MAX_CHARS_PER_TOKEN - wrap)  # rendered: exactly the bound
    counting = Counting(tokenizer)
    assert chat_prompt_ids(counting, [{"role": "user", "content": fits}], max_tokens=budget)
    assert counting.tokenized == 1
    with pytest.raises(PromptTooLongError) as refused:
        chat_prompt_ids(counting, [{"role": "user", "content": fits + "a"}], max_tokens=budget)
    assert counting.tokenized == 1  # never tokenized
    # many short messages count their template's characters too
    many = [{"role": "user", "content": ""}] * (budget * MAX_CHARS_PER_TOKEN // len("<|im_start|>user\n<|im_end|>"))
    with pytest.raises(PromptTooLongError):
        chat_prompt_ids(counting, many, max_tokens=budget)
    assert str(refused.value) == (
        f"a call prompt of {budget * MAX_CHARS_PER_TOKEN + 1} characters exceeds rollout.prompt_length={budget} "
        f"whatever its tokens (a token is at most {MAX_CHARS_PER_TOKEN} characters): refused before it is tokenized"
    )


@pytest.mark.timeout(60)
def test_text_the_template_leaves_out_does_not_count(tokenizer):
    long_reply = {"role": "assistant", "content": "b" * 100_000}  # far over 4 x 64 characters, never rendered
    messages = [{"role": "user", "content": "hi"}, long_reply, {"role": "user", "content": "and?"}]
    assert chat_prompt_ids(tokenizer, messages, max_tokens=64) == chat_prompt_ids(tokenizer, messages)
