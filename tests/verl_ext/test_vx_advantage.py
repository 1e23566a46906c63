"""verl's own multi-trajectory GRPO (``compute_advantage_for_multi_trajectories``, verl/trainer/ppo/v1/utils.py)
on rows shaped like ours, against advantages worked out by hand.

The rows are what the trainer hands it (``trainer_base.py:1743-1801``): keys ``{uid}_{session}_{index}``,
``response_mask`` and ``token_level_rewards`` (the rm_scores: each trajectory's reward at the last valid
token of every one of its rows), the prompt ``uid`` per row, in a shuffled order (rows are balanced across
ranks by length), plus verl's synthetic padding rows (their own ``pad...`` uid, all-zero mask and reward).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

WIDTH = 6  # padded response width

# (uid, session, reward, valid response lengths of its rows: memory turns..., final answer)
TRAJECTORIES = [
    ("uidA", 0, 1.0, [6, 3, 2]),  # two memory turns, then the answer
    ("uidA", 1, 0.0, [4]),  # an empty document: the answer only
    ("uidA", 2, 1.0, [5, 1]),
    ("uidB", 0, 1.0, [2, 6, 6, 3]),
    ("uidB", 1, 0.0, [1, 2]),
    ("uidC", 0, 1.0, [3, 4]),  # a group of one (rollout.n = 1)
]
PAD_UID = "pad0123abcd"
PADDING = [(PAD_UID, 0, 0.0, [1]), (PAD_UID, 1, 0.0, [1])]  # verl's upsampling rows, mask zeroed below

# By hand. Group means: A (1 + 0 + 1) / 3 = 2/3, B (1 + 0) / 2 = 1/2; a group of one has mean 0, std 1
# (as in the fork: its advantage is the raw reward).
# Unbiased stds: A sqrt(((1/3)^2 + (2/3)^2 + (1/3)^2) / 2) = sqrt(1/3); B sqrt((1/2)^2 * 2 / 1) = sqrt(1/2).
EPS = 1e-6
NO_STD = {
    ("uidA", 0): 1 / 3,
    ("uidA", 1): -2 / 3,
    ("uidA", 2): 1 / 3,
    ("uidB", 0): 0.5,
    ("uidB", 1): -0.5,
    ("uidC", 0): 1.0,
    (PAD_UID, 0): 0.0,
    (PAD_UID, 1): 0.0,
}
# fmt: off
WITH_STD = {("uidA", 0): (1 / 3) / (math.sqrt(1 / 3) + EPS), ("uidA", 1): (-2 / 3) / (math.sqrt(1 / 3) + EPS),
            ("uidA", 2): (1 / 3) / (math.sqrt(1 / 3) + EPS), ("uidB", 0): 0.5 / (math.sqrt(0.5) + EPS),
            ("uidB", 1): -0.5 / (math.sqrt(0.5) + EPS), ("uidC", 0): 1.0 / (1.0 + EPS),
            (PAD_UID, 0): 0.0, (PAD_UID, 1): 0.0}
# fmt: on


def build_rows(seed: int = 0) -> tuple[DataProto, list[str], list[tuple[str, int]]]:
    keys, masks, rewards, uids, owners = [], [], [], [], []
    for uid, session, reward, lengths in TRAJECTORIES + PADDING:
        for index, length in enumerate(lengths):
            mask = torch.zeros(WIDTH, dtype=torch.long)
            rm = torch.zeros(WIDTH)
            if uid != PAD_UID:
                mask[:length] = 1
                rm[length - 1] = reward  # the trajectory's reward, copied to every row at its last token
            keys.append(f"{uid}_{session}_{index}")
            masks.append(mask)
            rewards.append(rm)
            uids.append(uid)
            owners.append((uid, session))
    order = np.random.default_rng(seed).permutation(len(keys))  # balance_batch reorders rows
    data = DataProto.from_dict(
        tensors={"response_mask": torch.stack(masks)[order], "token_level_rewards": torch.stack(rewards)[order]},
        non_tensors={"uid": np.array(uids, dtype=object)[order]},
    )
    return data, [keys[i] for i in order], [owners[i] for i in order]


@pytest.mark.parametrize(("norm_by_std", "expected"), [(False, NO_STD), (True, WITH_STD)], ids=["paper", "std"])
def test_every_token_of_every_turn_gets_its_trajectorys_advantage(norm_by_std, expected):
    data, keys, owners = build_rows()
    mask = data.batch["response_mask"].clone()
    out = compute_advantage_for_multi_trajectories(
        data, batch_keys=keys, adv_estimator="grpo", norm_adv_by_std_in_grpo=norm_by_std
    )
    advantages = out.batch["advantages"]
    for row, owner in enumerate(owners):
        want = torch.tensor(expected[owner], dtype=torch.float32) * mask[row]
        torch.testing.assert_close(advantages[row], want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.batch["returns"], advantages)
    padding = [row for row, owner in enumerate(owners) if owner[0] == PAD_UID]
    assert padding and not advantages[padding].any()  # padding rows get none
