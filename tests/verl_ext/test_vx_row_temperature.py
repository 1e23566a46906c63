"""Agents keep their own sampling in training, checked where verl consumes it (verl_ext/row_sampling.py).

A self-consistency agent (tests/self_consistency_agent.py: three drafts at temperature 1.2 with ``asyncio.gather``,
a vote at 0.5) runs through our agent-loop worker, in async and sync mode, against the real tiny model's token
server (temperature-scaled sampling and log-probs). Then:

- every stored row carries the temperature that sampled it (its ``temperature`` field, and ``extra_fields``);
- verl's actor code (the FSDP engine's ``prepare_model_inputs`` / ``prepare_model_outputs``, the response slice
  ``_compute_old_log_prob`` stores) computes each row's log-probs at that row's temperature, once the trainer's
  scalar ``temperature`` is out of the batch (as :func:`row_temperatures` does): equal to a forward pass by hand,
  ``log_softmax(logits / T)``, at both temperatures, and to the log-probs the server sampled with;
- with verl's scalar left in (what verl 0.9.1 alone does) the vote's rows would be computed at 1.0: wrong.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from run_configs import cpu_run_config
from torchdata.stateful_dataloader import StatefulDataLoader
from transformers import AutoModelForCausalLM
from verl.trainer.ppo.utils import create_rl_dataset
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.dataset_utils import DatasetPadMode
from verl.utils.dataset.rl_dataset import collate_fn
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
from verl.workers.utils.padding import response_from_nested
from vx_helpers import capture_transfer_queue, make_worker

from verl_ext.row_sampling import ACTOR_METHODS, row_temperatures
from verl_ext.run_config import compose_run_config

AGENT = Path(__file__).resolve().parents[1] / "self_consistency_agent.py"
DRAFT_T, VOTE_T = 1.2, 0.5
ATOL = 2e-5  # fp32 on both sides: the server and the actor differ in the order of float operations only
QUESTIONS = ["What is 12 + 30?", "What is 7 + 8?"]
# A user's run config (the generic trainer on the CPU platform), the agent's own score as the reward.
pytestmark = pytest.mark.slow(seconds=40)


def nested(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(tensors, layout=torch.jagged)


@pytest.fixture(scope="module")
def actor(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    return model.eval()


@pytest.fixture(scope="module", params=["async", "sync"])
async def stored(request, tmp_path_factory, tiny_model_dir, tiny_tokenizer, tiny_server):
    """Every row our worker stores for 2 prompts x n=2 trajectories of the self-consistency agent."""
    mode, folder = request.param, tmp_path_factory.mktemp(request.param)
    rows = [
        {
            "prompt": [{"role": "user", "content": q}],
            "input": q,
            "data_source": "arith",
            "reward_model": {"ground_truth": ""},
        }
        for q in QUESTIONS
    ]
    pd.DataFrame(rows).to_parquet(folder / "train.parquet")
    settings = {"actor_rollout_ref.rollout.n": 2, "actor_rollout_ref.rollout.calculate_log_probs": True}
    sampling = {"max_tokens": 8, "draft_temperature": DRAFT_T, "vote_temperature": VOTE_T}
    config = cpu_run_config(
        str(AGENT),
        max_tokens=8,
        reward=("pkg://verl_ext.rewards", "agent_score"),
        agent_config=sampling,
        settings=settings,
    )
    (folder / "sc_cpu.yaml").write_text(config)
    overrides = [f"recurrent.mode={mode}", f"data.train_files={folder / 'train.parquet'}"]
    config = compose_run_config(folder / "sc_cpu.yaml", [*overrides, f"actor_rollout_ref.model.path={tiny_model_dir}"])
    dataset = create_rl_dataset(config.data.train_files, config.data, tiny_tokenizer, None, is_train=True)
    batch_dict = next(iter(StatefulDataLoader(dataset, batch_size=len(rows), collate_fn=collate_fn)))
    batch_dict = copy.deepcopy(batch_dict)
    batch_dict["uid"] = np.array([uuid.uuid4().hex for _ in rows], dtype=object)
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    with pytest.MonkeyPatch.context() as monkeypatch:
        log = capture_transfer_queue(monkeypatch)
        worker = make_worker(config, tiny_tokenizer, llm_client=tiny_server)
        await worker.generate_sequences(batch)
        await asyncio.gather(*worker.background_tasks)
    assert not log["errors"], log["errors"]
    stored_rows = []
    for put in log["rows"]:  # one put per trajectory: its calls, as verl's worker stores them
        fields = put["fields"]
        stored_rows.append([{name: fields[name][i] for name in ROW_FIELDS} for i in range(len(put["keys"]))])
    return stored_rows


ROW_FIELDS = (
    "prompts",
    "responses",
    "response_mask",
    "input_ids",
    "position_ids",
    "rollout_log_probs",
    "temperature",
    "extra_fields",
)


def actor_log_probs(model, rows, extra_info: dict) -> list[torch.Tensor]:
    """verl's actor on the rows as its worker receives them: the rows' fields (as TransferQueue returns them: the
    stored ``temperature`` a float tensor of one value per row), ``extra_info`` assigned over them as
    ``transferqueue_utils._async_meta_to_realdata`` does, then the FSDP engine's input and output code (the CPU
    config's path: no remove-padding, nested rows) and the response slice of ``old_log_probs``."""
    engine = object.__new__(FSDPEngineWithLMHead)
    engine.module, engine.pad_to_length = model, False
    micro_batch = tu.get_tensordict(
        {
            "input_ids": nested([row["input_ids"] for row in rows]),
            "position_ids": nested([row["position_ids"] for row in rows]),
            "temperature": torch.stack([row["temperature"] for row in rows]),
        }
    )
    for key, value in {**extra_info, "use_remove_padding": False, "pad_mode": DatasetPadMode.NO_PADDING}.items():
        tu.assign_non_tensor_data(micro_batch, key, value)
    with torch.no_grad():
        inputs, output_args = engine.prepare_model_inputs(micro_batch)
        output = model(**inputs, use_cache=False)
        log_probs = engine.prepare_model_outputs(output, output_args, micro_batch, None)["log_probs"]
    return list(response_from_nested(log_probs, nested([row["response_mask"] for row in rows])).unbind(0))


