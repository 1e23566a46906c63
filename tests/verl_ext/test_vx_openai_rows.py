"""The calculator written against the ``openai`` client and its tools API (experiments/calculator/openai_agent.py)
trains the same rows as the text calculator (experiments/calculator/agent.py), token for token, through verl's agent
loop and the calculator's CPU config, on the same scripted replies: the two contracts train the same thing. A call's own
temperature and top_p sample that call and are recorded on its row (any other sampling field is refused with the
trainer's message), ``n`` gives n rows, and sync mode (lockstep rounds) gives it the same rows."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import openai
import pytest
from omegaconf import open_dict
from verl.workers.rollout.replica import TokenOutput
from vx_helpers import compose_config, recurrent_agent_loop

from recurrent.openai_agents import openai_agent

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "37 * 48"}}</tool_call>'
WIDE = (
    "recurrent.config.max_tokens_per_turn=96",
    "data.max_response_length=96",
    "data.max_prompt_length=640",
    "actor_rollout_ref.rollout.max_model_len=736",
)


class CalculatorTokenServer:
    """Reads the prompt it is sent: a tool result gets ``\\boxed{result}``, a question gets ``prefix`` and a call."""

    def __init__(self, tokenizer, prefix: str = "") -> None:
        self.tokenizer = tokenizer
        self.prefix = prefix
        self.replies: list[list[int]] = []
        self.sampling: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_):
        result = re.findall(r"<tool_response>(-?\d+)</tool_response>", self.tokenizer.decode(prompt_ids))
        reply = f"So \\boxed{{{result[-1]}}}" if result else self.prefix + CALL
        ids = self.tokenizer.encode(reply, add_special_tokens=False)[: sampling_params["max_tokens"] - 1]
        ids.append(self.tokenizer.eos_token_id)
        self.replies.append(ids)
        self.sampling.append(dict(sampling_params))
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed", extra_fields={})


def rows_of(agent: str, tiny_model_dir, tokenizer, prefix: str = "", settings: bool = True):
    config = compose_config(
        "calculator_cpu", [f"actor_rollout_ref.model.path={tiny_model_dir}", f"recurrent.agent={agent}", *WIDE]
    )
    if not settings:
        with open_dict(config):
            config.recurrent.config = {}  # a stand-in agent without the calculator's settings
    server = CalculatorTokenServer(tokenizer, prefix)
    return recurrent_agent_loop(config, tokenizer, server), server


def chat(question: str) -> dict:
    messages = [{"role": "user", "content": question}]
    return {"uid": "u1", "session_id": 0, "index": 0, "prompt": messages, "raw_prompt": messages, "data_source": "c"}


@pytest.mark.parametrize("prefix", ["", "Let me compute that. "])
async def test_the_openai_calculator_trains_the_text_calculators_rows(tiny_model_dir, tiny_tokenizer, prefix):
    rows = {}
    for agent in ("calculator", "calculator_openai"):
        loop, server = rows_of(agent, tiny_model_dir, tiny_tokenizer, prefix)
        outputs = await loop.run(dict(SAMPLING), **chat("What is 37 * 48?"))
        assert [o.response_ids for o in outputs] == server.replies  # the ids sampled
        rows[agent] = [
            (o.prompt_ids, o.response_ids, o.response_logprobs, o.extra_fields["turn_kind"]) for o in outputs
        ]
    assert len(rows["calculator"]) == 2  # the tool call, then the answer
    assert rows["calculator_openai"] == rows["calculator"]
    second_prompt = tiny_tokenizer.decode(rows["calculator"][1][0])
    assert f"{prefix}{CALL}<|im_end|>" in second_prompt and "<tool_response>1776</tool_response>" in second_prompt


async def own_sampling(sample, client, config):
    """Two hot drafts in one request (``n=2``), then a cold answer: the self-consistency shape."""
    messages = [{"role": "user", "content": sample["question"]}]
    drafts = await client.chat.completions.create(
        model="m", messages=messages, max_tokens=4, n=2, temperature=1.3, top_p=0.9
    )
    texts = [choice.message.content for choice in drafts.choices]
    answer = [{"role": "user", "content": f"{sample['question']} Drafts: {texts}"}]
    completion = await client.chat.completions.create(model="m", messages=answer, max_tokens=4, temperature=0.2)
    return completion.choices[0].message.content


@dataclass
class Nothing:
    pass


OWN_SAMPLING = openai_agent("own_sampling", Nothing, own_sampling)


async def test_a_calls_own_temperature_and_top_p_sample_it_and_are_on_its_row(tiny_model_dir, tiny_tokenizer):
    loop, server = rows_of(f"{__file__}:OWN_SAMPLING", tiny_model_dir, tiny_tokenizer, settings=False)
    sample = {**chat("What is 1 + 1?"), "question": "What is 1 + 1?"}
    rollout = dict(SAMPLING, top_p=0.8)  # a rollout top_p that no call of this agent samples with
    outputs = await loop.run(rollout, **sample)
    # n=2: two rows of the same prompt, then the answer: three rows, each sampled with its call's own values; the
    # answer set temperature alone, so its top_p is the rule's 1.0 (recurrent/sampling.py), not the rollout's 0.8.
    assert len(outputs) == 3 and outputs[0].prompt_ids == outputs[1].prompt_ids
    own = [{"temperature": 1.3, "top_p": 0.9}] * 2 + [{"temperature": 0.2, "top_p": 1.0}]
    assert [{**rollout, **o, "max_tokens": 4} for o in own] == server.sampling
    assert [{k: o.extra_fields[k] for k in ("temperature", "top_p") if k in o.extra_fields} for o in outputs] == own
    # The two drafts' rows are choices 0 and 1 of one request; the answer's is the next request's only choice.
    made = [(o.extra_fields["request"], o.extra_fields["choice"]) for o in outputs]
    assert made == [("chatcmpl-recorded-0", 0), ("chatcmpl-recorded-0", 1), ("chatcmpl-recorded-1", 0)]
    assert [o.temperature for o in outputs] == [1.3, 1.3, 0.2]
    assert [float(o.as_dict()["temperature"]) for o in outputs] == pytest.approx([1.3, 1.3, 0.2])
    # The answer's prompt holds both drafts, as the agent read them.
    drafts = [tiny_tokenizer.decode(ids, skip_special_tokens=True) for ids in server.replies[:2]]
    assert str(drafts) in tiny_tokenizer.decode(outputs[2].prompt_ids)


async def test_a_call_without_its_own_sampling_keeps_the_rollouts(tiny_model_dir, tiny_tokenizer):
    loop, server = rows_of("calculator_openai", tiny_model_dir, tiny_tokenizer)
    outputs = await loop.run(dict(SAMPLING, temperature=0.7), **chat("What is 37 * 48?"))
    assert all(params["temperature"] == 0.7 for params in server.sampling)
    assert all("temperature" not in o.extra_fields for o in outputs)
    # the row's temperature is the run's rollout temperature (calculator_cpu: 1.0), which verl's actor uses
    assert all(o.temperature == 1.0 for o in outputs)


async def refused(sample, client, config):
    options = json.loads(sample["options"])
    messages = [{"role": "user", "content": "hi"}]
    completion = await client.chat.completions.create(model="m", messages=messages, **options)
    return completion.choices[0].message.content


REFUSED = openai_agent("refused", Nothing, refused)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"max_tokens": 4, "seed": 3}, r"sampling parameters \['seed'\] in training; a call may set temperature"),
        ({"max_tokens": 4, "temperature": 0.0}, r"temperature=0 \(greedy decoding\) cannot be trained on"),
        ({"max_tokens": 4, "top_p": 1.5}, r"top_p must be a finite number in \(0, 1\]"),
    ],
)
async def test_sampling_training_cannot_honour_is_refused_with_the_trainers_message(
    tiny_model_dir, tiny_tokenizer, options, error
):
    loop, _ = rows_of(f"{__file__}:REFUSED", tiny_model_dir, tiny_tokenizer, settings=False)
    with pytest.raises(openai.BadRequestError, match=error):
        await loop.run(dict(SAMPLING), **chat("What is 1 + 1?"), options=json.dumps(options))


async def test_lockstep_rounds_give_the_openai_calculator_the_same_rows(tiny_model_dir, tiny_tokenizer):
    from verl_ext.rollout import AgentRollout
    from verl_ext.sync_rollout import Trajectory, run_trajectories

    questions = ["What is 37 * 48?", "What is 1 + 1?"]
    loop, _ = rows_of("calculator_openai", tiny_model_dir, tiny_tokenizer)
    in_async = [await loop.run(dict(SAMPLING), **chat(q)) for q in questions]
    overrides = [f"actor_rollout_ref.model.path={tiny_model_dir}", "recurrent.agent=calculator_openai", *WIDE]
    config = compose_config("calculator_cpu", [*overrides, "recurrent.mode=sync"])
    trajectories = [Trajectory(chat(q), 0, dict(SAMPLING)) for q in questions]
    server = CalculatorTokenServer(tiny_tokenizer)
    in_sync = await run_trajectories(AgentRollout.get(config, tiny_tokenizer), server, trajectories)
    assert not [r for r in in_sync if isinstance(r, Exception)], in_sync
    for sync_rows, async_rows in zip(in_sync, in_async, strict=True):
        assert len(sync_rows) == 2
        for ours, theirs in zip(sync_rows, async_rows, strict=True):
            assert (ours.prompt_ids, ours.response_ids) == (theirs.prompt_ids, theirs.response_ids)
