"""The preflight holds against an agent that stops it (issue 63): an agent file that loops or blocks at import, an
agent that spins or blocks in plain code after one call of its trial episode, one that calls ``sys.exit(0)`` or
``os._exit(0)`` at import or in its episode: each is stopped and named in one line, the preflight exits 2 and
never prints "ready". Before, the first two hung the preflight silently (its 120 s bound never fired), ``sys.exit``
made it exit 0 with two tracebacks, ``os._exit`` exit 0 silently. The agents block on an event the test releases at
its end, or spin until it is set; the bounds are set small, and what is asserted is what was said."""

from __future__ import annotations

import blocking_agents
import pytest
from blocking_agents import marked_line
from test_vx_agent_probe import agent_file, checked, user  # noqa: F401 (user: the fixture)

from recurrent import agent_import
from recurrent.agent_thread import Deadline
from verl_ext import agent_probe
from verl_ext.preflight import PreflightError
from verl_ext.preflight import main as preflight_main
from verl_ext.trajectory_deadline import trajectory_deadline

ONE_CALL = "    reply = await client.chat([{'role': 'user', 'content': sample['input']}], 8)\n"
TRIAL = "its trial episode before the launch: the first sample of train.parquet against a scripted model"
AT_IMPORT = {  # module-level code, after the agent's definition
    "blocks": "from blocking_agents import BLOCKED, RELEASE\nBLOCKED.set()\nRELEASE.wait()  # blocks\n",
    "loops": "from blocking_agents import RELEASE\nwhile not RELEASE.is_set():  # blocks\n    pass\n",
}
IN_EPISODE = {
    "blocks": "    from blocking_agents import BLOCKED, RELEASE\n    BLOCKED.set()\n    RELEASE.wait()  # blocks\n",
    "spins": "    from blocking_agents import RELEASE\n    while not RELEASE.is_set():  # blocks\n        pass\n",
}


@pytest.fixture(autouse=True)
def small_bounds(monkeypatch):
    monkeypatch.setattr(agent_probe, "TIMEOUT_S", 1.0)
    monkeypatch.setattr(agent_import, "IMPORT_TIMEOUT_S", 1.0)
    blocking_agents.reset()
    yield
    blocking_agents.RELEASE.set()  # the abandoned threads end


def one_problem(mode: str) -> str:
    with pytest.raises(PreflightError) as raised:
        checked(mode)
    assert not blocking_agents.RELEASE.is_set()  # said while the agent was still blocked or spinning
    (problem,) = str(raised.value).splitlines()[1:]  # "the run cannot start:" and one problem
    return problem


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["async", "sync"])
@pytest.mark.parametrize("how", sorted(IN_EPISODE))
def test_an_agent_that_stops_its_thread_after_one_call_is_named_at_its_line(user, how, mode):  # noqa: F811
    text = agent_file(ONE_CALL + IN_EPISODE[how] + "    return reply.text\n")
    (user / "my_agent.py").write_text(text)
    problem = one_problem(mode)
    line = marked_line(text)
    assert problem.startswith(
        f"  - my_agent.py:{line}: TrajectoryTimeoutError: the agent did not finish its trial episode within 1 s "
        f"(the preflight's bound on a trial episode), after 1 model call; it was at my_agent.py:{line} (in my_agent)"
    ), problem
    assert f"{TRIAL}, in {mode} mode" in problem


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", sorted(AT_IMPORT))
def test_an_agent_file_that_stops_at_import_is_named_at_its_line(user, how):  # noqa: F811
    text = agent_file(ONE_CALL + "    return reply.text\n") + AT_IMPORT[how]
    (user / "my_agent.py").write_text(text)
    problem = one_problem("async")
    assert problem == (
        "  - recurrent.agent='my_agent.py': the agent file did not finish its import within 1 s (the bound on an "
        f"agent file's import); it was at my_agent.py:{marked_line(text)} (in <module>)"
    )


EXITS = {  # where, the code, what the line says
    ("import", "sys.exit"): ("import sys\nsys.exit(0)  # blocks\n", "SystemExit(0) raised on import (sys.exit)"),
    ("import", "os._exit"): ("import os\nos._exit(0)  # blocks\n", "AgentExitError: the agent called os._exit(0)"),
    ("episode", "sys.exit"): (
        "    import sys\n    sys.exit(0)  # blocks\n",
        "AgentExitError: the agent raised SystemExit(0) (sys.exit)",
    ),
    ("episode", "os._exit"): (
        "    import os\n    os._exit(0)  # blocks\n",
        "AgentExitError: the agent called os._exit(0)",
    ),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("where", "how"), sorted(EXITS))
def test_an_agent_that_exits_is_one_line_exit_2_and_never_ready(user, capsys, where, how):  # noqa: F811
    code, said = EXITS[(where, how)]
    if where == "import":
        text = agent_file(ONE_CALL + "    return reply.text\n") + code
    else:
        text = agent_file(ONE_CALL + code + "    return reply.text\n")
    (user / "my_agent.py").write_text(text)
    overrides = ["actor_rollout_ref.model.path=tiny", "data.train_files=train.parquet", "data.val_files=train.parquet"]
    with pytest.raises(SystemExit) as raised:
        preflight_main(["my_agent_cpu.yaml", *overrides])
    out, err = capsys.readouterr()
    assert raised.value.code == 2 and "ready" not in out and "Traceback" not in err
    (problem,) = err.splitlines()[1:]  # "[memagent] the run cannot start:" and one problem
    assert f"my_agent.py:{marked_line(text)}: {said}" in problem, problem
    if where == "episode":
        assert TRIAL in problem


def test_the_trial_episode_is_bounded_by_the_shorter_of_its_bound_and_the_runs_deadline():
    run = trajectory_deadline(0.5, "sync")
    assert agent_probe.trial_deadline(run, "sync") is run  # the run's own, shorter: as training would fail it
    for longer in (trajectory_deadline(3600, "async"), None):  # the default, or none: the trial's bound
        bound = agent_probe.trial_deadline(longer, "async")
        assert isinstance(bound, Deadline) and (bound.seconds, bound.cancel_calls) == (agent_probe.TIMEOUT_S, True)
