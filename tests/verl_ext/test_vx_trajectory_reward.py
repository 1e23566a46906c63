"""A reward over the whole trajectory, and a step that loses every trajectory (verl_ext/agent_loop_manager.py,
verl_ext/rewards.py, verl_ext/failures.py).

- verl's reward worker calls the run's reward function with the trajectory in ``extra_info``: every call's
  messages and reply, the sample, the agent's own score; its score lands on every row of the trajectory.
- ``verl_ext.rewards.agent_score`` makes the agent's own score the reward; without one it fails the trajectory.
- The memory agent's runs leave the trajectory out (``recurrent.reward_trajectory: false``).
- A sample of the replay buffer without any row raises with the count and the first failure read from the prompts'
  status tags (``error``), before verl clears them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from run_configs import cpu_run_config
from verl.workers.rollout.replica import TokenOutput
from vx_helpers import capture_transfer_queue, compose_config, make_worker

from verl_ext import failures
from verl_ext.agent_loop import RecurrentAgentLoop
from verl_ext.run_config import compose_run_config

AGENT = Path(__file__).resolve().parents[1] / "self_consistency_agent.py"
REWARD = Path(__file__).resolve().parents[1] / "self_consistency_reward.py"
DRAFTS = ["I say \\boxed{42}", "Maybe \\boxed{41}", "It is \\boxed{42}"]
pytestmark = pytest.mark.slow(seconds=60)


class DraftServer:
    """Drafts in turn from :data:`DRAFTS`, then a vote for 42 (a prompt holding "Drafts:")."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.drafts = tokenizer, 0

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_):
        await asyncio.sleep(0)
        if "Drafts:" in self.tokenizer.decode(prompt_ids):
            text = "Most say \\boxed{42}"
        else:
            text, self.drafts = DRAFTS[self.drafts % 3], self.drafts + 1
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed", extra_fields={})


def sample(uid: str = "uidS") -> dict:
    chat = [{"role": "user", "content": "What is 40 + 2?"}]
    return {
        "uid": uid,
        "session_id": 0,
        "global_steps": 1,
        "index": 0,
        "prompt": chat,
        "raw_prompt": chat,
        "input": "What is 40 + 2?",
        "data_source": "arith",
        "reward_model": {"ground_truth": "42"},
        "extra_info": {"index": 7},
    }


async def scored(tmp_path, tokenizer, model_dir, path: str, name: str, monkeypatch) -> tuple[list, dict]:
    run_config = cpu_run_config(str(AGENT), max_tokens=12, reward=(path, name), agent_config={"max_tokens": 12})
    (tmp_path / "run.yaml").write_text(run_config)
    config = compose_run_config(tmp_path / "run.yaml", [f"actor_rollout_ref.model.path={model_dir}"])
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    loop = RecurrentAgentLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=DraftServer(tokenizer),
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
    )
    outputs = await loop.run({"temperature": 1.0, "logprobs": True}, **sample())
    log = capture_transfer_queue(monkeypatch)
    await make_worker(config, tokenizer)._agent_loop_postprocess(outputs, False, **sample())
    return outputs, log["rows"][0]["fields"]


async def test_a_reward_function_reads_the_whole_trajectory(tmp_path, tiny_tokenizer, tiny_model_dir, monkeypatch):
    seen = []

    def spy(data_source, solution_str, ground_truth, extra_info=None, **_):
        seen.append(extra_info)
        return 0.25

    import verl_ext.rewards

    monkeypatch.setattr(verl_ext.rewards, "spy", spy, raising=False)
    outputs, fields = await scored(
        tmp_path, tiny_tokenizer, tiny_model_dir, "pkg://verl_ext.rewards", "spy", monkeypatch
    )
    (extra,) = seen
    assert extra["index"] == 7  # the row's own extra_info is kept
    # the drafts run at once, so which of them reaches the server first (and so gets which draft) is not fixed
    replies = [call["reply"] for call in extra["trajectory"]]
    assert sorted(replies[:3]) == sorted(DRAFTS) and replies[3] == "Most say \\boxed{42}"
    # each call's own, made whole by the rule (recurrent/sampling.py): top_p 1.0 beside a temperature set alone
    own = [{"temperature": 1.2, "top_p": 1.0}] * 3 + [{"temperature": 0.5, "top_p": 1.0}]
    assert [call["sampling"] for call in extra["trajectory"]] == own
    # labelled as the rows are (turn_kind): the answer "final", the drafts "call"
    assert [call["kind"] for call in extra["trajectory"]] == ["call"] * 3 + ["final"]
    assert [row.extra_fields["turn_kind"] for row in outputs] == ["call"] * 3 + ["final"]
    assert extra["trajectory"][0]["messages"] == [
        {"role": "user", "content": "What is 40 + 2?\nWrite a short draft answer."}
    ]
    vote_prompt = extra["trajectory"][3]["messages"][0]["content"]
    listed = vote_prompt.split("Drafts:\n")[1].split("\nPick")[0].splitlines()
    assert [line[:3] for line in listed] == ["1. ", "2. ", "3. "]  # the vote reads the three drafts, numbered
    assert sorted(line[3:] for line in listed) == sorted(DRAFTS)
    assert extra["sample"]["input"] == "What is 40 + 2?" and "extra_info" not in extra["sample"]
    assert extra["agent_score"] == pytest.approx(2 / 3)  # two drafts agree with the vote's 42
    # the trajectory's score on every row, at its last token
    assert [float(fields["rm_scores"][i].sum()) for i in range(len(outputs))] == [0.25] * 4
    assert "trajectory" not in list(fields.keys())  # the rows do not store it


