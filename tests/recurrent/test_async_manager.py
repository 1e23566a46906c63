"""The async manager against a real `transformers serve` (tiny model): rows, masks, usage, greedy determinism,
session concurrency, traces, and failures recorded per sample; the turn loop's hook with a scripted client."""

import asyncio
from dataclasses import dataclass

import pytest

from recurrent.async_manager import (
    AsyncGenerationManager,
    cancel_and_wait,
    reduce_timings,
    run_session,
    run_sessions,
)
from recurrent.client import ChatRequestError, OpenAIChatClient
from recurrent.functions import FunctionEpisode
from recurrent.interface import Reply, Turn, WorkflowConfig
from recurrent.local_server import free_port
from recurrent.trace import finished_ids, read_trace

GREEDY = {"temperature": 0}


@dataclass
class RelayConfig(WorkflowConfig):
    k: int = 0  # calls before the answer
    max_tokens: int = 4
    fail_at: int | None = None  # the agent raises on this call's reply (an agent bug in mid-run)
    early_final: bool = False  # a buggy agent: it flags its first call final, then goes on calling


async def relay(sample: dict, client, config: RelayConfig) -> str:
    """``k`` calls then the answer (flagged final); each prompt is one user message quoting the previous reply."""
    previous = "nothing yet"
    for step in range(config.k + 1):
        content = f"{sample['name']}, step {step}. Previous reply: {previous}"
        final = step == config.k or (config.early_final and step == 0)
        reply = await client.chat(
            [{"role": "user", "content": content}], config.max_tokens, final=final, meta={"step": step}
        )
        if step == config.fail_at:
            raise RuntimeError(f"{sample['name']} broke at step {step}")
        previous = reply.text
    return reply.text


def relay_episode(name: str, k: int, **config) -> FunctionEpisode:
    return FunctionEpisode(relay, {"name": name}, RelayConfig(k=k, **config), "relay")


def early_final_episode(name: str, k: int) -> FunctionEpisode:
    return relay_episode(name, k, early_final=True)


class InFlight:
    """A ChatClient wrapper that records the peak number of calls in flight."""

    def __init__(self, client) -> None:
        self.client, self.now, self.peak = client, 0, 0

    async def chat(self, messages, max_tokens, **sampling) -> Reply:
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            return await self.client.chat(messages, max_tokens, **sampling)
        finally:
            self.now -= 1


@pytest.fixture
async def client(tiny_server):
    """A client of the tiny server, its connections closed after the test."""
    client = OpenAIChatClient(tiny_server.base_url, tiny_server.model)
    yield client
    await client.aclose()


def test_reduce_timings_averages_async_keys_and_sums_the_rest():
    per_sample = [
        {"sample_seconds_mean": 2.0, "model_seconds_total": 1.5},
        {"sample_seconds_mean": 4.0, "model_seconds_total": 2.5, "tokenize": 0.25},
        {"sample_seconds_mean": 6.0, "model_seconds_total": 1.0},
    ]
    # async: (2 + 4 + 6) / 3 = 4; model: 1.5 + 2.5 + 1 = 5; tokenize only in one sample: 0.25
    assert reduce_timings(per_sample) == {"sample_seconds_mean": 4.0, "model_seconds_total": 5.0, "tokenize": 0.25}
    assert reduce_timings([]) == {}


async def test_run_session_drives_one_session_to_the_end(client):
    session = await run_session(relay_episode("solo", k=2), client, GREEDY)
    assert [rec.turn.final for rec in session.history] == [False, False, True]
    assert session.finished and session.answer == session.history[-1].reply.text
    # each prompt quotes the previous reply: the loop hands replies back in order
    assert session.history[1].turn.messages[0]["content"].endswith(session.history[0].reply.text)


