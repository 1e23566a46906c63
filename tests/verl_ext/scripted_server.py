"""A scripted token server: replies are a pure function of the prompt ids, so two versions of the rollout code
can be compared row for row (``tests/verl_ext/test_vx_rows_unchanged.py``)."""

from __future__ import annotations

import hashlib
import random
from typing import Any

from verl.workers.rollout.replica import TokenOutput


class ScriptedTokenServer:
    """``generate(request_id, prompt_ids=..., sampling_params=...)`` as verl's server manager offers it.

    The reply to a prompt is drawn from a random stream seeded by the prompt's ids: its length is 1 to
    ``max_tokens`` (a quarter of the replies use the whole budget), its tokens are ordinary vocabulary ids, and a
    reply shorter than its budget ends with ``eos``. Log-probs are made up the same way (one per token)."""

    def __init__(self, eos_token_id: int, vocab_ids: list[int]) -> None:
        self.eos_token_id = eos_token_id
        self.vocab_ids = vocab_ids
        self.calls: list[tuple[str, list[int], int]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any):
        max_tokens = int(sampling_params["max_tokens"])
        self.calls.append((request_id, list(prompt_ids), max_tokens))
        seed = hashlib.sha256(",".join(map(str, prompt_ids)).encode()).hexdigest()
        rng = random.Random(seed)
        full = rng.random() < 0.25
        length = max_tokens if full else rng.randint(1, max_tokens)
        ids = [rng.choice(self.vocab_ids) for _ in range(length - (0 if full else 1))]
        if not full:
            ids.append(self.eos_token_id)
        return TokenOutput(
            token_ids=ids,
            log_probs=[-round(rng.random() * 5, 6) for _ in ids],
            stop_reason="completed",
            extra_fields={"global_steps": 3},
        )


def ordinary_vocab(tokenizer: Any) -> list[int]:
    """Vocabulary ids that are not special tokens, in id order."""
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]