def by_hand(model, row, temperature: float) -> torch.Tensor:
    """One row alone: ``log_softmax(logits / T)`` of the logits that predict each response token."""
    prompt, response = row["prompts"], row["responses"]
    with torch.no_grad():
        logits = model(torch.cat([prompt, response]).unsqueeze(0)).logits[0]
    logits = logits[len(prompt) - 1 : len(prompt) + len(response) - 1].double() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, response.unsqueeze(-1)).squeeze(-1).float()


async def test_every_row_carries_the_temperature_that_sampled_it(stored):
    assert len(stored) == 2 * 2  # 2 prompts x n=2 trajectories
    for trajectory in stored:
        kinds = [row["extra_fields"]["turn_kind"] for row in trajectory]
        assert kinds == ["call", "call", "call", "final"]  # three drafts, then the vote
        assert [float(row["temperature"]) for row in trajectory] == pytest.approx([DRAFT_T] * 3 + [VOTE_T])
        assert [row["extra_fields"]["temperature"] for row in trajectory] == [DRAFT_T] * 3 + [VOTE_T]


async def test_the_actors_log_probs_are_at_each_rows_temperature(stored, actor):
    rows = [row for trajectory in stored for row in trajectory]
    verl_extra_info = {"temperature": 1.0, "calculate_entropy": False, "compute_loss": False}

    class Worker:  # a worker group: records what the actor would be sent
        def compute_log_prob(self, batch):
            return dict(batch.extra_info)

    class Batch:
        extra_info = dict(verl_extra_info)

    worker = Worker()
    with row_temperatures(worker):
        sent = worker.compute_log_prob(Batch())
    assert "temperature" not in sent and sent["compute_loss"] is False  # only the scalar is taken out
    ours = actor_log_probs(actor, rows, sent)
    verls = actor_log_probs(actor, rows, verl_extra_info)  # the scalar over every row's own
    worst_hand = worst_server = 0.0
    for row, computed, at_one in zip(rows, ours, verls, strict=True):
        temperature = float(row["temperature"])
        hand = by_hand(actor, row, temperature)
        worst_hand = max(worst_hand, float((computed - hand).abs().max()))
        worst_server = max(worst_server, float((computed - row["rollout_log_probs"]).abs().max()))
        if temperature != 1.0:  # verl alone computes these rows at 1.0: not what sampled them
            assert float((at_one - hand).abs().max()) > 100 * ATOL
    print(f"\nmax |actor - by hand| {worst_hand:.2e}, max |actor - server| {worst_server:.2e}, {len(rows)} rows")
    assert worst_hand < ATOL and worst_server < ATOL
    assert sorted({round(float(row["temperature"]), 6) for row in rows}) == [VOTE_T, DRAFT_T]  # two temperatures


def test_the_wrapper_covers_the_actor_and_reference_calls_and_is_undone():
    class Group:
        def __init__(self) -> None:
            self.sent: list[tuple[str, dict]] = []
            for name in ACTOR_METHODS:
                setattr(self, name, lambda batch, _name=name: self.sent.append((_name, dict(batch.extra_info))))

    class Batch:
        def __init__(self) -> None:
            self.extra_info = {"temperature": 0.7, "mini_batch_size": 8}

    actor, ref = Group(), Group()
    originals = [getattr(actor, name) for name in ACTOR_METHODS]
    with row_temperatures(actor, ref, None):
        for name in ACTOR_METHODS:
            getattr(actor, name)(Batch())
        ref.compute_ref_log_prob(Batch())
    assert actor.sent == [(name, {"mini_batch_size": 8}) for name in ACTOR_METHODS]
    assert ref.sent == [("compute_ref_log_prob", {"mini_batch_size": 8})]
    assert [getattr(actor, name) for name in ACTOR_METHODS] == originals
