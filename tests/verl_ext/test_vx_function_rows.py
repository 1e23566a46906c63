"""An agent function's training rows, from verl's agent loop: the calculator agent against a token server that
calls the tool and then answers. One row per model call; each row's prompt is exactly the conversation so far
rendered by the chat template (tool results there, never in a response); each response is the server's ids.
What a function may not do in training (its own sampling, an answer other than its last reply) is refused; in sync
mode (lockstep rounds) the same function gives the same rows."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from omegaconf import open_dict
from verl.workers.rollout.replica import TokenOutput
from vx_helpers import compose_config, recurrent_agent_loop

from experiments.calculator.agent import SYSTEM_PROMPT
from recurrent.functions import agent_function
from recurrent.interface import WorkflowConfig

CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "37 * 48"}}</tool_call>'
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


class CalculatorTokenServer:
    """Reads the prompt it is sent: a tool result gets ``\\boxed{result}``, a question gets a calculator call."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.prompts: list[list[int]] = []
        self.replies: list[list[int]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_):
        self.prompts.append(list(prompt_ids))
        text = self.tokenizer.decode(prompt_ids)
        result = re.findall(r"<tool_response>(-?\d+)</tool_response>", text)  # not the system prompt's "..."
        reply = f"So \\boxed{{{result[-1]}}}" if result else CALL
        ids = self.tokenizer.encode(reply, add_special_tokens=False)[: sampling_params["max_tokens"] - 1]
        ids.append(self.tokenizer.eos_token_id)
        self.replies.append(ids)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed", extra_fields={})


def calculator_config(tiny_model_dir, *overrides):
    return compose_config("calculator_cpu", [f"actor_rollout_ref.model.path={tiny_model_dir}", *overrides])


def sample(question: str) -> dict:
    chat = [{"role": "user", "content": question}]
    return {"uid": "u1", "session_id": 0, "index": 0, "prompt": chat, "raw_prompt": chat, "data_source": "calc"}


def chat_ids(tokenizer, messages) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


async def test_one_row_per_call_with_the_exact_prompt_and_response_ids(tiny_model_dir, tiny_tokenizer):
    # Wide enough rows for the tiny tokenizer's call (~65 tokens).
    wide = ("recurrent.config.max_tokens_per_turn=96", "data.max_response_length=96", "data.max_prompt_length=640")
    config = calculator_config(tiny_model_dir, *wide, "actor_rollout_ref.rollout.max_model_len=736")
    server = CalculatorTokenServer(tiny_tokenizer)
    loop = recurrent_agent_loop(config, tiny_tokenizer, server)
    outputs = await loop.run(dict(SAMPLING), **sample("What is 37 * 48?"))
    assert len(outputs) == 2 == len(server.prompts)  # the tool call, then the answer
    call_text = tiny_tokenizer.decode(server.replies[0], skip_special_tokens=True)
    system = config.recurrent.config.get("system_prompt", SYSTEM_PROMPT)  # the run config's, else the agent's
    first = [{"role": "system", "content": system}, {"role": "user", "content": "What is 37 * 48?"}]
    second = [
        *first,
        {"role": "assistant", "content": call_text},
        {"role": "user", "content": "<tool_response>1776</tool_response>"},
    ]
    assert outputs[0].prompt_ids == chat_ids(tiny_tokenizer, first)
    assert outputs[1].prompt_ids == chat_ids(tiny_tokenizer, second)
    assert [o.response_ids for o in outputs] == server.replies  # the sampled ids themselves
    assert all(o.response_mask == [1] * len(o.response_ids) for o in outputs)
    assert [o.response_logprobs for o in outputs] == [[-0.5] * len(ids) for ids in server.replies]
    # The tool's result is in the second prompt only: never in a response, so never trained on.
    assert "<tool_response>1776" in tiny_tokenizer.decode(outputs[1].prompt_ids)
    assert all("tool_response" not in tiny_tokenizer.decode(o.response_ids) for o in outputs)
    assert [o.extra_fields["turn_kind"] for o in outputs] == ["call", "final"]
    assert [o.extra_fields["turn_index"] for o in outputs] == [0, 1] and {o.num_turns for o in outputs} == {2}
    assert tiny_tokenizer.decode(outputs[1].response_ids, skip_special_tokens=True) == "So \\boxed{1776}"


