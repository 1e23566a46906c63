"""One agent, four entry points, the same sampling on every call (recurrent/sampling.py, the one rule).

The newcomer's agent (docs/write_your_own_agent.md, "Sampling of its own") on the official ``openai`` client: two
hot drafts at temperature 1.0 and top_p 0.9 made at once, one of them asking ``n=2``, then a cold judge that sets
temperature 0.2 alone. By the rule, worked by hand: the three drafts sample at (1.0, 0.9); the judge at (0.2, 1.0),
1.0 being the model's own top_p (never the run's: 0.95 in evaluation, 0.8 in this training run). The same agent runs
in training (verl's agent loop over a token server), in the harness (the run's client over HTTP to a model), behind
the endpoint, and against ``python -m recurrent.local_server``'s front (its ``openai`` client pointed at it, as a
newcomer tries it); each model records what each call arrived with.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import httpx2  # the openai package's HTTP library
import openai
import pytest
from aiohttp import web
from threaded_http import serve_in_a_thread
from verl.workers.rollout.replica import TokenOutput
from vx_helpers import compose_config, recurrent_agent_loop

from recurrent.async_manager import run_session
from recurrent.client import OpenAIChatClient
from recurrent.local_front import front_app
from recurrent.openai_agents import openai_agent
from taskutils.memory_eval.results import sampling_used

sys.path.insert(0, str(Path(__file__).parents[1] / "taskutils" / "endpoint"))  # the endpoint's test helpers
from serve_helpers import served  # noqa: E402

EXPECTED = [(1.0, 0.9)] * 3 + [(0.2, 1.0)]  # by hand: the drafts' own values; the judge's temperature, top_p 1.0
EVALUATION = {"temperature": 0.7, "top_p": 0.95}  # the harness's and the endpoint's defaults (the paper's)
WAIT = 30.0


async def hot_and_cold(sample, client, config):
    question = [{"role": "user", "content": sample["input"]}]
    hot = {"model": "m", "messages": question, "max_tokens": 4, "temperature": 1.0, "top_p": 0.9}
    pair, single = await asyncio.gather(
        client.chat.completions.create(**hot, n=2), client.chat.completions.create(**hot)
    )
    drafts = [choice.message.content for choice in pair.choices + single.choices]
    judge = [{"role": "user", "content": f"{sample['input']} Drafts: {drafts}. Which is right?"}]
    verdict = await client.chat.completions.create(model="m", messages=judge, max_tokens=4, temperature=0.2)
    return verdict.choices[0].message.content


@dataclass
class Nothing:
    pass


HOT_AND_COLD = openai_agent("hot_and_cold", Nothing, hot_and_cold)


def as_pairs(sampling: list[dict]) -> list[tuple[float, float]]:
    """(temperature, top_p) of each call, drafts first (the drafts made at once may arrive in any order)."""
    pairs = [(float(s["temperature"]), float(s["top_p"])) for s in sampling]
    return sorted(pairs[:-1], reverse=True) + pairs[-1:]


def model_app(seen: list[dict]) -> web.Application:
    """An OpenAI-compatible model that answers ``ok`` and records each request's body."""

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        return web.json_response(
            {"id": "x", "object": "chat.completion", "model": "m", "choices": [choice], "usage": usage}
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


class TokenServer:
    """verl's token server: every call answered ``ok``, its sampling recorded."""

    def __init__(self, tokenizer) -> None:
        self.ids = tokenizer.encode("ok", add_special_tokens=False) + [tokenizer.eos_token_id]
        self.sampling: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_):
        self.sampling.append(dict(sampling_params))
        return TokenOutput(
            token_ids=self.ids, log_probs=[-0.1] * len(self.ids), stop_reason="completed", extra_fields={}
        )


@pytest.mark.timeout(120)
async def test_training_samples_each_call_by_the_rule(tiny_model_dir, tiny_tokenizer):
    overrides = [f"actor_rollout_ref.model.path={tiny_model_dir}", f"recurrent.agent={__file__}:HOT_AND_COLD"]
    config = compose_config("calculator_cpu", overrides)
    config.recurrent.config = {}
    server = TokenServer(tiny_tokenizer)
    loop = recurrent_agent_loop(config, tiny_tokenizer, server)
    rollout = {"temperature": 0.6, "top_p": 0.8, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    messages = [{"role": "user", "content": "What is 1 + 1?"}]
    sample = {"uid": "u", "session_id": 0, "index": 0, "prompt": messages, "raw_prompt": messages, "input": "1 + 1?"}
    outputs = await loop.run(dict(rollout), **sample)
    assert as_pairs(server.sampling) == EXPECTED
    # each row records what sampled it; the actor's temperature per row is the call's
    assert [o.temperature for o in outputs][-1] == 0.2 and outputs[-1].extra_fields["top_p"] == 1.0


@pytest.mark.timeout(120)
def test_the_harness_sends_each_call_by_the_rule():
    seen: list[dict] = []
    with serve_in_a_thread(model_app(seen), wait_s=WAIT) as url:
        episode = HOT_AND_COLD.for_inference(None).episode({"input": "1 + 1?"})
        client = OpenAIChatClient(url, "m", max_retries=0)
        asyncio.run(run_session(episode, client, dict(EVALUATION)))  # what taskutils/memory_eval/runner.py does
    assert as_pairs(seen) == EXPECTED and all("n" not in body for body in seen)
    # The item's results line records what its calls used (not the run's 0.7 / 0.95, which none of them did).
    used = [{"temperature": 1.0, "top_p": 0.9, "calls": 3}, {"temperature": 0.2, "top_p": 1.0, "calls": 1}]
    assert sampling_used(episode.history, EVALUATION) == used


@pytest.mark.timeout(120)
def test_the_endpoint_sends_each_call_by_the_rule():
    seen: list[dict] = []
    with (
        serve_in_a_thread(model_app(seen), wait_s=WAIT) as url,
        served(url, "m", None, agent=f"{__file__}:HOT_AND_COLD") as (base, _),
    ):
        request = {"model": "memagent", "messages": [{"role": "user", "content": "1 + 1?"}]}
        reply = httpx.post(f"{base}/chat/completions", json=request, timeout=WAIT)
    assert reply.status_code == 200, reply.text
    assert as_pairs(seen) == EXPECTED


@pytest.mark.timeout(120)
def test_the_local_servers_front_gives_n_and_the_rule():
    seen: list[dict] = []
    with serve_in_a_thread(model_app(seen), wait_s=WAIT) as url:
        front = front_app(url.removesuffix("/v1"), dict(EVALUATION))
        transport = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=front), base_url="http://front")

        async def tried() -> str:
            client = openai.AsyncOpenAI(base_url="http://front/v1", api_key="x", http_client=transport)
            return await hot_and_cold({"input": "1 + 1?"}, client, Nothing())

        assert asyncio.run(tried()) == "ok"
    assert as_pairs(seen) == EXPECTED and all("n" not in body for body in seen)
