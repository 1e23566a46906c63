"""The one-node GPU smoke check (scripts/smoke_gpu.sh, configs/smoke_gpu.yaml, scripts/smoke_report.py). It cannot
run here (no GPU): its config is composed and passes verl's own validation, the script's DRY_RUN prints the command
and the composed config, and the report is checked on hand-written metrics and log lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf
from vx_helpers import compose_config

from experiments.tiny.data import write

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "smoke_gpu.sh"
sys.path.insert(0, str(REPO / "scripts"))
import smoke_report  # noqa: E402


def script_overrides(model: str, data: Path, out: Path, ngpus: int = 8) -> list[str]:
    """What scripts/smoke_gpu.sh passes (its DRY_RUN test below checks the same values in its command)."""
    return [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data}/train.parquet",
        f"data.val_files={data}/dev.parquet",
        f"trainer.n_gpus_per_node={ngpus}",
        "trainer.total_training_steps=2",
        f"trainer.default_local_dir={out}/checkpoints",
        "++ray_kwargs.ray_init.address=local",
        "++ray_kwargs.ray_init.runtime_env.env_vars.VERL_LOGGING_LEVEL='DEBUG'",
    ]


def test_the_composed_config_has_the_paper_budgets_and_passes_verl_and_our_preflight(tmp_path, tiny_model_dir):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from verl_ext.preflight import preflight

    write(tmp_path / "data", train=2, val=1, task="memory")  # short documents: the columns are what matters here
    config = compose_config("smoke_gpu", script_overrides(tiny_model_dir, tmp_path / "data", tmp_path / "out"))
    preflight(config)  # data columns, model folder, the paper's budgets against the tokenizer
    OmegaConf.resolve(config)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))

    memory = config.recurrent.config
    assert (memory.chunk_size, memory.max_memorization_length, memory.max_chunks) == (5000, 1024, 8)
    assert (memory.max_prompt_length, memory.max_final_response_length) == (1024, 1024)
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.prompt_length, rollout.response_length, rollout.max_model_len) == (8192, 1024, 9216)
    assert (config.data.train_batch_size, rollout.n, rollout.val_kwargs.n) == (8, 4, 2)
    trainer = config.trainer
    assert (trainer.nnodes, trainer.n_gpus_per_node, trainer.total_training_steps) == (1, 8, 2)
    assert (trainer.val_before_train, trainer.test_freq, trainer.save_freq) == (True, 2, 2)
    assert list(trainer.logger) == ["console", "file"] and trainer.resume_mode == "disable"
    env_vars = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert (env_vars.TQ_NUM_THREADS, env_vars.VERL_LOGGING_LEVEL) == ("1", "DEBUG")
    assert config.ray_kwargs.ray_init.address == "local"


def test_paper_size_documents(tmp_path):
    """--sentences sets the document length: (n, n) gives n filler sentences plus the one stating the answer."""
    paths = write(tmp_path, train=2, val=1, task="memory", sentences=(40, 40))
    rows = pd.read_parquet(paths["train"])
    assert [row.count(".") for row in rows["context"]] == [41, 41]
    for context, truth in zip(rows["context"], rows["reward_model"], strict=True):
        assert f" is {truth['ground_truth']}." in context


def run_script(env_extra: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "OUT_DIR": str(tmp_path / "out"), **env_extra}
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def test_dry_run_prints_the_command_and_config_and_starts_nothing(tmp_path, tiny_model_dir):
    result = run_script({"DRY_RUN": "1", "MODEL_PATH": tiny_model_dir, "NGPUS": "4"}, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    command = next(line for line in out.splitlines() if line.startswith("[smoke] command:"))
    for part in script_overrides(tiny_model_dir, tmp_path / "out" / "data", tmp_path / "out", ngpus=4)[:-1]:
        assert part in command, part
    assert "--config-name smoke_gpu" in command and "VERL_LOGGING_LEVEL=\\'DEBUG\\'" in command
    for line in (
        "chunk_size: 5000",
        "max_memorization_length: 1024",
        "max_chunks: 8",
        "max_model_len: 9216",
        "n_gpus_per_node: 4",
        "total_training_steps: 2",
        "val_before_train: true",
        "test_freq: 2",
        "save_freq: 2",
        "TQ_NUM_THREADS: '1'",
        "VERL_LOGGING_LEVEL: DEBUG",
        "address: local",
    ):
        assert line in out, line
    assert not (tmp_path / "out").exists()  # no data generated, nothing ran


def test_a_model_missing_from_the_local_cache_stops_with_a_clear_message(tmp_path):
    env = {"DRY_RUN": "1", "HF_HOME": str(tmp_path / "empty_hf_home"), "NGPUS": "1"}
    result = run_script({**env, "HF_HUB_CACHE": str(tmp_path / "empty_hf_home" / "hub")}, tmp_path)
    assert result.returncode == 2
    message = "[smoke] model 'Qwen/Qwen2.5-0.5B-Instruct' is neither a local folder nor in the local Hugging Face"
    assert message in result.stderr
    assert "[smoke] command:" not in result.stdout


def metric_line(step: int, data: dict) -> str:
    return json.dumps({"step": step, "data": data})


# Log lines as verl's memory logging prints them (utils/profiler/performance.py), behind Ray's and logging's prefixes:
# point samples; "After resume weights" twice (once per step).
LOG = """\
(WorkerDict pid=311) Before FSDP, memory allocated (GB): 0.92, memory reserved (GB): 1.00, device memory used/total (GB): 2.10/79.11
(WorkerDict pid=311) DEBUG:2026-01-01 10:00:00,000:After resume weights, memory allocated (GB): 1.50, memory reserved (GB): 2.00, device memory used/total (GB): 40.00/79.11
(WorkerDict pid=311) DEBUG:2026-01-01 10:01:00,000:After resume weights, memory allocated (GB): 1.25, memory reserved (GB): 2.50, device memory used/total (GB): 41.50/79.11
"""  # noqa: E501


def test_report_tables_and_a_complete_run(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        "\n".join(
            [
                metric_line(0, {"val-core/toy_memory/acc/mean@2": 0.0}),
                metric_line(
                    1,
                    {
                        "timing_s/gen": 61.04,
                        "timing_s/update_actor": 20.0,
                        "timing_s/step": 90.0,
                        "actor/perf/max_memory_allocated_gb": 10.5,
                    },
                ),
                metric_line(
                    2,
                    {
                        "timing_s/gen": 50.0,
                        "timing_s/save_checkpoint": 12.0,
                        "timing_s/step": 80.0,
                        "timing_s/testing": 30.0,
                        "actor/perf/max_memory_allocated_gb": 11.25,
                        "actor/perf/max_memory_reserved_gb": 14.0,
                        "val-core/toy_memory/acc/mean@2": 0.25,
                    },
                ),
            ]
        )
    )
    (tmp_path / "ckpt" / "global_step_2").mkdir(parents=True)
    steps = smoke_report.read_metrics(metrics)
    memory = smoke_report.memory_samples(LOG)
    # The larger of the two samples of each value at the repeated point (1.50 from the first, 2.50 / 41.50 later).
    assert memory == {"Before FSDP": (0.92, 1.0, 2.1, 79.11), "After resume weights": (1.5, 2.5, 41.5, 79.11)}
    text = smoke_report.report(steps, memory)
    table = text.splitlines()
    # Columns: steps 0 (the validation before training: no timings), 1, 2.
    assert f"  {'gen':<16}{'-':>10}{'61.0':>10}{'50.0':>10}" in table
    assert f"  {'testing':<16}{'-':>10}{'-':>10}{'30.0':>10}" in table
    # verl's actor/perf/max_memory_* are named for what they are: the peak so far, not the update's or a phase's.
    peaks = table.index(f"  {'peak so far':<16}{'0':>10}{'1':>10}{'2':>10}")
    assert "peak since the worker started" in table[peaks - 3] and "not per phase" in table[peaks - 1]
    allocated, reserved = "actor/perf/max_memory_allocated_gb", "actor/perf/max_memory_reserved_gb"
    assert table[peaks + 1] == f"  {'allocated':<16}{'-':>10}{'10.50':>10}{'11.25':>10}   ({allocated})"
    assert table[peaks + 2] == f"  {'reserved':<16}{'-':>10}{'-':>10}{'14.00':>10}   ({reserved})"
    assert "per phase" not in text.replace("not per phase", "").replace("not a peak over a phase", "")
    points = table.index(f"  {'point':<48}{'allocated':>10}{'reserved':>10}{'used':>10}{'total':>10}")
    assert table[points - 2].startswith("GPU memory at verl's logged points") and "not a peak" in table[points - 2]
    assert f"  {'After resume weights':<48}      1.50      2.50     41.50     79.11" in table
    assert smoke_report.problems(steps, tmp_path / "ckpt", 2) == []
    argv = ["--metrics", str(metrics), "--log", str(tmp_path / "none.log"), "--checkpoints", str(tmp_path / "ckpt")]
    assert smoke_report.main(argv) == 0


def test_report_fails_a_run_that_skipped_work(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(metric_line(1, {"timing_s/step": 90.0}))
    steps = smoke_report.read_metrics(metrics)
    assert smoke_report.problems(steps, tmp_path / "ckpt", 2) == [
        "training step 2 has no metrics (timing_s/step)",
        "no validation before training (val-core/* at step 0)",
        "no validation at step 2 (val-core/*)",
        f"no checkpoint {tmp_path / 'ckpt' / 'global_step_2'}",
    ]
    argv = ["--metrics", str(metrics), "--log", str(tmp_path / "none.log"), "--checkpoints", str(tmp_path / "ckpt")]
    assert smoke_report.main(argv) == 1
