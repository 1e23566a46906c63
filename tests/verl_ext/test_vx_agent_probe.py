"""The preflight's trial episode (verl_ext/agent_probe.py): the four first-run mistakes of a new agent (no call, a
sampling field the trainer cannot honour, a call left running when it returns, a raise) each stop the preflight
with one line naming the agent's file, the line and the cause, in the run's mode; a sound agent passes, its calls
made at once included. The launcher itself stops on such an agent before Ray starts: test_the_launcher_stops_....
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from run_configs import cpu_run_config

from verl_ext.preflight import PreflightError, preflight
from verl_ext.run_config import compose_run_config

REPO = Path(__file__).resolve().parents[2]
HEAD = """\
import asyncio
from dataclasses import dataclass

from recurrent.functions import agent_function


@dataclass
class Config:
    max_tokens: int = 8


"""
# Each mistake: the agent's body, and the line of the agent file the message names (counted in the file below).
MISTAKES = {
    "no call": ("    return 'forty-two'\n", "def", "returned without calling the model"),
    "sampling": (
        "    reply = await client.chat([{'role': 'user', 'content': sample['input']}], 8, seed=3)\n"
        "    return reply.text\n",
        "seed=3",
        "ValueError: an agent passed sampling parameters ['seed'] in training",
    ),
    "call left running": (
        "    reply = await client.chat([{'role': 'user', 'content': sample['input']}], 8)\n"
        "    asyncio.ensure_future(client.chat([{'role': 'user', 'content': 'and?'}], 8))\n"
        "    return reply.text\n",
        "ensure_future",
        "returned with 1 model call(s) still running",
    ),
    # made before the calls the agent awaits: a model that answers at once has answered it by the time the agent
    # returns; the trial's model holds its reply until the agent awaits it, so it is still running, whatever the
    # timing (and with another max_tokens its reply is not the answer's either)
    "call left running, made first": (
        "    asyncio.ensure_future(client.chat([{'role': 'user', 'content': 'and?'}], 8))\n"
        "    draft = await client.chat([{'role': 'user', 'content': sample['input']}], 8)\n"
        "    reply = await client.chat([{'role': 'user', 'content': draft.text}], 8)\n"
        "    return reply.text\n",
        "ensure_future",
        "returned with 1 model call(s) still running",
    ),
    "call left running, made first, another max_tokens": (
        "    asyncio.ensure_future(client.chat([{'role': 'user', 'content': 'and?'}], 3))\n"
        "    draft = await client.chat([{'role': 'user', 'content': sample['input']}], 8)\n"
        "    reply = await client.chat([{'role': 'user', 'content': draft.text}], 8)\n"
        "    return reply.text\n",
        "ensure_future",
        "returned with 1 model call(s) still running",
    ),
    "raise": (
        "    reply = await client.chat([{'role': 'user', 'content': sample['input']}], 8)\n"
        "    return str(len(reply.text) / 0)\n",
        "/ 0",
        "ZeroDivisionError: division by zero",
    ),
}
GATHER = (
    "    replies = await asyncio.gather(*(client.chat([{'role': 'user', 'content': sample['input']}], 8, "
    "temperature=1.2) for _ in range(3)))\n"
    "    reply = await client.chat([{'role': 'user', 'content': ' '.join(r.text for r in replies)}], 8, "
    "temperature=0.3)\n"
    "    return reply.text\n"
)
# Calls handed to tasks and awaited later, each way asyncio offers: the held replies reach the agent.
AWAITED_LATER = {
    "await task": (
        "    early = asyncio.ensure_future(client.chat([{'role': 'user', 'content': 'draft'}], 8))\n"
        "    await client.chat([{'role': 'user', 'content': sample['input']}], 8)\n"
        "    first = await early\n"
        "    reply = await client.chat([{'role': 'user', 'content': first.text}], 8)\n"
        "    return reply.text\n"
    ),
    "asyncio.wait": (
        "    tasks = [asyncio.ensure_future(client.chat([{'role': 'user', 'content': 'd'}], 8)) for _ in range(2)]\n"
        "    await asyncio.wait(tasks)\n"
        "    reply = await client.chat([{'role': 'user', 'content': tasks[0].result().text}], 8)\n"
        "    return reply.text\n"
    ),
    "TaskGroup": (
        "    async with asyncio.TaskGroup() as group:\n"
        "        draft = group.create_task(client.chat([{'role': 'user', 'content': 'draft'}], 8))\n"
        "    reply = await client.chat([{'role': 'user', 'content': draft.result().text}], 8)\n"
        "    return reply.text\n"
    ),
    "wait_for": (
        "    draft = await asyncio.wait_for(client.chat([{'role': 'user', 'content': 'draft'}], 8), 600)\n"
        "    reply = await client.chat([{'role': 'user', 'content': draft.text}], 8)\n"
        "    return reply.text\n"
    ),
}


def agent_file(body: str) -> str:
    return (
        HEAD
        + "async def my_agent(sample, client, config):\n"
        + body
        + ("\n\nREGISTER = agent_function('mine', Config, my_agent, columns=('input',))\n")
    )


def line_of(text: str, marker: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if marker in line)


@pytest.fixture
def user(tmp_path, monkeypatch) -> Path:
    """A user's folder: the run config, the data (one question), the working directory."""
    settings = {
        "data.train_batch_size": 2,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.rollout.n": 2,
    }
    (tmp_path / "my_agent_cpu.yaml").write_text(cpu_run_config("my_agent.py", max_tokens=16, settings=settings))
    row = {
        "prompt": [{"role": "user", "content": "What is 6 * 7?"}],
        "input": "What is 6 * 7?",
        "data_source": "arith",
        "reward_model": {"ground_truth": "42"},
    }
    pd.DataFrame([row]).to_parquet(tmp_path / "train.parquet")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def checked(mode: str):
    config = compose_run_config(
        "my_agent_cpu.yaml",
        ["actor_rollout_ref.model.path=tiny", "data.train_files=train.parquet", "data.val_files=train.parquet"]
        + [f"recurrent.mode={mode}"],
    )
    preflight(config)


