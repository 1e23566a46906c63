"""Which token count divides the loss under each ``recurrent.credit`` mode, seen inside verl 0.9.1's actor update.

One training step's actor side runs in a fresh process on the CPU platform (verl_ext/cpu): verl's own actor
worker
(``ActorRolloutRefWorker``, role ``actor``, its FSDP2 engine on a one-rank gloo group) computes the old
log-probabilities, our trainer's ``_compute_advantage`` (verl's GRPO, then the credit mode) writes the advantages
and masks, and the worker's ``update_actor`` (what verl's trainer calls through Ray) makes the updates. Rows are
kept in a dict standing in for TransferQueue (the process has no Ray). The reference policy is the actor shifted by
a constant, so that the KL loss term shows which tokens each mode trains. The loss function verl calls is registered
under a test name (verl's policy-loss registry): it records the ``batch_num_tokens`` the engine hands it and then
runs verl's ``vanilla`` loss. Expectations come from the row lengths and rewards below, by hand.
"""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

import pytest
from process_helpers import in_a_fresh_process

pytestmark = pytest.mark.timeout(600)

# (uid, session, reward, response lengths of the trajectory's rows: the memory turns, then the answer).
# GRPO without std division: uid u 1.0 / 0.0 -> +0.5 / -0.5, uid v 0.0 / 1.0 -> -0.5 / +0.5, on every row.
TRAJECTORIES = [
    ("u", 0, 1.0, [5, 7, 3]),
    ("u", 1, 0.0, [6, 4, 2]),
    ("v", 0, 0.0, [8, 9, 2, 4]),
    ("v", 1, 1.0, [3, 6]),
]
ADVANTAGE = {("u", 0): 0.5, ("u", 1): -0.5, ("v", 0): -0.5, ("v", 1): 0.5}
# Two updates of 6 rows each (verl's row counting: ppo_mini_batch_size x n rows, in the order given): the u rows,
# then the v rows.
N, PPO_MINI_BATCH = 2, 3
PROBE = "vx_credit_probe"  # the policy loss name the run registers and selects

