"""An agent written against ``openai.AsyncOpenAI`` (recurrent/openai_agents.py): every ``chat.completions.create``
returns a real ``ChatCompletion`` from the in-process recording route and is one recorded call, whose prompt ids
are the chat template's rendering of the request (tools included) and whose reply ids are the backend's. Expected
ids come from the tokenizer's own ``apply_chat_template`` on conversations written out here."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion
from transformers import AutoTokenizer

from experiments.calculator.openai_agent import SYSTEM_PROMPT, TOOLS, CalculatorConfig
from recurrent.async_manager import check_finished, run_session
from recurrent.generation_manager import run_lockstep
from recurrent.interface import Reply, load_register
from recurrent.openai_agents import openai_agent

CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "6 * 7"}}</tool_call>'
# Qwen2.5's chat template, its tool parts: tools into the system turn, calls and results in its format.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{{ messages[0]['content'] }}\n\n# Tools\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools><|im_end|>\n"
    "{%- set rest = messages[1:] %}{%- else %}{%- set rest = messages %}{%- endif %}"
    "{%- for message in rest %}"
    "{%- if message.role == 'assistant' %}<|im_start|>assistant{% if message.content %}\n{{ message.content }}"
    "{% endif %}{%- for call in message.tool_calls or [] %}\n<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


class TokenBackend:
    """A token-in backend as training has (verl_ext/rollout.py's TokenClient): the prompt is the ids it is
    given,
    the reply the ids of the next scripted text plus the end token, and an agent's own sampling is refused."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.sampled: list[list[int]] = []

    async def chat(self, messages, max_tokens, *, prompt_ids=None, **sampling) -> Reply:
        if sampling:
            raise ValueError(f"an agent passed sampling parameters {sorted(sampling)} in training; the rollout's apply")
        ids = self.tokenizer.encode(self.replies.pop(0), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        self.sampled.append(ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Reply(text, "stop", ids, len(prompt_ids), len(ids), prompt_ids=list(prompt_ids))


class Upstream:
    """An OpenAI-style client (evaluation): keeps what each call was sent, answers in order."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.sent: list[tuple[list[dict], int, dict]] = []

    async def chat(self, messages, max_tokens, **options) -> Reply:
        self.sent.append((messages, max_tokens, options))
        return Reply(self.replies.pop(0), "stop", prompt_tokens=7, completion_tokens=3)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def tools_tokenizer(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TOOLS_TEMPLATE
    return tokenizer


def template_ids(tokenizer, messages, tools=None) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@dataclass
class TwoCalls:
    max_tokens: int = 16


COMPLETIONS: list[ChatCompletion] = []


async def two_calls(sample, client, config):
    first = await client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": sample["q"]}], max_tokens=config.max_tokens
    )
    COMPLETIONS.append(first)
    messages = [
        {"role": "user", "content": sample["q"]},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Sure?"},
    ]
    second = await client.chat.completions.create(model="any", messages=messages, max_completion_tokens=8)
    COMPLETIONS.append(second)
    return second.choices[0].message.content


TWO_CALLS = openai_agent("two_calls", TwoCalls, two_calls, columns=("q",))


def train(register, tokenizer, backend, sample, **config):
    episode = register.for_training(config, tokenizer).episode(sample)
    asyncio.run(run_session(episode, backend))
    check_finished(episode)
    return episode


def test_each_create_is_a_chat_completion_and_one_call_with_the_template_ids(tokenizer):
    COMPLETIONS.clear()
    backend = TokenBackend(tokenizer, ["Draft 42", "Yes, 42"])
    episode = train(TWO_CALLS, tokenizer, backend, {"q": "What is 6 * 7?"})
    first, second = COMPLETIONS
    assert isinstance(first, ChatCompletion) and first.choices[0].message.content == "Draft 42"
    assert first.choices[0].finish_reason == "stop" and first.model == "any"
    assert first.usage.completion_tokens == len(backend.sampled[0])
    assert first.choices[0].model_extra["token_ids"] == backend.sampled[0]  # vLLM's return_token_ids field
    question = [{"role": "user", "content": "What is 6 * 7?"}]
    again = [*question, {"role": "assistant", "content": "Draft 42"}, {"role": "user", "content": "Sure?"}]
    assert [r.turn.prompt_ids for r in episode.history] == [
        template_ids(tokenizer, question),
        template_ids(tokenizer, again),
    ]
    assert [r.reply.token_ids for r in episode.history] == backend.sampled  # the ids sampled, never re-encoded
    assert [r.turn.max_tokens for r in episode.history] == [16, 8]  # max_tokens, then max_completion_tokens
    assert episode.answer == "Yes, 42" == second.choices[0].message.content


def test_tools_render_through_a_template_that_supports_them(tools_tokenizer):
    backend = TokenBackend(tools_tokenizer, [CALL, "So \\boxed{42}"])
    episode = train(load_register("calculator_openai"), tools_tokenizer, backend, {"prompt": "What is 6 * 7?"})
    asked = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "What is 6 * 7?"}]
    called = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_0_0",
                "type": "function",
                "function": {"name": "calculate", "arguments": {"expression": "6 * 7"}},
            }
        ],
    }
    answered = [*asked, called, {"role": "tool", "tool_call_id": "call_0_0", "content": "42"}]
    assert episode.history[0].turn.prompt_ids == template_ids(tools_tokenizer, asked, TOOLS)
    assert episode.history[1].turn.prompt_ids == template_ids(tools_tokenizer, answered, TOOLS)
    rendered = tools_tokenizer.decode(episode.history[1].turn.prompt_ids)
    assert '"name": "calculate"' in rendered.split("</tools>")[0]  # the tool described by the template
    assert '<tool_call>\n{"name": "calculate", "arguments": {"expression": "6 * 7"}}\n</tool_call>' in rendered
    assert [r.reply.token_ids for r in episode.history] == backend.sampled
    assert episode.answer == "So \\boxed{42}"


@dataclass
class Ask:
    options: str = "{}"  # JSON: the request's fields besides the messages


async def ask(sample, client, config):
    fields = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **json.loads(config.options)}
    return (await client.chat.completions.create(**fields)).choices[0].message.content


ASK = openai_agent("ask", Ask, ask)
ASK_CAPPED = openai_agent("ask", Ask, ask, max_tokens=5)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"max_tokens": 4, "temperature": 0.0}, r"passed sampling parameters \['temperature', 'top_p'\] in training"),
        ({"max_tokens": 4, "tools": TOOLS, "tool_choice": "required"}, r"sampling parameters \['tool_choice'\]"),
        ({}, r"max_tokens \(or max_completion_tokens\): each call's cap on new tokens is required"),
        ({"max_tokens": 4, "stream": True}, "stream: the recording route answers whole completions only"),
    ],
)
def test_what_training_refuses_reaches_the_agent_as_a_bad_request(tokenizer, options, error):
    with pytest.raises(openai.BadRequestError, match=error):
        train(ASK, tokenizer, TokenBackend(tokenizer, ["x"]), {}, options=json.dumps(options))


def test_a_registered_cap_serves_requests_that_set_none(tokenizer):
    episode = train(ASK_CAPPED, tokenizer, TokenBackend(tokenizer, ["ok"]), {})
    assert episode.history[0].turn.max_tokens == 5 and episode.answer == "ok"


def test_in_evaluation_the_request_goes_upstream_as_it_is():
    upstream = Upstream([CALL, "So \\boxed{42}"])
    episode = load_register("calculator_openai").for_inference(None).episode({"prompt": "What is 6 * 7?"})
    asyncio.run(run_session(episode, upstream))
    (first, cap, options), (second, _, _) = upstream.sent
    assert cap == CalculatorConfig().max_tokens_per_turn and options == {"tools": TOOLS}  # no prompt ids
    assert first == [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "What is 6 * 7?"}]
    call = {
        "id": "call_0_0",
        "type": "function",
        "function": {"name": "calculate", "arguments": '{"expression": "6 * 7"}'},
    }
    assert second[2:] == [
        {"role": "assistant", "tool_calls": [call]},  # the reply as the agent received it
        {"role": "tool", "tool_call_id": "call_0_0", "content": "42"},
    ]
    assert episode.answer == "So \\boxed{42}"


def test_sampling_goes_upstream_in_evaluation():
    upstream = Upstream(["hello"])
    options = json.dumps({"max_tokens": 4, "temperature": 0.5, "seed": 3})
    episode = ASK.for_inference(None, options=options).episode({})
    asyncio.run(run_session(episode, upstream))
    # top_p 1.0: a call that sets temperature gets the model's own distribution for top_p (recurrent/sampling.py)
    assert upstream.sent[0][2] == {"temperature": 0.5, "top_p": 1.0, "seed": 3} and episode.answer == "hello"


def test_calls_that_run_out_end_on_the_last_reply_as_the_answer(tokenizer):
    config = asdict(CalculatorConfig(max_turns=2, max_tokens_per_turn=64))
    backend = TokenBackend(tokenizer, [CALL, "Again " + CALL])
    episode = train(load_register("calculator_openai"), tokenizer, backend, {"prompt": "What is 6 * 7?"}, **config)
    # The agent returned the last completion's content ("Again "); the answer is the reply the reward scores.
    assert episode.answer == "Again " + CALL == episode.history[-1].reply.text


def test_tool_choice_none_goes_upstream_and_parses_no_calls():
    upstream = Upstream([CALL])
    options = json.dumps({"max_tokens": 4, "tools": TOOLS, "tool_choice": "none"})
    episode = ASK.for_inference(None, options=options).episode({})
    asyncio.run(run_session(episode, upstream))
    assert upstream.sent[0][2] == {"tools": TOOLS, "tool_choice": "none"}
    assert episode.answer == CALL  # the reply's text as content: vLLM reads no calls under "none"


async def n_drafts(sample, client, config):
    completion = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "draft"}], max_tokens=4, n=3, temperature=1.2
    )
    texts = [choice.message.content for choice in completion.choices]
    final = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": " | ".join(texts)}], max_tokens=4
    )
    return final.choices[0].message.content


N_DRAFTS = openai_agent("n_drafts", TwoCalls, n_drafts)


class SamplingBackend(TokenBackend):
    """The scripted backend, recording each call's own sampling instead of refusing it."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        super().__init__(tokenizer, replies)
        self.sampling: list[dict] = []

    async def chat(self, messages, max_tokens, *, prompt_ids=None, **sampling) -> Reply:
        self.sampling.append(sampling)
        return await super().chat(messages, max_tokens, prompt_ids=prompt_ids)


def test_n_completions_are_n_calls_made_at_once_one_choice_each(tokenizer):
    backend = SamplingBackend(tokenizer, ["a", "b", "c", "abc"])
    episode = train(N_DRAFTS, tokenizer, backend, {})
    assert [rec.reply.text for rec in episode.history] == ["a", "b", "c", "abc"]
    draft = template_ids(tokenizer, [{"role": "user", "content": "draft"}])
    assert [rec.turn.prompt_ids for rec in episode.history[:3]] == [draft] * 3  # one prompt, three rows
    # n is the route's, temperature the call's, top_p the rule's 1.0 for a call that set temperature alone
    assert backend.sampling == [{"temperature": 1.2, "top_p": 1.0}] * 3 + [{}]
    final = template_ids(tokenizer, [{"role": "user", "content": "a | b | c"}])
    assert episode.history[3].turn.prompt_ids == final and episode.answer == "abc"
    # Each row names the request it came from and its choice: the n=3 drafts are choices 0-2 of the first request.
    made = [(rec.turn.meta["request"], rec.turn.meta["choice"]) for rec in episode.history]
    assert made == [("chatcmpl-recorded-0", 0), ("chatcmpl-recorded-0", 1), ("chatcmpl-recorded-0", 2)] + [
        ("chatcmpl-recorded-1", 0)
    ]


def test_a_bad_n_is_a_bad_request(tokenizer):
    with pytest.raises(openai.BadRequestError, match="n: the number of completions is an integer >= 1, got 0"):
        train(ASK, tokenizer, TokenBackend(tokenizer, ["x"]), {}, options=json.dumps({"max_tokens": 4, "n": 0}))


async def gathered_drafts(sample, client, config):
    async def draft(k: int) -> str:
        completion = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"{sample['q']} draft {k}"}], max_tokens=4
        )
        return completion.choices[0].message.content

    drafts = await asyncio.gather(*(draft(k) for k in range(3)))
    vote = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": " | ".join(drafts)}], max_tokens=4
    )
    return vote.choices[0].message.content


