"""Training metrics per trajectory (final answers only, turns, memory), on rows stored the way verl's worker
stores them; and DAPO group filtering in verl's replay buffer on such rows (whole trajectory groups)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1 import replay_buffer as rb_module
from verl.trainer.ppo.v1.trainer_base import PPOTrainer
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from verl_ext import trainer as trainer_module
from verl_ext.metrics import trajectory_metrics, trajectory_metrics_from_rows

# (uid, session, final reward, [(kind, response length, finish reason), ...]) -- as the memory agent writes them
TRAJECTORIES = [
    ("uidA", 0, 1.0, [("memory", 8, "length"), ("memory", 5, "stop"), ("final", 3, "stop")]),
    ("uidA", 1, 0.0, [("final", 6, "length")]),  # empty document: the answer only
    ("uidB", 0, 0.0, [("memory", 8, "length"), ("memory", 8, "length"), ("memory", 2, "stop"), ("final", 4, "stop")]),
    ("uidB", 1, 1.0, [("memory", 7, "stop"), ("final", 2, "stop")]),
]


def stored_rows(trajectories, shaping: float = 0.0) -> tuple[list[str], list[dict]]:
    """Rows as verl's V1 worker stores them: the final reward at every row's last token, the reward info copied."""
    keys, rows = [], []
    for uid, session, acc, turns in trajectories:
        reward = acc + shaping
        for index, (kind, length, finish) in enumerate(turns):
            rm = torch.zeros(length)
            rm[-1] = reward
            keys.append(f"{uid}_{session}_{index}")
            rows.append(
                {
                    "responses": torch.arange(length),
                    "rm_scores": rm,
                    "extra_fields": {
                        "turn_kind": kind,
                        "finish_reason": finish,
                        "reward_extra_info": {"acc": acc, "memory_turns": len(turns) - 1},
                    },
                }
            )
    return keys, rows


def test_metrics_by_hand():
    keys, rows = stored_rows(TRAJECTORIES, shaping=-0.25)  # e.g. an overlong penalty: reward != acc
    metrics = trajectory_metrics_from_rows(keys, list_of_dict_to_tensordict(rows))
    assert metrics["recurrent/final/reward/mean"] == pytest.approx((0.75 - 0.25 - 0.25 + 0.75) / 4)
    assert metrics["recurrent/final/acc/mean"] == pytest.approx(0.5)  # the verifier's verdict, per trajectory
    assert metrics["recurrent/final/response_length/mean"] == pytest.approx((3 + 6 + 4 + 2) / 4)
    assert metrics["recurrent/final/truncated_ratio"] == pytest.approx(1 / 4)
    assert metrics["recurrent/turns_per_sample/mean"] == pytest.approx((3 + 1 + 4 + 2) / 4)
    assert (metrics["recurrent/turns_per_sample/max"], metrics["recurrent/turns_per_sample/min"]) == (4, 1)
    memory = [8, 5, 8, 8, 2, 7]
    assert metrics["recurrent/calls/memory/length/mean"] == pytest.approx(sum(memory) / len(memory))
    assert metrics["recurrent/calls/memory/length/max"] == 8
    assert metrics["recurrent/calls/memory/truncated_ratio"] == pytest.approx(3 / 6)  # memory turns cut at their cap
    assert metrics["recurrent/num_trajectories"] == 4
    # Row order does not matter (rows are balanced across ranks, never in session order).
    order = [5, 0, 9, 2, 7, 1, 4, 8, 3, 6]
    shuffled = trajectory_metrics(
        [keys[i] for i in order],
        [len(rows[i]["responses"]) for i in order],
        [float(rows[i]["rm_scores"].sum()) for i in order],
        [rows[i]["extra_fields"] for i in order],
    )
    assert shuffled == pytest.approx(metrics)


def test_rows_of_equal_length():
    keys, rows = stored_rows([("uidA", 0, 1.0, [("memory", 4, "length"), ("final", 4, "stop")])])
    metrics = trajectory_metrics_from_rows(keys, list_of_dict_to_tensordict(rows))  # a dense tensor, not nested
    assert metrics["recurrent/final/reward/mean"] == 1.0 and metrics["recurrent/calls/memory/length/mean"] == 4


def test_trainer_adds_them_without_the_padding_rows(monkeypatch):
    keys, rows = stored_rows(TRAJECTORIES)
    store = dict(zip(keys, rows, strict=True))
    pad_key = "pad00ff_0_0"
    store[pad_key] = {"responses": torch.tensor([0]), "rm_scores": torch.zeros(1), "extra_fields": {}}

    def kv_batch_get(keys, partition_id, select_fields):
        assert pad_key not in keys and partition_id == "train"
        return list_of_dict_to_tensordict([{f: store[k][f] for f in select_fields} for k in keys])

    monkeypatch.setattr(PPOTrainer, "_compute_metrics", lambda self, *args, **kwargs: None)  # verl's own part
    monkeypatch.setattr(trainer_module.tq, "kv_batch_get", kv_batch_get)
    batch = KVBatchMeta(keys=[*keys, pad_key], tags=[{} for _ in keys] + [{"is_padding": True}], partition_id="train")
    metrics: dict = {}
    trainer = object.__new__(trainer_module.RecurrentPPOTrainer)
    trainer.config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": 2}}})
    trainer_module.RecurrentPPOTrainer._compute_metrics(trainer, batch, metrics, {}, 1, 0)
    # By hand, from TRAJECTORIES (no shaping; the padding row would add a fifth trajectory of reward 0):
    # finals uidA_0 1.0 (3 tokens, stop), uidA_1 0.0 (6, length), uidB_0 0.0 (4, stop), uidB_1 1.0 (2, stop);
    # turns 3, 1, 4, 2; memory turns 8 L, 5, 8 L, 8 L, 2, 7 (L: cut at the cap).
    assert metrics == pytest.approx(
        {
            "recurrent/final/reward/mean": 0.5,
            "recurrent/final/acc/mean": 0.5,
            "recurrent/final/response_length/mean": (3 + 6 + 4 + 2) / 4,
            "recurrent/final/truncated_ratio": 1 / 4,
            "recurrent/turns_per_sample/mean": (3 + 1 + 4 + 2) / 4,
            "recurrent/turns_per_sample/max": 4,
            "recurrent/turns_per_sample/min": 1,
            "recurrent/num_trajectories": 4,
            "recurrent/calls/memory/length/mean": (8 + 5 + 8 + 8 + 2 + 7) / 6,
            "recurrent/calls/memory/length/max": 8,
            "recurrent/calls/memory/truncated_ratio": 3 / 6,
            "recurrent/rollout/failed_groups": 0,
            "recurrent/rollout/failed_trajectories": 0,
        }
    )


@pytest.mark.parametrize("metric", ["acc", "reward"])
def test_dapo_filters_whole_trajectory_groups(monkeypatch, metric):
    # uidA: rewards 1, 0 (signal: kept); uidS: all solved; uidN: none solved (no signal: evicted and refilled).
    # fmt: off
    trajectories = [*TRAJECTORIES[:2],
                    ("uidS", 0, 1.0, [("memory", 3, "stop"), ("final", 2, "stop")]),
                    ("uidS", 1, 1.0, [("memory", 3, "stop"), ("memory", 3, "stop"), ("final", 2, "stop")]),
                    ("uidN", 0, 0.0, [("final", 2, "stop")]),
                    ("uidN", 1, 0.0, [("memory", 4, "stop"), ("final", 2, "stop")])]
    # fmt: on
    keys, rows = stored_rows(trajectories)
    store = dict(zip(keys, rows, strict=True))

    def kv_batch_get(keys, partition_id, select_fields):
        return list_of_dict_to_tensordict([{f: store[k][f] for f in select_fields} for k in keys])

    monkeypatch.setattr(rb_module.tq, "kv_batch_get", kv_batch_get)
    buffer = rb_module.ReplayBuffer(
        trainer_mode="sync",
        trainer_config={},
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs={},
        refill_fn=lambda n: None,
        filter_groups_metric=metric,
        train_batch_size=3,
        gen_batch_size=1,
    )
    buffer.partitions["train"] = {key: {"status": "success"} for key in keys}
    buffer.finished_keys["train"] = {"uidA", "uidS", "uidN"}
    evicted, counts = buffer._dapo_filtered_keys("train")
    assert evicted == {"uidS", "uidN"}
    assert counts == {1.0: 1, 0.0: 1}
