"""Unit tests of the CPU adaptations of verl 0.9.1 (verl_ext/cpu): platform, the backend patch, the engine
registrations, the ``hf_cpu`` rollout server and adapter, the loader's VERL_PLATFORM guard.

What depends on verl's process-wide platform singleton runs in a subprocess (``import verl`` with the
loader in ``VERL_USE_EXTERNAL_MODULES``, as every Ray process of a CPU run does); the rest runs here, where
``register()`` only adds registry entries that change nothing unless ``VERL_PLATFORM=cpu``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from verl_ext import cpu as verl_ext_cpu

REPO = str(Path(__file__).resolve().parents[3])


def run_python(code: str, **env: str) -> dict:
    """Run ``code`` in a fresh interpreter (env: this one's minus VERL_PLATFORM, plus ``env``); it prints one
    JSON line last, which is returned."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES")}
    full_env.update(env)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


PROBE = """
    import json, sys
    import verl
    lazy = "verl.workers.engine.fsdp.transformer_impl" not in sys.modules  # deferred registrations stay deferred
    from verl.plugin.platform import PlatformRegistry
    from verl.utils.device import get_device_name, get_nccl_backend, get_device_id, get_resource_name
    from verl.workers.rollout.replica import RolloutReplicaRegistry
    print(json.dumps({
        "device": get_device_name(),
        "backend": get_nccl_backend(),
        "device_id": str(get_device_id()) if get_device_name() == "cpu" else None,
        "resource": get_resource_name(),
        "cpu_registered": PlatformRegistry.get("cpu") is not None,
        "hf_cpu_registered": "hf_cpu" in RolloutReplicaRegistry._registry,
        "engine_module_not_imported_by_verl": lazy,
    }))
"""


# ------------------------------------------------------------------------------------------------------------
# platform and loader


def test_cpu_platform_is_selected_with_verl_platform_cpu():
    result = run_python(PROBE, VERL_PLATFORM="cpu", VERL_USE_EXTERNAL_MODULES="verl_ext.cpu.load")
    assert result == {
        "device": "cpu",
        "backend": "gloo",
        "device_id": "cpu",
        "resource": "GPU",  # fake Ray GPUs
        "cpu_registered": True,
        "hf_cpu_registered": True,  # registered when verl's replica module was imported
        "engine_module_not_imported_by_verl": True,
    }


def test_loader_does_nothing_without_verl_platform_cpu():
    """A host with the loader in VERL_USE_EXTERNAL_MODULES but no VERL_PLATFORM=cpu (a GPU cluster) keeps
    verl's own platform detection and registries."""
    result = run_python(PROBE, VERL_USE_EXTERNAL_MODULES="verl_ext.cpu.load")
    assert result["device"] != "cpu" and result["backend"] != "gloo"
    assert not result["cpu_registered"] and not result["hf_cpu_registered"]


def test_platform_is_never_auto_detected_and_names_cpu_devices():
    from verl_ext.cpu.platform import PlatformCPU

    platform = PlatformCPU()
    assert not platform.is_platform_available(use_smi_check=True)
    assert not platform.is_platform_available()
    assert platform.device_name == "cpu" and platform.vendor_name == "cpu"
    assert platform.current_device() == "cpu"  # a device string, never the int 0 (= cuda:0)
    assert torch.zeros(1).to(platform.current_device()).device.type == "cpu"
    assert platform.communication_backend_name() == "gloo"
    assert platform.ray_resource_name() == "GPU" and platform.ray_resource_options(1) == {"num_gpus": 1}
    assert platform.get_device_capability() == (None, None)
    with platform.nvtx_range("x"):
        pass


def test_device_module_answers_what_verl_calls():
    from verl_ext.cpu.platform import PlatformCPU

    device = PlatformCPU().device_module
    assert device.is_available() is False  # guards accelerator-only work in verl (memory stats, map_location)
    assert device.current_device() == "cpu" and device.device_count() == 1
    for noop in ("empty_cache", "synchronize", "ipc_collect", "reset_peak_memory_stats"):
        assert getattr(device, noop)() is None
    assert device.set_device(0) is None and device.set_per_process_memory_fraction(0.9) is None
    assert device.memory_allocated() == 0 and device.max_memory_reserved() == 0
    free, total = device.mem_get_info()
    assert 0 < free <= total
    state = device.get_rng_state()
    first = torch.rand(3)
    device.set_rng_state(state)
    assert torch.equal(first, torch.rand(3))
    assert device.Stream is torch.cpu.Stream and device.amp is torch.cpu.amp  # forwarded from torch.cpu


