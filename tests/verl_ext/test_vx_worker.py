"""Our agent-loop worker fed the way verl's V1 trainer feeds it: a parquet through verl's RLHFDataset, dataloader and
collate, uids, ``tu.get_tensordict``, against the real tiny token server. In sync mode all trajectories of the
batch run in lockstep; in async mode verl's own worker code runs one ``memory_agent`` loop per trajectory (found
through verl's registry). Either way every row reaches TransferQueue under ``{uid}_{session}_{index}`` with its
reward, and each prompt's status goes running -> finished."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from text_hash_reward import text_hash
from torchdata.stateful_dataloader import StatefulDataLoader
from verl.trainer.ppo.utils import create_rl_dataset
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.rl_dataset import collate_fn
from verl.utils.import_utils import load_class_from_fqn
from vx_helpers import TINY_BUDGETS, capture_transfer_queue, compose_config, make_worker

from recurrent.tokens import encode_long, num_chunks
from verl_ext import agent_loop_manager
from verl_ext.sync_rollout import run_trajectories

REWARD_FILE = Path(__file__).with_name("text_hash_reward.py")
CONTEXTS = ["", "The river city was born in the year of the film. " * 3 + "The magic number is 42."]


@pytest.mark.parametrize(
    ("mode", "manager", "worker"),
    [
        ("async", "RecurrentAgentLoopManager", agent_loop_manager.RecurrentAgentLoopWorkerImpl),
        ("sync", "LockstepAgentLoopManager", agent_loop_manager.LockstepAgentLoopWorkerImpl),
    ],
)
def test_recurrent_mode_names_the_manager_class_verl_builds(mode, manager, worker):
    # verl reads actor_rollout_ref.rollout.agent.agent_loop_manager_class (main_ppo.py, TaskRunnerV1).
    config = compose_config("tiny_cpu", [f"recurrent.mode={mode}"])
    fqn = config.actor_rollout_ref.rollout.agent.agent_loop_manager_class
    assert fqn == f"verl_ext.agent_loop_manager.{manager}"
    assert load_class_from_fqn(fqn, "AgentLoopManager").worker_impl is worker


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_worker_stores_every_turn_of_every_rollout(
    tmp_path, monkeypatch, tiny_model_dir, tiny_tokenizer, tiny_server, mode
):
    rows = [
        {
            "prompt": [{"role": "user", "content": f"What is magic number {i}?"}],
            "context": context,
            "data_source": "hotpotqa",
            "reward_model": {"ground_truth": "42"},
        }
        for i, context in enumerate(CONTEXTS)
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "train.parquet")
    overrides = [
        f"recurrent.mode={mode}",
        f"data.train_files={tmp_path}/train.parquet",
        f"reward.custom_reward_function.path={REWARD_FILE}",
        "reward.custom_reward_function.name=compute_score",
    ]
    config = compose_config("tiny_cpu", [*TINY_BUDGETS, *overrides, f"actor_rollout_ref.model.path={tiny_model_dir}"])

    # The trainer's batch (trainer_base.py: _fetch_one_gen_batch, _next_train_batch).
    dataset = create_rl_dataset(config.data.train_files, config.data, tiny_tokenizer, None, is_train=True)
    batch_dict = next(iter(StatefulDataLoader(dataset, batch_size=2, collate_fn=collate_fn)))
    batch_dict["uid"] = np.array([str(uuid.uuid4()) for _ in range(2)], dtype=object)
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    uids = list(batch_dict["uid"])

    log = capture_transfer_queue(monkeypatch)
    lockstep_calls = []

    async def spy(rollout, server, trajectories):
        lockstep_calls.append(len(trajectories))
        return await run_trajectories(rollout, server, trajectories)

    monkeypatch.setattr(agent_loop_manager, "run_trajectories", spy)
    worker = make_worker(config, tiny_tokenizer, llm_client=tiny_server)
    await worker.generate_sequences(batch)  # returns at once; the lockstep batch runs in the background
    await asyncio.gather(*worker.background_tasks)

    n = config.actor_rollout_ref.rollout.n
    assert lockstep_calls == ([2 * n] if mode == "sync" else [])  # one lockstep batch for the whole batch
    keys = [key for put in log["rows"] for key in put["keys"]]
    expected = []
    for uid, context in zip(uids, CONTEXTS, strict=True):
        turns = num_chunks(len(encode_long(context, tiny_tokenizer)), 16) + 1
        expected += [f"{uid}_{s}_{i}" for s in range(n) for i in range(turns)]
    assert sorted(keys) == sorted(expected)
    assert len(log["rows"]) == 2 * n  # one TransferQueue write per trajectory
    finals = []
    for put in log["rows"]:
        fields, last = put["fields"], max(range(len(put["keys"])), key=lambda i: int(put["keys"][i].rsplit("_", 1)[1]))
        # the reward by hand: the hash of the final answer, decoded here from the final row's own response tokens
        response = fields["responses"][last][fields["response_mask"][last].bool()]
        final = text_hash(tiny_tokenizer.decode(response.tolist(), skip_special_tokens=True))
        scores = [float(fields["rm_scores"][i].sum()) for i in range(len(put["keys"]))]
        assert scores == pytest.approx([final] * len(scores), abs=1e-6)  # the final reward on every turn
        finals.append(final)
        assert "context" not in list(fields.keys())
    assert len(set(finals)) > 1  # trajectories differ, so a reward landing on another trajectory's rows shows
    statuses = {uid: [status for key, _, status in log["status"] if key == uid] for uid in uids}
    assert statuses == {uid: ["running", "finished"] for uid in uids}
