"""A user's self-consistency agent, written against the official ``openai`` client: hot drafts made at once with
``asyncio.gather``, then a cold vote that reads them and answers in ``\\boxed{}``. It returns its own score, the
share of drafts that agree with the vote, and its trajectory-wide reward counts the drafts that wrote a box
(self_consistency_reward.py). tests/verl_ext/test_vx_row_temperature.py checks its rows' log-probs at their
temperatures; tests/test_self_consistency_trainer.py trains it in both modes."""

import asyncio
import re
from dataclasses import dataclass

from openai import AsyncOpenAI

from recurrent.functions import Answer
from recurrent.openai_agents import openai_agent

DRAFT = "{question}\nWrite a short draft answer."
VOTE = "Question: {question}\nDrafts:\n{drafts}\nPick the answer most drafts agree on and put it in \\boxed{{}}."
BOX = re.compile(r"\\boxed\{([^{}]*)\}")


@dataclass
class SelfConsistencyConfig:
    drafts: int = 3
    draft_n: int = 1  # drafts per request (the API's n): drafts / draft_n requests made at once
    max_tokens: int = 16  # new tokens per call
    draft_temperature: float = 1.2
    vote_temperature: float = 0.5
    model: str = "policy"


def boxed(text: str) -> str | None:
    found = BOX.findall(text or "")
    return found[-1].strip() if found else None


async def self_consistency(sample: dict, client: AsyncOpenAI, config: SelfConsistencyConfig) -> Answer:
    question = sample["input"]

    async def draft() -> list[str]:
        completion = await client.chat.completions.create(
            model=config.model,
            messages=[{"role": "user", "content": DRAFT.format(question=question)}],
            max_tokens=config.max_tokens,
            temperature=config.draft_temperature,
            **({"n": config.draft_n} if config.draft_n != 1 else {}),
        )
        return [choice.message.content or "" for choice in completion.choices]

    requests = await asyncio.gather(*(draft() for _ in range(config.drafts // config.draft_n)))
    drafts = [text for choices in requests for text in choices]
    listed = "\n".join(f"{i + 1}. {text}" for i, text in enumerate(drafts))
    vote = await client.chat.completions.create(
        model=config.model,
        messages=[{"role": "user", "content": VOTE.format(question=question, drafts=listed)}],
        max_tokens=config.max_tokens,
        temperature=config.vote_temperature,
    )
    text = vote.choices[0].message.content or ""
    agree = sum(boxed(d) is not None and boxed(d) == boxed(text) for d in drafts) / len(drafts)
    return Answer(text, score=agree)


REGISTER = openai_agent("self_consistency", SelfConsistencyConfig, self_consistency, columns=("input",))