@dataclass
class Nothing(WorkflowConfig):
    pass


async def own_sampling(sample, client, config):
    # a call may set its temperature and top_p in training (its row records them); a seed it may not
    return (await client.chat([{"role": "user", "content": "hi"}], 4, temperature=0.7, seed=1)).text


async def greedy_call(sample, client, config):
    return (await client.chat([{"role": "user", "content": "hi"}], 4, temperature=0.0)).text


async def other_answer(sample, client, config):
    reply = await client.chat([{"role": "user", "content": "hi"}], 4)
    return reply.text.upper() + "!"


OWN_SAMPLING = agent_function("own_sampling", Nothing, own_sampling)
GREEDY_CALL = agent_function("greedy_call", Nothing, greedy_call)
OTHER_ANSWER = agent_function("other_answer", Nothing, other_answer)


@pytest.mark.parametrize(
    ("agent", "error"),
    [
        ("OWN_SAMPLING", r"passed sampling parameters \['seed'\] in training"),
        ("GREEDY_CALL", r"temperature=0 \(greedy decoding\) cannot be trained on"),
        ("OTHER_ANSWER", "the agent's answer is not its last call's reply"),
    ],
)
async def test_what_a_function_may_not_do_in_training_is_refused(tiny_model_dir, tiny_tokenizer, agent, error):
    config = calculator_config(tiny_model_dir, f"recurrent.agent={__file__}:{agent}")
    with open_dict(config):
        config.recurrent.config = {}  # the stand-in agent has no settings
    loop = recurrent_agent_loop(config, tiny_tokenizer, CalculatorTokenServer(tiny_tokenizer))
    with pytest.raises((ValueError, RuntimeError), match=error):
        await loop.run(dict(SAMPLING), **sample("What is 1 + 1?"))


async def test_lockstep_rounds_run_an_agent_function_with_the_same_rows(tiny_model_dir, tiny_tokenizer):
    from verl_ext.rollout import AgentRollout
    from verl_ext.sync_rollout import Trajectory, run_trajectories

    wide = ("recurrent.config.max_tokens_per_turn=96", "data.max_response_length=96", "data.max_prompt_length=640")
    overrides = (*wide, "actor_rollout_ref.rollout.max_model_len=736")
    questions = ["What is 37 * 48?", "What is 1 + 1?"]
    loop = recurrent_agent_loop(
        calculator_config(tiny_model_dir, *overrides), tiny_tokenizer, CalculatorTokenServer(tiny_tokenizer)
    )
    in_async = [await loop.run(dict(SAMPLING), **sample(q)) for q in questions]
    config = calculator_config(tiny_model_dir, *overrides, "recurrent.mode=sync")
    rollout = AgentRollout.get(config, tiny_tokenizer)
    server = CalculatorTokenServer(tiny_tokenizer)
    trajectories = [Trajectory(sample(q), 0, dict(SAMPLING)) for q in questions]
    in_sync = await run_trajectories(rollout, server, trajectories)
    assert not [r for r in in_sync if isinstance(r, Exception)], in_sync
    for sync_rows, async_rows in zip(in_sync, in_async, strict=True):
        assert len(sync_rows) == 2  # the tool call, then the answer
        for ours, theirs in zip(sync_rows, async_rows, strict=True):
            assert (ours.prompt_ids, ours.response_ids) == (theirs.prompt_ids, theirs.response_ids)
            assert ours.extra_fields == theirs.extra_fields and ours.num_turns == theirs.num_turns
    # Lockstep: both tool calls went out in the first round, both answers in the second.
    assert ["<tool_response>" in tiny_tokenizer.decode(p) for p in server.prompts] == [False, False, True, True]
