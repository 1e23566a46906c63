"""Actor settings that would undo the paper's mini-batches: honoured or refused (verl_ext/minibatch.py).

The honoured ones are checked where verl 0.9.1 consumes them: a laid-out step goes through verl's own
``make_iterator`` (the worker's mini-batches, ``train_mini_batch``) and ``prepare_micro_batches`` (the engine's
micro-batches). The refused ones are checked in the preflight, which runs before Ray starts.

The step used throughout, worked by hand: prompts ``p`` and ``q``, two sessions each, 9 rows (positions 0-8):
trajectory ``p_0`` has 2 rows, ``p_1`` 3, ``q_0`` 2, ``q_1`` 2; 2 updates (the paper's count for this size),
2 ranks. In ``trajectory`` mode update 0 is ``p_0 + p_1`` (positions 0-4), update 1 is ``q_0 + q_1`` (5-8).
Rows are dealt longest first to the rank with fewer rows, ties to fewer tokens, then rank 0:

- update 0: p_1_0(30)->r0, p_1_1(20)->r1, p_0_0(10)->r1 (20 < 30 tokens), p_1_2(5)->r0 (1 row < 2),
  p_0_1(4)->r1 (2 rows each, 30 < 35 tokens): r0 holds positions [2, 4], r1 [0, 1, 3];
- update 1: q_1_0(12)->r0, q_0_0(8)->r1, q_0_1(6)->r1 (8 < 12), q_1_1(3)->r0: r0 [7, 8], r1 [5, 6].

The largest share is 3 rows, so a slot is 3 rows with token-budget micro-batches.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.workers.engine.utils import prepare_micro_batches
from vx_helpers import TINY_BUDGETS, compose_config

from verl_ext.minibatch import (
    ActorSettings,
    Row,
    actor_setting_problems,
    actor_settings,
    check_updates_made,
    plan_minibatches,
)
from verl_ext.preflight import PreflightError, preflight

# fmt: off
STEP = [
    Row("p_0_0", 10), Row("p_0_1", 4),
    Row("p_1_0", 30), Row("p_1_1", 20), Row("p_1_2", 5),
    Row("q_0_0", 8), Row("q_0_1", 6),
    Row("q_1_0", 12), Row("q_1_1", 3),
]
# fmt: on
UPDATE_OF = {0: 0, 1: 0, 2: 0, 3: 0, 4: 0, 5: 1, 6: 1, 7: 1, 8: 1}
PAD = -1  # a padding row, in the tensors handed to verl
STATIC = (
    "actor_rollout_ref.actor.use_dynamic_bsz=false",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
)


def config(*overrides: str):
    return compose_config("memagent_7b", list(overrides))


def shards(plan) -> list[TensorDict]:
    """What each rank receives: verl's dispatch hands rank r the r-th of dp equal contiguous parts of the batch."""
    rows = torch.tensor([PAD if p is None else p for p in plan.order])
    size = len(rows) // plan.dp_size
    return [TensorDict({"row": rows[r * size : (r + 1) * size]}, batch_size=[size]) for r in range(plan.dp_size)]


def worker_minibatches(plan, shard: TensorDict, rank: int, epochs: int, shuffle: bool) -> list[TensorDict]:
    """The mini-batches verl 0.9.1's ``train_mini_batch`` iterates over on one rank: ``mini_batch_size`` (what the
    trainer sends: the plan's rows per mini-batch) over the data-parallel size, cut by verl's ``make_iterator`` with
    the ``epochs``, seed and ``dataloader_kwargs`` that ``_update_actor`` sends."""
    per_gpu = plan.minibatch_rows // plan.dp_size
    batches = tu.make_iterator(
        shard, mini_batch_size=per_gpu, epochs=epochs, seed=42 + rank, dataloader_kwargs={"shuffle": shuffle}
    )
    return list(batches)


def micro_batches(data: TensorDict, micro: int) -> list[list[int]]:
    """verl's engine split of ``data`` into static micro-batches of ``micro`` rows (``use_dynamic_bsz=false``)."""
    data = data.clone()
    tu.assign_non_tensor(data, use_dynamic_bsz=False, micro_batch_size_per_gpu=micro)
    micro_batches_, _ = prepare_micro_batches(data)
    return [m["row"].tolist() for m in micro_batches_]


# ---- use_dynamic_bsz=false: honoured, slots rounded up with padding rows ----


def test_static_micro_batch_sizes_round_the_slots():
    settings = actor_settings(config(*STATIC))
    # Update micro-batches of 2 rows, log-prob micro-batches of 4: every slot a multiple of lcm(2, 4, 4) = 4.
    assert settings == ActorSettings(epochs=1, row_multiple=4)
    plan = plan_minibatches(STEP, 2, 2, "trajectory", settings.row_multiple, settings.epochs)
    assert plan.slot_rows == 4 and plan.minibatch_rows == 8 and plan.num_padding == 16 - 9
    # fmt: off
    assert plan.order == [
        2, 4, None, None,     # rank 0, update 0
        7, 8, None, None,     # rank 0, update 1
        0, 1, 3, None,        # rank 1, update 0
        5, 6, None, None,     # rank 1, update 1
    ]
    # fmt: on


