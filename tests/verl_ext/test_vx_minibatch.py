"""The paper's optimizer updates per step (verl_ext/minibatch.py), worked by hand on small steps.

The step used throughout: prompts ``a`` and ``b``, two sessions each; trajectory ``a_0`` has 3 rows (2 memory
turns + the answer), ``a_1`` 2, ``b_0`` 2, ``b_1`` 4: 11 rows. They arrive shuffled, as rows arrive from the
replay buffer (in the order their trajectories finished).
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl_ext.minibatch import Row, minibatch_mode, plan_minibatches, spread_over_ranks, updates_per_step

# fmt: off
LENGTHS = {
    "a_0_0": 10, "a_0_1": 20, "a_0_2": 5,
    "a_1_0": 30, "a_1_1": 8,
    "b_0_0": 7, "b_0_1": 9,
    "b_1_0": 40, "b_1_1": 11, "b_1_2": 12, "b_1_3": 6,
}
# fmt: on
ARRIVAL = ["b_1_2", "a_0_0", "a_1_1", "b_0_0", "a_0_2", "b_1_0", "a_1_0", "b_0_1", "a_0_1", "b_1_3", "b_1_1"]
ROWS = [Row(key, LENGTHS[key]) for key in ARRIVAL]


def keys(positions):
    return [None if p is None else ARRIVAL[p] for p in positions]


def test_updates_per_step_is_the_papers_count():
    assert updates_per_step(128, 8) == 16  # 7B
    assert updates_per_step(256, 16) == 16  # 14B
    with pytest.raises(ValueError, match="not a multiple"):
        updates_per_step(128, 12)


def test_trajectory_mode_by_hand():
    plan = plan_minibatches(ROWS, num_minibatches=2, dp_size=2, mode="trajectory")
    # Prompts in order of first appearance (b before a: b_1_2 arrived first), sessions in order:
    # update 0 = b_0 + b_1 (6 rows), update 1 = a_0 + a_1 (5 rows).
    # Each update's rows are dealt longest first to the rank with fewer rows, ties to fewer tokens, then rank 0:
    #   update 0: b_1_0(40)->r0, b_1_2(12)->r1, b_1_1(11)->r1 (12 < 40 tokens), b_0_1(9)->r0 (1 row < 2),
    #             b_0_0(7)->r1 (2 rows each, 23 < 49 tokens), b_1_3(6)->r0 (2 rows < 3)
    #   update 1: a_1_0(30)->r0, a_0_1(20)->r1, a_0_0(10)->r1 (20 < 30), a_1_1(8)->r0, a_0_2(5)->r1 (30 < 38)
    # Slots of 3 rows; shares keep arrival order; rank 0's update-1 share gets one padding row.
    assert plan.num_minibatches == 2 and plan.slot_rows == 3 and plan.minibatch_rows == 6
    # fmt: off
    assert keys(plan.order) == [
        "b_1_0", "b_0_1", "b_1_3",  # rank 0, update 0
        "a_1_1", "a_1_0", None,     # rank 0, update 1
        "b_1_2", "b_0_0", "b_1_1",  # rank 1, update 0
        "a_0_0", "a_0_2", "a_0_1",  # rank 1, update 1
    ]
    # fmt: on
    assert plan.num_padding == 1
    by_key = {ARRIVAL[p]: g for p, g in plan.minibatch_of.items()}
    assert {k for k, g in by_key.items() if g == 0} == {"b_0_0", "b_0_1", "b_1_0", "b_1_1", "b_1_2", "b_1_3"}
    assert {k for k, g in by_key.items() if g == 1} == {"a_0_0", "a_0_1", "a_0_2", "a_1_0", "a_1_1"}


def test_turn_major_mode_is_the_forks_cut():
    plan = plan_minibatches(ROWS, num_minibatches=2, dp_size=2, mode="turn_major")
    # Trajectory order b_0, b_1, a_0, a_1. Rounds: memory turn 0 (b_0_0, b_1_0, a_0_0, a_1_0), turn 1 (b_1_1,
    # a_0_1), turn 2 (b_1_2), then the answers (b_0_1, b_1_3, a_0_2, a_1_1). 11 rows over 2 ranks: 6 + 5;
    # rank 0's 6 in two updates of 3, rank 1's 5 in 3 + 2 (+1 padding row).
    # fmt: off
    assert keys(plan.order) == [
        "b_0_0", "b_1_0", "a_0_0",  # rank 0, update 0
        "a_1_0", "b_1_1", "a_0_1",  # rank 0, update 1
        "b_1_2", "b_0_1", "b_1_3",  # rank 1, update 0
        "a_0_2", "a_1_1", None,     # rank 1, update 1
    ]
    # fmt: on
    assert plan.slot_rows == 3 and plan.num_padding == 1


def test_every_row_once_and_each_trajectory_in_one_update():
    # A larger step: 8 prompts x 4 sessions with 2-7 rows each, 4 updates, 3 ranks.
    rows = []
    for prompt in range(8):
        for session in range(4):
            for turn in range(2 + (prompt * 3 + session) % 6):
                rows.append(Row(f"p{prompt}_{session}_{turn}", 50 + (prompt * 7 + session * 5 + turn * 11) % 90))
    plan = plan_minibatches(rows, num_minibatches=4, dp_size=3, mode="trajectory")
    real = [p for p in plan.order if p is not None]
    assert sorted(real) == list(range(len(rows)))
    assert len(plan.order) == 3 * 4 * plan.slot_rows
    trajectories = {}
    for p, g in plan.minibatch_of.items():
        trajectories.setdefault(rows[p].key.rsplit("_", 1)[0], set()).add(g)
    assert all(len(g) == 1 for g in trajectories.values())
    # 32 trajectories in 4 updates: 8 each, i.e. two whole prompts (the paper's ppo_mini_batch_size x n).
    for g in range(4):
        prompts = {rows[p].key.split("_")[0] for p, h in plan.minibatch_of.items() if h == g}
        assert prompts == {f"p{2 * g}", f"p{2 * g + 1}"}
    # The worker cuts each rank's shard into equal slots: slot g of every rank holds only update g's rows.
    for r in range(3):
        shard = plan.order[r * 4 * plan.slot_rows : (r + 1) * 4 * plan.slot_rows]
        for g in range(4):
            slot = shard[g * plan.slot_rows : (g + 1) * plan.slot_rows]
            assert {plan.minibatch_of[p] for p in slot if p is not None} <= {g}


# Uneven trajectories: a_0, a_1, b_0, b_1 have 2, 5, 3 and 2 rows. Prompt a holds 7 rows and b 5, so an even cut
# of the 12 rows (6 + 6) would put a_1's first four rows in one update and its last in the other.
# fmt: off
UNEVEN_LENGTHS = {
    "a_0_0": 10, "a_0_1": 4,
    "a_1_0": 30, "a_1_1": 25, "a_1_2": 20, "a_1_3": 15, "a_1_4": 5,
    "b_0_0": 12, "b_0_1": 9, "b_0_2": 3,
    "b_1_0": 8, "b_1_1": 6,
}
# fmt: on
UNEVEN_ARRIVAL = [
    "a_1_3",
    "b_0_0",
    "a_0_0",
    "b_1_1",
    "a_1_0",
    "a_0_1",
    "b_0_2",
    "a_1_4",
    "b_1_0",
    "a_1_1",
    "b_0_1",
    "a_1_2",
]


def test_uneven_trajectories_stay_whole_by_hand():
    rows = [Row(key, UNEVEN_LENGTHS[key]) for key in UNEVEN_ARRIVAL]
    plan = plan_minibatches(rows, num_minibatches=2, dp_size=2, mode="trajectory")
    # Prompt a first (a_1_3 arrived first): update 0 = a_0 + a_1 (7 rows), update 1 = b_0 + b_1 (5 rows).
    updates = {UNEVEN_ARRIVAL[p]: g for p, g in plan.minibatch_of.items()}
    assert updates == {key: 0 if key.startswith("a") else 1 for key in UNEVEN_LENGTHS}
    # Dealt longest first to the rank with fewer rows, ties to fewer tokens, then rank 0:
    #   update 0: a_1_0(30)->r0, a_1_1(25)->r1, a_1_2(20)->r1 (25 < 30 tokens), a_1_3(15)->r0 (1 row < 2),
    #             a_0_0(10)->r0 (45 = 45 tokens: rank 0), a_1_4(5)->r1 (2 rows < 3), a_0_1(4)->r1 (50 < 55)
    #   update 1: b_0_0(12)->r0, b_0_1(9)->r1, b_1_0(8)->r1 (9 < 12), b_1_1(6)->r0, b_0_2(3)->r1 (17 < 18)
    # Slots of 4 rows (rank 1's share of update 0); shares keep arrival order; 4 padding rows.
    assert (plan.num_minibatches, plan.slot_rows, plan.num_padding) == (2, 4, 4)
    # fmt: off
    assert [None if p is None else UNEVEN_ARRIVAL[p] for p in plan.order] == [
        "a_1_3", "a_0_0", "a_1_0", None,     # rank 0, update 0
        "b_0_0", "b_1_1", None, None,        # rank 0, update 1
        "a_0_1", "a_1_4", "a_1_1", "a_1_2",  # rank 1, update 0
        "b_0_2", "b_1_0", "b_0_1", None,     # rank 1, update 1
    ]
    # fmt: on


@pytest.mark.parametrize(
    ("sizes", "num_minibatches", "dp_size"),
    [((2, 5, 3, 2), 2, 1), ((2, 5, 3, 2), 3, 2), ((1, 6, 1, 4, 3, 2, 7, 1), 4, 3), ((3, 1, 4, 1, 5, 9), 2, 2)],
)
def test_uneven_trajectories_each_take_one_update(sizes, num_minibatches, dp_size):
    # Two sessions per prompt; trajectory t has sizes[t] rows, arriving turn-interleaved across trajectories.
    names = [f"p{t // 2}_{t % 2}" for t in range(len(sizes))]
    rows = [
        Row(f"{names[t]}_{turn}", 7 + 3 * t + turn)
        for turn in range(max(sizes))
        for t, n in enumerate(sizes)
        if turn < n
    ]
    plan = plan_minibatches(rows, num_minibatches, dp_size, "trajectory")
    assert sorted(p for p in plan.order if p is not None) == list(range(len(rows)))
    by_trajectory = {}
    for p, g in plan.minibatch_of.items():
        by_trajectory.setdefault(rows[p].key.rsplit("_", 1)[0], set()).add(g)
    assert all(len(g) == 1 for g in by_trajectory.values()), by_trajectory
    # Whole trajectories in order, as evenly as trajectories go: with 4 trajectories in 3 updates, 2 + 1 + 1.
    expected = []
    for g in range(num_minibatches):
        count = len(sizes) // num_minibatches + (g < len(sizes) % num_minibatches)
        expected += [g] * count
    assert [by_trajectory[name].pop() for name in names] == expected
    # What the worker cuts: slot g of every rank's shard holds rows of update g only.
    for r in range(dp_size):
        shard = plan.order[r * num_minibatches * plan.slot_rows : (r + 1) * num_minibatches * plan.slot_rows]
        for g in range(num_minibatches):
            slot = shard[g * plan.slot_rows : (g + 1) * plan.slot_rows]
            assert {plan.minibatch_of[p] for p in slot if p is not None} <= {g}


def test_fewer_trajectories_than_updates():
    rows = [Row("u_0_0", 5), Row("u_0_1", 3)]
    plan = plan_minibatches(rows, num_minibatches=16, dp_size=2, mode="trajectory")
    # One trajectory: one update (not 16, 15 of them on padding alone); its two rows on the two ranks.
    assert plan.num_minibatches == 1 and plan.order == [0, 1] and plan.slot_rows == 1


def test_spread_keeps_row_counts_within_one():
    rows = [Row(f"u_0_{i}", length) for i, length in enumerate([100, 1, 1, 1, 1, 1])]
    shares = spread_over_ranks(range(6), rows, 2)
    # Length alone would put the five short rows on one rank; the slots must stay equal for the worker.
    assert sorted(len(s) for s in shares) == [3, 3]


def test_mode_is_read_from_the_config_and_checked():
    assert minibatch_mode(OmegaConf.create({"recurrent": {}})) == "trajectory"
    assert minibatch_mode(OmegaConf.create({"recurrent": {"minibatch": "rows"}})) == "rows"
    with pytest.raises(ValueError, match="recurrent.minibatch"):
        minibatch_mode(OmegaConf.create({"recurrent": {"minibatch": "prompts"}}))


@pytest.mark.parametrize(("name", "prompts", "mini"), [("memagent_7b", 128, 8), ("memagent_14b", 256, 16)])
def test_plan_of_the_paper_runs(name, prompts, mini):
    from verl_ext.plan import compose, plan_step

    plan = plan_step(compose(name, []), context_tokens=28_000, gpu_memory_gib=80)
    # 28K tokens in chunks of 5,000: 6 memory turns + the answer = 7 rows; n = 16 trajectories per prompt.
    assert (plan.trajectories, plan.rows_per_trajectory, plan.rows) == (prompts * 16, 7, prompts * 16 * 7)
    assert (plan.minibatch, plan.updates, plan.rows_per_update) == ("trajectory", 16, mini * 16 * 7)
    assert plan.verl_row_updates == 112  # verl's count: rows / (mini x 16) = 7 x 16
    # vLLM takes 0.6 x 80 GiB while generating and for the weight sync, nothing while the actor trains.
    assert plan.rollout_gib_by_phase == {
        "generation": 48.0,
        "old_log_prob": 0.0,
        "ref": 0.0,
        "update_actor": 0.0,
        "update_weights": 48.0,
    }
    kept = plan_step(compose(name, ["actor_rollout_ref.rollout.free_cache_engine=false"]), 28_000, 80)
    assert set(kept.rollout_gib_by_phase.values()) == {48.0}


def test_failure_metrics_count_lost_trajectories_by_hand():
    from verl_ext.trainer import failure_metrics

    # Prompt x lost session 1 (sessions 0 and 2 stored rows), prompt y lost everything, z is fine; n = 3.
    keys = ["x_0_0", "x_0_1", "x_2_0", "x_2_1", "z_0_0", "z_1_0", "z_2_0"]
    assert failure_metrics(keys, {"x", "y"}, n=3) == {
        "recurrent/rollout/failed_groups": 2,
        "recurrent/rollout/failed_trajectories": 1 + 3,
    }


def test_optimizer_updates_read_from_the_actor_report():
    from verl_ext.trainer import optimizer_updates

    assert optimizer_updates({"grad_norm": [0.5, 0.25], "pg_loss": [0.1, 0.2, 0.3, 0.4]}) == 2
    assert optimizer_updates({"pg_loss": 0.1}) is None


def test_earlier_rows_are_all_but_each_trajectorys_last():
    from verl_ext.settings import recurrent_settings
    from verl_ext.trainer import earlier_row_keys

    keys = ["u_0_0", "u_0_1", "u_0_2", "u_1_0", "v_0_1", "v_0_0", "pad9_0_0"]
    tags = [{}] * 6 + [{"is_padding": True}]
    assert earlier_row_keys(keys, tags) == ["u_0_0", "u_0_1", "v_0_0"]
    assert recurrent_settings(OmegaConf.create({"recurrent": {}})).credit == "all"
    with pytest.raises(ValueError, match="recurrent.credit"):
        recurrent_settings(OmegaConf.create({"recurrent": {"credit": "memory"}}))
