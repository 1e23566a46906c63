"""The direct full-context baseline (the paper's long-context comparison) as a registered one-call agent.

The whole document goes into one prompt (the paper's ``template_0shot``). A prompt longer
than the model's input budget is middle-truncated at the token level: the first and last halves of the
*whole prompt's* tokens are kept and decoded, as the original does, so the instruction at the top and the question at
the bottom survive and the middle of the document is dropped. Registered as ``direct``, it runs through the same
runner, client and results path as the memory agent (``python -m taskutils.memory_eval.run --method direct``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from recurrent.interface import (
    Reply,
    Session,
    SessionWorkflow,
    Turn,
    TurnRecord,
    WorkflowConfig,
    WorkflowRegistration,
)
from recurrent.templating import render
from recurrent.tokens import centre_truncate, encode_long

# The original template, reconstructed from its description (not copied from its source): the LongBench-style
# 0-shot layout, instruction, <text> block, question, "Therefore, the answer is" instruction.
TEMPLATE_0SHOT = """Please read the following text and answer the question below.

<text>
{context}
</text>

{question}

Format your response as follows: "Therefore, the answer is (insert answer here)"."""

# The boxed variant only replaces the last line (the original's `--api boxed`).
TEMPLATE_0SHOT_BOXED = """Please read the following text and answer the question below.

<text>
{context}
</text>

{question}

Put the answer in \\boxed{}."""

DIRECT_TEMPLATES = {"answer_is": TEMPLATE_0SHOT, "boxed": TEMPLATE_0SHOT_BOXED}


@dataclass
class DirectConfig(WorkflowConfig):
    """The direct baseline's budgets; the defaults are the paper's (60K + 60K input tokens kept, 10K new)."""

    max_input: int = 120000  # whole-prompt tokens kept by middle truncation
    max_output: int = 10000
    final_prompt: Literal["answer_is", "boxed"] = "answer_is"
    question_key: str = "input"
    context_key: str = "context"

    def __post_init__(self) -> None:
        if self.max_input <= 0 or self.max_output <= 0:
            raise ValueError(f"max_input and max_output must be positive, got {self.max_input}, {self.max_output}")
        if self.final_prompt not in DIRECT_TEMPLATES:
            raise ValueError(f"final_prompt must be one of {sorted(DIRECT_TEMPLATES)}, got {self.final_prompt!r}")


class DirectWorkflow(SessionWorkflow):
    """Builds one :class:`DirectSession` per sample: ``max_input`` prompt tokens at most, ``max_output`` new."""

    def __init__(self, config: DirectConfig, tokenizer: Any) -> None:
        super().__init__(config, tokenizer)
        self.max_input = config.max_input
        self.max_output = config.max_output
        self.template = DIRECT_TEMPLATES[config.final_prompt]
        self.question_key = config.question_key
        self.context_key = config.context_key

    def prompt(self, question: str, context: str) -> tuple[str, int, int]:
        """The prompt text, its full token count, and the count actually sent (after middle truncation)."""
        text = render(self.template, context=context.strip(), question=question.strip())
        ids = encode_long(text, self.tokenizer)
        if len(ids) <= self.max_input:
            return text, len(ids), len(ids)
        kept = centre_truncate(ids, self.max_input)
        return self.tokenizer.decode(kept.tolist(), skip_special_tokens=True), len(ids), len(kept)

    def session(self, sample: dict[str, Any]) -> DirectSession:
        for key in (self.question_key, self.context_key):
            if key not in sample:
                raise KeyError(f"sample has no column {key!r}; columns: {sorted(sample)}")
        text, full, sent = self.prompt(sample[self.question_key], sample[self.context_key] or "")
        return DirectSession(text, self.max_output, prompt_tokens_full=full, prompt_tokens_sent=sent)


class DirectSession(Session):
    """One final turn: the (possibly truncated) full-document prompt, then the answer."""

    def __init__(self, prompt: str, max_tokens: int, prompt_tokens_full: int, prompt_tokens_sent: int) -> None:
        self._turn: Turn | None = Turn(
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            final=True,
            meta={"kind": "direct", "prompt_tokens_full": prompt_tokens_full, "prompt_tokens_sent": prompt_tokens_sent},
        )
        self.prompt_tokens_full = prompt_tokens_full
        self.truncated = prompt_tokens_sent < prompt_tokens_full
        self._history: list[TurnRecord] = []
        self._pending = False

    def next_turn(self) -> Turn | None:
        if self._pending:
            raise RuntimeError("next_turn called twice without record")
        if self._history:
            return None
        self._pending = True
        return self._turn

    def record(self, reply: Reply) -> None:
        if not self._pending:
            raise RuntimeError("record called without a pending turn")
        self._pending = False
        turn = self._turn
        # Keep the facts of the turn, not its (document-sized) prompt.
        self._history.append(TurnRecord(Turn([], turn.max_tokens, final=True, meta=turn.meta), reply))
        self._turn = None

    @property
    def history(self) -> list[TurnRecord]:
        return self._history

    @property
    def answer(self) -> str | None:
        return self._history[-1].reply.text if self._history else None

    def trace(self) -> dict[str, Any]:
        out = super().trace()
        out.update(prompt_tokens_full=self.prompt_tokens_full, truncated=self.truncated, answer=self.answer)
        return out


REGISTER = WorkflowRegistration(
    name="direct",
    config_cls=DirectConfig,
    build=DirectWorkflow,
    columns=lambda config: (config.question_key, config.context_key),
    large_columns=lambda config: (config.context_key,),
)
