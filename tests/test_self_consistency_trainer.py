"""A self-consistency agent trains 2 CPU steps in async and sync mode, from a user's folder outside the repository,
with a reward only its whole trajectory can give; a run whose every trajectory fails stops with the agent's own
message and the count.

The agent (tests/self_consistency_agent.py, the official ``openai`` client) makes three hot drafts at once with
``asyncio.gather`` (temperature 1.2) and a cold vote (0.5) that reads them; the reward
(tests/self_consistency_reward.py) is the share of drafts whose reply holds a digit, read from ``extra_info``'s
trajectory. Checked on the rollout dump of the last step, by hand: four rows a trajectory (three drafts, then the
vote) with their temperatures; the vote's prompt is the chat template of the vote message holding the drafts as the
agent read them; the score is the share computed from the drafts' own text; the actor's recomputed log-probs agree
with the rollout's at every row's temperature (``training/rollout_probs_diff_max``: at a wrong temperature the vote
rows would differ by whole nats); sync mode sends all drafts of all trajectories in one round.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from run_configs import cpu_run_config
from test_new_user_agent import REPO, TRAIN_TIMEOUT_S, problems_frame, train_as_user, user_env

from recurrent.models import load_tokenizer
from recurrent.templating import chat_prompt_ids

TESTS = Path(__file__).resolve().parent
DRAFT = "{question}\nWrite a short draft answer."
VOTE = "Question: {question}\nDrafts:\n{drafts}\nPick the answer most drafts agree on and put it in \\boxed{{}}."
QUESTIONS = [(f"What is {a} + {b}?", a + b) for a, b in ((12, 30), (7, 8), (21, 21), (40, 2), (5, 9), (33, 11))]
BOXED_ONLY = """
from dataclasses import dataclass

from recurrent.functions import agent_function


@dataclass
class Config:
    max_tokens: int = 16


async def boxed_only(sample, client, config):
    reply = await client.chat([{"role": "user", "content": sample["input"]}], config.max_tokens)
    if "\\\\boxed{" not in reply.text:
        raise ValueError("no box in the reply")
    return reply.text


