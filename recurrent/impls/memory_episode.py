"""The memory agent's episodes as their users read them, and what its episodes share.

A module of the memory agent (recurrent/impls/memory.py), which builds both: this module imports nothing of the
agent. :class:`MemoryEpisode` is one sample's run of :func:`~recurrent.impls.memory.read_and_answer` over its
:class:`~recurrent.impls.memory.Reading`, with what the endpoint, the harness and traces read of it (the chunks,
the context read, the memory after every chunk). :class:`ContextCache` holds the tokenized contexts of training
rows: the n rollouts of a prompt share its ``uid``, and its context is tokenized for the first of them only.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from recurrent.functions import FunctionEpisode
from recurrent.tokens import encode_long

CONTEXT_CACHE_SIZE = 256  # tokenized training contexts kept (the n episodes of a prompt tokenize it once)


class MemoryEpisode(FunctionEpisode):
    """One sample's run of the memory agent: ``read_and_answer`` over its ``Reading`` (``sample``)."""

    sample: Any  # the episode's Reading (recurrent/impls/memory.py)

    @property
    def reading(self) -> Any:
        return self.sample

    @property
    def num_chunks(self) -> int:
        return self.sample.num_chunks

    @property
    def context_ids(self) -> np.ndarray:
        return self.sample.context_ids

    @property
    def original_context_tokens(self) -> int:
        return self.sample.original_context_tokens

    @property
    def memory_trace(self) -> list[str]:
        return self.sample.memory_trace

    def trace(self) -> dict[str, Any]:
        out = super().trace()
        out.update(
            question=self.sample.question,
            context_tokens=self.original_context_tokens,
            context_tokens_read=len(self.context_ids),
            num_chunks=self.num_chunks,
            memories=list(self.memory_trace),
            answer=self.answer,
            memory_truncated=[rec.reply.finish_reason == "length" for rec in self.history if not rec.turn.final],
        )
        return out


class ContextCache:
    """Contexts tokenized with ``tokenizer`` (:func:`recurrent.tokens.encode_long`), the last
    :data:`CONTEXT_CACHE_SIZE` kept by their row's ``uid`` and length: a row without a ``uid`` is tokenized anew."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._contexts: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()

    def ids(self, context: str, uid: Any) -> np.ndarray:
        if uid is None:
            return encode_long(context, self.tokenizer)
        key = (str(uid), len(context))
        ids = self._contexts.get(key)
        if ids is None:
            ids = self._contexts[key] = encode_long(context, self.tokenizer)
            while len(self._contexts) > CONTEXT_CACHE_SIZE:
                self._contexts.popitem(last=False)
        return ids