def test_register_is_idempotent_and_the_platform_registry_keeps_one_class():
    from verl.plugin.platform import PlatformRegistry

    from verl_ext.cpu.platform import PlatformCPU

    verl_ext_cpu.register()
    verl_ext_cpu.register()
    assert PlatformRegistry.get("cpu") is PlatformCPU


# ------------------------------------------------------------------------------------------------------------
# the backend patch (adaptation 3)


def test_backend_patch_defaults_to_cpu_gloo_only_on_the_cpu_device(monkeypatch):
    import verl.utils.device as device
    import verl.utils.distributed as distributed
    import verl.workers.engine_workers as engine_workers

    from verl_ext.cpu import dist_patch

    verl_ext_cpu.register()
    patched = distributed.initialize_global_process_group_ray
    assert patched.__verl_ext_cpu_patched__
    assert engine_workers.initialize_global_process_group_ray is patched  # engine_workers.py:38 binding
    monkeypatch.setattr(device, "get_device_name", lambda: "cpu")
    assert dist_patch.default_backend(None) == "cpu:gloo"
    assert dist_patch.default_backend("cpu:gloo") == "cpu:gloo"  # explicit backends pass through
    monkeypatch.setattr(device, "get_device_name", lambda: "cuda")
    assert dist_patch.default_backend(None) is None  # verl's own default on every other device
    dist_patch.apply()  # idempotent: no second wrapper
    assert distributed.initialize_global_process_group_ray is patched


def test_backend_patch_lets_a_cpu_process_group_start():
    """verl's default backend string on device cpu is rejected by torch; the patched function starts gloo."""
    result = run_python(
        """
        import json, os, socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        import verl, torch.distributed as dist
        from verl.workers import engine_workers
        init = engine_workers.initialize_global_process_group_ray
        try:
            init.__wrapped__(timeout_second=60)   # verl's own function: "cpu:gloo,cpu:gloo"
            original_error = None
        except ValueError as err:
            original_error = str(err)
        init(timeout_second=60)
        print(json.dumps({"original_error": original_error, "backend": dist.get_backend()}))
        dist.destroy_process_group()
        """,
        VERL_PLATFORM="cpu",
        VERL_USE_EXTERNAL_MODULES="verl_ext.cpu.load",
    )
    assert "Duplicate device type cpu" in result["original_error"]
    assert result["backend"] == "cpu:gloo"


# ------------------------------------------------------------------------------------------------------------
# engines


def test_fsdp_engines_are_registered_for_device_cpu(monkeypatch):
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    from verl_ext.cpu._fsdp_cpu import CPUFSDPEngineWithLMHead, CPUFSDPEngineWithValueHead

    verl_ext_cpu.register()
    assert EngineRegistry._engines["language_model"]["fsdp2"]["cpu"] is CPUFSDPEngineWithLMHead
    assert EngineRegistry._engines["value_model"]["fsdp2"]["cpu"] is CPUFSDPEngineWithValueHead
    assert "cpu" not in EngineRegistry._engines["language_model"]["fsdp"]  # FSDP1 needs a GPU (engine.py)
    for backend in ("fsdp", "fsdp2"):  # the GPU registrations are untouched
        assert EngineRegistry._engines["language_model"][backend]["cuda"] is FSDPEngineWithLMHead
    assert issubclass(CPUFSDPEngineWithLMHead, FSDPEngineWithLMHead)
    assert issubclass(CPUFSDPEngineWithValueHead, FSDPEngineWithValueHead)
    monkeypatch.setenv("VERL_ENGINE_DEVICE", "cpu")  # what get_engine_cls sees on the cpu platform
    assert EngineRegistry.get_engine_cls("language_model", "fsdp2") is CPUFSDPEngineWithLMHead


def test_forward_only_cpu_engine_builds_fsdp_without_host_offload(monkeypatch):
    """The ref engine (forward_only) would get CPUOffloadPolicy(pin_memory=True), which needs an accelerator."""
    from verl.workers.config import FSDPEngineConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    from verl_ext.cpu._fsdp_cpu import CPUFSDPEngineWithLMHead

    seen = []

    def build(self, module):
        seen.append(self.engine_config)
        return module

    monkeypatch.setattr(FSDPEngine, "_build_fsdp_module", build)
    engine = object.__new__(CPUFSDPEngineWithLMHead)
    config = FSDPEngineConfig(strategy="fsdp2", forward_only=True)
    engine.engine_config = config
    assert engine._build_fsdp_module("module") == "module"
    assert seen[0].forward_only is False and seen[0].strategy == "fsdp2"
    assert engine.engine_config is config and config.forward_only is True  # the engine keeps its config
    trainable = FSDPEngineConfig(strategy="fsdp2")
    engine.engine_config = trainable
    engine._build_fsdp_module("module")
    assert seen[1] is trainable


