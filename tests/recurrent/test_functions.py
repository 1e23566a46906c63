"""Agents written as plain async functions (recurrent/functions.py) behave in the drivers as session agents do:
every call recorded in order, failures per sample, cancellation between calls, concurrency limits, traces; and
what a function may not do is refused with a message that says why."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from recurrent.async_manager import AsyncGenerationManager, run_session
from recurrent.functions import FunctionEpisode, agent_function
from recurrent.interface import Reply, WorkflowConfig
from recurrent.trace import read_trace


@dataclass
class AskConfig(WorkflowConfig):
    calls: int = 2
    fail_after: int | None = None  # raise after this many calls (an agent bug)


async def ask(sample, client, config):
    """Ask ``calls`` times, each prompt quoting the previous reply; the last reply is the answer."""
    reply = None
    for i in range(config.calls):
        if config.fail_after == i:
            raise RuntimeError(f"{sample['name']} broke after {i} calls")
        previous = reply.text if reply else "nothing"
        kind = "answer" if i == config.calls - 1 else "step"
        reply = await client.chat([{"role": "user", "content": f"{sample['name']} {i}: {previous}"}], 4, kind=kind)
    return reply.text


REGISTER = agent_function("ask", AskConfig, ask, columns=("name",))


class GatedClient:
    """Each call waits on its own gate, which the test opens (no timing involved)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gates: list[asyncio.Event] = []
        self.arrived = asyncio.Event()
        self.in_flight = self.peak = 0

    async def chat(self, messages, max_tokens, **sampling) -> Reply:
        self.calls.append(messages[0]["content"])
        gate = asyncio.Event()
        self.gates.append(gate)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.arrived.set()
        try:
            await gate.wait()
        finally:
            self.in_flight -= 1
        return Reply(text=f"reply {len(self.calls)}", finish_reason="stop", prompt_tokens=3, completion_tokens=2)

    async def wait_for_calls(self, n: int) -> None:
        while len(self.calls) < n:
            self.arrived.clear()
            await self.arrived.wait()

    def open_all(self) -> None:
        for gate in self.gates:
            gate.set()


class InstantClient(GatedClient):
    async def chat(self, messages, max_tokens, **sampling) -> Reply:
        self.calls.append(messages[0]["content"])
        return Reply(text=f"reply {len(self.calls)}", finish_reason="stop", prompt_tokens=3, completion_tokens=2)


def episode(name: str, **config) -> FunctionEpisode:
    return REGISTER.for_training(config, None).episode({"name": name})


async def test_every_call_is_recorded_in_order_and_the_last_reply_is_the_answer():
    client = InstantClient()
    run = episode("a", calls=3)
    assert await run_session(run, client) is run
    assert client.calls == ["a 0: nothing", "a 1: reply 1", "a 2: reply 2"]
    assert [rec.reply.text for rec in run.history] == ["reply 1", "reply 2", "reply 3"]
    assert [rec.turn.meta["kind"] for rec in run.history] == ["step", "step", "answer"]
    assert [rec.turn.messages[0]["content"] for rec in run.history] == client.calls
    assert run.finished and run.answer == "reply 3"
    trace = run.trace()
    assert trace["answer"] == "reply 3" and [t["response"] for t in trace["turns"]] == ["reply 1", "reply 2", "reply 3"]


async def test_failures_are_per_sample_and_traced(tmp_path):
    client = InstantClient()
    runs = [episode("ok", calls=2), episode("bad", calls=3, fail_after=1), episode("ok2", calls=1)]
    trace = tmp_path / "trace.jsonl"
    rollout = await AsyncGenerationManager(client, trace_path=trace, progress=False).run(runs)
    assert [e is None for e in rollout.errors] == [True, False, True]
    assert "bad broke after 1 calls" in str(rollout.errors[1])
    # Rows of the finished samples only (the failed one has no answer to reward): 2 + 1, the last of each final.
    assert rollout.sample_index.tolist() == [0, 0, 2] and rollout.final_mask.tolist() == [False, True, True]
    lines = {line["id"]: line for line in read_trace(trace)}
    # Each agent runs in its own thread (recurrent/agent_thread.py): the samples' calls interleave in any order, and
    # "ok"'s answer is the reply to its second call, wherever that call came.
    answer = f"reply {client.calls.index('ok 1: ' + lines[0]['turns'][0]['response']) + 1}"
    assert lines[1]["error"].startswith("RuntimeError: bad broke") and lines[0]["answer"] == answer
    assert rollout.prompt_tokens == 3 * 4  # every call paid for, the failed sample's one call included


