"""The GPU stack on a machine without a GPU: run by ``make check-gpu-stack`` with ``.venv-gpu/bin/python`` (the GPU
lock: vLLM 0.24.0, torch 2.11.0 built for CUDA 13), never by the CPU suite's interpreter (docs/cluster.md, "The GPU
stack, checked on CPU").

vLLM picks its platform from the hardware and finds none here; its argument parser and config classes need one.
vLLM's own CPU platform class is set before anything asks for the platform, so they run: whatever they check
that does not depend on the device is the check a GPU machine would make."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

import pytest  # noqa: E402
import vllm.platforms  # noqa: E402
from vllm.platforms.cpu import CpuPlatform  # noqa: E402

vllm.platforms._current_platform = CpuPlatform()

REPO = Path(__file__).resolve().parents[2]
# The launchers checked with DRY_RUN and this interpreter (test_verl_rollout_args.py).
LAUNCHERS = ("run_memory_7B.sh", "run_memory_14B.sh", "scripts/smoke_gpu.sh")
sys.path.insert(0, str(REPO / "tests" / "verl_ext"))  # vx_helpers.compose_config: the configs as the suite composes

# The published config.json of each model the paper's runs and the harness serve, written here (no download).
_QWEN25_COMMON = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "use_cache": True,
    "torch_dtype": "bfloat16",
}
QWEN25_CONFIGS = {
    "Qwen2.5-0.5B-Instruct": {
        **_QWEN25_COMMON,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "max_window_layers": 21,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "vocab_size": 151936,
    },
    "Qwen2.5-7B-Instruct": {
        **_QWEN25_COMMON,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "max_window_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "vocab_size": 152064,
    },
    "Qwen2.5-14B-Instruct": {
        **_QWEN25_COMMON,
        "hidden_size": 5120,
        "intermediate_size": 13824,
        "num_hidden_layers": 48,
        "max_window_layers": 70,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "vocab_size": 152064,
    },
    "Qwen2.5-32B-Instruct": {
        **_QWEN25_COMMON,
        "hidden_size": 5120,
        "intermediate_size": 27648,
        "num_hidden_layers": 64,
        "max_window_layers": 70,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "vocab_size": 152064,
    },
}
# The RL-MemoryAgent checkpoints are fine-tuned Qwen2.5-Instruct models of the same shapes.
BASE_OF = {
    "BytedTsinghua-SIA/RL-MemoryAgent-7B": "Qwen2.5-7B-Instruct",
    "BytedTsinghua-SIA/RL-MemoryAgent-14B": "Qwen2.5-14B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct": "Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-14B-Instruct": "Qwen2.5-14B-Instruct",
    "Qwen/Qwen2.5-32B-Instruct": "Qwen2.5-32B-Instruct",
    "Qwen/Qwen2.5-0.5B-Instruct": "Qwen2.5-0.5B-Instruct",
}


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    """A folder per Qwen2.5 shape: its published config.json and a tokenizer (the tiny model's: what is checked
    here reads the model's shape and rope settings, not its vocabulary)."""
    from recurrent.models import TINY, materialize

    tiny = materialize(TINY)
    root = tmp_path_factory.mktemp("models")
    dirs = {}
    for name, config in QWEN25_CONFIGS.items():
        folder = root / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config, indent=1))
        for file in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            (folder / file).write_bytes((tiny / file).read_bytes())
        dirs[name] = folder
    return dirs


@pytest.fixture(scope="session")
def local_ray():
    """verl's vLLM server asks Ray for its job id and node address: a real local Ray, one CPU, no dashboard.
    Ray gives its raylet a fixed 30 s to register at start-up; on a machine overloaded by other work (a training
    run beside the suite) it can miss that, so a start-up timeout is retried, twice at most."""
    import ray

    for attempt in range(3):
        try:
            ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
            break
        except Exception as err:
            if "timed out during startup" not in str(err) or attempt == 2:
                raise
            ray.shutdown()
    yield
    ray.shutdown()


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The set under test, in the header of the run (tests/test_gpu_stack.py reads these two lines)."""
    import torch

    names = ("vllm", "torch", "verl", "transformers", "triton", "numpy", "fastapi", "ray", "flash-attn")

    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return [
        f"[gpu-stack] Python {platform.python_version()} | " + ", ".join(f"{n} {version(n)}" for n in names),
        f"[gpu-stack] torch built for CUDA {torch.version.cuda} | GPU visible: {torch.cuda.is_available()}",
    ]


class DryRun:
    """One launcher run with DRY_RUN=1 and this interpreter, in a folder of its own; ``result`` waits for it."""

    def __init__(self, script: str, model: Path, folder: Path) -> None:
        self.folder = folder
        env = {
            **os.environ,
            "DRY_RUN": "1",
            "PYTHON": sys.executable,
            "MODEL_PATH": str(model),
            "PROJ_ROOT": str(folder / "runs"),
            "DATASET_ROOT": str(folder / "data"),
            "OUT_DIR": str(folder / "smoke"),
        }
        self.process = subprocess.Popen(
            ["bash", str(REPO / script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.completed: subprocess.CompletedProcess | None = None

    def result(self) -> subprocess.CompletedProcess:
        if self.completed is None:
            stdout, stderr = self.process.communicate(timeout=300)
            self.completed = subprocess.CompletedProcess(self.process.args, self.process.returncode, stdout, stderr)
        return self.completed

    def stop(self) -> None:
        if self.completed is None:  # a run no test read (it failed first)
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="session")
def launcher_dry_runs(model_dirs, tmp_path_factory) -> Iterator[dict[str, DryRun]]:
    """Every launcher's DRY_RUN, started side by side. Each is a process of its own by nature (bash, then this
    interpreter with ``-m verl_ext.main``), and each spends ~7 s of CPU importing verl (hydra's search path
    ``pkg://verl.trainer.config`` imports the package, and with it torch and Ray) to print a config."""
    runs = {
        script: DryRun(script, model_dirs["Qwen2.5-7B-Instruct"], tmp_path_factory.mktemp("dry_run"))
        for script in LAUNCHERS
    }
    yield runs
    for run in runs.values():
        run.stop()


@pytest.fixture(scope="session", autouse=True)
def _dry_runs_start_with_the_session(request) -> None:
    """The launchers' dry runs start with the first test, where their tests select them, and run beside the
    checks in this process (imports, Ray, vLLM's configs) instead of after them."""
    if any("launcher_dry_runs" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("launcher_dry_runs")
