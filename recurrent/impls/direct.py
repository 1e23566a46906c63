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

from recurrent.functions import CallRecorder, FunctionEpisode, FunctionWorkflow
from recurrent.interface import WorkflowConfig, WorkflowRegistration
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


@dataclass(frozen=True)
class DirectPrompt:
    """One sample's prompt (after middle truncation) and its token counts, whole and sent."""

    text: str
    tokens_full: int
    tokens_sent: int


async def answer_directly(prompt: DirectPrompt, client: CallRecorder, config: DirectConfig) -> str:
    """The whole (possibly truncated) document in one prompt; the reply is the answer."""
    meta = {"prompt_tokens_full": prompt.tokens_full, "prompt_tokens_sent": prompt.tokens_sent}
    messages = [{"role": "user", "content": prompt.text}]
    reply = await client.chat(messages, config.max_output, kind="direct", final=True, meta=meta)
    return reply.text


class DirectEpisode(FunctionEpisode):
    """One sample's run of the direct baseline: one call, its prompt not kept (document-sized)."""

    sample: DirectPrompt

    def trace(self) -> dict[str, Any]:
        out = super().trace()
        truncated = self.sample.tokens_sent < self.sample.tokens_full
        out.update(prompt_tokens_full=self.sample.tokens_full, truncated=truncated, answer=self.answer)
        return out


class DirectWorkflow(FunctionWorkflow):
    """The direct baseline: ``max_input`` prompt tokens at most, ``max_output`` new; the prompt is built (and
    middle-truncated) when the episode is made, off the event loop where the caller has one."""

    episode_class = DirectEpisode

    def __init__(self, config: DirectConfig, tokenizer: Any) -> None:
        columns = (config.question_key, config.context_key)
        super().__init__(config, tokenizer, name="direct", agent=answer_directly, columns=columns, keep_prompts=False)
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

    def prepare(self, sample: dict[str, Any]) -> DirectPrompt:
        for key in (self.question_key, self.context_key):
            if key not in sample:
                raise KeyError(f"sample has no column {key!r}; columns: {sorted(sample)}")
        return DirectPrompt(*self.prompt(sample[self.question_key], sample[self.context_key] or ""))


REGISTER = WorkflowRegistration(
    name="direct",
    config_cls=DirectConfig,
    build=DirectWorkflow,
    columns=lambda config: (config.question_key, config.context_key),
    large_columns=lambda config: (config.context_key,),
    source=answer_directly,
)
