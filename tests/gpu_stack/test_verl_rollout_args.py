"""The paper's configs on the real GPU stack: verl 0.9.1 validates them with vLLM 0.24.0 installed, the engine
arguments verl's own vLLM server builds from them are accepted by vLLM's engine-argument class and give the
intended model configuration, and the launchers' DRY_RUN works with this interpreter."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path

import pytest
from conftest import LAUNCHERS
from omegaconf import OmegaConf
from vllm.engine.arg_utils import AsyncEngineArgs
from vx_helpers import compose_config

# config, the model folder it is checked with, tensor parallel, GPUs per node (hand-copied from configs/*.yaml)
RUNS = [
    ("memagent_7b", "Qwen2.5-7B-Instruct", 1, 8),
    ("memagent_14b", "Qwen2.5-14B-Instruct", 2, 8),
    ("smoke_gpu", "Qwen2.5-0.5B-Instruct", 1, 8),
]
VLLM_CONTEXT = 9216  # chunk 5000 + memory 1024 + question 1024 + template, and the 1024-token answer


def composed(name: str, folder: Path):
    config = compose_config(name, [f"actor_rollout_ref.model.path={folder}"])
    OmegaConf.resolve(config)
    return config


@pytest.mark.parametrize(("name", "model", "tp", "gpus"), RUNS, ids=[run[0] for run in RUNS])
def test_verl_validates_the_config_with_vllm_installed(name, model, tp, gpus, model_dirs):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config = composed(name, model_dirs[model])
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    assert config.actor_rollout_ref.rollout.name == "vllm"


def engine_args_from_verl(config, gpus: int) -> AsyncEngineArgs:
    """The command line verl's vLLM server builds for replica 0 (``vLLMHttpServer.launch_server``: its engine
    kwargs, compilation config, sleep mode, seed), parsed by vLLM's parser as verl does, caught where verl would
    start the engine (``run_server``, which needs a GPU), then read by vLLM's engine-argument class as
    ``run_server`` does first."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.rollout.replica import RolloutMode
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

    class ServerUpToTheEngine(vLLMHttpServer):
        async def run_server(self, args):
            self.server_args = args

    replica = vLLMReplica(
        replica_rank=0,
        config=omega_conf_to_dataclass(config.actor_rollout_ref.rollout),
        model_config=omega_conf_to_dataclass(config.actor_rollout_ref.model),
        gpus_per_node=gpus,
    )
    server = ServerUpToTheEngine(
        config=replica.config,
        model_config=replica.model_config,
        rollout_mode=RolloutMode.HYBRID,
        workers=[],
        replica_rank=0,
        node_rank=0,
        gpus_per_node=replica.gpus_per_node,
        nnodes=replica.nnodes,
        cuda_visible_devices=",".join(str(i) for i in range(replica.world_size)),
    )
    asyncio.run(server.launch_server())
    return AsyncEngineArgs.from_cli_args(server.server_args)


@pytest.mark.parametrize(("name", "model", "tp", "gpus"), RUNS, ids=[run[0] for run in RUNS])
def test_vllm_accepts_the_engine_arguments_verl_builds(name, model, tp, gpus, model_dirs, local_ray):
    config = composed(name, model_dirs[model])
    rollout = config.actor_rollout_ref.rollout
    engine_args = engine_args_from_verl(config, gpus)
    assert engine_args.model == str(model_dirs[model])
    assert engine_args.tensor_parallel_size == tp
    assert engine_args.max_model_len == VLLM_CONTEXT == rollout.max_model_len
    assert engine_args.enable_sleep_mode is True  # weights and KV cache released while the actor trains
    assert engine_args.gpu_memory_utilization == rollout.gpu_memory_utilization
    assert engine_args.dtype == "bfloat16"
    assert engine_args.enable_prefix_caching is True
    # vLLM's model and engine configuration. Sleep mode is a CUDA-platform feature that vLLM's CPU platform refuses
    # ("Sleep mode is not supported on current platform"), so those two are built with it off; everything else is
    # what verl passed.
    awake = dataclasses.replace(engine_args, enable_sleep_mode=False)
    model_config = awake.create_model_config()
    assert model_config.max_model_len == VLLM_CONTEXT
    assert model_config.hf_config.rope_parameters.get("rope_type", "default") == "default"  # no YaRN in training
    engine_config = awake.create_engine_config()
    assert engine_config.parallel_config.tensor_parallel_size == tp


def test_vllms_cpu_platform_is_what_refuses_sleep_mode(model_dirs, local_ray):
    # The one argument left out above is refused for the platform, not for its value.
    engine_args = engine_args_from_verl(composed("memagent_7b", model_dirs["Qwen2.5-7B-Instruct"]), 8)
    with pytest.raises(Exception, match="Sleep mode is not supported on current platform"):
        engine_args.create_model_config()


@pytest.mark.parametrize("script", LAUNCHERS)
def test_dry_run_of_the_launchers_with_the_gpu_interpreter(script, launcher_dry_runs):
    run = launcher_dry_runs[script]
    result = run.result()
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{sys.executable} -m verl_ext.main" in result.stdout
    for line in ("max_model_len: 9216", "name: vllm", "use_remove_padding: false", "attn_implementation: sdpa"):
        assert line in result.stdout, line  # resolved here, where flash-attn is not installed
    assert "flash-attn is not installed" in result.stderr
    assert not (run.folder / "runs").exists() and not (run.folder / "smoke").exists()
