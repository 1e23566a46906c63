"""A call's ``prompt_ids`` are what the list held when the agent made the call (recurrent/functions.py,
``CallRecorder.chat``), in both drivers: a lockstep round (sync mode) sends its calls later, and an agent's code runs
on in its own thread while the async driver sends them, so an agent that goes on editing the list it passed (the
next prompt built in the same buffer) would have the call sent with the edits, in sync mode always and in async mode
as the threads fall."""

from __future__ import annotations

import asyncio

import pytest

from recurrent.async_manager import run_session
from recurrent.functions import FunctionEpisode
from recurrent.generation_manager import run_lockstep
from recurrent.interface import Reply, Turn, WorkflowConfig


async def edits_its_ids(sample, client, config) -> str:
    """One call with the ids [1, 2, 3], and at once (the same pass of its loop) the next prompt built in that list."""
    ids = [1, 2, 3]

    async def next_prompt() -> None:
        ids.extend([4] * 300)

    reply, _ = await asyncio.gather(client.chat([{"role": "user", "content": "q"}], 8, prompt_ids=ids), next_prompt())
    return reply.text


class SeenIds:
    """A token client (chat) and a lockstep generate that answer "ok" and keep each call's prompt ids."""

    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    async def chat(self, messages, max_tokens, *, prompt_ids=None, **sampling) -> Reply:
        self.seen.append(list(prompt_ids))
        return Reply("ok", "stop")

    async def __call__(self, i: int, turn: Turn) -> Reply:
        return await self.chat(turn.messages, turn.max_tokens, prompt_ids=turn.prompt_ids)


@pytest.mark.timeout(30)
async def test_a_lockstep_round_sends_the_ids_as_they_were_when_the_call_was_made():
    model = SeenIds()
    episode = FunctionEpisode(edits_its_ids, {}, WorkflowConfig(), "edits")
    run = await run_lockstep([episode], model)
    assert run.errors == [None] and model.seen == [[1, 2, 3]]
    assert episode.history[0].turn.prompt_ids == [1, 2, 3]  # and the record keeps them


@pytest.mark.timeout(30)
async def test_the_async_driver_sends_the_ids_as_they_were_when_the_call_was_made():
    for _ in range(5):  # whichever thread runs first
        model = SeenIds()
        episode = await run_session(FunctionEpisode(edits_its_ids, {}, WorkflowConfig(), "edits"), model)
        assert model.seen == [[1, 2, 3]] and episode.history[0].turn.prompt_ids == [1, 2, 3]
