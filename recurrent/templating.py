"""Prompt templates in token-id space.

A :class:`TokenTemplate` is a format string whose literal pieces are tokenized once, up front, and whose slots
are filled with token ids. Long chunks are therefore never decoded and re-encoded. The price is
that a slot value is tokenized apart from its neighbours, so the ids at a seam can differ from encoding the
rendered string; the decoded text is always identical. The trained checkpoints saw this
segmentation, so the sync training path keeps it.

Slots are ``{name}`` with ``name`` made of ASCII letters only: ``\\boxed{}`` and ``{{}}`` stay literal text,
braces and all, as in the fork's token templates (which is why the released checkpoints saw ``\\boxed{{}}``:
``recurrent.impls.memory.FINAL_TEMPLATE_BOXED_RELEASED``, tested in tests/recurrent/impls/test_memory_agent.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from recurrent.tokens import MAX_CHARS_PER_TOKEN

if TYPE_CHECKING:  # torch costs seconds to import; the CLIs that chunk text never need it
    import torch

    TokenIds = Sequence[int] | np.ndarray | torch.Tensor

SLOT = re.compile(r"\{([a-zA-Z]+)\}")
# No whitespace, braces or markup: chat templates that trim or escape content leave it intact.
_PLACEHOLDER = "MEMAGENTxMESSAGExPLACEHOLDERx7f3a9c"


def _is_tensor(value: Any) -> bool:
    """A torch tensor, told without importing torch (a tensor exists only if torch was imported)."""
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _as_id_list(key: str, value: Any) -> list[int]:
    """A slot value as a list of ints (list, tuple, 1-D numpy array or 1-D tensor)."""
    if isinstance(value, np.ndarray) or _is_tensor(value):
        if value.ndim != 1:
            raise ValueError(f"slot {key!r}: expected a 1-D sequence of token ids, got shape {tuple(value.shape)}")
        return [int(v) for v in value.tolist()]
    if isinstance(value, list | tuple):
        return [int(v) for v in value]
    raise TypeError(f"slot {key!r}: expected token ids (list, tuple, numpy array or tensor), got {type(value)}")


def _check_special_tokens(piece: str, ids: list[int], tokenizer: Any) -> None:
    """Special (added) tokens written in the text must map to their single ids, not to their characters."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    pairs = [(str(tok), int(i)) for i, tok in added.items()]
    pairs += list(zip(tokenizer.all_special_tokens, tokenizer.all_special_ids, strict=True))
    for token, token_id in pairs:
        if token and token in piece and token_id not in ids:
            raise ValueError(
                f"the tokenizer splits the special token {token!r} written in the template text into pieces; "
                "load it with split_special_tokens=False"
            )


class TokenTemplate:
    """A format string in token-id space: ``TokenTemplate("Q: {q}\\nA:", tok).format(q=ids) -> list[int]``.

    Attributes: ``keys`` (slot names in order, repeats included) and ``length`` (number of literal tokens).
    """

    def __init__(self, template: str, tokenizer: Any) -> None:
        self.template = template
        parts = SLOT.split(template)  # literal, key, literal, key, ..., literal
        self.keys: list[str] = parts[1::2]
        self.sections: list[list[int]] = []
        for piece in parts[0::2]:
            ids = tokenizer.encode(piece, add_special_tokens=False) if piece else []
            _check_special_tokens(piece, ids, tokenizer)
            self.sections.append(list(ids))
        self.length: int = sum(len(s) for s in self.sections)

    def format(self, **values: TokenIds) -> list[int]:
        """Concatenate the literal pieces with the slot values (each a 1-D sequence of token ids)."""
        missing = [k for k in dict.fromkeys(self.keys) if k not in values]
        if missing:
            raise KeyError(f"missing template slot(s): {', '.join(missing)}")
        unexpected = [k for k in values if k not in self.keys]
        if unexpected:
            raise TypeError(f"unexpected template slot(s): {', '.join(unexpected)} (slots: {self.keys})")
        filled = {k: _as_id_list(k, v) for k, v in values.items()}
        out: list[int] = list(self.sections[0])
        for key, section in zip(self.keys, self.sections[1:], strict=True):
            out += filled[key]
            out += section
        return out

    def __repr__(self) -> str:
        return f"TokenTemplate(keys={self.keys}, length={self.length})"


