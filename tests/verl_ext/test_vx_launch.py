"""The launch scripts: DRY_RUN prints the full command and the composed (resolved) config and exits 0 on a CPU
machine, without starting Ray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("script", "size", "batch", "tp"), [("run_memory_7B.sh", "7B", 128, 1),
                                                             ("run_memory_14B.sh", "14B", 256, 2)])  # fmt: skip
def test_dry_run_prints_command_and_config(tmp_path, script, size, batch, tp):
    env = {
        **os.environ,
        "DRY_RUN": "1",
        "PYTHON": sys.executable,
        "PROJ_ROOT": str(tmp_path / "runs"),
        "DATASET_ROOT": str(tmp_path / "data"),
        "MODE": "sync",
        "DUMP_ROLLOUTS": "1",
        "WANDB_OFFLINE": "1",
    }
    result = subprocess.run(["bash", str(REPO / script), "trainer.total_epochs=1"], capture_output=True, text=True,
                            env=env, cwd=tmp_path, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    command = next(line for line in out.splitlines() if line.startswith("[memagent] command:"))
    run_dir = tmp_path / "runs" / "memory_agent" / size
    for part in ("-m verl_ext.main", f"--config-name memagent_{size.lower()}", "recurrent.mode=sync",
                 f"data.train_files={tmp_path}/data/hotpotqa/hotpotqa_train_32k.parquet",
                 f"trainer.default_local_dir={run_dir}", f"trainer.rollout_data_dir={run_dir}/rollouts",
                 "trainer.resume_mode=auto", "trainer.total_epochs=1", "WANDB_MODE=offline"):  # fmt: skip
        assert part in command, part
    for line in (
        f"train_batch_size: {batch}",
        "max_model_len: 9216",
        "prompt_length: 8192",
        f"tensor_model_parallel_size: {tp}",
        "mode: sync",
        "total_epochs: 1",
        "kl_loss_coef: 0.001",
    ):
        assert line in out, line
    assert not (tmp_path / "runs").exists()  # nothing ran
