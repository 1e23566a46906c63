"""An agent written against the official ``openai`` client (tests/openai_user_agent.py: nothing of the framework but
its registration's line) trains unmodified: 2 steps of the CPU launcher from a user's folder outside the
repository, with the tiny offline model. Every call is one row of the rollout dump whose prompt is the call's
messages in the chat template and whose response is the ids the rollout sampled (the next call's prompt holds
them as the agent read them: decoded, never re-sampled). The evaluation side of the same file:
tests/taskutils/memory_eval/test_eval_openai_agent.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from run_configs import cpu_run_config
from test_new_user_agent import REPO, problems_frame, run, train_as_user

from recurrent.models import load_tokenizer

AGENT_FILE = Path(__file__).resolve().parent / "openai_user_agent.py"
DRAFT = "{question}\nWrite a short draft answer."
CHECK = "Check the draft and put the final answer in \\boxed{}."

pytestmark = [pytest.mark.trainer, pytest.mark.slow(seconds=300), pytest.mark.timeout(2400)]


def train(user: Path) -> None:
    settings = "CONFIG=my_openai_agent_cpu.yaml DATA_DIR=data MODEL=tiny STEPS=2 OUT_DIR=runs/openai"
    command = f"{settings} bash {REPO}/scripts/train_tiny_cpu.sh"
    train_as_user(command, user)


def test_an_openai_client_agent_trains_two_steps_one_row_per_call(tmp_path: Path):
    user = tmp_path / "user"
    (user / "data").mkdir(parents=True)
    shutil.copy(AGENT_FILE, user / "my_openai_agent.py")
    settings = {
        "data.train_batch_size": 4,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.optim.lr_warmup_steps": 0,
        "actor_rollout_ref.rollout.n": 4,
    }
    config = cpu_run_config("my_openai_agent.py", max_tokens=32, agent_config={"max_tokens": 32}, settings=settings)
    (user / "my_openai_agent_cpu.yaml").write_text(config)
    questions = [(f"What is {a} + {b}?", a + b) for a, b in ((12, 30), (7, 8), (21, 21), (40, 2), (5, 9), (33, 11))]
    problems_frame(questions).to_parquet(user / "data" / "train.parquet")
    problems_frame(questions[:2]).to_parquet(user / "data" / "validation.parquet")
    train(user)
    metrics = [json.loads(line) for line in (user / "runs" / "openai" / "metrics.jsonl").read_text().splitlines()]
    assert sorted({m["step"] for m in metrics if "actor/lr" in m["data"]}) == [1, 2]

    rows = [
        json.loads(x)
        for x in run("python -m verl_ext.rows runs/openai/rollout --tokenizer tiny --json", user).stdout.splitlines()
    ]
    by_trajectory: dict[str, list[dict]] = {}
    for row in rows:
        by_trajectory.setdefault(row["trajectory"], []).append(row)
    assert len(by_trajectory) == 4 * 4  # train_batch_size 4 x rollout.n 4 of the last step
    tokenizer = load_tokenizer("tiny")

    def ids(messages: list[dict]) -> list[int]:  # the tokenizer's own rendering, not the route's
        return list(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        )

    drafts = {
        tuple(ids([{"role": "user", "content": DRAFT.format(question=q)}])): q
        for q in pd.read_parquet(user / "data" / "train.parquet")["input"]
    }
    for trajectory, calls in by_trajectory.items():
        assert [(c["turn_index"], c["turn_kind"]) for c in calls] == [(0, "call"), (1, "final")], trajectory
        draft, final = calls
        question = drafts[tuple(draft["prompt_ids"])]
        reply = tokenizer.decode(draft["response_ids"], skip_special_tokens=True)
        assert "<tool_call>" not in reply  # a random model writes no call: the draft's message is its whole text
        check = [
            {"role": "user", "content": DRAFT.format(question=question)},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": CHECK},
        ]
        assert final["prompt_ids"] == ids(check), trajectory
        assert all(0 < len(c["response_ids"]) <= 32 for c in calls)
        assert draft["advantage"] == final["advantage"]