# ------------------------------------------------------------------------------------------------------------
# rollout: registries, server, adapter


def test_hf_cpu_rollout_is_registered():
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    from verl_ext.cpu.rollout.adapter import HFCPUServerAdapter
    from verl_ext.cpu.rollout.replica import HFCPUReplica

    verl_ext_cpu.register()
    assert get_rollout_replica_class("hf_cpu") is HFCPUReplica
    assert get_rollout_class("hf_cpu", "async") is HFCPUServerAdapter


@pytest.fixture(scope="module")
def rollout_config():
    from verl.workers.config import RolloutConfig

    return RolloutConfig(
        name="hf_cpu", prompt_length=64, response_length=16, max_model_len=80, tensor_model_parallel_size=1
    )


@pytest.fixture(scope="module")
def model_config(tiny_model_dir):
    from verl.workers.config import HFModelConfig

    return HFModelConfig(path=tiny_model_dir)


@pytest.fixture
def server(rollout_config, model_config):
    from verl_ext.cpu.rollout.server import HFCPUServer

    return HFCPUServer(rollout_config, model_config, replica_rank=0)


def prompt_ids(tokenizer, text: str = "Repeat exactly: river city") -> list[int]:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
    )


def direct_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    logits = logits[len(prompt) - 1 : len(prompt) + len(response) - 1] / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)


async def test_server_generate_honours_max_tokens_and_returns_logprobs_of_a_forward_pass(server):
    prompt = prompt_ids(server.engine.tokenizer)
    params = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": 5}
    out = await server.generate("r1", prompt_ids=prompt, sampling_params=params)
    eos = set(server.engine.eos_ids)
    assert 1 <= len(out.token_ids) <= 5 and (len(out.token_ids) == 5 or out.token_ids[-1] in eos)
    assert len(out.log_probs) == len(out.token_ids)
    expected = direct_logprobs(server.model, prompt, out.token_ids, temperature=0.7)
    assert torch.allclose(torch.tensor(out.log_probs), expected, atol=1e-4), (out.log_probs, expected)
    assert out.extra_fields["global_steps"] == 0
    assert params["max_tokens"] == 5  # the caller's dict is not consumed

    no_logprobs = await server.generate("r2", prompt_ids=prompt, sampling_params={"temperature": 1.0})
    assert no_logprobs.log_probs is None
    # without max_tokens: vLLM's default, min(response_length, prompt_length + response_length - len(prompt))
    assert len(no_logprobs.token_ids) <= 16


async def test_server_budget_is_clamped_to_max_model_len(server):
    prompt = [5] * 76  # 4 tokens of headroom under max_model_len=80
    assert server.max_tokens_for(len(prompt), {"max_tokens": 16}) == 4
    assert server.max_tokens_for(10, {}) == 16
    assert server.max_tokens_for(60, {}) == 16 and server.max_tokens_for(70, {}) == 10
    out = await server.generate("r3", prompt_ids=prompt, sampling_params={"temperature": 1.0, "max_tokens": 16})
    assert len(out.token_ids) <= 4
    with pytest.raises(ValueError, match="no room"):
        server.max_tokens_for(80, {})


async def test_server_greedy_honours_top_k_and_is_deterministic(server):
    prompt = prompt_ids(server.engine.tokenizer)
    greedy = {"temperature": 0.0, "max_tokens": 8, "logprobs": True}
    first = await server.generate("g1", prompt_ids=prompt, sampling_params=greedy)
    second = await server.generate("g2", prompt_ids=prompt, sampling_params=greedy)
    assert first.token_ids == second.token_ids
    top1_params = {"temperature": 1.0, "top_k": 1, "max_tokens": 8}
    top1 = await server.generate("k1", prompt_ids=prompt, sampling_params=top1_params)
    assert top1.token_ids == first.token_ids  # top_k=1 sampling is greedy