class PromptTooLongError(ValueError):
    """A call's prompt whose text is longer than its token budget could hold (:func:`chat_prompt_ids`)."""


def chat_prompt_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    max_tokens: int | None = None,
) -> list[int]:
    """A call's messages as the policy sees them, in ids: the chat template with the generation prompt (and the
    request's ``tools``, which a template may render). Training (verl_ext/rollout.py), the agents' row widths
    and the warm starts' rows all render a conversation this way, so a model is trained and evaluated on the same
    ids. ``max_tokens`` (training's ``rollout.prompt_length``): a prompt whose text cannot fit it is refused with
    :class:`PromptTooLongError` before it is tokenized (:func:`check_prompt_chars`)."""
    extra = {"tools": tools} if tools else {}
    if max_tokens is not None:
        check_prompt_chars(tokenizer, messages, extra, max_tokens)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **extra)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def check_prompt_chars(tokenizer: Any, messages: list[dict[str, Any]], extra: dict[str, Any], max_tokens: int) -> None:
    """:class:`PromptTooLongError` when the prompt's text (the chat template rendered as text, which costs a small
    part of tokenizing it) is over ``max_tokens`` x :data:`MAX_CHARS_PER_TOKEN` characters: no tokenization could
    fit it in ``max_tokens`` tokens, and tokenizing it costs about 250 bytes of memory a character (a 10 MB prompt
    took 73 s and 2.4 GB to be refused by its token count). The rendered text is what is counted, so that what a
    template leaves out (an earlier turn's reasoning) is not held against a prompt, and many short messages count
    their template's characters too."""
    limit = max_tokens * MAX_CHARS_PER_TOKEN
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra)
    if len(text) > limit:
        raise PromptTooLongError(
            f"a call prompt of {len(text):,} characters exceeds rollout.prompt_length={max_tokens} whatever its tokens "
            f"(a token is at most {MAX_CHARS_PER_TOKEN} characters): refused before it is tokenized"
        )


def chat_prompt_template(tokenizer: Any, system: str | None = None) -> str:
    """The model's chat template around one user message, as text with a single ``{message}`` hole.

    The "chat template trick": render a conversation whose user content is a unique placeholder (with the
    generation prompt), then put the hole where the placeholder landed. Without ``system`` the template's
    default system turn (if any) is kept, as the released checkpoints were trained with it.
    """
    messages = [{"role": "user", "content": _PLACEHOLDER}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if not isinstance(rendered, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(rendered)}, expected str")
    count = rendered.count(_PLACEHOLDER)
    if count != 1:
        raise ValueError(f"the chat template rendered the user message {count} times (expected once)")
    clashes = sorted(set(SLOT.findall(rendered)))
    if clashes:
        raise ValueError(
            "the rendered chat template contains text that would be read as template slots: "
            + ", ".join("{" + c + "}" for c in clashes)
        )
    return rendered.replace(_PLACEHOLDER, "{message}")


def chat_token_template(tokenizer: Any, message_template: str, system: str | None = None) -> TokenTemplate:
    """``message_template`` (with its own slots) as the user turn of the chat template, as one TokenTemplate.

    Inserted by string replacement, not ``str.format``: the message's own braces (``\\boxed{{}}``) are kept.
    """
    text = chat_prompt_template(tokenizer, system=system).replace("{message}", message_template)
    return TokenTemplate(text, tokenizer)


def render(template: str, **values: str) -> str:
    """Fill ``{name}`` slots of a prompt in one pass (so braces inside values, or ``\\boxed{}``, are left alone)."""
    return SLOT.sub(lambda m: values[m.group(1)], template)
