"""verl 0.9.1's V1 trainer end to end on CPU: ``TASK=toy scripts/train_tiny_cpu.sh`` for 2 steps.

The run is verl's own ``python -m verl.trainer.main_ppo`` (sync V1 trainer, TransferQueue, GRPO n=2, KL loss
with the ref policy, two FSDP2 ranks on gloo, the ``hf_cpu`` rollout, validation before training and after
every step, a checkpoint every step): the CPU adaptations of ``verl_ext/cpu`` under verl's stock entry point,
without any of our trainer. Checked: exit code, per-step metrics in the console log and the JSONL metrics
file, finite KL / reward / advantage statistics with non-zero advantages, the weights the actor saved differ
from the initial model and the rollout server got them (rollout/actor log-prob agreement), rollout and
validation dumps, that no process of the run outlives it. Timings are printed (``pytest -s``).

Resume (a second invocation continuing from the last checkpoint with the same data order) and the checkpoint
export are tested on our trainer, in ``test_cpu_memory_trainer.py``: verl's resume code is the same for both.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from trainer_run import STAGES, load_safetensors, read_jsonl, read_metrics, run_script, tail

RUN_TIMEOUT_S = 300  # ~110 s on 2 idle cores

pytestmark = [pytest.mark.trainer, pytest.mark.slow(seconds=110), pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("train_tiny_cpu")
    first = run_script(out_dir, steps=2, task="toy", timeout_s=RUN_TIMEOUT_S)
    assert first[0] == 0, tail(first[1])
    metrics_first = read_metrics(out_dir / "metrics.jsonl")
    return {"out": out_dir, "first": first, "metrics_first": metrics_first}


def test_two_steps_with_validation_log_metrics(runs):
    rc, output, elapsed = runs["first"]
    metrics = runs["metrics_first"]
    assert re.search(r"step:1 - ", output) and re.search(r"step:2 - ", output), tail(output)
    assert sorted(metrics) == [0, 1, 2]  # validation before training (step 0), then steps 1 and 2
    for step in (0, 1, 2):
        assert "val-aux/toy_copy/reward/mean@1" in metrics[step]
    for step in (1, 2):
        data = metrics[step]
        for key in (
            "actor/kl_loss",
            "actor/pg_loss",
            "actor/grad_norm",
            "critic/score/mean",
            "critic/rewards/mean",
            "critic/advantages/mean",
            "critic/advantages/max",
            "critic/advantages/min",
        ):
            assert key in data and math.isfinite(data[key]), (step, key, data.get(key))
        # the dense toy reward differs within GRPO groups, so advantages are not all zero
        assert data["critic/advantages/max"] > 0 > data["critic/advantages/min"]
        assert 0.0 <= data["critic/score/mean"] <= 1.0
        assert data["actor/kl_coef"] == pytest.approx(0.001)
        assert data["actor/grad_norm"] > 0
        for stage in STAGES:
            assert math.isfinite(data[f"timing_s/{stage}"]), stage
        # the HF server's log-probs agree with the FSDP actor's recompute: the weight sync works
        assert data["training/rollout_probs_diff_max"] < 0.05
    # step 2 runs with the ref policy of step 0 and an updated actor: the KL term is live
    assert metrics[2]["actor/kl_loss"] >= 0.0
    timings = {stage: [round(metrics[s][f"timing_s/{stage}"], 2) for s in (1, 2)] for stage in STAGES}
    print(f"\n[train_tiny_cpu] 2 steps: wall {elapsed:.0f} s; timing_s per step (step 1, step 2): {timings}")


def test_checkpoints_dumps_and_changed_weights(runs, tiny_model_dir):
    import torch

    out = runs["out"]
    ckpt = out / "checkpoints"
    for step in (1, 2):
        actor = ckpt / f"global_step_{step}" / "actor"
        assert (actor / "model_world_size_2_rank_0.pt").is_file() and (actor / "model_world_size_2_rank_1.pt").is_file()
        assert (actor / "optim_world_size_2_rank_0.pt").is_file()
        assert (actor / "huggingface" / "model.safetensors").is_file()  # save_contents includes hf_model
        assert (ckpt / f"global_step_{step}" / "data.pt").is_file()  # dataloader state, for resume
    initial = load_safetensors(Path(tiny_model_dir) / "model.safetensors")
    trained = load_safetensors(ckpt / "global_step_2" / "actor" / "huggingface" / "model.safetensors")
    assert set(trained) == set(initial)
    changed = [name for name in initial if not torch.equal(initial[name].float(), trained[name].float())]
    assert len(changed) >= len(initial) // 2, changed  # an optimizer step touches (almost) every tensor
    step1 = load_safetensors(ckpt / "global_step_1" / "actor" / "huggingface" / "model.safetensors")
    assert any(not torch.equal(step1[name], trained[name]) for name in trained)  # and step 2 moved them again

    for step in (1, 2):
        rows = read_jsonl(out / "rollout" / f"{step}.jsonl")
        assert len(rows) == 8  # 4 prompts x n=2
        assert {"input", "output", "gts", "score", "step"} <= set(rows[0])
    for step in (0, 1, 2):
        assert (out / "validation" / f"{step}.jsonl").is_file()