async def test_update_weights_changes_outputs_and_the_weight_version(server):
    prompt = prompt_ids(server.engine.tokenizer, "Repeat exactly: memory answer")
    greedy = {"temperature": 0.0, "max_tokens": 8}
    before = await server.generate("u1", prompt_ids=prompt, sampling_params=greedy)
    generator = torch.Generator().manual_seed(0)
    # named_parameters() lists tied weights (embeddings = lm_head) once, as the trainer's state dict must agree
    new_weights = {
        name: param.detach() + 0.5 * torch.randn(param.shape, generator=generator)
        for name, param in server.model.named_parameters()
    }
    copied = await server.update_weights(new_weights, global_steps=7)
    assert copied == len(new_weights)
    after = await server.generate("u2", prompt_ids=prompt, sampling_params=greedy)
    assert after.token_ids != before.token_ids
    assert after.extra_fields["global_steps"] == 7 and await server.get_global_steps() == 7
    name = next(iter(new_weights))
    assert torch.equal(server.model.state_dict()[name], new_weights[name])
    with pytest.raises(KeyError):
        await server.update_weights({"not.a.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="shape"):
        await server.update_weights({name: torch.zeros(3)})


async def test_server_lifecycle_calls_are_no_ops(server):
    for call in (
        server.clear_kv_cache,
        server.release_kv_cache,
        server.resume_kv_cache,
        server.resume_generation,
        server.wait_for_requests_to_drain,
        server.stop_profile,
    ):
        assert await call() is None
    assert (await server.abort_all_requests())["aborted_count"] == 0


async def test_server_sleeps_as_vllm_does_with_free_cache_engine(rollout_config, model_config):
    import dataclasses

    from verl_ext.cpu.rollout.server import HFCPUServer

    server = HFCPUServer(rollout_config, model_config, replica_rank=0)  # free_cache_engine: verl's default, true
    assert rollout_config.free_cache_engine
    prompt, greedy = prompt_ids(server.engine.tokenizer), {"temperature": 0.0, "max_tokens": 6}
    before = await server.generate("u1", prompt_ids=prompt, sampling_params=greedy)
    weights = {name: p.detach().clone() for name, p in server.model.named_parameters()}
    held = (await server.stats())["held_parameter_bytes"]
    assert held == sum(t.numel() * t.element_size() for t in weights.values()) > 0
    await server.sleep()  # level-2 sleep: the weights are discarded
    assert (await server.stats())["held_parameter_bytes"] == 0
    with pytest.raises(RuntimeError, match="asleep"):
        await server.generate("u2", prompt_ids=prompt, sampling_params=greedy)
    with pytest.raises(RuntimeError, match="released"):
        await server.update_weights(weights)
    await server.wake_up(tags=["weights"])  # storage back; the values come with the weight sync, as in verl
    assert (await server.stats())["held_parameter_bytes"] == held
    await server.update_weights(weights)
    await server.wake_up(tags=["kv_cache"])
    after = await server.generate("u3", prompt_ids=prompt, sampling_params=greedy)
    assert after.token_ids == before.token_ids

    kept = HFCPUServer(dataclasses.replace(rollout_config, free_cache_engine=False), model_config, replica_rank=0)
    await kept.sleep()  # vLLM: a no-op without free_cache_engine
    assert (await kept.stats())["held_parameter_bytes"] == held
    assert (await kept.generate("u4", prompt_ids=prompt, sampling_params=greedy)).token_ids == before.token_ids


class _FakeRemote:
    def __init__(self):
        self.calls = []

    def remote(self, *args, **kwargs):
        self.calls.append(args or kwargs)  # positional arguments, else the keyword ones

        async def done():
            return len(args[0]) if args else None

        return done()


class _FakeServer:
    """Records what the adapter sends to its server actor (``.remote`` calls)."""

    def __init__(self):
        self.update_weights, self.wake_up, self.sleep = _FakeRemote(), _FakeRemote(), _FakeRemote()


@pytest.mark.parametrize(("rank", "tp", "replica", "leader"), [(1, 1, 1, True), (1, 2, 0, False), (2, 2, 1, True)])
async def test_adapter_drains_weights_on_every_rank_and_sends_from_the_replica_leader(
    monkeypatch, rollout_config, model_config, rank, tp, replica, leader
):
    import dataclasses

    from verl_ext.cpu.rollout.adapter import HFCPUServerAdapter

    monkeypatch.setenv("RANK", str(rank))
    config = dataclasses.replace(rollout_config, tensor_model_parallel_size=tp)
    adapter = HFCPUServerAdapter(config, model_config, device_mesh=None)
    assert (adapter.replica_rank, adapter.is_leader) == (replica, leader)
    adapter._server = _FakeServer()
    drained = []

    def weights():
        for i in range(3):
            drained.append(i)
            yield f"w{i}", torch.full((2,), float(i))

    await adapter.update_weights(weights(), global_steps=4)
    assert drained == [0, 1, 2]  # every rank iterates (FSDP full_tensor() is a collective)
    calls = adapter._server.update_weights.calls
    if leader:
        ((state, steps),) = calls
        assert steps == 4 and sorted(state) == ["w0", "w1", "w2"] and torch.equal(state["w2"], torch.full((2,), 2.0))
    else:
        assert calls == []
    with pytest.raises(NotImplementedError):
        await adapter.update_weights(iter(()), wire_format="delta_flush")
    # free_cache_engine (true here, verl's default): the leader wakes and sleeps its server, as vLLM's adapter does
    await adapter.resume(["weights"])
    await adapter.release()
    assert adapter._server.wake_up.calls == ([{"tags": ["weights"]}] if leader else [])
    assert adapter._server.sleep.calls == ([{}] if leader else [])
    adapter.config = dataclasses.replace(config, free_cache_engine=False)  # nothing to release or resume
    await adapter.resume(["weights"])
    await adapter.release()
    assert len(adapter._server.wake_up.calls) == len(adapter._server.sleep.calls) == int(leader)


def test_server_actor_names_match_between_replica_and_adapter():
    from verl_ext.cpu.rollout import server_actor_name

    assert server_actor_name(0) == "hf_cpu_server_0"
    assert server_actor_name(1, "reward", "_x") == "hf_cpu_server_reward_1_x"


# ------------------------------------------------------------------------------------------------------------
# toy task


def test_toy_data_and_dense_reward(tmp_path):
    import pandas as pd

    from experiments.tiny import data as toy_data
    from experiments.tiny import reward as toy_reward

    paths = toy_data.write(tmp_path, train=6, val=2)
    train = pd.read_parquet(paths["train"])
    assert len(train) == 6 and set(train.columns) == {"prompt", "data_source", "reward_model", "extra_info"}
    row = train.iloc[0]
    answer = row["reward_model"]["ground_truth"]
    assert row["prompt"][0]["content"].endswith(answer)
    assert toy_reward.compute_score(row["data_source"], f" {answer.upper()} ", answer) == {"score": 1.0, "acc": 1.0}
    partial = toy_reward.compute_score("toy_copy", answer[: len(answer) // 2], answer)["score"]
    assert 0.0 < partial < 1.0
    assert toy_reward.compute_score("toy_copy", "", answer)["score"] == 0.0


def test_memory_task_documents_have_two_to_four_chunks_and_a_dense_reward(tmp_path, tiny_model_dir):
    import pandas as pd
    from transformers import AutoTokenizer

    from experiments.tiny import data as toy_data
    from experiments.tiny import reward as toy_reward
    from recurrent.tokens import encode_long, num_chunks

    paths = toy_data.write(tmp_path, train=40, val=4, task="memory")
    train = pd.read_parquet(paths["train"])
    assert {"prompt", "context", "data_source", "reward_model"} <= set(train.columns)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    chunks = [num_chunks(len(encode_long(context, tokenizer)), 64) for context in train.context]
    assert set(chunks) == {2, 3, 4}  # configs/tiny_cpu.yaml: chunk_size 64, max_chunks 4
    for _, row in train.iterrows():  # the needle is in the haystack
        assert f"is {row.reward_model['ground_truth']}." in row.context
    assert toy_data.make_memory_rows(3, "train", 0) == toy_data.make_memory_rows(5, "train", 0)[:3]  # prefix-stable

    score = toy_reward.compute_memory_score
    assert score("toy_memory", "so \\boxed{8019}", "8019") == {"score": 1.0, "acc": 1.0, "dense": 1.0, "strict": 1.0}
    unboxed = score("toy_memory", "8019", "8019")  # dense credit, but the strict verifier wants a box
    assert unboxed["score"] == 1.0 and unboxed["acc"] == 0.0
    near = score("toy_memory", "\\boxed{8010}", "8019")
    assert 0.0 < near["score"] < 1.0 and near["acc"] == 0.0
    assert score("toy_memory", "no digits here", "8019")["score"] == 0.0
    assert score("toy_memory", "\\boxed{17}", ["8019", "17"])["acc"] == 1.0  # any ground truth
