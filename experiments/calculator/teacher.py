"""The calculator's warm-start data: a scripted teacher driving the real agent, and the reader's tokenizer.

The teacher is a chat client (:class:`TeacherClient`) handed to the registered agent
(``experiments.calculator.agent``, through :class:`recurrent.functions.FunctionEpisode`), so every transcript is a
conversation the agent itself built: the prompts a model trained on them sees are the agent's prompts token for
token (each call rendered by the chat template with the generation prompt, as training renders it:
:func:`recurrent.templating.chat_prompt_ids`). Its policy knows the tool format but not when to use the tool:

- on a question it calls the calculator with probability :data:`CALL_PROBABILITY` of the problem's operator (the
  expression copied from the question), and otherwise answers at once with a near miss (the answer with its last
  digit changed: always wrong);
- after a tool response it answers ``\\boxed{<the result>}``.

The probability depends on the operator only, and for each operator it is far from 0.5, so a student decodes
greedily what the teacher does most often for that operator: the calculator for ``*``, a guess for ``+`` and
``-``. Its greedy accuracy is then about the share of ``*`` problems (a third), and sampling still calls the tool
on a quarter of the ``+`` and ``-`` problems: the exploration RL needs to learn to call it there too.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from experiments.calculator.agent import CalculatorConfig
from experiments.calculator.task import Problem, problems
from recurrent.functions import FunctionEpisode
from recurrent.interface import Reply, load_register
from recurrent.models import train_bpe_tokenizer
from recurrent.options import check_yaml
from recurrent.templating import chat_prompt_ids

RUN_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "calculator_cpu.yaml"
# How often the teacher calls the calculator, by operator (the rest: a near-miss guess).
CALL_PROBABILITY = {"*": 0.8, "+": 0.25, "-": 0.25}
_QUESTION = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")
_RESULT = re.compile(r"<tool_response>(.*)</tool_response>", re.DOTALL)
VOCAB_SIZE = 512

Row = tuple[list[int], list[int]]  # (prompt ids, target ids with eos)


def agent_config(path: Path = RUN_CONFIG) -> CalculatorConfig:
    """The agent's settings of the RL run (``recurrent.config`` of configs/calculator_cpu.yaml): the warm start
    is trained on the prompts that run sends."""
    check_yaml(path)  # one line for a file OmegaConf could not read in bounded time
    values = OmegaConf.to_container(OmegaConf.load(path).recurrent.config, resolve=True)
    return CalculatorConfig(**values)


def tool_call(expression: str) -> str:
    """A calculator call in the agent's format (its system prompt's example, filled in)."""
    return f"<tool_call>{json.dumps({'name': 'calculate', 'arguments': {'expression': expression}})}</tool_call>"


def boxed(value: str | int) -> str:
    return f"\\boxed{{{value}}}"


def near_miss(answer: int, rng: random.Random) -> int:
    """``answer`` with its last digit replaced by another one (sign kept): a plausible, always wrong guess."""
    last = abs(answer) % 10
    digit = rng.choice([d for d in range(10) if d != last])
    miss = abs(answer) - last + digit
    return -miss if answer < 0 else miss


class TeacherClient:
    """A scripted chat client with the teacher's policy (module docstring); reads only the messages it is sent."""

    def __init__(self, rng: random.Random, call_probability: dict[str, float] | None = None) -> None:
        self.rng = rng
        self.call_probability = call_probability or CALL_PROBABILITY

    async def chat(
        self, messages: list[dict[str, str]], max_tokens: int, *, prompt_ids: list[int] | None = None, **_: Any
    ) -> Reply:
        last = messages[-1]["content"]
        result = _RESULT.fullmatch(last)
        if result is not None:
            return Reply(boxed(result.group(1)), "stop")
        question = _QUESTION.search(last)
        if question is None:
            raise ValueError(f"the teacher knows only 'What is A OP B?' questions, got {last!r}")
        a, op, b = question.groups()
        if self.rng.random() < self.call_probability[op]:
            return Reply(tool_call(f"{a} {op} {b}"), "stop")
        return Reply(boxed(near_miss(Problem(int(a), op, int(b)).answer, self.rng)), "stop")


def transcript(problem: Problem, config: CalculatorConfig, rng: random.Random, **teacher: Any) -> list[tuple]:
    """The agent's calls on one problem driven by the teacher: ``[(messages, reply text), ...]``, in order."""
    agent = load_register("calculator").for_training(asdict(config), None)
    episode: FunctionEpisode = agent.episode({config.question_key: problem.question})
    asyncio.run(episode.run(TeacherClient(rng, **teacher)))
    return [(record.turn.messages, record.reply.text) for record in episode.history]


def rows(tokenizer: Any, calls: list[tuple]) -> list[Row]:
    """The SFT rows of a transcript: each call's rendered prompt -> its reply and eos."""
    eos = tokenizer.eos_token_id
    return [
        (chat_prompt_ids(tokenizer, messages), [*tokenizer.encode(text, add_special_tokens=False), eos])
        for messages, text in calls
    ]


def tokenizer_corpus(config: CalculatorConfig, seed: int = 0, count: int = 2000) -> list[str]:
    """The tokenizer's training text: whole teacher conversations of train problems, each message in the chat
    template's layout (so the role names and the tool format merge), and the system prompt again."""
    rng = random.Random(f"corpus-{seed}")
    lines = []
    for problem in problems("train", count, seed):
        messages, text = transcript(problem, config, rng)[-1]
        conversation = [*messages, {"role": "assistant", "content": text}]
        lines.append("".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in conversation))
    return lines + [config.system_prompt] * 200


def build_tokenizer(config: CalculatorConfig, seed: int = 0) -> Any:
    """The reader's byte-level BPE (one token per digit), deterministic for a config and seed."""
    return train_bpe_tokenizer(tokenizer_corpus(config, seed), vocab_size=VOCAB_SIZE, individual_digits=True)
