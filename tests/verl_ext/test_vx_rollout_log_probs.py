"""The rollout's log-probs are the actor's old log-probs, so the CPU replication can take them instead of a second
forward pass (``algorithm.rollout_correction.bypass_mode``; docs/replication_cpu_notebook.md, "The old log-probs").

- The rows verl's agent-loop worker stores from our memory agent on the ``hf_cpu`` server (weights pushed by the
  trainer's weight sync, temperature 1.0, concurrent requests batched) carry ``rollout_log_probs`` with one value per
  response token of every turn, and those values are what verl's actor computes for the same rows: the FSDP engine's
  own input and output code (``prepare_model_inputs`` / ``prepare_model_outputs``, the path of
  ``use_remove_padding=false``) and the response slice ``_compute_old_log_prob`` writes as ``old_log_probs``
  (``response_from_nested``), within 2e-5; a plain forward pass of each row, computed here, agrees with both.
- The configs: only the CPU replication takes them; nothing else of its algorithm changes (no importance weights,
  no rejection, the PPO clip loss with token-mean), and the GPU default keeps verl's recomputation.
"""

from __future__ import annotations

import asyncio
import copy
import uuid

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf, open_dict
from test_vx_sync_mode import QUESTIONS, make_batch
from transformers import AutoModelForCausalLM
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.dataset_utils import DatasetPadMode
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
from verl.workers.utils.padding import response_from_nested
from vx_helpers import capture_transfer_queue, compose_config, make_worker

# fp32 both sides, temperature 1.0: the two computations differ only in the order of float operations (the server
# reads a prompt once and each new token through its KV cache, left-padded in a batch; the actor reads the whole
# row, right-padded). Measured here: up to 8e-6, varying with how the server happened to batch the requests (the
# same rows by hand against the actor's code: up to 4e-6); the bound leaves room for that.
ATOL = 2e-5