REGISTER = agent_function("boxed_only", Config, boxed_only, columns=("input",))
"""

pytestmark = [pytest.mark.trainer, pytest.mark.slow(seconds=300), pytest.mark.timeout(2400)]


def user_folder(root: Path, agent: str, reward_path: str, reward_name: str, agent_config: dict | None = None) -> Path:
    assert REPO not in root.parents
    (root / "data").mkdir(parents=True)
    for helper in ("self_consistency_agent.py", "self_consistency_reward.py"):
        shutil.copy(TESTS / helper, root / helper)
    settings = {
        "data.train_batch_size": 4,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.optim.lr_warmup_steps": 0,
        "actor_rollout_ref.rollout.n": 2,
        "actor_rollout_ref.rollout.calculate_log_probs": True,
    }
    config = cpu_run_config(
        agent,
        max_tokens=16,
        reward=(reward_path, reward_name),
        agent_config=agent_config or {"max_tokens": 16},
        settings=settings,
    )
    (root / "run_cpu.yaml").write_text(config)
    problems_frame(QUESTIONS).to_parquet(root / "data" / "train.parquet")
    problems_frame(QUESTIONS[:2]).to_parquet(root / "data" / "validation.parquet")
    return root


def vote_prompt(tokenizer, question: str, drafts: tuple[str, ...]) -> list[int]:
    listed = "\n".join(f"{i + 1}. {text}" for i, text in enumerate(drafts))
    return chat_prompt_ids(tokenizer, [{"role": "user", "content": VOTE.format(question=question, drafts=listed)}])


def last_step_rows(out: Path) -> dict[str, list[dict]]:
    steps = sorted(int(p.stem) for p in (out / "rollout").glob("*.jsonl"))
    rows = [json.loads(line) for line in (out / "rollout" / f"{steps[-1]}.jsonl").read_text().splitlines()]
    by_trajectory: dict[str, list[dict]] = {}
    for row in rows:
        if not row["is_padding"]:
            by_trajectory.setdefault(row["trajectory"], []).append(row)
    return {key: sorted(calls, key=lambda r: r["turn_index"]) for key, calls in by_trajectory.items()}


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_self_consistency_trains_two_steps_with_a_trajectory_reward(tmp_path, mode):
    user = user_folder(
        tmp_path / "user", "self_consistency_agent.py", "self_consistency_reward.py", "drafts_with_a_digit"
    )
    settings = f"CONFIG=run_cpu.yaml DATA_DIR=data MODEL=tiny STEPS=2 OUT_DIR=runs/{mode}"
    train_as_user(f"{settings} bash {REPO}/scripts/train_tiny_cpu.sh recurrent.mode={mode}", user)
    out = user / "runs" / mode
    metrics: dict[int, dict] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        metrics.setdefault(record["step"], {}).update(record["data"])
    for step in (1, 2):
        assert metrics[step]["actor/lr"] > 0
        # the actor's old log-probs, at each row's own temperature, are the rollout's (fp32 on both sides)
        assert metrics[step]["training/rollout_probs_diff_max"] < 1e-4, metrics[step]
    if mode == "sync":  # round 1: every draft of every trajectory (8 x 3 calls), round 2: the votes
        log = (user / "train.log").read_text()
        rounds = re.findall(r"\[recurrent\] lockstep: 8 trajectories in (\d+) rounds, 0 failed \((\d+) calls\)", log)
        assert rounds and set(rounds) == {("2", "32")}, rounds

    tokenizer = load_tokenizer("tiny")
    drafted = {
        tuple(chat_prompt_ids(tokenizer, [{"role": "user", "content": DRAFT.format(question=q)}])): q
        for q, _ in QUESTIONS
    }
    by_trajectory = last_step_rows(out)
    assert len(by_trajectory) == 4 * 2  # train_batch_size 4 x rollout.n 2
    for trajectory, calls in by_trajectory.items():
        assert [c["turn_kind"] for c in calls] == ["call", "call", "call", "final"], trajectory
        assert [c["temperature"] for c in calls] == [1.2, 1.2, 1.2, 0.5], trajectory
        question = drafted[tuple(calls[0]["prompt_ids"])]
        drafts = [tokenizer.decode(c["response_ids"], skip_special_tokens=True) for c in calls[:3]]
        # The vote's prompt holds the three drafts as the agent read them, in the order it made them; rows are in the
        # order the calls finished, which for calls made at once may differ.
        votes = [vote_prompt(tokenizer, question, order) for order in itertools.permutations(drafts)]
        assert calls[3]["prompt_ids"] in votes, trajectory
        expected = sum(any(ch.isdigit() for ch in text) for text in drafts) / 3
        assert [c["score"] for c in calls] == pytest.approx([expected] * 4), trajectory
        assert len({c["advantage"] for c in calls}) == 1


def test_a_run_whose_every_trajectory_fails_stops_with_the_agents_message_and_the_count(tmp_path):
    # The agent raises on a reply without a box: it passes the preflight's trial episode (the scripted model writes
    # one) and fails every trajectory of the tiny random model, which never does.
    user = user_folder(tmp_path / "user", "my_agent.py", "pkg://taskutils.verifiers.strict", "compute_score")
    (user / "my_agent.py").write_text(BOXED_ONLY)
    raise_line = next(i for i, line in enumerate(BOXED_ONLY.splitlines(), 1) if "raise ValueError" in line)
    settings = "CONFIG=run_cpu.yaml DATA_DIR=data MODEL=tiny STEPS=2 OUT_DIR=runs/x"
    env = {**user_env(), "PYTHON": sys.executable}
    env.pop("VERL_PLATFORM", None)
    process = subprocess.Popen(
        ["bash", "-c", f"{settings} bash {REPO}/scripts/train_tiny_cpu.sh"],
        cwd=user,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=TRAIN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 1, output[-5000:]
    failure = f"my_agent.py:{raise_line}: ValueError: no box in the reply"
    # validation before training: 2 prompts x val_kwargs.n 4 = 8 trajectories, all failed
    stop = f"[memagent] every trajectory of the validation at step 0 failed (8 of 8, 2 prompts); the first: {failure}"
    assert output.count(stop) == 1, output[-5000:]
    # each failed trajectory's traceback once: one report line and one raise line per trajectory
    assert len(re.findall(rf"agent trajectory \S+ failed: {re.escape(failure)}", output)) == 8
    assert output.count('raise ValueError("no box in the reply")') == 8
    assert "Received an empty list as keys" not in output
