"""A deadline for every trajectory in training (issues 47 and 63, ``recurrent.trajectory_timeout_s``): an agent that
does not finish, whatever its code does (awaits forever, computes without awaiting, blocks its thread, raises
SystemExit), fails its own trajectory, in one line that says so and where it was, counted as a failed trajectory,
and the other trajectories and the step go on, in both rollout modes. The deadline is on by default (3600 s) and
its value is checked where it is read. Before it, the trainer sat in its first validation with only a "running: 4,
finished: 0" heartbeat. Every test has a short timeout: a deadline that no longer fires fails fast here, not at
pytest-timeout's 900 s."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from test_vx_sync_mode import QUESTIONS, make_batch, run_worker, trajectories_per_uid

from recurrent.agent_thread import AgentExitError
from recurrent.async_manager import run_session
from recurrent.functions import agent_function
from recurrent.generation_manager import run_lockstep
from recurrent.interface import Reply
from verl_ext.rollout import AgentRollout, Budgets
from verl_ext.settings import RecurrentSettings, recurrent_settings
from verl_ext.trajectory_deadline import TrajectoryTimeoutError, trajectory_deadline

REPO = Path(__file__).resolve().parents[2]
RELEASE = threading.Event()  # what the blocking agents wait on, in plain code; set at the end of each test
WAIT = 60.0  # the deadline of an agent that finishes: a bound, never reached


@dataclass
class Behaviour:
    how: str = "answer"  # answer: two calls, the second the answer; hang: awaits forever after its first call;
    # loop: calls forever; block: blocks its thread in plain code after its first call; spin: computes without
    # awaiting after its first call; exit: sys.exit(0) after its first call


async def behave(sample, client, config):
    reply = await client.chat([{"role": "user", "content": "first"}], 4)
    if config.how == "hang":
        await asyncio.Event().wait()
    if config.how == "block":
        RELEASE.wait()  # blocks
    while config.how == "spin" and not RELEASE.is_set():  # spins
        pass
    if config.how == "exit":
        raise SystemExit(0)
    while config.how == "loop":
        reply = await client.chat([{"role": "user", "content": "again"}], 4)
    reply = await client.chat([{"role": "user", "content": "answer"}], 4)
    return reply.text


BEHAVES = agent_function("behaves", Behaviour, behave)


def episode(how: str):
    return BEHAVES.for_inference(None, how=how).episode({})


def deadline(seconds: float, mode: str):
    return trajectory_deadline(seconds, mode)


def line_of(marker: str) -> int:
    return next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if f"# {marker}" in line)


@pytest.fixture(autouse=True)
def released():
    RELEASE.clear()
    yield
    RELEASE.set()  # the abandoned threads end


async def instant(i: int, turn) -> Reply:
    return Reply("ok", "stop", prompt_tokens=1, completion_tokens=1)


class Instant:
    async def chat(self, messages, max_tokens, **options):
        return await instant(0, None)


def lockstep(hows: list[str], seconds: float):
    """A batch in lockstep: the first agent, which answers, within ``WAIT``, the others within ``seconds`` (in sync
    mode a trajectory waits at the barrier for the others: under one deadline it would run out with theirs)."""
    episodes = [episode(how) for how in hows]
    deadlines = [deadline(WAIT, "sync")] + [deadline(seconds, "sync")] * (len(hows) - 1)
    return episodes, asyncio.run(run_lockstep(episodes, instant, deadlines))


@pytest.mark.timeout(60)
def test_in_sync_mode_an_agent_past_its_deadline_fails_alone_and_the_rounds_go_on():
    episodes, run = lockstep(["answer", "hang", "loop"], 0.5)
    assert run.errors[0] is None and episodes[0].answer == "ok" and len(episodes[0].history) == 2
    hung, looped = run.errors[1:]
    assert isinstance(hung, TrajectoryTimeoutError) and isinstance(looped, TrajectoryTimeoutError)
    assert str(hung) == (
        "the agent did not finish its trajectory within 0.5 s (recurrent.trajectory_timeout_s), after 1 model call"
    )
    # The looping agent's calls ran to their ends (its last one's reply may have come after it was failed), and
    # none was sent once it had: every round it was in was answered.
    looped_rounds = sum(2 in r for r in run.rounds)
    assert looped_rounds - len(episodes[2].history) in (0, 1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["block", "spin"])
def test_in_sync_mode_an_agent_that_stops_its_own_thread_fails_at_its_deadline_naming_its_line(how):
    # On the batch's event loop such an agent stopped every deadline and every other trajectory with it.
    episodes, run = lockstep(["answer", how], 0.5)
    assert run.errors[0] is None and episodes[0].answer == "ok"
    assert not RELEASE.is_set()  # still blocked or spinning when its trajectory was failed
    assert isinstance(run.errors[1], TrajectoryTimeoutError)
    marker = "blocks" if how == "block" else "spins"
    assert str(run.errors[1]).startswith(
        "the agent did not finish its trajectory within 0.5 s (recurrent.trajectory_timeout_s), after 1 model call; "
        "it was at "
    )
    assert f"test_vx_trajectory_deadline.py:{line_of(marker)} (in behave)" in str(run.errors[1])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["block", "spin"])
def test_in_async_mode_an_agent_that_stops_its_own_thread_fails_at_its_deadline_naming_its_line(how):
    with pytest.raises(TrajectoryTimeoutError) as raised:
        asyncio.run(run_session(episode(how), Instant(), deadline=deadline(0.5, "async")))
    assert not RELEASE.is_set()
    marker = "blocks" if how == "block" else "spins"
    assert "within 0.5 s (recurrent.trajectory_timeout_s), after 1 model call; it was at " in str(raised.value)
    assert f"test_vx_trajectory_deadline.py:{line_of(marker)} (in behave)" in str(raised.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_an_agent_that_raises_system_exit_fails_its_trajectory_not_the_process(mode):
    if mode == "sync":
        episodes, run = lockstep(["answer", "exit"], 30)
        assert run.errors[0] is None and episodes[0].answer == "ok"
        error = run.errors[1]
    else:
        with pytest.raises(AgentExitError) as raised:
            asyncio.run(run_session(episode("exit"), Instant(), deadline=deadline(30, "async")))
        error = raised.value
    assert isinstance(error, AgentExitError) and "the agent raised SystemExit(0) (sys.exit)" in str(error)


@pytest.mark.timeout(60)
def test_in_sync_mode_calls_made_at_once_by_an_agent_in_its_thread_land_in_one_round():
    async def drafts(sample, client, config):
        replies = await asyncio.gather(*(client.chat([{"role": "user", "content": str(k)}], 4) for k in range(3)))
        reply = await client.chat([{"role": "user", "content": " ".join(r.text for r in replies)}], 4, final=True)
        return reply.text

    three = agent_function("drafts", Behaviour, drafts).for_inference(None).episode({})
    episodes = [three, episode("answer")]
    run = asyncio.run(run_lockstep(episodes, instant, deadline(30, "sync")))
    assert run.errors == [None, None]
    # round 1: the three drafts and the other agent's first call; round 2: its second call (flagged final by
    # none); round 3: the drafts' answer, flagged final, once no other call is left
    assert run.rounds == [[0, 1], [1], [0]] and run.calls == [4, 1, 1]


@pytest.mark.timeout(60)
def test_in_async_mode_a_call_that_never_returns_fails_the_trajectory_at_its_deadline():
    class Hung:
        async def chat(self, messages, max_tokens, **options):
            await asyncio.Event().wait()

    with pytest.raises(TrajectoryTimeoutError, match=r"within 0\.5 s .* after 0 model calls; it was waiting on"):
        asyncio.run(run_session(episode("answer"), Hung(), deadline=deadline(0.5, "async")))


@pytest.mark.timeout(60)
def test_an_agents_own_timeout_error_is_its_own():
    async def own(sample, client, config):
        await client.chat([{"role": "user", "content": "x"}], 4)
        raise TimeoutError("the agent's own")

    mine = agent_function("own", Behaviour, own).for_inference(None).episode({})
    with pytest.raises(TimeoutError, match="the agent's own") as raised:
        asyncio.run(run_session(mine, Instant(), deadline=deadline(30, "async")))
    assert not isinstance(raised.value, TrajectoryTimeoutError)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (True, "recurrent.trajectory_timeout_s is a number of seconds, got True (a boolean)"),
        ("abc", "recurrent.trajectory_timeout_s is a number of seconds, got 'abc'"),
        (
            1e-300,
            "recurrent.trajectory_timeout_s must be a finite number of seconds >= 0.1 (null: no limit), got 1e-300",
        ),
        (0.05, "recurrent.trajectory_timeout_s must be a finite number of seconds >= 0.1"),
        (0, "recurrent.trajectory_timeout_s must be a finite number of seconds >= 0.1"),
        (-1, "recurrent.trajectory_timeout_s must be a finite number of seconds >= 0.1"),
        (float("inf"), "recurrent.trajectory_timeout_s must be a finite number of seconds >= 0.1"),
        (float("nan"), "recurrent.trajectory_timeout_s must be a finite number of seconds >= 0.1"),
    ],
)
def test_a_trajectory_timeout_that_is_no_deadline_is_refused_naming_the_key(value, said):
    with pytest.raises(ValueError) as raised:
        recurrent_settings({"recurrent": {"agent": "memory", "trajectory_timeout_s": value}})
    assert str(raised.value).startswith(said)
    with pytest.raises(ValueError, match="recurrent.trajectory_timeout_s"):  # the dataclass itself checks it too
        RecurrentSettings(agent="memory", trajectory_timeout_s=value)


def test_the_trajectory_timeout_is_on_by_default_finite_and_documented():
    assert recurrent_settings({"recurrent": {"agent": "memory"}}).trajectory_timeout_s == 3600
    assert RecurrentSettings().trajectory_timeout_s == 3600
    trainer = yaml.safe_load((REPO / "configs" / "recurrent_trainer.yaml").read_text())
    assert trainer["recurrent"]["trajectory_timeout_s"] == 3600
    fidelity = " ".join((REPO / "docs" / "fidelity.md").read_text().split())
    assert "`recurrent.trajectory_timeout_s` has passed (default 3600 s" in fidelity
    off = recurrent_settings({"recurrent": {"agent": "memory", "trajectory_timeout_s": None}})
    assert off.trajectory_timeout_s is None  # null: the documented way to turn it off


@pytest.mark.parametrize(("mode", "cancel_calls"), [("async", True), ("sync", False)])
def test_the_rollout_puts_every_episode_under_the_configured_deadline(tiny_tokenizer, mode, cancel_calls):
    config = {"chunk_size": 16, "max_prompt_length": 32, "max_memorization_length": 8, "max_final_response_length": 6}
    settings = RecurrentSettings(agent="memory", agent_config=config, mode=mode, trajectory_timeout_s=5.0)
    rollout = AgentRollout(settings, tiny_tokenizer, Budgets(4096, 64))
    assert (rollout.deadline.seconds, rollout.deadline.cancel_calls) == (5.0, cancel_calls)
    assert rollout.deadline.key == "recurrent.trajectory_timeout_s"
    off = RecurrentSettings(agent="memory", agent_config=config, trajectory_timeout_s=None)
    assert AgentRollout(off, tiny_tokenizer, Budgets(4096, 64)).deadline is None  # null: no deadline


class HangingServer:
    """The real tiny token server, except that every request of one prompt never returns."""

    def __init__(self, server, request_id: str) -> None:
        self.server, self.request_id = server, request_id

    async def generate(self, request_id: str, **kwargs):
        if request_id == self.request_id:
            await asyncio.Event().wait()
        return await self.server.generate(request_id, **kwargs)


@pytest.mark.slow(seconds=40)  # the hung trajectory's 10 s, and the worker's start
@pytest.mark.timeout(120)
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
