"""The second agent (``experiments/calculator/agent.py``), an agent function: a growing conversation with a
calculator tool, driven through the framework by a scripted client."""

from __future__ import annotations

import asyncio
from dataclasses import asdict

import pytest
from transformers import AutoTokenizer

from experiments.calculator.agent import CalculatorConfig, parse_tool_call, row_widths
from experiments.calculator.tool import calculate
from recurrent.async_manager import run_session
from recurrent.functions import FunctionEpisode
from recurrent.interface import Reply, load_register

CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "6*7"}}</tool_call>'


class ScriptedClient:
    """Replies in order from a script, recording what each call was sent."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.sent: list[tuple[list[dict], int]] = []

    async def chat(self, messages, max_tokens, *, prompt_ids=None, **sampling) -> Reply:
        self.sent.append(([dict(m) for m in messages], max_tokens))
        return Reply(self.replies.pop(0), "stop")


def run(config: CalculatorConfig, sample: dict, replies: list[str]) -> tuple[FunctionEpisode, ScriptedClient]:
    episode = load_register("calculator").for_training(asdict(config), None).episode(sample)
    client = ScriptedClient(replies)
    asyncio.run(run_session(episode, client))
    return episode, client


def test_calculate_and_parse():
    assert calculate("(17 + 3) * 4 / 8") == "10"
    assert calculate("2 ** 10 - 1") == "1023"
    assert calculate("7 / 2") == "3.5"
    assert calculate("1 / 0").startswith("error")
    assert calculate("__import__('os')").startswith("error")
    assert calculate("2 ** 1000").startswith("error")
    assert parse_tool_call("I will compute. " + CALL) == "6*7"
    assert parse_tool_call("<tool_call>not json</tool_call>") == ""
    assert parse_tool_call("The answer is \\boxed{42}") is None


def test_tool_results_grow_the_conversation_and_a_reply_without_a_call_is_the_answer():
    config = CalculatorConfig(max_turns=5, max_tokens_per_turn=20)
    question = [{"role": "user", "content": "What is 6 times 7?"}]
    episode, client = run(config, {"prompt": question}, [CALL, "So \\boxed{42}"])
    first, second = (messages for messages, _ in client.sent)
    assert [m["role"] for m in first] == ["system", "user"] and first[1]["content"] == "What is 6 times 7?"
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[2]["content"] == CALL and second[3]["content"] == "<tool_response>42</tool_response>"
    assert [max_tokens for _, max_tokens in client.sent] == [20, 20]
    # Two calls, two records (each its own training row), and the answer is the last reply.
    assert [rec.reply.text for rec in episode.history] == [CALL, "So \\boxed{42}"]
    assert episode.answer == "So \\boxed{42}" and episode.finished
    assert [rec.turn.messages for rec in episode.history] == [first, second]


def test_the_last_allowed_call_is_the_answer_whatever_it_holds():
    episode, client = run(CalculatorConfig(max_turns=3), {"prompt": "1+1?"}, [CALL] * 3)
    assert len(client.sent) == 3 and episode.answer == CALL
    assert [m["role"] for m in client.sent[-1][0]] == ["system", "user"] + ["assistant", "user"] * 2


def test_a_malformed_call_and_a_long_result_come_back_as_text():
    config = CalculatorConfig(max_turns=3, max_result_chars=5)
    bad = "<tool_call>{not json}</tool_call>"
    long = '<tool_call>{"name": "calculate", "arguments": {"expression": "2**60"}}</tool_call>'
    _, client = run(config, {"prompt": "?"}, [bad, long, "\\boxed{0}"])
    assert client.sent[1][0][-1]["content"] == "<tool_response>error</tool_response>"  # "error: malformed..." cut
    assert client.sent[2][0][-1]["content"] == "<tool_response>11529</tool_response>"  # 1152921504606846976, cut


def test_a_missing_question_column_is_named():
    register = load_register("calculator")
    agent = register.for_training({"question_key": "question"}, None)
    assert register.columns_of(agent.config) == ("question",)
    with pytest.raises(KeyError, match="'question'"):
        agent.episode({"prompt": "1+1?"})


def test_row_widths_bound_the_longest_call(tiny_model_dir):
    """The widest prompt, counted by hand: the longest conversation the agent can send, with every content at its
    budget (replies of max_tokens_per_turn tokens, results of max_result_chars characters, the question at its
    budget), rendered by the tokenizer, is no longer than the declared width."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = CalculatorConfig(max_turns=3, max_tokens_per_turn=12, max_question_tokens=10, max_result_chars=6)
    widths = row_widths(config, tokenizer)
    word = tokenizer.decode(tokenizer.encode(" value", add_special_tokens=False)[:1])
    reply = word * 12  # 12 tokens (one token repeated)
    assert len(tokenizer.encode(reply, add_special_tokens=False)) <= 12
    question = word * 10
    longest = [{"role": "system", "content": config.system_prompt}, {"role": "user", "content": question}]
    longest += [
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "<tool_response>123456</tool_response>"},
    ] * 2
    rendered = tokenizer.apply_chat_template(longest, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert len(rendered) <= widths.prompt and widths.response == 12
    assert "max_turns=3" in widths.made_of and "max_result_chars=6" in widths.made_of


def test_registered_by_name():
    register = load_register("calculator")
    assert register.name == "calculator" and register.config_cls is CalculatorConfig
    with pytest.raises(ModuleNotFoundError, match=r"no agent 'calculatr'.*calculator.*memory"):
        load_register("calculatr")


def test_a_multi_turn_chat_is_answered_for_its_last_question():
    chat = [
        {"role": "user", "content": "What is 1 plus 1?"},
        {"role": "assistant", "content": "\\boxed{2}"},
        {"role": "user", "content": "And 6 times 7?"},
    ]
    _, client = run(CalculatorConfig(max_turns=2), {"prompt": chat}, ["\\boxed{42}"])
    assert client.sent[0][0][1:] == [{"role": "user", "content": "And 6 times 7?"}]
