"""The ``hf_cpu`` rollout server: verl's token-in/token-out server API around a transformers model.

One instance per replica runs as a Ray actor (created by :class:`~verl_ext.cpu.rollout.replica.HFCPUReplica`).
It answers what verl's rollout servers answer (``workers/rollout/vllm_rollout/vllm_async_server.py``):

- ``generate(request_id, prompt_ids, sampling_params, image_data=None, video_data=None, **kw) -> TokenOutput``,
  called by ``LLMServerClient.generate`` (``workers/rollout/llm_server.py:105-163``). ``max_tokens`` (or
  ``max_new_tokens``) caps new tokens; without it the default is vLLM's,
  ``min(response_length, prompt_length + response_length - len(prompt))`` (``vllm_async_server.py:601-612``),
  and it is clamped to ``[1, max_model_len - len(prompt)]``. ``temperature``/``top_p``/``top_k`` are
  honoured, ``logprobs`` returns the log-probability of each sampled token under the temperature-scaled
  distribution (vLLM's ``processed_logprobs``, what the actor recomputes). ``extra_fields`` carries
  ``global_steps`` (the weight version), which ``LLMServerClient`` and the V1 replay buffer read.
- ``update_weights(state_dict, global_steps)``: the weights pushed by the trainer-side adapter.
- ``sleep`` / ``wake_up(tags)``: the memory release that ``rollout.free_cache_engine`` controls, with vLLM's
  contract (``vllm_async_server.py`` ``sleep``: a no-op unless ``free_cache_engine``; otherwise the weights are
  discarded, vLLM's level-2 sleep, and come back through ``wake_up(["weights"])`` and the next weight sync).
  verl's sync trainer sleeps the replicas after every rollout and its worker resumes them before the weight
  sync only when ``free_cache_engine`` is set (``engine_workers.py`` ``update_weights``), so this twin shows on
  CPU what a vLLM replica holds during the training phases (docs/fidelity.md, "Rollout memory").
  ``RECURRENT_ROLLOUT_EVENTS=<dir>`` appends each change of state (``generate``, ``sleep``, ``wake_up:<tags>``,
  ``update_weights``) with the parameter bytes held to ``<dir>/server_<replica>.jsonl``.
- other lifecycle calls (kv-cache, abort, profiling): no-ops (no KV cache; requests are not preemptible).

Concurrent requests are batched by the engine (:class:`~verl_ext.cpu.hf_server.HFTokenServer`: one
``model.generate`` call takes every queued request of the same sampling, up to ``rollout.max_num_seqs``, vLLM's
cap on the sequences of a batch; ``max_num_seqs=1`` serves them one at a time). Each call runs under the model
lock that weight updates and sleep / wake-up take, so none of them interleaves with a generation (the forward
passes run in a thread so the actor's event loop stays responsive).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import torch
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.replica import TokenOutput

from verl_ext.cpu.hf_server import HFTokenServer

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


@torch.no_grad()
def copy_weights(model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy ``(name, tensor)`` pairs (Hugging Face names) into ``model`` in place; returns the count.

    Unknown names and shape mismatches raise: a silent partial update would let the server sample from a
    model the trainer no longer has. Tied weights (``lm_head.weight`` = embeddings) share storage, so
    either name updates both."""
    target = model.state_dict(keep_vars=True)
    copied = 0
    for name, tensor in weights:
        if name not in target:
            raise KeyError(f"weight {name!r} is not a parameter or buffer of the served model")
        dest = target[name]
        if tuple(dest.shape) != tuple(tensor.shape):
            raise ValueError(f"weight {name!r}: shape {tuple(tensor.shape)} != served {tuple(dest.shape)}")
        dest.data.copy_(tensor.detach().to(device=dest.device, dtype=dest.dtype))
        copied += 1
    return copied


