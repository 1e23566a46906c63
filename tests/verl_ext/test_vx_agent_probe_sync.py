"""The preflight's trial episode runs in the run's mode (verl_ext/agent_probe.py): a sync-mode run's through the
lockstep route that training's sync mode takes (verl_ext/sync_rollout.py, ``run_trajectories``: one trajectory in
lockstep rounds), an async-mode run's as one coroutine (``run_session``), each route's own function really run.

Why by the route and not by an agent: for one trajectory the two routes catch the same mistakes. The one agent
mistake that only the lockstep caught (a call's ``prompt_ids`` edited after the call, which the lockstep sent at its
round) came from a bug: the ids were not copied when the call was made, and the async driver's thread raced the
agent over them (recurrent/functions.py, tests/recurrent/test_call_prompt_ids.py)."""

from __future__ import annotations

import pytest
from test_vx_agent_probe import GATHER, agent_file, checked, user  # noqa: F401 (user: the fixture)

from verl_ext import agent_probe


@pytest.fixture
def routes(monkeypatch):
    """The routes the trial took: ("lockstep", trajectories) and ("coroutine", 1) per run, the real ones run."""
    taken: list[tuple[str, int]] = []
    lockstep, coroutine = agent_probe.run_trajectories, agent_probe.run_session

    async def run_trajectories(rollout, server, trajectories, *args, **kwargs):
        taken.append(("lockstep", len(trajectories)))
        return await lockstep(rollout, server, trajectories, *args, **kwargs)

    async def run_session(*args, **kwargs):
        taken.append(("coroutine", 1))
        return await coroutine(*args, **kwargs)

    monkeypatch.setattr(agent_probe, "run_trajectories", run_trajectories)
    monkeypatch.setattr(agent_probe, "run_session", run_session)
    return taken


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("mode", "route"), [("sync", "lockstep"), ("async", "coroutine")])
def test_the_trial_episode_takes_the_route_of_the_runs_mode(user, routes, mode, route):  # noqa: F811
    (user / "my_agent.py").write_text(agent_file(GATHER))  # three drafts made at once, then a vote
    checked(mode)
    assert routes == [(route, 1)]
