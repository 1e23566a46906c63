"""A deadline for every trajectory in training (issue 47, ``recurrent.trajectory_timeout_s``): an agent that never
returns fails its own trajectory, in one line that says so, counted as a failed trajectory, and the other
trajectories and the step go on, in both rollout modes. Before it, the trainer sat in its first validation with
only a "running: 4, finished: 0" heartbeat."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from dataclasses import dataclass

import pytest
from test_vx_sync_mode import QUESTIONS, make_batch, run_worker, trajectories_per_uid

from recurrent.async_manager import run_session
from recurrent.functions import agent_function
from recurrent.generation_manager import run_lockstep
from recurrent.interface import Reply
from verl_ext.rollout import AgentRollout, Budgets
from verl_ext.settings import RecurrentSettings, recurrent_settings
from verl_ext.trajectory_deadline import TimedEpisode, TrajectoryTimeoutError

WAIT = 60.0  # the deadline of an agent that finishes: a bound, never reached


@dataclass
class Behaviour:
    how: str = "answer"  # answer: two calls, the second the answer; hang: waits forever after its first call;
    # loop: calls forever


async def behave(sample, client, config):
    reply = await client.chat([{"role": "user", "content": "first"}], 4)
    if config.how == "hang":
        await asyncio.Event().wait()
    while config.how == "loop":
        reply = await client.chat([{"role": "user", "content": "again"}], 4)
    reply = await client.chat([{"role": "user", "content": "answer"}], 4)
    return reply.text


BEHAVES = agent_function("behaves", Behaviour, behave)


def timed(how: str, seconds: float, cancel_calls: bool) -> TimedEpisode:
    return TimedEpisode(BEHAVES.for_inference(None, how=how).episode({}), seconds, cancel_calls)


async def instant(i: int, turn) -> Reply:
    return Reply("ok", "stop", prompt_tokens=1, completion_tokens=1)


def test_in_sync_mode_an_agent_past_its_deadline_fails_alone_and_the_rounds_go_on():
    episodes = [timed("answer", WAIT, False), timed("hang", 0.2, False), timed("loop", 0.2, False)]
    run = asyncio.run(run_lockstep(episodes, instant))
    assert run.errors[0] is None and episodes[0].answer == "ok" and len(episodes[0].history) == 2
    hung, looped = run.errors[1:]
    assert isinstance(hung, TrajectoryTimeoutError) and isinstance(looped, TrajectoryTimeoutError)
    assert str(hung) == (
        "the agent did not finish its trajectory within 0.2 s (recurrent.trajectory_timeout_s), after 1 model call"
    )
    # The looping agent's call past the deadline was refused before the barrier: every round it was in answered.
    assert sum(1 in r for r in run.rounds) == 1 and sum(2 in r for r in run.rounds) == len(episodes[2].history)


def test_in_async_mode_a_call_that_never_returns_fails_the_trajectory_at_its_deadline():
    class Hung:
        async def chat(self, messages, max_tokens, **options):
            await asyncio.Event().wait()

    with pytest.raises(TrajectoryTimeoutError, match=r"within 0\.2 s .* after 0 model calls"):
        asyncio.run(run_session(timed("answer", 0.2, True), Hung()))


def test_an_agents_own_timeout_error_is_its_own():
    async def own(sample, client, config):
        await client.chat([{"role": "user", "content": "x"}], 4)
        raise TimeoutError("the agent's own")

    episode = TimedEpisode(agent_function("own", Behaviour, own).for_inference(None).episode({}), WAIT, True)
    with pytest.raises(TimeoutError, match="the agent's own") as raised:
        asyncio.run(run_session(episode, type("C", (), {"chat": lambda self, *a, **k: instant(0, None)})()))
    assert not isinstance(raised.value, TrajectoryTimeoutError)


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan")])
def test_a_trajectory_timeout_is_a_finite_number_of_seconds(value):
    with pytest.raises(ValueError, match="recurrent.trajectory_timeout_s must be a finite number of seconds > 0"):
        recurrent_settings({"recurrent": {"agent": "memory", "trajectory_timeout_s": value}})


@pytest.mark.parametrize(("mode", "cancel_calls"), [("async", True), ("sync", False)])
def test_the_rollout_puts_every_episode_under_the_configured_deadline(tiny_tokenizer, mode, cancel_calls):
    config = {"chunk_size": 16, "max_prompt_length": 32, "max_memorization_length": 8, "max_final_response_length": 6}
    settings = RecurrentSettings(agent="memory", agent_config=config, mode=mode, trajectory_timeout_s=5.0)
    rollout = AgentRollout(settings, tiny_tokenizer, Budgets(4096, 64))
    sample = {"prompt": [{"role": "user", "content": "Why?"}], "context": "A short note."}
    episode = asyncio.run(rollout.episode(sample))
    assert isinstance(episode, TimedEpisode) and (episode.seconds, episode.cancel_calls) == (5.0, cancel_calls)
    plain = AgentRollout(RecurrentSettings(agent="memory", agent_config=config), tiny_tokenizer, Budgets(4096, 64))
    assert not isinstance(asyncio.run(plain.episode(sample)), TimedEpisode)  # unset: no deadline, as before


class HangingServer:
    """The real tiny token server, except that every request of one prompt never returns."""

    def __init__(self, server, request_id: str) -> None:
        self.server, self.request_id = server, request_id

    async def generate(self, request_id: str, **kwargs):
        if request_id == self.request_id:
            await asyncio.Event().wait()
        return await self.server.generate(request_id, **kwargs)


@pytest.mark.slow(seconds=40)  # the hung trajectory's 10 s, and the worker's start
async def test_a_hung_trajectory_fails_counted_and_the_step_goes_on(
    tmp_path, monkeypatch, tiny_model_dir, tiny_tokenizer, tiny_server, caplog
):
    uids = [uuid.uuid4().hex for _ in QUESTIONS[:2]]
    good, hung = uids
    extra = ["recurrent.trajectory_timeout_s=10"]  # the other trajectories take ~1 s
    config, batch_dict = make_batch(tmp_path, tiny_tokenizer, QUESTIONS[:2], "async", extra)
    server = HangingServer(tiny_server, request_id=hung)
    stored, statuses = await run_worker(config, batch_dict, uids, tiny_tokenizer, server, monkeypatch, tiny_model_dir)
    n = config.actor_rollout_ref.rollout.n
    assert trajectories_per_uid(stored) == Counter({good: n})
    assert statuses == {good: ["running", "finished"], hung: ["running", "failure"]}
    assert "did not finish its trajectory within 10 s (recurrent.trajectory_timeout_s)" in caplog.text