@pytest.mark.parametrize(
    ("mistake", "mode"),
    # each in async mode; in sync mode too where the lockstep barrier carries the call (its sampling, a late call)
    [(mistake, "async") for mistake in sorted(MISTAKES)]
    + [("sampling", "sync"), ("call left running", "sync"), ("call left running, made first", "sync")],
)
def test_each_first_run_mistake_is_one_line_naming_the_agents_file_and_line(user, mistake, mode):
    body, marker, cause = MISTAKES[mistake]
    text = agent_file(body)
    (user / "my_agent.py").write_text(text)
    with pytest.raises(PreflightError) as raised:
        checked(mode)
    (problem,) = str(raised.value).splitlines()[1:]  # "the run cannot start:" and one problem
    where = f"my_agent.py:{line_of(text, marker)}: "
    assert problem.startswith(f"  - {where}") and cause in problem, problem
    trial = "its trial episode before the launch: the first sample of train.parquet against a scripted model"
    assert f"{trial}, in {mode} mode" in problem


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_sound_agent_with_calls_made_at_once_passes(user, mode, capsys):
    (user / "my_agent.py").write_text(agent_file(GATHER))
    checked(mode)
    # the trial episode is no batch of the run: no "[recurrent] lockstep: ..." line to be read as one
    assert "[recurrent] lockstep" not in capsys.readouterr().out


@pytest.mark.parametrize("how", sorted(AWAITED_LATER))
def test_calls_handed_to_tasks_and_awaited_later_pass(user, how):
    (user / "my_agent.py").write_text(agent_file(AWAITED_LATER[how]))
    checked("async")


def test_the_episode_can_be_switched_off(user):
    (user / "my_agent.py").write_text(agent_file(MISTAKES["raise"][0]))
    config = compose_run_config(
        "my_agent_cpu.yaml",
        ["actor_rollout_ref.model.path=tiny", "data.train_files=train.parquet", "data.val_files=train.parquet"]
        + ["recurrent.preflight_episode=false"],
    )
    preflight(config)


