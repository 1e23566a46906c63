"""scripts/train_tiny_cpu.sh from anywhere: CONFIG as a name of configs/ or a YAML file anywhere (absolute, or
relative to the caller's working directory), composed on the repository's configs (DRY_RUN prints the composed
config and trains nothing); the script called by a relative path from another directory; an agent file named in
a config read from the caller's working directory (verl_ext/settings.py resolve_agent_file)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from verl_ext.settings import resolve_agent_file

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "train_tiny_cpu.sh"
MARKER = "verify_from_anywhere"


def user_folder(root: Path) -> Path:
    """A user's folder outside the repository: a run config composed on the repository's configs, and data files
    (only their presence is checked before the trainer starts)."""
    user = root / "user"
    (user / "data").mkdir(parents=True)
    text = (REPO / "configs" / "calculator_cpu.yaml").read_text()
    (user / "verify_cpu.yaml").write_text(text.replace("experiment_name: calculator_cpu", f"experiment_name: {MARKER}"))
    for name in ("train.parquet", "validation.parquet"):
        (user / "data" / name).write_bytes(b"")
    return user


def launch(script: str | Path, cwd: Path, env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("CONFIG", "DATA_DIR", "OUT_DIR", "TASK", "DRY_RUN")}
    environ.pop("PYTHONPATH", None)
    return subprocess.run(
        ["bash", str(script), *overrides],
        cwd=cwd,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def composed(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return yaml.safe_load(result.stdout.split("composed config follows; not starting\n", 1)[1])


@pytest.mark.parametrize("relative", [False, True])
def test_a_config_file_anywhere_is_composed_on_the_repositorys_configs(tmp_path, tiny_model_dir, relative):
    user = user_folder(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if relative:  # every path relative to the caller's working directory
        env = {"CONFIG": "../user/verify_cpu.yaml", "DATA_DIR": "../user/data", "OUT_DIR": "out"}
    else:
        env = {
            "CONFIG": str(user / "verify_cpu.yaml"),
            "DATA_DIR": str(user / "data"),
            "OUT_DIR": str(elsewhere / "out"),
        }
    config = composed(launch(SCRIPT, elsewhere, {**env, "DRY_RUN": "1", "MODEL": tiny_model_dir}))
    assert config["trainer"]["experiment_name"] == MARKER  # the user's file ...
    assert config["recurrent"]["agent"] == "calculator"
    assert config["actor_rollout_ref"]["actor"]["optim"]["lr_scheduler_type"] == "constant"  # ... recurrent_trainer
    assert config["trainer"]["device"] == "cpu"  # ... cpu_platform
    assert config["data"]["train_files"] == str(user / "data" / "train.parquet")
    assert config["trainer"]["default_local_dir"] == str(elsewhere / "out" / "checkpoints")
    assert not (elsewhere / "out" / "metrics.jsonl").exists()  # a dry run trains nothing


def test_a_config_by_name_still_reads_configs(tmp_path, tiny_model_dir):
    user = user_folder(tmp_path)
    env = {"CONFIG": "calculator_cpu", "DATA_DIR": str(user / "data"), "OUT_DIR": str(tmp_path / "out")}
    config = composed(launch(SCRIPT, tmp_path, {**env, "DRY_RUN": "1", "MODEL": tiny_model_dir}))
    assert config["trainer"]["experiment_name"] == "calculator_cpu"


def test_bad_config_paths_stop_naming_the_file(tmp_path, tiny_model_dir):
    user = user_folder(tmp_path)
    env = {"DATA_DIR": str(user / "data"), "OUT_DIR": str(tmp_path / "out"), "DRY_RUN": "1", "MODEL": tiny_model_dir}
    missing = launch(SCRIPT, tmp_path, {**env, "CONFIG": "user/nope.yaml"})
    assert missing.returncode == 2 and f"no YAML file at {tmp_path / 'user' / 'nope.yaml'}" in missing.stderr
    (user / "tiny_cpu.yaml").write_text((user / "verify_cpu.yaml").read_text())
    clash = launch(SCRIPT, tmp_path, {**env, "CONFIG": "user/tiny_cpu.yaml"})
    assert clash.returncode == 2 and "configs/tiny_cpu.yaml of the repository has its name" in clash.stderr


def test_the_script_by_a_relative_path_from_another_folder_reaches_the_trainer(tmp_path, tiny_model_dir):
    """Called as `bash repo/scripts/train_tiny_cpu.sh` from outside the repository, the launcher starts the
    trainer (its supervisor found), which reads the config's agent file from the caller's working directory: a
    missing one stops the run at once, naming where it was looked for."""
    user = user_folder(tmp_path)
    (tmp_path / "repo").symlink_to(REPO)
    env = {"CONFIG": "calculator_cpu", "DATA_DIR": str(user / "data"), "OUT_DIR": "out", "MODEL": tiny_model_dir}
    result = launch("repo/scripts/train_tiny_cpu.sh", tmp_path, env, "recurrent.agent=missing_agent.py")
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert f"recurrent.agent=missing_agent.py: no agent file at {tmp_path / 'missing_agent.py'}" in output
    assert "trainer session=" in output and (tmp_path / "out" / "train.log").is_file()


def test_an_agent_file_in_a_config_is_read_from_the_working_directory(tmp_path):
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "mine.py").write_text("")
    config = OmegaConf.create({"recurrent": {"agent": "agents/mine.py:AGENT", "config": {}}})
    assert resolve_agent_file(config, tmp_path) == f"{tmp_path / 'agents' / 'mine.py'}:AGENT"
    assert config.recurrent.agent == f"{tmp_path / 'agents' / 'mine.py'}:AGENT"
    assert resolve_agent_file(OmegaConf.create({"recurrent": {"agent": "memory"}}), tmp_path) is None
    with pytest.raises(FileNotFoundError, match=f"no agent file at {tmp_path / 'gone.py'} .*working directory"):
        resolve_agent_file(OmegaConf.create({"recurrent": {"agent": "gone.py"}}), tmp_path)
