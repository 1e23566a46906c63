"""Shared fixtures: offline environment, the materialized offline models."""

import os

# Tests never reach a hub or a tracking service.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import importlib.util  # noqa: E402

import pytest  # noqa: E402

from recurrent.models import SMOLLM2, TINY, materialize  # noqa: E402

# tests/gpu_stack runs with the GPU set's interpreter (.venv-gpu: tests/test_gpu_stack.py, `make check-gpu-stack`);
# the CPU set has no vLLM.
collect_ignore = [] if importlib.util.find_spec("vllm") else ["gpu_stack"]


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """The tiny random Qwen2 model folder (materialized by set-up; built here if missing)."""
    return str(materialize(TINY))


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """The SmolLM2-135M-Instruct folder converted from the packaged GGUF."""
    return str(materialize(SMOLLM2))
