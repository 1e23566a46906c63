"""verl 0.9.1's V1 trainer end to end on CPU: ``scripts/train_tiny_cpu.sh`` for 2 steps, then resumed to 3.

The run is verl's own ``python -m verl.trainer.main_ppo`` (sync V1 trainer, TransferQueue, GRPO n=2, KL loss
with the ref policy, two FSDP2 ranks on gloo, the ``hf_cpu`` rollout, validation before training and after
every step, a checkpoint every step). Checked: exit code, per-step metrics in the console log and the JSONL
metrics file, finite KL / reward / advantage statistics with non-zero advantages, the weights the actor saved
differ from the initial model and the rollout server got them (rollout/actor log-prob agreement), rollout
and validation dumps, that no process of the run outlives it, and that a second invocation with STEPS=3
resumes from the step-2 checkpoint and trains only step 3. Timings are printed (``pytest -s``).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "train_tiny_cpu.sh"
RUN_TIMEOUT_S = 270  # each of the two runs; ~110 s and ~90 s on 2 idle cores
STAGES = ("gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights", "save_checkpoint", "testing", "step")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _session_members(sid: int) -> list[int]:
    """Pids of live processes whose session id is ``sid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid and fields[0] != "Z":  # fields: state ppid pgrp session ...
            members.append(int(entry))
    return members


def run_script(out_dir: Path, steps: int) -> tuple[int, str, float]:
    """Run the launcher in its own session; on timeout, stop it (its trap ends the trainer's session)."""
    env = {**os.environ, "STEPS": str(steps), "OUT_DIR": str(out_dir)}
    env.pop("VERL_PLATFORM", None)  # the script sets what it needs
    log_path = out_dir / f"script_steps{steps}.log"
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["bash", str(SCRIPT)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            rc = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = -1
    elapsed = time.monotonic() - start
    output = log_path.read_text()
    match = re.search(r"trainer pid=(\d+)", output)
    if match:  # nothing of the run (Ray daemons, workers, servers) may outlive it
        deadline = time.monotonic() + 15
        while _session_members(int(match.group(1))) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _session_members(int(match.group(1))), "processes of the run were left behind"
    return rc, output, elapsed


def read_metrics(path: Path) -> dict[int, dict]:
    """verl's file logger: one JSON line ``{"step": N, "data": {...}}`` per log call; merged per step."""
    steps: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(int(record["step"]), {}).update(record["data"])
    return steps


def load_safetensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("train_tiny_cpu")
    first = run_script(out_dir, steps=2)
    assert first[0] == 0, tail(first[1])
    metrics_first = read_metrics(out_dir / "metrics.jsonl")
    second = run_script(out_dir, steps=3)
    assert second[0] == 0, tail(second[1])
    return {"out": out_dir, "first": first, "second": second, "metrics_first": metrics_first}


def test_two_steps_with_validation_log_metrics(runs):
    rc, output, elapsed = runs["first"]
    metrics = runs["metrics_first"]
    assert re.search(r"step:1 - ", output) and re.search(r"step:2 - ", output), tail(output)
    assert sorted(metrics) == [0, 1, 2]  # validation before training (step 0), then steps 1 and 2
    for step in (0, 1, 2):
        assert "val-aux/toy_copy/reward/mean@1" in metrics[step]
    for step in (1, 2):
        data = metrics[step]
        for key in ("actor/kl_loss", "actor/pg_loss", "actor/grad_norm", "critic/score/mean", "critic/rewards/mean",
                    "critic/advantages/mean", "critic/advantages/max", "critic/advantages/min"):  # fmt: skip
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
        rows = [json.loads(line) for line in (out / "rollout" / f"{step}.jsonl").read_text().splitlines()]
        assert len(rows) == 8  # 4 prompts x n=2
        assert {"input", "output", "gts", "score", "step"} <= set(rows[0])
    for step in (0, 1, 2):
        assert (out / "validation" / f"{step}.jsonl").is_file()


def test_resume_trains_only_the_next_step(runs):
    out = runs["out"]
    rc, output, elapsed = runs["second"]
    assert "Loaded model from" in output and "global_step_2" in output, tail(output)
    assert re.search(r"step:3 - ", output)
    train_lines = [line for line in output.splitlines() if re.search(r"step:[12] - .*timing_s/step", line)]
    assert not train_lines, "a resumed run must not retrain steps 1-2"
    metrics = read_metrics(out / "metrics.jsonl")
    assert sorted(metrics) == [2, 3]  # validation at the resumed step, then step 3
    assert "timing_s/step" in metrics[3] and "timing_s/step" not in metrics[2]
    assert math.isfinite(metrics[3]["actor/kl_loss"])
    assert read_metrics(out / "metrics.1.jsonl").keys() == {0, 1, 2}  # the first run's file is kept
    assert (out / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert (out / "checkpoints" / "global_step_3" / "actor" / "huggingface" / "model.safetensors").is_file()
    total = runs["first"][2] + elapsed
    print(f"\n[train_tiny_cpu] resume to step 3: wall {elapsed:.0f} s; both runs {total:.0f} s")
