"""Sync (lockstep) mode against async mode, through our agent-loop worker fed as verl's V1 trainer feeds it.

- Greedy decoding: both modes store the same rows under the same keys (same prompt and response ids).
- Faults: one failed request and one question over its budget. Each mode loses exactly the failed trajectories,
  stores the rest, and marks the affected prompts ``failure`` and the others ``finished``: one bad sample never
  fails the batch.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import uuid
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from verl.trainer.ppo.utils import create_rl_dataset
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.rl_dataset import collate_fn
from vx_helpers import TINY_BUDGETS, capture_transfer_queue, compose_config, make_worker

CONTEXT = "The river city was born in the year of the film. " * 3 + "The magic number is 42."
QUESTIONS = ["What is magic number 0?", "What is magic number 1?", "What is " + "the very long " * 20 + "number?"]


class FailingServer:
    """The real tiny token server, except that the ``fail_at``-th request of one prompt raises (a dropped
    connection, say). Counts requests per prompt (request id = prompt uid)."""

    def __init__(self, server, request_id: str | None, fail_at: int) -> None:
        self.server, self.request_id, self.fail_at = server, request_id, fail_at
        self.calls: Counter[str] = Counter()

    async def generate(self, request_id: str, **kwargs):
        self.calls[request_id] += 1
        if request_id == self.request_id and self.calls[request_id] == self.fail_at:
            raise ConnectionError(f"injected failure of request {self.calls[request_id]} of {request_id}")
        return await self.server.generate(request_id, **kwargs)


class RecordingServer:
    """Passes every request on to ``server`` and records what each successful one returned:
    ``(request id, prompt ids, token ids, float32 log-probs)``."""

    def __init__(self, server) -> None:
        self.server = server
        self.calls: Counter[tuple] = Counter()

    async def generate(self, request_id: str, **kwargs):
        output = await self.server.generate(request_id, **kwargs)
        log_probs = torch.tensor(output.log_probs, dtype=torch.float32).tolist()
        self.calls[request_id, tuple(kwargs["prompt_ids"]), tuple(output.token_ids), tuple(log_probs)] += 1
        return output


def make_batch(tmp_path, tokenizer, questions, mode, extra=()):
    rows = [
        {
            "prompt": [{"role": "user", "content": q}],
            "context": CONTEXT,
            "data_source": "hotpotqa",
            "reward_model": {"ground_truth": "42"},
        }
        for q in questions
    ]
    path = tmp_path / f"train_{mode}.parquet"
    pd.DataFrame(rows).to_parquet(path)
    config = compose_config(
        "tiny_cpu",
        [
            *TINY_BUDGETS,
            f"recurrent.mode={mode}",
            f"data.train_files={path}",
            "data.filter_overlong_prompts=false",
            *extra,
        ],
    )
    dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, None, is_train=True)
    batch_dict = next(iter(StatefulDataLoader(dataset, batch_size=len(rows), collate_fn=collate_fn)))
    return config, batch_dict


async def run_worker(config, batch_dict, uids, tokenizer, server, monkeypatch, model_dir, with_log_probs=False):
    from omegaconf import open_dict

    with open_dict(config):
        config.actor_rollout_ref.model.path = model_dir
    batch_dict = copy.deepcopy(batch_dict)
    batch_dict["uid"] = np.array(uids, dtype=object)
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    log = capture_transfer_queue(monkeypatch)
    worker = make_worker(config, tokenizer, llm_client=server)
    await worker.generate_sequences(batch)
    await asyncio.gather(*worker.background_tasks)
    stored = {}
    for put in log["rows"]:
        fields = put["fields"]
        for i, key in enumerate(put["keys"]):
            stored[key] = (fields["prompts"][i].tolist(), fields["responses"][i].tolist())
            if with_log_probs:  # not compared across modes: float rounding depends on the server's batching
                stored[key] += (fields["rollout_log_probs"][i].tolist(),)
    statuses = {uid: [s for key, _, s in log["status"] if key == uid] for uid in uids}
    return stored, statuses


def trajectories_per_uid(stored):
    counts: Counter[str] = Counter()
    for key in {k.rsplit("_", 1)[0] for k in stored}:
        counts[key.split("_")[0]] += 1
    return counts


async def test_sync_and_async_store_identical_rows_under_greedy(
    tmp_path, monkeypatch, tiny_model_dir, tiny_tokenizer, tiny_server
):
    uids = [uuid.uuid4().hex for _ in QUESTIONS[:2]]
    results = {}
    for mode in ("sync", "async"):
        config, batch_dict = make_batch(
            tmp_path, tiny_tokenizer, QUESTIONS[:2], mode, ["actor_rollout_ref.rollout.temperature=0"]
        )
        results[mode] = await run_worker(
            config, batch_dict, uids, tiny_tokenizer, tiny_server, monkeypatch, tiny_model_dir
        )
    (sync_rows, sync_status), (async_rows, async_status) = results["sync"], results["async"]
    n = config.actor_rollout_ref.rollout.n
    assert len(sync_rows) > 2 * n  # memory turns and answers of every trajectory
    assert sync_rows.keys() == async_rows.keys()
    assert all(sync_rows[key] == async_rows[key] for key in sync_rows)
    assert sync_status == async_status == {uid: ["running", "finished"] for uid in uids}


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_failed_request_and_an_oversize_question_lose_only_their_trajectories(
    tmp_path, monkeypatch, tiny_model_dir, tiny_tokenizer, tiny_server, mode, caplog
):
    uids = [uuid.uuid4().hex for _ in QUESTIONS]
    good, flaky, oversize = uids
    config, batch_dict = make_batch(tmp_path, tiny_tokenizer, QUESTIONS, mode)
    server = FailingServer(tiny_server, request_id=flaky, fail_at=2)  # one request of one trajectory fails
    with caplog.at_level(logging.ERROR):
        stored, statuses = await run_worker(
            config, batch_dict, uids, tiny_tokenizer, server, monkeypatch, tiny_model_dir
        )
    n = config.actor_rollout_ref.rollout.n
    # The good prompt keeps all n trajectories, the flaky one n - 1, the oversize question none.
    assert trajectories_per_uid(stored) == Counter({good: n, flaky: n - 1})
    assert statuses == {good: ["running", "finished"], flaky: ["running", "failure"], oversize: ["running", "failure"]}
    # Every stored trajectory is complete: its turns are 0..last with no gap.
    turns: dict[str, list[int]] = {}
    for key in stored:
        trajectory, index = key.rsplit("_", 1)
        turns.setdefault(trajectory, []).append(int(index))
    assert all(sorted(t) == list(range(len(t))) and len(t) >= 2 for t in turns.values())
    logged = caplog.text
    assert "injected failure" in logged and "question" in logged  # both causes reach the log


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_failed_prompts_first_leave_every_row_with_its_own_server_outputs(
    tmp_path, monkeypatch, tiny_model_dir, tiny_tokenizer, tiny_server, mode
):
    # The failing prompts come first: the oversize question's trajectories never join the lockstep, so every
    # later trajectory's lockstep index differs from its batch index (with them last, the two coincide).
    questions = [QUESTIONS[2], QUESTIONS[0], QUESTIONS[1]]
    uids = [uuid.uuid4().hex for _ in questions]
    oversize, flaky, good = uids
    extra = ["actor_rollout_ref.rollout.calculate_log_probs=true"]
    config, batch_dict = make_batch(tmp_path, tiny_tokenizer, questions, mode, extra)
    server = RecordingServer(FailingServer(tiny_server, request_id=flaky, fail_at=2))
    stored, statuses = await run_worker(
        config, batch_dict, uids, tiny_tokenizer, server, monkeypatch, tiny_model_dir, with_log_probs=True
    )
    # Every stored row is one server call of its own prompt (request id = uid): the prompt sent, the tokens and
    # the log-probs returned, each call behind one row at most.
    unused = server.calls.copy()
    for key, (prompt, response, log_probs) in stored.items():
        call = (key.split("_")[0], tuple(prompt), tuple(response), tuple(log_probs))
        assert unused[call] > 0, f"row {key} matches no call of its prompt"
        unused[call] -= 1
    n = config.actor_rollout_ref.rollout.n
    assert trajectories_per_uid(stored) == Counter({good: n, flaky: n - 1})
    assert statuses == {good: ["running", "finished"], flaky: ["running", "failure"], oversize: ["running", "failure"]}
    # Each trajectory's turn k + 1 reads the memory its turn k wrote (the response without its eos and pad
    # tokens): its rows chain within the trajectory.
    ends = {tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id}
    for trajectory in {key.rsplit("_", 1)[0] for key in stored}:
        turns = sorted((int(k.rsplit("_", 1)[1]), v) for k, v in stored.items() if k.rsplit("_", 1)[0] == trajectory)
        for (_, (_, response, _)), (_, (next_prompt, _, _)) in itertools.pairwise(turns):
            assert _contains(next_prompt, [t for t in response if t not in ends]), trajectory


def _contains(sequence: list[int], part: list[int]) -> bool:
    return any(sequence[i : i + len(part)] == part for i in range(len(sequence) - len(part) + 1))