GATHERED = openai_agent("gathered", TwoCalls, gathered_drafts, columns=("q",))


def test_in_sync_mode_an_openai_agents_drafts_made_at_once_go_in_one_round(tokenizer, monkeypatch):
    """Four agents, each three drafts at once then a vote: two rounds of 12 and 4 calls. The SDK's first request on a
    client would look its platform up in a worker thread, which the lockstep barrier cannot see (a draft still there
    missed its round now and then: three rounds); the route's clients make no such hop."""
    import openai._base_client as base_client

    hops: list[str] = []

    def recording_asyncify(function):
        hops.append(getattr(function, "__name__", repr(function)))
        return original(function)

    original = base_client.asyncify
    monkeypatch.setattr(base_client, "asyncify", recording_asyncify)

    async def model(i: int, turn) -> Reply:
        ids = tokenizer.encode(f"r{i}", add_special_tokens=False) + [tokenizer.eos_token_id]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        return Reply(text, "stop", ids, len(turn.prompt_ids), len(ids), prompt_ids=list(turn.prompt_ids))

    workflow = GATHERED.for_training({}, tokenizer)
    episodes = [workflow.episode({"q": f"question {i}"}) for i in range(4)]
    run = asyncio.run(run_lockstep(episodes, model))
    assert hops == []  # no request of a recording client left the event loop
    assert run.errors == [None] * 4
    assert run.rounds == [[0, 1, 2, 3], [0, 1, 2, 3]] and run.calls == [12, 4]
    assert [len(episode.history) for episode in episodes] == [4] * 4