def test_static_micro_batch_sizes_round_turn_major_slots():
    # Turn-major order: memory turn 0 of p_0, p_1, q_0, q_1 (positions 0, 2, 5, 7), turn 1 of p_1 (3), then the
    # answers (1, 4, 6, 8). 9 rows over 2 ranks: 5 + 4; rank 0's [0, 2, 5 | 7, 3], rank 1's [1, 4 | 6, 8].
    plan = plan_minibatches(STEP, 2, 2, "turn_major", row_multiple=4)
    assert plan.slot_rows == 4
    # fmt: off
    assert plan.order == [
        0, 2, 5, None,        # rank 0, update 0
        7, 3, None, None,     # rank 0, update 1
        1, 4, None, None,     # rank 1, update 0
        6, 8, None, None,     # rank 1, update 1
    ]
    # fmt: on


def test_static_micro_batches_where_verl_cuts_them():
    settings = actor_settings(config(*STATIC))
    plan = plan_minibatches(STEP, 2, 2, "trajectory", settings.row_multiple, settings.epochs)
    rank0, rank1 = shards(plan)
    # The old-log-prob and reference passes cut each rank's whole shard into micro-batches of 4 rows.
    assert micro_batches(rank0, 4) == [[2, 4, PAD, PAD], [7, 8, PAD, PAD]]
    assert micro_batches(rank1, 4) == [[0, 1, 3, PAD], [5, 6, PAD, PAD]]
    # The actor update: one mini-batch per update on each rank, each cut into micro-batches of 2 rows.
    got = [
        [micro_batches(mb, 2) for mb in worker_minibatches(plan, shard, r, 1, False)]
        for r, shard in enumerate(shards(plan))
    ]
    assert got == [
        [[[2, 4], [PAD, PAD]], [[7, 8], [PAD, PAD]]],
        [[[0, 1], [3, PAD]], [[5, 6], [PAD, PAD]]],
    ]


def test_coprime_micro_batch_sizes_round_to_their_least_common_multiple():
    # Update micro-batches of 2 rows, log-prob micro-batches of 3: a slot must hold a multiple of both, so 6 rows
    # (the larger size, 3, is not a multiple of 2; 4 is not a multiple of 3).
    sizes = (
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=3",
    )
    settings = actor_settings(config(*sizes))
    assert settings == ActorSettings(epochs=1, row_multiple=6)
    plan = plan_minibatches(STEP, 2, 2, "trajectory", settings.row_multiple, settings.epochs)
    assert plan.slot_rows == 6
    # What verl cuts with those sizes, and asserts divides: each rank's shard in micro-batches of 3 rows (the
    # log-prob passes), each update's share in micro-batches of 2 rows.
    for r, shard in enumerate(shards(plan)):
        assert [len(m) for m in micro_batches(shard, 3)] == [3, 3, 3, 3]
        for minibatch in worker_minibatches(plan, shard, r, 1, False):
            assert [len(m) for m in micro_batches(minibatch, 2)] == [2, 2, 2]


def test_without_rounding_verl_stops_at_the_first_update():
    # Token-budget micro-batches: slots of 3 rows. Cut into micro-batches of 2 rows, verl's engine asserts.
    plan = plan_minibatches(STEP, 2, 2, "trajectory")
    assert plan.slot_rows == 3
    first = worker_minibatches(plan, shards(plan)[0], 0, 1, False)[0]
    assert first["row"].tolist() == [2, 4, PAD]
    with pytest.raises(AssertionError, match="divisible by force_group_size \\* micro_batch_size_per_gpu"):
        micro_batches(first, 2)


def test_static_micro_batch_sizes_must_be_set():
    problems = actor_setting_problems(config("actor_rollout_ref.actor.use_dynamic_bsz=false"))
    # verl's engine worker reads only the *_per_gpu sizes; the 7B run uses a reference policy (KL loss): three.
    assert [p.split(" needs ")[0] for p in problems] == [
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=false",
    ]
    assert "needs actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" in problems[0]
    assert "which is unset" in problems[0] and "use_dynamic_bsz=true" in problems[0]
    # Token budgets (the paper's setting) need none of them.
    assert actor_settings(config()) == ActorSettings(epochs=1, row_multiple=1)


# ---- ppo_epochs > 1: honoured, counted as epochs x updates ----