class HFCPUServer:
    """A replica's server: the policy model in this process, its weights updated by the trainer."""

    def __init__(
        self,
        config: RolloutConfig | Any,
        model_config: HFModelConfig | Any,
        replica_rank: int = 0,
        dtype: str = "float32",
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.config: RolloutConfig = omega_conf_to_dataclass(config)
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        # vLLM's engine seed (vllm_async_server.py:343): rollout.seed + replica rank, so that a run's sampling
        # follows rollout.seed (the replication's RL seeds) and replicas draw different samples.
        torch.manual_seed(self.config.seed + replica_rank)
        model = AutoModelForCausalLM.from_pretrained(
            self.model_config.local_path,
            dtype=DTYPES[dtype],
            attn_implementation="sdpa",
            trust_remote_code=self.model_config.trust_remote_code,
        )
        self.max_model_len = self.config.max_model_len or self.config.prompt_length + self.config.response_length
        self.engine = HFTokenServer(
            model,
            self.model_config.tokenizer,
            device="cpu",
            max_model_len=self.max_model_len,
            max_batch_size=self.config.max_num_seqs,
            around_batch=self._generation,
        )
        self.weight_updates = 0
        self._lock: asyncio.Lock | None = None  # generation vs weight update; created in the actor's loop
        self._released: dict[str, tuple[torch.Size, torch.dtype]] | None = None  # parameter shapes while asleep
        events_dir = os.environ.get("RECURRENT_ROLLOUT_EVENTS")
        self._events = Path(events_dir) / f"server_{replica_rank}.jsonl" if events_dir else None
        self._last_event: str | None = None

    def _model_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    @contextlib.asynccontextmanager
    async def _generation(self) -> AsyncIterator[None]:
        """Entered by the engine around each model.generate call: the weights stay as they are meanwhile."""
        async with self._model_lock():
            if self._released is not None:
                raise RuntimeError("hf_cpu server: generate() while asleep (its weights are released)")
            self._event("generate")
            yield

    @property
    def model(self) -> torch.nn.Module:
        return self.engine.model

    @property
    def global_steps(self) -> int:
        return self.engine.global_steps

    async def ready(self) -> bool:
        """Returns once the model is loaded (the replica waits on it, so load errors surface at launch)."""
        return True

    def max_tokens_for(self, prompt_len: int, sampling_params: dict[str, Any]) -> int:
        """The token budget of a request, as vLLM's server computes it (``vllm_async_server.py:593-617``)."""
        headroom = self.max_model_len - prompt_len
        if headroom < 1:
            raise ValueError(
                f"prompt length ({prompt_len}) leaves no room to generate within max_model_len ({self.max_model_len})"
            )
        if sampling_params.get("max_tokens") is not None:
            budget = sampling_params["max_tokens"]
        elif sampling_params.get("max_new_tokens") is not None:
            budget = sampling_params["max_new_tokens"]
        else:
            budget = min(
                self.config.response_length, self.config.prompt_length + self.config.response_length - prompt_len
            )
        return max(1, min(int(budget), headroom))

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any
    ) -> TokenOutput:
        """verl's server ``generate``: the budget as vLLM computes it, then the engine's ``generate`` (which
        takes, and refuses, the multimodal ``image_data`` / ``video_data`` / ``audio_data``; it batches
        concurrent requests, each call under the model lock: ``_generation``)."""
        params = dict(sampling_params)
        params.pop("max_new_tokens", None)
        params["max_tokens"] = self.max_tokens_for(len(prompt_ids), sampling_params)
        params.setdefault("repetition_penalty", getattr(self.config, "repetition_penalty", 1.0))
        return await self.engine.generate(request_id, prompt_ids=prompt_ids, sampling_params=params, **kwargs)

    async def update_weights(self, state_dict: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Load the trainer's weights (Hugging Face names) and record their version."""
        async with self._model_lock():
            if self._released is not None:
                raise RuntimeError("hf_cpu server: update_weights() while the weights are released (wake_up first)")
            copied = copy_weights(self.engine.model, state_dict.items())
            self.weight_updates += 1
            self._event("update_weights")
            if global_steps is not None:
                self.engine.global_steps = int(global_steps)
        logger.info("hf_cpu server %d: %d tensors updated (global_steps=%s)", self.replica_rank, copied, global_steps)
        return copied

    async def set_global_steps(self, global_steps: int) -> None:
        self.engine.global_steps = int(global_steps)

    async def get_global_steps(self) -> int:
        return self.engine.global_steps

    async def stats(self) -> dict[str, int]:
        return {
            "requests": self.engine.requests,
            "generate_calls": self.engine.generate_calls,
            "weight_updates": self.weight_updates,
            "global_steps": self.engine.global_steps,
            "held_parameter_bytes": self.held_parameter_bytes(),
        }

    def held_parameter_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.engine.model.parameters())

    def _event(self, name: str) -> None:
        if self._events is None or name == self._last_event:
            return
        self._last_event = name
        record = {"event": name, "held_parameter_bytes": self.held_parameter_bytes(), "global_steps": self.global_steps}
        with open(self._events, "a") as file:
            file.write(json.dumps(record) + "\n")

    # Memory release (rollout.free_cache_engine), as vLLM's server does it.
    async def sleep(self, *args: Any, **kwargs: Any) -> None:
        if not self.config.free_cache_engine:  # vLLM: `if ... not self.config.free_cache_engine: return`
            self._event("sleep:kept")
            return
        async with self._model_lock():
            if self._released is None:
                params = dict(self.engine.model.named_parameters())  # tied weights appear once
                self._released = {name: (p.shape, p.dtype) for name, p in params.items()}
                for p in params.values():
                    p.data = torch.empty(0, dtype=p.dtype)  # the storage is freed; buffers (rotary) stay
            self._event("sleep")

    async def wake_up(self, tags: list[str] | None = None, *args: Any, **kwargs: Any) -> None:
        tags = list(tags or ["weights", "kv_cache"])
        async with self._model_lock():
            if "weights" in tags and self._released is not None:
                # Storage only: the values arrive with the weight sync that follows (verl resumes, then syncs).
                for name, p in self.engine.model.named_parameters():
                    shape, dtype = self._released[name]
                    p.data = torch.empty(shape, dtype=dtype)
                self._released = None
            self._event("wake_up:" + ",".join(sorted(tags)))

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        await self.engine.drain()

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None
