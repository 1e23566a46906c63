"""Helpers of the trainer tests: run ``scripts/train_tiny_cpu.sh`` in its own session and read what it wrote."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path

from process_helpers import session_members

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "train_tiny_cpu.sh"
# The stages verl times in every training step (``timing_s/<stage>`` in the metrics).
STAGES = ("gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights", "save_checkpoint", "testing", "step")


def run_script(
    out_dir: Path,
    steps: int,
    task: str,
    timeout_s: float,
    overrides: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
) -> tuple[int, str, float]:
    """Run the launcher in its own session; on timeout, stop it (its trap ends the trainer's session).
    Returns (exit code, the launcher's output, seconds). Nothing of the run may outlive it."""
    env = {**os.environ, **(extra_env or {}), "STEPS": str(steps), "OUT_DIR": str(out_dir), "TASK": task}
    env.pop("VERL_PLATFORM", None)  # the script sets what it needs
    log_path = out_dir / f"script_steps{steps}.log"
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            ["bash", str(SCRIPT), *overrides], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout_s)
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
    match = re.search(r"trainer session=(\d+)", output)
    if match:  # nothing of the run (Ray daemons, workers, servers) may outlive it
        deadline = time.monotonic() + 15
        while session_members(int(match.group(1))) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not session_members(int(match.group(1))), "processes of the run were left behind"
    return rc, output, elapsed


def read_metrics(path: Path) -> dict[int, dict]:
    """verl's file logger: one JSON line ``{"step": N, "data": {...}}`` per log call; merged per step."""
    steps: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(int(record["step"]), {}).update(record["data"])
    return steps


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trajectories(rows: list[dict]) -> dict[str, list[dict]]:
    """The real rows of a dump by trajectory ({uid}_{session}), in turn order."""
    by_trajectory: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if not row["is_padding"]:
            by_trajectory[row["trajectory"]].append(row)
    return {key: sorted(rows, key=lambda r: r["turn_index"]) for key, rows in by_trajectory.items()}


def grpo_by_hand(by_trajectory: dict[str, list[dict]]) -> dict[str, float]:
    """GRPO without std division over each prompt's trajectories: final score - mean of the group's final scores."""
    groups: dict[str, dict[str, float]] = defaultdict(dict)
    for trajectory, rows in by_trajectory.items():
        uid = trajectory.rsplit("_", 1)[0]
        groups[uid][trajectory] = rows[-1]["score"]
    expected = {}
    for scores in groups.values():
        mean = sum(scores.values()) / len(scores)
        expected.update({trajectory: score - mean for trajectory, score in scores.items()})
    return expected


def adam_steps(checkpoint: Path) -> set[int]:
    """The optimizer updates made so far, as the optimizer counts them: AdamW's ``step`` of every parameter in
    every rank's optimizer state of a checkpoint (``global_step_N/actor``)."""
    import torch

    steps = set()
    for path in sorted(checkpoint.glob("optim_world_size_*_rank_*.pt")):
        state = torch.load(path, map_location="cpu", weights_only=False)["state"]
        steps |= {int(param_state["step"]) for param_state in state.values()}
    return steps


def load_safetensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])