class EchoClient:
    """A scripted client: each reply echoes the prompt's first words (no server)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, dict]] = []

    async def chat(self, messages: list[dict[str, str]], max_tokens: int, **sampling) -> Reply:
        self.calls.append((max_tokens, sampling))
        return Reply("echo " + messages[-1]["content"].split(".")[0], "stop")


async def test_on_turn_sees_each_turn_after_the_session_recorded_it():
    session, client, seen = relay_episode("s", k=1), EchoClient(), []

    def on_turn(turn: Turn, reply: Reply) -> None:
        seen.append((turn.meta["step"], turn.final, reply.text, len(session.history)))

    assert await run_session(session, client, GREEDY, on_turn=on_turn) is session
    assert client.calls == [(4, GREEDY), (4, GREEDY)]
    assert seen == [(0, False, "echo s, step 0", 1), (1, True, "echo s, step 1", 2)]


async def test_cancel_and_wait_stops_running_tasks_and_keeps_finished_results():
    done = asyncio.ensure_future(asyncio.sleep(0, result=7))
    await done
    sleeper = asyncio.ensure_future(asyncio.sleep(60))
    await cancel_and_wait([done, sleeper])
    assert sleeper.cancelled() and done.result() == 7


async def test_rows_masks_usage_and_length(client):
    sessions = [relay_episode("a", k=0), relay_episode("b", k=1), relay_episode("c", k=3)]
    rollout = await AsyncGenerationManager(client, progress=False).run(sessions, GREEDY)
    assert rollout.errors == [None, None, None] and rollout.ok == [True, True, True]
    assert rollout.sample_index.tolist() == [0, 1, 1, 2, 2, 2, 2]
    assert rollout.final_mask.tolist() == [True, False, True, False, False, False, True]
    assert rollout.sample_index.dtype.is_floating_point is False and rollout.final_mask.dtype.is_signed is False
    assert [rec.turn.meta["step"] for rec in rollout.records] == [0, 0, 1, 0, 1, 2, 3]
    replies = [rec.reply for rec in rollout.records]
    assert all(r.finish_reason == "length" and r.completion_tokens == 4 and r.prompt_tokens > 0 for r in replies)
    assert rollout.completion_tokens == 7 * 4 == client.stats.completion_tokens
    assert rollout.prompt_tokens == sum(r.prompt_tokens for r in replies) == client.stats.prompt_tokens
    assert set(rollout.timing) == {"sample_seconds_mean", "model_seconds_total", "wall_seconds"}
    assert max(rollout.seconds) <= rollout.timing["wall_seconds"]


def test_greedy_runs_are_deterministic_and_traced(tiny_server, tmp_path):
    trace = tmp_path / "trace.jsonl"
    client = OpenAIChatClient(tiny_server.base_url, tiny_server.model)  # one client, two event loops (two asyncio.run)

    def run():
        sessions = [relay_episode(f"s{i}", k=i % 3, max_tokens=6) for i in range(5)]
        return run_sessions(sessions, client, GREEDY, ids=[f"q{i}" for i in range(5)], trace_path=trace, progress=False)

    first, second = run(), run()
    assert [r.reply.text for r in first.records] == [r.reply.text for r in second.records]
    records = read_trace(trace)
    assert len(records) == 10  # appended across the two runs
    assert sorted(r["id"] for r in records[:5]) == [f"q{i}" for i in range(5)]
    q2 = next(r for r in records if r["id"] == "q2")
    assert [t["step"] for t in q2["turns"]] == [0, 1, 2] and q2["turns"][-1]["final"] is True
    assert q2["error"] is None and q2["completion_tokens"] == 3 * 6 and q2["seconds"] > 0


async def test_manager_bounds_concurrent_sessions(client):
    counted = InFlight(client)
    sessions = [relay_episode(f"s{i}", k=1) for i in range(6)]
    rollout = await AsyncGenerationManager(counted, max_concurrency=2, progress=False).run(sessions, GREEDY)
    assert rollout.num_failed == 0
    assert counted.peak == 2  # each session has one call in flight at a time


async def test_failing_session_is_recorded_and_the_others_finish(client, tmp_path):
    trace = tmp_path / "trace.jsonl"
    sessions = [
        relay_episode("ok1", k=2),
        relay_episode("broken", k=3, fail_at=1),
        early_final_episode("early-final", k=1),
        relay_episode("ok2", k=1),
    ]
    manager = AsyncGenerationManager(client, trace_path=trace, progress=False)
    rollout = await manager.run(sessions, GREEDY, ids=["a", "b", "c", "d"])
    assert rollout.ok == [True, False, False, True] and rollout.num_failed == 2
    assert isinstance(rollout.errors[1], RuntimeError) and "broke at step 1" in str(rollout.errors[1])
    assert "only the last one flagged final" in str(rollout.errors[2])
    # failed samples contribute no training rows; the sample indices still name the original positions
    assert rollout.sample_index.tolist() == [0, 0, 0, 3, 3]
    assert rollout.final_mask.tolist() == [False, False, True, False, True]
    # their partial calls were paid for (the broken one's reply too): counted in the token totals, in the trace
    assert rollout.completion_tokens == 4 * (3 + 2 + 2 + 2)
    by_id = {r["id"]: r for r in read_trace(trace)}
    assert set(by_id) == {"a", "b", "c", "d"}
    assert by_id["b"]["error"] == "RuntimeError: broken broke at step 1" and len(by_id["b"]["turns"]) == 2
    assert finished_ids(trace) == {"a", "d"}  # a resumed run redoes b and c


async def test_unreachable_server_errors_surface_per_sample():
    client = OpenAIChatClient(f"http://127.0.0.1:{free_port()}/v1", "m", max_retries=1, backoff=0.01)
    rollout = await AsyncGenerationManager(client, progress=False).run([relay_episode(f"s{i}", k=1) for i in range(3)])
    assert rollout.num_failed == 3
    assert all(isinstance(e, ChatRequestError) and e.attempts == 2 for e in rollout.errors)
    assert len(rollout.records) == 0 and rollout.sample_index.tolist() == []
    assert client.stats.failures == 3 and client.stats.requests == 6
    await client.aclose()


class ScriptedClient:
    """A ChatClient whose replies the test releases one by one (no timing involved): every call waits on its
    own event, named by the session (the prompt's first word)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.arrived = asyncio.Event()

    async def chat(self, messages, max_tokens, **sampling) -> Reply:
        content = messages[0]["content"]
        name = content.split(",")[0]
        self.calls.append(content)
        self.gates[name] = gate = asyncio.Event()
        self.arrived.set()
        await gate.wait()
        return Reply(text=f"reply {len(self.calls)}", finish_reason="length", completion_tokens=1)

    async def wait_for_calls(self, n: int) -> None:
        while len(self.calls) < n:
            self.arrived.clear()
            await self.arrived.wait()


async def test_fail_fast_raises_and_cancels_the_rest(tmp_path):
    trace = tmp_path / "trace.jsonl"
    client = ScriptedClient()
    sessions = [relay_episode("broken", k=1, fail_at=0)] + [relay_episode(f"long{i}", k=50) for i in range(3)]
    manager = AsyncGenerationManager(client, trace_path=trace, progress=False)
    run = asyncio.create_task(manager.run(sessions, GREEDY, fail_fast=True))
    await client.wait_for_calls(4)  # every session waits on its first reply
    client.gates["broken"].set()  # only the broken agent gets a reply: it raises on it
    with pytest.raises(RuntimeError, match="broke at step 0"):
        await run
    assert len(client.calls) == 4  # nobody asked again
    assert all(s.history == [] for s in sessions[1:])  # the others were stopped while waiting
    assert [r["id"] for r in read_trace(trace)] == [0]  # only the finished (failed) sample is traced
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]  # nothing left running


class CancelledWithReply(ScriptedClient):
    """The stop request arrives together with the reply: the caller's task is cancelled as the reply returns."""

    async def chat(self, messages, max_tokens, **sampling) -> Reply:
        self.calls.append(messages[0]["content"])
        asyncio.current_task().cancel()
        return Reply(text="a reply that came with the stop", finish_reason="stop", completion_tokens=1)


async def test_a_session_cancelled_with_its_reply_stops_between_turns():
    client = CancelledWithReply()
    session = relay_episode("s", k=5)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(run_session(session, client))  # its own task: the one that gets cancelled
    assert len(client.calls) == 1 and session.history == []  # it did not read on