# By hand, per update: all rows' response tokens, the answer rows' ones, and sum(advantage x tokens) over each.
ALL_TOKENS = [5 + 7 + 3 + 6 + 4 + 2, 8 + 9 + 2 + 4 + 3 + 6]  # 27, 32
ANSWER_TOKENS = [3 + 2, 4 + 6]  # 5, 10
ALL_ADVANTAGE_SUM = [0.5 * 15 - 0.5 * 12, -0.5 * 23 + 0.5 * 9]  # 1.5, -7.0
ANSWER_ADVANTAGE_SUM = [0.5 * 3 - 0.5 * 2, -0.5 * 4 + 0.5 * 6]  # 0.5, 1.0
# The reference policy is set REF_SHIFT nats above the actor's old log-probs on every token, so the KL loss term is
# not zero: verl's low_var_kl of that gap, exp(d) - d - 1, on each token its response_mask keeps (at ratio 1).
REF_SHIFT = 0.5
KL_PER_TOKEN = math.exp(REF_SHIFT) - REF_SHIFT - 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_step_per_credit_mode(model_dir: str, modes: list[str]) -> dict[str, dict]:
    """Run in a fresh process: for each mode, the old log-probs, the advantages and the actor update of one step
    on the rows of :data:`TRAJECTORIES`; what the loss function saw and what the worker reported, per mode."""
    # The CPU platform is chosen when verl is imported, and the worker's process group reads these.
    os.environ.update(VERL_PLATFORM="cpu", VERL_USE_EXTERNAL_MODULES="verl_ext.cpu.load")
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    import numpy as np
    import torch
    import transfer_queue
    from tensordict import TensorDict
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.core_algos import get_policy_loss_fn, register_policy_loss
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from vx_helpers import compose_config

    from verl_ext.trainer import RecurrentPPOTrainer

    seen: list[float] = []
    vanilla = get_policy_loss_fn("vanilla")

    @register_policy_loss(PROBE)
    def probe(**kwargs):  # the loss verl's ppo_loss calls, with the update's global batch info in its config
        seen.append(kwargs["config"].global_batch_info["batch_num_tokens"])
        return vanilla(**kwargs)

    base = [
        f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={PROBE}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PPO_MINI_BATCH}",
        f"actor_rollout_ref.rollout.n={N}",
        # lr 0: the weights stay, so every update starts from the weights of the old log-probs (ratio 1) and the
        # modes are compared on one model
        "actor_rollout_ref.actor.optim.lr=0",
    ]
    worker = ActorRolloutRefWorker(compose_config("tiny_cpu", base).actor_rollout_ref, role="actor")
    worker.init_model()

    def fetch(store: dict, keys: list[str], extra: dict | None = None) -> TensorDict:
        fields = [name for name in store[keys[0]] if all(name in store[key] for key in keys)]
        data = tu.list_of_dict_to_tensordict([{name: store[key][name] for name in fields} for key in keys])
        for key, value in (extra or {}).items():
            tu.assign_non_tensor_data(data, key, value)
        return data

    class WorkerGroup:
        """What verl's Ray worker group and TransferQueue bridge do for one rank: rows in, outputs stored."""

        def __init__(self, store: dict) -> None:
            self.store, self.update_outputs = store, []

        def compute_log_prob(self, batch: KVBatchMeta) -> KVBatchMeta:
            output = worker.compute_log_prob(fetch(self.store, batch.keys, batch.extra_info))
            rows = zip(batch.keys, output["log_probs"].unbind(0), output["entropy"].unbind(0), strict=True)
            for key, log_probs, entropy in rows:
                self.store[key].update(log_probs=log_probs, entropy=entropy)
            return batch

        def update_actor(self, batch: KVBatchMeta) -> TensorDict:
            output = worker.update_actor(fetch(self.store, batch.keys, batch.extra_info))
            self.update_outputs.append(output["metrics"])
            return output

    results = {}
    for mode in modes:
        gen = torch.Generator().manual_seed(0)
        store: dict[str, dict] = {}
        for uid, session, reward, lengths in TRAJECTORIES:
            for index, length in enumerate(lengths):
                prompt = torch.randint(10, 200, (6 + index + session,), generator=gen)
                response = torch.randint(10, 200, (length,), generator=gen)
                ids = torch.cat([prompt, response])
                mask = torch.ones(length, dtype=torch.int64)
                scores = torch.zeros(length)
                scores[-1] = reward  # verl's rollout: the final reward at every row's last token
                store[f"{uid}_{session}_{index}"] = {  # the fields verl's V1 rollout stores (agent_loop_tq.py)
                    "uid": uid,
                    "prompts": prompt,
                    "responses": response,
                    "input_ids": ids,
                    "position_ids": torch.arange(len(ids)),
                    "attention_mask": torch.ones_like(ids),
                    "response_mask": mask,
                    "loss_mask": mask,
                    "rm_scores": scores,
                    # the server's log-probs: only verl's debug and rollout-correction metrics read them here
                    "rollout_log_probs": torch.zeros(length),
                }
        keys = list(store)

        def kv_batch_get(keys, partition_id, select_fields, store=store):
            rows = [{name: store[key][name] for name in select_fields if name in store[key]} for key in keys]
            return tu.list_of_dict_to_tensordict(rows)

        def kv_batch_put(keys, partition_id, fields=None, tags=None, store=store):
            for name, value in ({} if fields is None else fields).items():
                for key, row in zip(keys, value.unbind(0), strict=True):
                    store[key][name] = row
            return KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id=partition_id)

        transfer_queue.kv_batch_get, transfer_queue.kv_batch_put = kv_batch_get, kv_batch_put
        trainer = object.__new__(RecurrentPPOTrainer)
        trainer.config = compose_config("tiny_cpu", [*base, f"recurrent.credit={mode}"])
        trainer.actor_rollout_wg = group = WorkerGroup(store)
        trainer._plan = None  # verl's own mini-batches: ppo_mini_batch_size x n rows, in the order given
        batch = KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id="train")
        metrics: dict = {}
        trainer._compute_old_log_prob(batch, metrics)  # verl's
        for key in keys:  # a reference policy that differs from the actor by REF_SHIFT on every token
            store[key]["ref_log_prob"] = store[key]["old_log_probs"] + REF_SHIFT
        seen.clear()
        trainer._compute_advantage(batch, metrics)  # verl's GRPO, then the credit mode
        trainer._update_actor(batch, metrics)  # verl's: extra_info, then the worker
        (reported,) = group.update_outputs
        results[mode] = {
            "batch_num_tokens": list(seen),
            "pg_loss": [float(v) for v in reported["actor/pg_loss"]],
            "kl_loss": [float(v) for v in reported["kl_loss"]],
            "grad_norm": [float(v) for v in reported["grad_norm"]],
            "advantages": {key: float(np.mean(store[key]["advantages"].numpy())) for key in keys},
            "masked": metrics.get("recurrent/credit/earlier_rows_masked"),
        }
    return results


