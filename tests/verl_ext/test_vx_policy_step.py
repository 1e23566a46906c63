"""One policy-gradient step on the tiny model with verl's own loss (``verl.workers.utils.losses.ppo_loss``, the loss
of verl's V1 engine workers) on memory-agent rows: the log-probability of positive-advantage responses rises and
that of negative-advantage responses falls, over memory turns and final answers alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from transformers import AutoModelForCausalLM
from verl import DataProto
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.losses import ppo_loss
from vx_helpers import load_example

from verl_ext.rollout import AgentRollout
from verl_ext.sync_rollout import Trajectory, run_trajectories

# The log-probability helpers of the walkthrough (one definition).
_example = load_example("one_step")
token_log_probs, response_log_probs, nested = _example.token_log_probs, _example.response_log_probs, _example.nested

CONTEXT = "The river city was born in the year of the film. " * 3 + "The magic number is 42."
REWARDS = {0: 1.0, 1: 0.0}  # session 0 answered right, session 1 wrong: advantages +0.5 / -0.5 (no std)


@pytest.fixture(scope="module")
async def rows(tiny_config, tiny_tokenizer, tiny_server):
    """Two sampled trajectories of one prompt (different seeds), as (keys, [(prompt_ids, response_ids)])."""
    rollout = AgentRollout.get(tiny_config, tiny_tokenizer)
    sample = {"uid": "uidP", "prompt": "What is the magic number?", "context": CONTEXT}
    trajectories = [Trajectory(sample, s, {"temperature": 1.0, "seed": 7 + s, "logprobs": True}) for s in REWARDS]
    results = await run_trajectories(rollout, tiny_server, trajectories)
    keys, seqs = [], []
    for session, outputs in enumerate(results):
        assert len(outputs) >= 3  # memory turns and the answer
        for index, output in enumerate(outputs):
            keys.append(f"uidP_{session}_{index}")
            seqs.append((output.prompt_ids, output.response_ids))
    return keys, seqs


def advantages_for(keys, seqs) -> list[torch.Tensor]:
    """verl's multi-trajectory GRPO on the rows (rewards by hand, at each row's last token)."""
    width = max(len(r) for _, r in seqs)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    scores = torch.zeros(len(seqs), width)
    for i, (key, (_, response)) in enumerate(zip(keys, seqs, strict=True)):
        mask[i, : len(response)] = 1
        scores[i, len(response) - 1] = REWARDS[int(key.split("_")[1])]
    data = DataProto.from_dict(
        tensors={"response_mask": mask, "token_level_rewards": scores},
        non_tensors={"uid": np.array(["uidP"] * len(seqs), dtype=object)},
    )
    adv = compute_advantage_for_multi_trajectories(data, keys, "grpo", norm_adv_by_std_in_grpo=False)
    return [adv.batch["advantages"][i, : len(r)] for i, (_, r) in enumerate(seqs)]


async def test_one_step_raises_the_log_prob_of_positive_advantage_responses(tiny_config, tiny_model_dir, rows):
    keys, seqs = rows
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    advantages = advantages_for(keys, seqs)
    assert {round(float(a[0]), 6) for a in advantages} == {0.5, -0.5}  # the same scalar on every turn

    old = response_log_probs(model, seqs)
    tokens = sum(len(r) for _, r in seqs)
    data = TensorDict(
        {
            "prompts": nested([torch.tensor(p) for p, _ in seqs]),
            "responses": nested([torch.tensor(r) for _, r in seqs]),
            "response_mask": nested([torch.ones(len(r), dtype=torch.long) for _, r in seqs]),
            "old_log_probs": nested(old),
            "ref_log_prob": nested(old),
            "advantages": nested(advantages),
        },
        batch_size=[len(seqs)],
    )
    for key, value in {"dp_size": 1, "batch_num_tokens": tokens, "global_batch_size": len(seqs)}.items():
        tu.assign_non_tensor_data(data, key, value)
    actor = omega_conf_to_dataclass(tiny_config.actor_rollout_ref.actor)
    assert (actor.loss_agg_mode, actor.use_kl_loss, actor.kl_loss_type) == ("token-mean", True, "low_var_kl")

    model.train()
    loss, _ = ppo_loss(actor, {"log_probs": torch.cat(token_log_probs(model, seqs))}, data)
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.05).step()

    new = response_log_probs(model, seqs)
    delta = {sign: 0.0 for sign in (1, -1)}
    for a, before, after in zip(advantages, old, new, strict=True):
        delta[1 if a[0] > 0 else -1] += float((after - before).sum())
    assert delta[1] > 0 > delta[-1], delta

    # After the step (ratio != 1) verl's loss is, by hand: PPO-clip 0.2/0.2 with dual clip 3 on every response
    # token of every turn, a token-mean over all of them, plus 0.001 x low_var_kl to the reference (the fork's loss).
    with torch.no_grad():
        loss_after, _ = ppo_loss(actor, {"log_probs": torch.cat(token_log_probs(model, seqs))}, data)
    a, logp, ref = torch.cat(advantages), torch.cat(new), torch.cat(old)
    ratio = torch.exp(logp - ref)
    pg = torch.maximum(-a * ratio, -a * ratio.clamp(1 - 0.2, 1 + 0.2))
    pg = torch.where(a < 0, torch.minimum(pg, -a * 3.0), pg)
    kl = ref - logp
    low_var_kl = (torch.exp(kl) - kl - 1).clamp(-10, 10)
    expected = pg.sum() / tokens + 0.001 * low_var_kl.sum() / tokens
    assert float(loss_after) == pytest.approx(float(expected), rel=1e-4, abs=1e-6)
    assert float(loss_after) < float(loss)  # the step improved the objective