async def test_the_concurrency_limit_holds_for_functions():
    client = GatedClient()
    runs = [episode(f"s{i}", calls=2) for i in range(5)]
    task = asyncio.create_task(AsyncGenerationManager(client, max_concurrency=2, progress=False).run(runs))
    await client.wait_for_calls(2)
    assert len(client.calls) == 2 and client.in_flight == 2  # two samples at a time, not five
    while not task.done():
        client.open_all()
        await asyncio.sleep(0)  # hand control to the released calls (an event-loop turn, not a timing)
    rollout = task.result()
    assert rollout.num_failed == 0 and client.peak == 2 and len(client.calls) == 10


class CancelledWithReply(InstantClient):
    async def chat(self, messages, max_tokens, **sampling) -> Reply:
        reply = await super().chat(messages, max_tokens, **sampling)
        asyncio.current_task().cancel()  # the stop arrives together with the reply
        return reply


async def test_a_function_cancelled_with_its_reply_makes_no_further_call():
    client = CancelledWithReply()
    run = episode("c", calls=4)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(run_session(run, client))
    assert len(client.calls) == 1 and run.history == [] and not run.finished


async def test_what_a_function_may_not_do_is_refused():
    with pytest.raises(KeyError, match="no column 'name'"):
        REGISTER.for_training({}, None).episode({"question": "?"})
    with pytest.raises(ValueError, match=r"has no setting 'turns'.*calls, fail_after"):
        REGISTER.for_training({"turns": 3}, None)

    async def silent(sample, client, config):
        return "an answer without asking"

    run = agent_function("silent", AskConfig, silent).for_training({}, None).episode({})
    with pytest.raises(RuntimeError, match="without calling the model"):
        await run_session(run, InstantClient())

    async def not_text(sample, client, config):
        await client.chat([{"role": "user", "content": "x"}], 1)
        return 42

    run = agent_function("number", AskConfig, not_text).for_training({}, None).episode({})
    with pytest.raises(TypeError, match="returned a int"):
        await run_session(run, InstantClient())
    run = episode("twice")
    await run_session(run, InstantClient())
    with pytest.raises(RuntimeError, match="runs once"):
        await run_session(run, InstantClient())


class SamplingClient:
    """Records the sampling each call arrived with."""

    def __init__(self) -> None:
        self.sampling: list[dict] = []

    async def chat(self, messages, max_tokens, **sampling) -> Reply:
        self.sampling.append(sampling)
        return Reply(text="ok", finish_reason="stop", prompt_tokens=1, completion_tokens=1)


async def test_an_agents_own_per_call_sampling_reaches_the_model_over_the_runs():
    async def greedy_then_default(sample, client, config):
        await client.chat([{"role": "user", "content": "q"}], 4, temperature=0.0)
        await client.chat([{"role": "user", "content": "q"}], 4, top_k=5, final=True)
        return "done"

    run = agent_function("greedy", AskConfig, greedy_then_default).for_training({}, None).episode({})
    client = SamplingClient()
    await run.run(client, sampling={"temperature": 0.7, "top_p": 0.9}, final_sampling={"top_k": 1, "seed": 3})
    # What the agent set for a call wins. A call that sets temperature or top_p gets 1.0 for the other (the one rule
    # of recurrent/sampling.py, never the run's 0.9); a call that sets neither takes the run's for both.
    assert client.sampling == [
        {"temperature": 0.0, "top_p": 1.0},
        {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 3},
    ]


async def test_an_agent_may_return_its_own_score_with_its_answer():
    from recurrent.functions import Answer

    async def scored(sample, client, config):
        reply = await client.chat([{"role": "user", "content": "q"}], 4)
        return Answer(reply.text, score=0.75)

    episode = FunctionEpisode(scored, {}, AskConfig(), "scored")
    await run_session(episode, InstantClient())
    assert (episode.answer, episode.score) == ("reply 1", 0.75) and episode.trace()["score"] == 0.75
    plain = FunctionEpisode(ask, {"name": "a"}, AskConfig(), "ask")
    await run_session(plain, InstantClient())
    assert plain.score is None and "score" not in plain.trace()
    for bad in (float("nan"), True, "1"):
        with pytest.raises(ValueError, match="an agent's score is a finite number"):
            Answer("x", score=bad)