@pytest.fixture(scope="module")
def steps(tiny_model_dir) -> dict[str, dict]:
    assert Path(tiny_model_dir).is_dir()
    return in_a_fresh_process(one_step_per_credit_mode, tiny_model_dir, ["all", "final_same_step", "final_token_mean"])


def test_the_advantages_each_mode_trains_with(steps):
    for mode, step in steps.items():
        for uid, session, _, lengths in TRAJECTORIES:
            for index in range(len(lengths)):
                memory = index < len(lengths) - 1
                expected = 0.0 if memory and mode != "all" else ADVANTAGE[(uid, session)]
                assert step["advantages"][f"{uid}_{session}_{index}"] == pytest.approx(expected), (mode, index)
    memory_rows = sum(len(lengths) - 1 for *_, lengths in TRAJECTORIES)
    assert [steps[mode]["masked"] for mode in steps] == [None, memory_rows, memory_rows]


@pytest.mark.parametrize(
    ("mode", "normalizer", "advantage_sum", "trained"),
    [
        # the paper: every row trained, each update divided by all its rows' tokens
        ("all", ALL_TOKENS, ALL_ADVANTAGE_SUM, ALL_TOKENS),
        # the answers alone trained, still divided by every row's tokens: the answers' step under `all`
        ("final_same_step", ALL_TOKENS, ANSWER_ADVANTAGE_SUM, ANSWER_TOKENS),
        # the answers alone trained and counted: the token-mean of the loss that remains
        ("final_token_mean", ANSWER_TOKENS, ANSWER_ADVANTAGE_SUM, ANSWER_TOKENS),
    ],
)
def test_the_token_count_that_divides_each_update(steps, mode, normalizer, advantage_sum, trained):
    step = steps[mode]
    # one micro-batch per update (token budget 4096): the engine's all-reduced loss_mask sum, as the loss saw it
    assert step["batch_num_tokens"] == normalizer
    # verl's reported policy loss at ratio 1: -sum(advantage x tokens trained) / that count
    expected = [-total / count for total, count in zip(advantage_sum, normalizer, strict=True)]
    assert step["pg_loss"] == pytest.approx(expected, rel=1e-5, abs=1e-7)
    # the KL term on the tokens trained (response_mask) only, over the same count: a memory row whose response_mask
    # were kept under a final_* mode would add its tokens' KL although it carries no advantage
    kl = [KL_PER_TOKEN * tokens / count for tokens, count in zip(trained, normalizer, strict=True)]
    assert step["kl_loss"] == pytest.approx(kl, rel=1e-4)


def test_the_answer_step_is_larger_by_the_ratio_of_token_counts(steps):
    # same rows trained, same weights: only the divisor differs, so the gradients differ by all / answer tokens
    token_mean, same_step = steps["final_token_mean"]["grad_norm"], steps["final_same_step"]["grad_norm"]
    ratios = [t / s for t, s in zip(token_mean, same_step, strict=True)]
    assert ratios == pytest.approx([a / b for a, b in zip(ALL_TOKENS, ANSWER_TOKENS, strict=True)], rel=1e-4)


def test_the_switch_names_its_variant():
    from omegaconf import OmegaConf

    from verl_ext.settings import recurrent_settings

    def credit_mode(config):
        return recurrent_settings(config).credit

    def config(**recurrent):
        return OmegaConf.create({"recurrent": recurrent})

    assert credit_mode(config()) == "all"  # the paper's
    assert credit_mode(config(credit="final_same_step", minibatch="rows")) == "final_same_step"
    assert credit_mode(config(credit="final_token_mean")) == "final_token_mean"
    # the old name meant final_same_step; it is refused so that a run says which of the two it is
    with pytest.raises(ValueError, match="final_same_step .* final_token_mean"):
        credit_mode(config(credit="final"))
    # an update without an answer row would divide 0 by 0: only whole-trajectory updates are accepted
    for minibatch in ("rows", "turn_major"):
        with pytest.raises(ValueError, match="recurrent.minibatch=trajectory"):
            credit_mode(config(credit="final_token_mean", minibatch=minibatch))
