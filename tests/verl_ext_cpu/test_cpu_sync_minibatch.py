"""Our trainer end to end on CPU in sync (lockstep) mode, with the paper's optimizer updates per step (issue 10).

Run 1: ``recurrent.mode=sync``, 4 prompts per step, ``rollout.n=2``, ``ppo_mini_batch_size=2`` (so the paper's
count is 4 / 2 = 2 updates per step), documents of 2-4 chunks (trajectories of 3-5 rows), a lockstep validation
after step 2, a checkpoint every step. (Resume, verl's row counting, ``free_cache_engine=false`` and the credit
ablation are checked on the async run, ``test_cpu_memory_trainer.py``: none of them depends on the mode.)

Updates are counted by the optimizer itself: AdamW's ``step`` in the checkpointed optimizer state. The
rollout server (``hf_cpu``, the CPU twin of vLLM's) logs its memory states, showing what verl's sleep/wake
path does with ``free_cache_engine`` on and off.
"""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
from trainer_run import adam_steps, read_jsonl, read_metrics, run_script, tail

RUN_TIMEOUT_S = 480
SIZES = ("actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2")
PROMPTS, N, UPDATES = 4, 2, 2

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("sync_minibatch")
    env = {"MEMAGENT_ROLLOUT_EVENTS": str(out / "events")}
    (out / "events").mkdir()
    # one validation (after step 2) is enough to show lockstep validation; the async run validates every step
    overrides = ("recurrent.mode=sync", "trainer.val_before_train=false", "trainer.test_freq=2", *SIZES)
    first = run_script(out, steps=2, task="memory", timeout_s=RUN_TIMEOUT_S, overrides=overrides, extra_env=env)
    assert first[0] == 0, tail(first[1])
    metrics_first = read_metrics(out / "metrics.jsonl")
    events_first = {p.name: read_jsonl(p) for p in sorted((out / "events").glob("*.jsonl"))}
    return {
        "out": out,
        "first": first,
        "metrics_first": metrics_first,
        "events_first": events_first,
    }


def by_trajectory(rows: list[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if not row["is_padding"]:
            grouped[row["trajectory"]].append(row)
    return {key: sorted(value, key=lambda r: r["turn_index"]) for key, value in grouped.items()}


def test_sync_mode_trains_validates_and_checkpoints(runs):
    output, metrics = runs["first"][1], runs["metrics_first"]
    # lockstep rollouts: the whole batch (4 prompts x 2) per training step, 2 x 2 per validation
    assert re.search(r"\[memagent\] lockstep: 8 trajectories in [45] rounds, 0 failed", output), tail(output)
    assert re.search(r"\[memagent\] step 1: reward=", output) and re.search(r"\[memagent\] step 2: reward=", output)
    assert sorted(metrics) == [1, 2]
    assert "val-core/toy_memory/acc/mean@2" not in metrics[1]  # test_freq=2: validated after step 2 only
    assert 0.0 <= metrics[2]["val-core/toy_memory/acc/mean@2"] <= 1.0
    for step in (1, 2):
        assert metrics[step]["memagent/num_trajectories"] == PROMPTS * N
        assert metrics[step]["memagent/rollout/failed_groups"] == 0
        assert metrics[step]["actor/grad_norm"] > 0


def test_the_papers_update_count_counted_by_the_optimizer(runs):
    out, metrics = runs["out"], runs["metrics_first"]
    ckpt = out / "checkpoints"
    # AdamW's own step counter: 2 updates per training step (4 prompts / 2 per mini-batch), whatever the rows.
    assert adam_steps(ckpt / "global_step_1" / "actor") == {2}
    assert adam_steps(ckpt / "global_step_2" / "actor") == {4}
    for step in (1, 2):
        assert metrics[step]["memagent/minibatch/updates"] == UPDATES
        assert metrics[step]["memagent/minibatch/updates_made"] == UPDATES  # the actor's report agrees
        rows = read_jsonl(out / "rollout" / f"{step}.jsonl")
        trajectories = by_trajectory(rows)
        assert len(trajectories) == PROMPTS * N
        assert all(3 <= len(turns) <= 5 for turns in trajectories.values())  # 2-4 memory turns + the answer
        update_of = {}
        for name, turns in trajectories.items():
            assert len({row["minibatch"] for row in turns}) == 1, name  # all rows of a trajectory: one update
            update_of[name] = turns[0]["minibatch"]
        assert sorted(set(update_of.values())) == [0, 1]
        for update in (0, 1):  # each update: two whole prompts with both their trajectories (ppo_mini_batch x n)
            members = [name for name, g in update_of.items() if g == update]
            assert len(members) == 2 * N and len({name.rsplit("_", 1)[0] for name in members}) == 2
        # rows per update (padding included) is what the worker was told, and the dump has every row
        assert len(rows) == UPDATES * metrics[step]["memagent/minibatch/rows"]


def test_rollout_memory_is_released_while_the_actor_trains(runs):
    # free_cache_engine=true (the default): after every rollout verl sleeps the replicas and the server holds no
    # weights until verl's worker resumes it for the weight sync; then generation starts again.
    assert runs["events_first"], "no rollout server wrote events"
    for events in runs["events_first"].values():
        names = [e["event"] for e in events]
        assert names.count("sleep") >= 3  # at start-up and after each rollout (two steps, one validation)
        for i, name in enumerate(names):
            if name == "sleep":
                assert events[i]["held_parameter_bytes"] == 0
                assert names[i + 1 : i + 4] == ["wake_up:weights", "update_weights", "wake_up:kv_cache"]
            if name == "generate":
                assert events[i]["held_parameter_bytes"] > 0
                if i + 1 < len(names):
                    assert names[i + 1] == "sleep"  # nothing else happens to the server before it sleeps