@pytest.mark.slow(seconds=60)
def test_the_launcher_stops_before_ray_starts_with_the_one_line(user):
    body, marker, cause = MISTAKES["raise"]
    text = agent_file(body)
    (user / "my_agent.py").write_text(text)
    (user / "data").mkdir()
    for name in ("train", "validation"):
        (user / "data" / f"{name}.parquet").write_bytes((user / "train.parquet").read_bytes())
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    env.pop("VERL_PLATFORM", None)
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "train_tiny_cpu.sh")],
        cwd=user,
        env={**env, "CONFIG": "my_agent_cpu.yaml", "DATA_DIR": "data", "MODEL": "tiny", "OUT_DIR": "runs/x"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-3000:]
    lines = [line for line in output.splitlines() if f"my_agent.py:{line_of(text, marker)}: {cause}" in line]
    assert len(lines) == 1, output[-3000:]
    assert "ray init kwargs" not in output and "Started a local Ray instance" not in output


REWARD = """\
def score(data_source, solution_str, ground_truth, extra_info=None, **_):
    if "trajectory" in extra_info:  # recurrent.reward_trajectory: the calls, the answer last, and the row
        assert extra_info["trajectory"][-1]["reply"] == solution_str and len(extra_info["trajectory"]) == 4
        assert extra_info["sample"]["input"] == "What is 6 * 7?"
    return float(ground_truth in solution_str)


def keyerror(data_source, solution_str, ground_truth, extra_info=None, **_):
    question = extra_info["question"]
    return float(question == solution_str)


def nothing(data_source, solution_str, ground_truth, extra_info=None, **_):
    print(solution_str)


async def async_keyerror(data_source, solution_str, ground_truth, extra_info=None, **_):
    return {"score": float(extra_info["question"] == solution_str)}
"""


def checked_with_reward(name: str, *extra: str) -> None:
    config = compose_run_config(
        "my_agent_cpu.yaml",
        ["actor_rollout_ref.model.path=tiny", "data.train_files=train.parquet", "data.val_files=train.parquet"]
        + ["reward.custom_reward_function.path=my_reward.py", f"reward.custom_reward_function.name={name}", *extra],
    )
    preflight(config)


@pytest.mark.parametrize("name", ["keyerror", "async_keyerror"])
def test_a_raise_in_the_reward_is_one_line_naming_the_rewards_file_and_line(user, name):
    (user / "my_agent.py").write_text(agent_file(GATHER))
    (user / "my_reward.py").write_text(REWARD)
    with pytest.raises(PreflightError) as raised:
        checked_with_reward(name)
    (problem,) = str(raised.value).splitlines()[1:]
    line = line_of(REWARD, "question = extra_info" if name == "keyerror" else 'return {"score"')
    assert problem.startswith(f"  - my_reward.py:{line}: KeyError: 'question'"), problem
    # called as verl's reward loop calls it: on the trial's answer, the scripted reply cut at the call's 8 tokens
    assert f"reward my_reward.py:{name}, on the trial episode's answer 'The answer is" in problem


def test_a_reward_without_a_score_is_refused(user):
    (user / "my_agent.py").write_text(agent_file(GATHER))
    (user / "my_reward.py").write_text(REWARD)
    with pytest.raises(PreflightError, match=r"reward my_reward.py:nothing returned None: verl takes a reward's"):
        checked_with_reward("nothing")


@pytest.mark.parametrize("trajectory", [True, False])
def test_a_sound_reward_passes_reading_the_trajectory_training_gives_it(user, trajectory):
    (user / "my_agent.py").write_text(agent_file(GATHER))  # three drafts and the answer: four calls
    (user / "my_reward.py").write_text(REWARD)
    checked_with_reward("score", f"recurrent.reward_trajectory={str(trajectory).lower()}")
    (user / "my_reward.py").write_text(REWARD.replace('len(extra_info["trajectory"]) == 4', "False"))
    if trajectory:  # the check above ran: with it false, the same reward is refused
        with pytest.raises(PreflightError, match="AssertionError"):
            checked_with_reward("score", "recurrent.reward_trajectory=true")