async def test_the_agents_own_score_is_the_reward(tmp_path, tiny_tokenizer, tiny_model_dir, monkeypatch):
    outputs, fields = await scored(
        tmp_path, tiny_tokenizer, tiny_model_dir, "pkg://verl_ext.rewards", "agent_score", monkeypatch
    )
    assert [float(fields["rm_scores"][i].sum()) for i in range(len(outputs))] == pytest.approx([2 / 3] * 4)


async def test_a_trajectory_reward_file_of_the_users(tmp_path, tiny_tokenizer, tiny_model_dir, monkeypatch):
    outputs, fields = await scored(
        tmp_path, tiny_tokenizer, tiny_model_dir, str(REWARD), "drafts_with_a_digit", monkeypatch
    )
    # every draft holds a digit (41 or 42): 3 of 3
    assert [float(fields["rm_scores"][i].sum()) for i in range(len(outputs))] == [1.0] * 4


def test_agent_score_without_a_score_says_what_to_return():
    from verl_ext.rewards import agent_score

    assert agent_score("s", "x", "1", {"agent_score": 0.5}) == 0.5
    with pytest.raises(ValueError, match=r"return recurrent.functions.Answer\(text, score=...\)"):
        agent_score("s", "x", "1", {})


def test_the_memory_agents_runs_leave_the_trajectory_out():
    assert compose_config("memagent_7b").recurrent.reward_trajectory is False
    assert compose_config("tiny_cpu").recurrent.reward_trajectory is False
    assert compose_config("calculator_cpu").recurrent.reward_trajectory is True


class Config:
    class actor_rollout_ref:  # noqa: N801  (the shape of the run config the guard reads)
        class rollout:  # noqa: N801
            n = 4

            class val_kwargs:  # noqa: N801
                n = 2


class Trainer:
    config, global_steps = Config, 3


class Batch:
    def __init__(self, keys: list[str]) -> None:
        self.keys = keys


def test_a_sample_without_rows_stops_with_the_count_and_the_first_failure(monkeypatch):
    tags = {"u1": {"status": "failure"}, "u2": {"status": "failure", "error": "a.py:3: KeyError: 'x'"}}
    monkeypatch.setattr(failures.tq, "kv_list", lambda partition_id: {partition_id: tags})
    cleared = []

    class ReplayBuffer:
        def _materialize_batch(self, partition_id, selected, snapshot):
            cleared.extend(selected)  # verl clears the sampled prompts' tags here
            return Batch([key for key in snapshot if key.split("_")[0] in selected])

    buffer = ReplayBuffer()
    failures.guard_replay_buffer(buffer, Trainer)
    with pytest.raises(failures.TrajectoriesFailed) as raised:
        buffer._materialize_batch("train", ["u1", "u2"], {})
    assert str(raised.value) == (
        "every trajectory of training step 3 failed (8 of 8, 2 prompts); the first: a.py:3: KeyError: 'x'"
    )
    with pytest.raises(failures.TrajectoriesFailed, match=r"of the validation at step 3 failed \(4 of 4, 2 prompts\)"):
        buffer._materialize_batch("val", ["u1", "u2"], {})
    # a sample with rows goes on, failed trajectories or not
    assert buffer._materialize_batch("train", ["u1", "u2"], {"u2_0_0": {}}).keys == ["u2_0_0"]
    assert cleared == ["u1", "u2"] * 3


async def test_a_failed_trajectorys_first_failure_goes_into_its_prompts_tag(monkeypatch, caplog):
    puts = []

    async def put(key, partition_id, tag):
        puts.append((key, partition_id, tag))

    monkeypatch.setattr(failures.tq, "async_kv_put", put)
    reported: set[str] = set()
    try:
        {}["question"]
    except KeyError as err:
        error = err
    import logging

    logger = logging.getLogger("test_failures")
    with caplog.at_level(logging.ERROR):
        for session in (0, 1):
            await failures.report_failure(logger, reported, "uidF", session, "train", error, None)
    assert puts == [("uidF", "train", {"error": "KeyError: 'question'"})]  # the first only
    assert caplog.text.count("Traceback") == 2 and "agent trajectory uidF_1 failed: KeyError: 'question'" in caplog.text
