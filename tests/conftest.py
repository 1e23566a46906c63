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
from yaml_memo import memoize_yaml_parsing  # noqa: E402

from experiments.sft import pin_numerics  # noqa: E402
from recurrent.models import SMOLLM2, TINY, materialize  # noqa: E402

# Every test process (and what it starts) computes on the numerics a warm start's build pins, set before its first
# kernel: a build inside a test process then equals a build's own fresh process on a machine with AVX-512 too, where
# the pins set later would not take effect (docs/replication_cpu_notebook.md, "The build on another machine").
pin_numerics()

memoize_yaml_parsing()  # Hydra's compositions in the workers parse each config file once (tests/yaml_memo.py)

# tests/gpu_stack runs with the GPU set's interpreter (.venv-gpu: tests/test_gpu_stack.py, `make check-gpu-stack`);
# the CPU set has no vLLM.
collect_ignore = [] if importlib.util.find_spec("vllm") else ["gpu_stack"]


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """The tiny random Qwen2 model folder (materialized by set-up; built here if missing)."""
    return str(materialize(TINY))


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir):
    """A real `transformers serve` with the tiny model (``base_url``, ``model``), one per test process: each start
    costs ~8 s of CPU, and greedy replies do not depend on what was asked before."""
    from recurrent.local_server import transformers_serve

    with transformers_serve(tiny_model_dir) as server:
        yield server


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """The SmolLM2-135M-Instruct folder converted from the packaged GGUF."""
    return str(materialize(SMOLLM2))


def expected_seconds(item: pytest.Item) -> float:
    """What the ``slow`` marker says a test (or the module fixture it shares) costs on 2 idle cores."""
    marker = item.get_closest_marker("slow")
    if marker is None:
        return 0.0
    return float(marker.kwargs.get("seconds", 30))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slowest files first. ``make test`` hands whole files to two workers in this order
    (``--dist loadfile --no-loadscope-reorder``), so the trainer runs start at once and the short files fill in
    around them, instead of a trainer run starting last and running alone. Only the order changes."""
    cost: dict[str, float] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        cost[path] = max(cost.get(path, 0.0), expected_seconds(item))
    items.sort(key=lambda item: -cost[item.nodeid.split("::", 1)[0]])  # stable: file order otherwise unchanged