def test_a_reward_whose_helper_import_fails_names_the_helpers_line(user):
    (user / "my_agent.py").write_text(agent_file(GATHER))
    (user / "my_reward.py").write_text("from reward_helpers import normalise\n\n" + REWARD)
    (user / "reward_helpers.py").write_text("import re\nfrom strng import punctuation\n")
    with pytest.raises(PreflightError) as raised:
        checked_with_reward("score")
    (problem,) = str(raised.value).splitlines()[1:]
    assert problem.startswith("  - reward_helpers.py:2: ModuleNotFoundError: No module named 'strng'"), problem


# ---- what an agent asks is bounded before it is held (issue 63) ----

OPENAI_AGENT = """\
from dataclasses import dataclass

from recurrent.openai_agents import openai_agent


@dataclass
class Config:
    max_tokens: int = 8


async def my_agent(sample, client, config):
    messages = [{"role": "user", "content": PROMPT}]
    completion = await client.chat.completions.create(model="policy", messages=messages, max_tokens=8, N)
    return completion.choices[0].message.content


REGISTER = openai_agent("mine", Config, my_agent, columns=("input",))
"""
TEN_MB = "'x ' * 5_000_000"  # 10,000,000 characters; a 256-token prompt holds 16,384 at most
FUNCTION_PROMPT = (
    f"    reply = await client.chat([{{'role': 'user', 'content': {TEN_MB}}}], 8)\n    return reply.text\n"
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_an_openai_agent_asking_a_million_completions_is_refused_naming_n_and_its_bound(user, mode):
    # n=10**6: no output and 4.6 GB after 200 s (a million calls made at once).
    text = OPENAI_AGENT.replace("PROMPT", "sample['input']").replace("N)", "n=10**6)")
    (user / "my_agent.py").write_text(text)
    with pytest.raises(PreflightError) as raised:
        checked(mode)
    (problem,) = str(raised.value).splitlines()[1:]
    where = f"my_agent.py:{line_of(text, 'n=10**6')}: BadRequestError: "
    assert problem.startswith(f"  - {where}"), problem
    assert "n: the number of completions is at most 128, got 1,000,000" in problem


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["async", "sync"])
@pytest.mark.parametrize("kind", ["function", "openai"])
def test_a_ten_mb_prompt_is_refused_by_its_characters_before_it_is_tokenized(user, mode, kind, monkeypatch):
    # It cost the preflight 73 s and 2.4 GB (the tokenizing) before its refusal by the token count.
    if kind == "function":
        text, marker = agent_file(FUNCTION_PROMPT), "5_000_000"
    else:
        text, marker = OPENAI_AGENT.replace("PROMPT", TEN_MB).replace(", N)", ")"), "create("  # where it raises
    (user / "my_agent.py").write_text(text)
    import transformers

    tokenized: list[int] = []  # the characters of every text the tokenizer was asked to turn into ids
    base = transformers.PreTrainedTokenizerBase
    real = base.apply_chat_template

    def counted(self, conversation, *args, **kwargs):
        if kwargs.get("tokenize", True):
            tokenized.append(sum(len(m.get("content") or "") for m in conversation))
        return real(self, conversation, *args, **kwargs)

    monkeypatch.setattr(base, "apply_chat_template", counted)
    with pytest.raises(PreflightError) as raised:
        checked(mode)
    (problem,) = str(raised.value).splitlines()[1:]
    assert problem.startswith(f"  - my_agent.py:{line_of(text, marker)}: "), problem
    # the message's 10,000,000 characters and the template's few around it
    # (the openai client's agent gets it as the route's 400)
    said = (
        r"(PromptTooLong|BadRequest)Error: a call prompt of 10,000,\d{3} characters exceeds rollout.prompt_length=256"
    )
    assert re.search(said, problem), problem
    assert "refused before it is tokenized" in problem and max(tokenized, default=0) < 10_000_000
