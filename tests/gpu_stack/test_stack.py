"""The GPU set as installed from its lock: the versions the lock names, the CUDA build of torch, and verl's vLLM
rollout with our agent loop importing against the real vLLM."""

import importlib
import importlib.metadata as metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def locked_versions() -> dict[str, str]:
    import sys

    sys.path.insert(0, str(REPO / "scripts"))
    import locks

    return locks.lock_pins(locks.lock_path("gpu", f"{sys.version_info[0]}.{sys.version_info[1]}"))


def test_installed_versions_are_the_locks():
    locked = locked_versions()
    for name in ("torch", "vllm", "verl", "transformers", "numpy", "fastapi", "triton", "ray", "tensordict"):
        assert metadata.version(name).split("+")[0] == locked[name], name
    differing = {}
    for name, version in locked.items():
        try:
            installed = metadata.version(name).split("+")[0]
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            differing[name] = (installed, version)
    assert differing == {}


def test_torch_is_the_cuda_13_build():
    import torch

    assert torch.__version__ == "2.11.0+cu130"
    assert torch.version.cuda.startswith("13.")
    # kernels for compute capability 7.5 to 12.0 (the paper's bf16 runs need 8.0 or more: README, "GPU clusters")
    assert torch._C._cuda_getArchFlags().split() == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


@pytest.mark.parametrize(
    "module",
    [
        "vllm.entrypoints.openai.api_server",
        "vllm.v1.engine.async_llm",
        "verl.workers.rollout.vllm_rollout.vllm_async_server",
        "verl.workers.rollout.vllm_rollout.vllm_rollout",
        "verl.workers.engine_workers",
        "verl.trainer.ppo.v1.agent_loop_tq",
        "verl_ext.agent_loop",
        "verl_ext.agent_loop_manager",
        "verl_ext.trainer",
        "verl_ext.main",
    ],
)
def test_rollout_and_agent_loop_modules_import(module):
    importlib.import_module(module)


def test_the_recurrent_agent_loop_is_registered_with_real_vllm():
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    assert "recurrent_agent" in _agent_loop_registry