def nested(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(tensors, layout=torch.jagged)


@pytest.fixture(scope="module")
def actor(tiny_model_dir):
    """The actor after some updates: the tiny model with every weight moved (seeded noise), so that the server
    samples from what the weight sync pushed, not from the folder both sides loaded."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


@pytest.fixture(scope="module", params=["async", "sync"])
async def stored_rows(request, tmp_path_factory, tiny_model_dir, tiny_tokenizer, actor):
    """Every row verl's worker stores for 2 prompts x n = 4 trajectories, sampled by the ``hf_cpu`` server at
    temperature 1.0 after the weight sync, in either rollout mode (async: the CPU replication's)."""
    from verl_ext.cpu.rollout.server import HFCPUServer

    mode = request.param
    overrides = ["actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.temperature=1.0"]
    overrides.append("actor_rollout_ref.rollout.calculate_log_probs=true")
    config, batch_dict = make_batch(tmp_path_factory.mktemp(mode), tiny_tokenizer, QUESTIONS[:2], mode, overrides)
    with open_dict(config):
        config.actor_rollout_ref.model.path = tiny_model_dir
    server = HFCPUServer(config.actor_rollout_ref.rollout, config.actor_rollout_ref.model, replica_rank=0)
    await server.update_weights({name: t.clone() for name, t in actor.state_dict().items()}, global_steps=1)
    batch_dict = copy.deepcopy(batch_dict)
    batch_dict["uid"] = np.array([uuid.uuid4().hex for _ in QUESTIONS[:2]], dtype=object)
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    with pytest.MonkeyPatch.context() as monkeypatch:
        log = capture_transfer_queue(monkeypatch)
        worker = make_worker(config, tiny_tokenizer, llm_client=server)
        await worker.generate_sequences(batch)
        await asyncio.gather(*worker.background_tasks)
    rows = []
    for put in log["rows"]:  # one put per trajectory: its turns, as verl's worker stores them
        fields = put["fields"]
        for i, key in enumerate(put["keys"]):
            rows.append({"key": key, **{name: fields[name][i] for name in ROW_FIELDS}})
            rows[-1]["turn_kind"] = fields["extra_fields"][i]["turn_kind"]
    return rows, server.engine


ROW_FIELDS = ("prompts", "responses", "response_mask", "loss_mask", "input_ids", "position_ids", "rollout_log_probs")


def actor_old_log_probs(model, rows) -> list[torch.Tensor]:
    """verl's actor on the rows: the FSDP engine's input and output code around the model (the micro-batch fields
    of ``compute_log_prob`` on the CPU config: no remove-padding, temperature 1.0, nested rows), then the response
    slice ``_compute_old_log_prob`` stores as ``old_log_probs``. The FSDP wrapper itself is left out: in fp32 it
    gathers the same weights."""
    engine = object.__new__(FSDPEngineWithLMHead)
    engine.module, engine.pad_to_length = model, False
    micro_batch = tu.get_tensordict(
        {
            "input_ids": nested([row["input_ids"] for row in rows]),
            "position_ids": nested([row["position_ids"] for row in rows]),
        }
    )
    tu.assign_non_tensor_data(micro_batch, "temperature", 1.0)
    tu.assign_non_tensor_data(micro_batch, "use_remove_padding", False)
    tu.assign_non_tensor_data(micro_batch, "pad_mode", DatasetPadMode.NO_PADDING)
    with torch.no_grad():
        inputs, output_args = engine.prepare_model_inputs(micro_batch)
        output = model(**inputs, use_cache=False)
        log_probs = engine.prepare_model_outputs(output, output_args, micro_batch, None)["log_probs"]
    response_mask = nested([row["response_mask"] for row in rows])
    return list(response_from_nested(log_probs, response_mask).unbind(0))


def hand_log_probs(model, row) -> torch.Tensor:
    """One row alone: log-softmax of the logits that predict each response token."""
    prompt, response = row["prompts"], row["responses"]
    with torch.no_grad():
        logits = model(torch.cat([prompt, response]).unsqueeze(0)).logits[0]
    logits = logits[len(prompt) - 1 : len(prompt) + len(response) - 1]
    return torch.log_softmax(logits.double(), dim=-1).gather(-1, response.unsqueeze(-1)).squeeze(-1).float()


async def test_every_turn_stores_one_rollout_log_prob_per_response_token(stored_rows):
    rows, _ = stored_rows
    assert len({row["key"].rsplit("_", 1)[0] for row in rows}) == 2 * 4  # every trajectory stored
    assert {row["turn_kind"] for row in rows} == {"memory", "final"}
    for row in rows:
        length = len(row["responses"])
        assert row["rollout_log_probs"].dtype == torch.float32
        assert len(row["rollout_log_probs"]) == len(row["response_mask"]) == length > 0
        assert torch.equal(row["input_ids"], torch.cat([row["prompts"], row["responses"]]))
        # every response token is trained on (the memory agent's rows): each has its log-prob
        assert row["response_mask"].tolist() == row["loss_mask"].tolist() == [1] * length
        assert bool((row["rollout_log_probs"] <= 0).all())


async def test_the_rollout_log_probs_are_the_actors_old_log_probs(stored_rows, actor):
    rows, engine = stored_rows
    # the server batched concurrent requests: left-padded rows read through the KV cache were among them
    assert engine.generate_calls < engine.requests
    old = actor_old_log_probs(actor, rows)
    worst_actor, worst_hand = 0.0, 0.0
    for row, old_log_probs in zip(rows, old, strict=True):
        rollout = row["rollout_log_probs"]
        hand = hand_log_probs(actor, row)
        assert old_log_probs.shape == rollout.shape == hand.shape, row["key"]
        worst_actor = max(worst_actor, float((rollout - old_log_probs).abs().max()))
        worst_hand = max(worst_hand, float((hand - old_log_probs).abs().max()))
    print(f"\nmax |rollout - actor| {worst_actor:.2e}, max |by hand - actor| {worst_hand:.2e}, {len(rows)} rows")
    assert worst_hand < ATOL  # the actor's route above is the model's log-probs
    assert worst_actor < ATOL
    # the sampled tokens are not all the most likely ones (sampling at temperature 1.0, not greedy)
    assert any(float(lp.min()) < -1.0 for lp in old)


def test_only_the_cpu_replication_takes_the_rollout_log_probs_and_its_algorithm_stays_the_papers():
    cpu = compose_config("replicate_cpu")
    correction = cpu.algorithm.rollout_correction
    assert correction.bypass_mode is True
    assert cpu.actor_rollout_ref.rollout.calculate_log_probs is True  # the server returns them (verl's default)
    # what makes them equal: fp32 on both sides, the actor's temperature is the rollout's
    fsdp = cpu.actor_rollout_ref.actor.fsdp_config
    assert fsdp.model_dtype == "fp32" and fsdp.mixed_precision.param_dtype == "fp32"
    assert cpu.actor_rollout_ref.rollout.name == "hf_cpu" and cpu.actor_rollout_ref.rollout.temperature == 1.0
    # the v1 trainer reads bypass_mode in _compute_old_log_prob and _compute_advantage only; the actor's loss is
    # policy_loss.loss_mode, which it does not touch: the paper's PPO clip, token-mean, no importance weights or
    # rejection
    assert correction.rollout_is is None and correction.rollout_rs is None
    actor = cpu.actor_rollout_ref.actor
    assert actor.policy_loss.loss_mode == "vanilla" and actor.loss_agg_mode == "token-mean"
    assert actor.clip_ratio == 0.2
    # nothing else differs from the same run with verl's recomputation
    recompute = compose_config("replicate_cpu", ["algorithm.rollout_correction.bypass_mode=false"])
    with_bypass = OmegaConf.to_container(cpu, resolve=False)
    without = OmegaConf.to_container(recompute, resolve=False)
    with_bypass["algorithm"]["rollout_correction"].pop("bypass_mode")
    without["algorithm"]["rollout_correction"].pop("bypass_mode")
    assert with_bypass == without
    # the GPU runs (vLLM's bf16 log-probs are not FSDP's) and the tiny CPU run recompute
    for name in ("memagent_7b", "memagent_14b", "smoke_gpu", "tiny_cpu"):
        assert compose_config(name).algorithm.rollout_correction.bypass_mode is False, name