def test_epochs_repeat_every_minibatch_and_are_counted():
    settings = actor_settings(config("actor_rollout_ref.actor.ppo_epochs=2"))
    assert settings == ActorSettings(epochs=2, row_multiple=1)
    plan = plan_minibatches(STEP, 2, 2, "trajectory", settings.row_multiple, settings.epochs)
    assert (plan.num_minibatches, plan.epochs, plan.updates) == (2, 2, 4)
    # verl's worker: 2 epochs over the same 2 mini-batches, in order; each still holds one update's rows only.
    got = [
        [mb["row"].tolist() for mb in worker_minibatches(plan, shard, r, 2, False)]
        for r, shard in enumerate(shards(plan))
    ]
    assert got == [
        [[2, 4, PAD], [7, 8, PAD], [2, 4, PAD], [7, 8, PAD]],
        [[0, 1, 3], [5, 6, PAD], [0, 1, 3], [5, 6, PAD]],
    ]
    # The trainer's check after update_actor: 4 grad norms reported are right, 2 (one epoch) are not.
    check_updates_made(plan, 4)
    check_updates_made(plan, None)
    with pytest.raises(RuntimeError, match=r"made 2 optimizer updates instead of 4 \(2 mini-batches x 2 epochs\)"):
        check_updates_made(plan, 2)


def test_plan_prints_epochs_times_updates(capsys):
    from verl_ext.plan import compose, main, plan_step

    plan = plan_step(compose("memagent_7b", ["actor_rollout_ref.actor.ppo_epochs=2"]), 28_000, 80)
    # 16 mini-batches x 2 epochs; each update still 8 prompts x 16 trajectories x 7 rows; verl's rows: 112 x 2.
    assert (plan.epochs, plan.updates, plan.rows_per_update, plan.verl_row_updates) == (2, 32, 896, 224)
    main(["--config-name", "memagent_7b", "--no-cost", "actor_rollout_ref.actor.ppo_epochs=2"])  # the plan's lines
    printed = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert {k.strip(): v for k, v in printed.items() if k.strip() in ("epochs", "updates")} == {
        "epochs": "2",
        "updates": "32",
    }


def test_epochs_below_one_are_refused():
    problems = actor_setting_problems(config("actor_rollout_ref.actor.ppo_epochs=0"))
    assert problems == [
        "actor_rollout_ref.actor.ppo_epochs=0: verl's worker would make no optimizer update; set it to 1 "
        "(the paper) or more"
    ]


# ---- shuffle=true: refused in trajectory and turn_major ----


def test_verl_shuffle_mixes_the_updates():
    # Why it is refused: verl's make_iterator permutes each rank's rows before cutting them into mini-batches.
    # The count stays 2 per rank (the trainer's update check cannot see it); what each update holds does not.
    plan = plan_minibatches(STEP, 2, 2, "trajectory")
    mixed = 0
    for r, shard in enumerate(shards(plan)):
        minibatches = worker_minibatches(plan, shard, r, 1, True)
        assert len(minibatches) == 2
        for mb in minibatches:
            mixed += len({UPDATE_OF[p] for p in mb["row"].tolist() if p != PAD}) > 1
    assert mixed > 0


@pytest.mark.parametrize("mode", ["trajectory", "turn_major"])
def test_shuffle_is_refused_where_rows_are_laid_out(mode):
    problems = actor_setting_problems(config("actor_rollout_ref.actor.shuffle=true", f"recurrent.minibatch={mode}"))
    assert len(problems) == 1
    assert problems[0].startswith(f"actor_rollout_ref.actor.shuffle=true with recurrent.minibatch={mode}: ")
    assert "set actor_rollout_ref.actor.shuffle=false" in problems[0] and "recurrent.minibatch=rows" in problems[0]
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.shuffle=true"):
        actor_settings(config("actor_rollout_ref.actor.shuffle=true", f"recurrent.minibatch={mode}"))


def test_shuffle_is_verls_business_with_row_counting():
    assert actor_setting_problems(config("actor_rollout_ref.actor.shuffle=true", "recurrent.minibatch=rows")) == []


def test_refused_settings_stop_the_run_in_the_preflight(tmp_path, tiny_model_dir):
    # The preflight runs on the launching machine before Ray starts (verl_ext/main.py), so before the first
    # step.
    row = {
        "prompt": [{"role": "user", "content": "What is the magic number?"}],
        "context": "The magic number is 42.",
        "data_source": "hotpotqa",
        "reward_model": {"ground_truth": "42", "style": "rule"},
    }
    data = str(tmp_path / "train.parquet")
    pd.DataFrame([row]).to_parquet(data)
    paths = [f"data.train_files={data}", f"data.val_files={data}", f"actor_rollout_ref.model.path={tiny_model_dir}"]
    good = compose_config("tiny_cpu", [*TINY_BUDGETS, *paths])
    preflight(good, load_tokenizer=False)
    bad = compose_config(
        "tiny_cpu",
        [*TINY_BUDGETS, *paths, "actor_rollout_ref.actor.shuffle=true", "actor_rollout_ref.actor.ppo_epochs=0"],
    )
    with pytest.raises(PreflightError) as err:
        preflight(bad, load_tokenizer=False)
    message = str(err.value)
    assert "actor_rollout_ref.actor.shuffle=true with recurrent.minibatch=trajectory" in message
    assert "actor_rollout_ref.actor.ppo_epochs=0" in message
