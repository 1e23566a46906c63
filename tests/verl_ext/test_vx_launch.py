"""The launch scripts: DRY_RUN prints the full command and the composed (resolved) config and exits 0 on a CPU
machine, without starting Ray; a real launch on a machine without GPUs stops with what is missing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from process_helpers import session_members

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("script", "size", "batch", "tp"), [("run_memory_7B.sh", "7B", 128, 1), ("run_memory_14B.sh", "14B", 256, 2)]
)
def test_dry_run_prints_command_and_config(tmp_path, script, size, batch, tp):
    env = {
        **os.environ,
        "DRY_RUN": "1",
        "PYTHON": sys.executable,
        "PROJ_ROOT": str(tmp_path / "runs"),
        "DATASET_ROOT": str(tmp_path / "data"),
        "DUMP_ROLLOUTS": "1",
        "WANDB_OFFLINE": "1",
    }
    result = subprocess.run(
        ["bash", str(REPO / script), "trainer.total_epochs=1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    command = next(line for line in out.splitlines() if line.startswith("[memagent] command:"))
    run_dir = tmp_path / "runs" / "memory_agent" / size
    for part in (
        "-m verl_ext.main",
        f"--config-name memagent_{size.lower()}",
        "recurrent.mode=sync",
        f"data.train_files={tmp_path}/data/hotpotqa/hotpotqa_train_32k.parquet",
        f"trainer.default_local_dir={run_dir}",
        f"trainer.rollout_data_dir={run_dir}/rollouts",
        "trainer.resume_mode=auto",
        "trainer.total_epochs=1",
        "WANDB_MODE=offline",
    ):
        assert part in command, part
    for line in (
        f"train_batch_size: {batch}",
        "max_model_len: 9216",
        "prompt_length: 8192",
        f"tensor_model_parallel_size: {tp}",
        "mode: sync",
        "total_epochs: 1",
        "kl_loss_coef: 0.001",
        "TQ_NUM_THREADS: '1'",
    ):
        assert line in out, line
    # The released runs' mode by default (no MODE given): said, and in the composed config.
    assert "[memagent] rollout mode: sync (lockstep rounds" in out
    assert not (tmp_path / "runs").exists()  # nothing ran


def dry_run(tmp_path: Path, script: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "PROJ_ROOT": str(tmp_path / "runs"), **env}
    return subprocess.run(
        ["bash", str(REPO / script)], capture_output=True, text=True, env=environment, cwd=tmp_path, timeout=300
    )


def test_mode_async_is_a_switch_and_an_unknown_mode_is_refused(tmp_path):
    result = dry_run(tmp_path, "run_memory_7B.sh", MODE="async")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "recurrent.mode=async" in result.stdout and "[memagent] rollout mode: async" in result.stdout
    assert "\n  mode: async\n" in result.stdout  # the composed config's recurrent.mode
    refused = dry_run(tmp_path, "run_memory_14B.sh", MODE="lockstep")
    assert refused.returncode == 2 and "MODE=lockstep: one of sync" in refused.stderr
    assert "[memagent] command:" not in refused.stdout  # refused before anything


def test_the_paper_configs_set_sync_mode_themselves():
    # `python -m verl_ext.main --config-name memagent_7b` without the launcher is the released runs' mode too.
    from vx_helpers import compose_config

    for name in ("memagent_7b", "memagent_14b"):
        config = compose_config(name, [])
        assert config.recurrent.mode == "sync", name
        assert config.actor_rollout_ref.rollout.agent.agent_loop_manager_class.endswith("LockstepAgentLoopManager")


@pytest.mark.parametrize("proj_root", [None, "shared"])
def test_on_a_cluster_an_unset_proj_root_is_pointed_out(tmp_path, proj_root):
    """With RAY_ADDRESS, checkpoints under the repository mean the repository must be on shared storage: said."""
    env = {
        **os.environ,
        "DRY_RUN": "1",
        "PYTHON": sys.executable,
        "RAY_ADDRESS": "auto",
        "DATASET_ROOT": str(tmp_path / "data"),
    }
    env.pop("PROJ_ROOT", None)
    if proj_root:
        env["PROJ_ROOT"] = str(tmp_path / proj_root)
    result = subprocess.run(
        ["bash", str(REPO / "run_memory_7B.sh")], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    note = f"[memagent] note: PROJ_ROOT is not set; checkpoints go under the repository ({REPO}/checkpoints/"
    assert (note in result.stdout) == (proj_root is None)


def test_a_launch_without_its_data_and_model_names_the_launchers_variables(tmp_path):
    """Before Ray starts: the data files the data folder lacks, and a model that is not here, named as the launcher
    takes it (MODEL_PATH, not a flag of another command)."""
    env = {**os.environ, "PYTHON": sys.executable, "PROJ_ROOT": str(tmp_path / "runs"), "LOGGER": "console"}
    env |= {"DATASET_ROOT": str(tmp_path / "data"), "MODEL_PATH": "no-such-org/no-such-model"}
    env.pop("RAY_ADDRESS", None)
    result = subprocess.run(
        ["bash", str(REPO / "run_memory_7B.sh")], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"data file not found: {tmp_path}/data/hotpotqa/hotpotqa_train_32k.parquet" in result.stderr
    assert "e.g. MODEL_PATH=/path/to/Qwen2.5-7B-Instruct" in result.stderr and "--model" not in result.stderr


@pytest.mark.slow(seconds=60)
def test_a_real_launch_without_gpus_stops_with_what_is_missing(tmp_path, tiny_model_dir):
    """`bash run_memory_7B.sh` on this GPU-less machine: real data files, a local model folder, a real local Ray.
    The task runner finds 0 GPUs for 4 x 8 and refuses before TransferQueue starts (which would wait forever)."""
    from experiments.tiny.data import write

    data = tmp_path / "data" / "hotpotqa"
    data.mkdir(parents=True)
    files = write(tmp_path / "generated", train=4, val=2, task="memory")
    shutil.copy(files["train"], data / "hotpotqa_train_32k.parquet")
    shutil.copy(files["dev"], data / "hotpotqa_dev.parquet")
    ray_tmp = tempfile.mkdtemp(prefix="rc")  # Ray's Unix sockets need a short path
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PROJ_ROOT": str(tmp_path / "runs"),
        "DATASET_ROOT": str(tmp_path / "data"),
        "MODEL_PATH": tiny_model_dir,
        "LOGGER": "console",
    }
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        ["bash", str(REPO / "run_memory_7B.sh"), f"++ray_kwargs.ray_init._temp_dir={ray_tmp}"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail("the launcher did not stop within 120 s:\n" + output[-3000:])
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 2, output[-3000:]
    assert "[memagent] the run cannot start on node " in output
    assert "Ray sees 0 GPU(s), the run needs trainer.nnodes x trainer.n_gpus_per_node = 4 x 8 = 32" in output
    assert "bash scripts/train_tiny_cpu.sh" in output
    assert "Traceback" not in output  # a message to read, not a crash
    deadline = time.monotonic() + 15  # Ray's daemons stop with the driver; give them a moment to exit
    while session_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not session_members(proc.pid), "processes of the run were left behind"


def test_a_launch_on_a_run_folder_in_use_stops_naming_its_holder(tmp_path):
    """Two runs never share a run folder: the launcher takes a lock on it (scripts/lib/session.sh, hold_run_lock)
    before anything starts, and stops with status 2 naming the run that holds it. Here the lock is held by this
    test, as a running trainer holds it; DRY_RUN does not take it (nothing is written)."""
    import fcntl

    run_dir = tmp_path / "runs" / "memory_agent" / "7B"
    run_dir.mkdir(parents=True)
    env = {**os.environ, "PYTHON": sys.executable, "PROJ_ROOT": str(tmp_path / "runs"), "LOGGER": "console"}
    env.pop("RAY_ADDRESS", None)
    with open(run_dir / ".run.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write("pid 4242 on node-a, started 2026-01-01 00:00:00\n")
        lock.flush()
        result = subprocess.run(
            ["bash", str(REPO / "run_memory_7B.sh")], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
        )
        dry = subprocess.run(
            ["bash", str(REPO / "run_memory_7B.sh")],
            capture_output=True,
            text=True,
            env={**env, "DRY_RUN": "1"},
            cwd=tmp_path,
            timeout=300,
        )
    assert result.returncode == 2, result.stderr[-2000:]
    # The process that holds the lock is named (this test's, alive), not the pid the lock file records.
    said = f"error: {run_dir} is in use by another training run: pid {os.getpid()} ("
    assert said in result.stderr and f"kill {os.getpid()}" in result.stderr, result.stderr[-2000:]
    assert "[memagent] DRY_RUN" not in result.stdout and dry.returncode == 0, dry.stderr[-2000:]
