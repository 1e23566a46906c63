"""The ``hf_cpu`` server adapter: the trainer-side end of the weight sync, inside each FSDP worker.

``ActorRolloutRefWorker.init_model`` builds ``get_rollout_class(rollout.name, rollout.mode)``
(``workers/engine_workers.py:667``) from the module-level ``_ROLLOUT_REGISTRY`` of
``workers/rollout/base.py:89-93``, which has no public ``register()``; we add
``("hf_cpu", "async")`` to the dict (private name, hence version-guarded in :func:`register_adapter`).
Without it: ``AssertionError: Rollout hf_cpu with mode async not found``.

The sync trainer pushes weights with ``actor_wg.update_weights(mode="naive")`` (``checkpoint_engine/base.py:518``,
``trainer/ppo/v1/trainer_base.py:382`` forces ``naive``), i.e. ``ActorRolloutRefWorker.update_weights``
(``engine_workers.py:728-826``), which hands this adapter the engine's ``(name, tensor)`` generator on
every rank. Every rank must drain it: for FSDP2 each item is a ``DTensor.full_tensor()``, a collective.
The replica's first rank gathers the tensors into a CPU state dict and sends it to its server actor
(by name) through the Ray object store.

Upstream change that makes the registry entry unnecessary: a public ``register_rollout_class(name, mode, fqn)``
next to ``_ROLLOUT_REGISTRY``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Generator
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout

from verl_ext.cpu.rollout import server_actor_name

logger = logging.getLogger(__name__)


class HFCPUServerAdapter(BaseRollout):
    """Forwards weight updates from the FSDP ranks of one replica to that replica's ``HFCPUServer``."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1, **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        replica_world_size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        rank = int(os.environ.get("RANK", "0"))
        self.replica_rank = rank // replica_world_size if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % replica_world_size
        self.is_leader = self.rollout_rank == 0  # the rank that talks to the server
        self._server: ray.actor.ActorHandle | None = None

    def server(self) -> ray.actor.ActorHandle:
        """The replica's server actor (looked up lazily: servers launch after the hybrid engine)."""
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    # As vLLM's ServerAdapter (vllm_rollout.py resume/release): only with rollout.free_cache_engine.
    async def resume(self, tags: list[str]) -> None:
        if self.config.free_cache_engine and self.is_leader:
            await self.server().wake_up.remote(tags=tags)

    async def release(self) -> None:
        if self.config.free_cache_engine and self.is_leader:
            await self.server().sleep.remote()

    async def update_weights(
        self,
        weights: Generator[tuple[str, torch.Tensor], None, None],
        wire_format: str = "named_tensors",
        **kwargs: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"hf_cpu rollout takes full named tensors, not {wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("hf_cpu rollout does not serve unmerged LoRA adapters (set lora.merge=True)")
        state_dict: dict[str, torch.Tensor] = {}
        for name, tensor in weights:  # every rank drains the generator (FSDP collectives)
            if self.is_leader:
                state_dict[name] = tensor.detach().to("cpu").clone()
        if not self.is_leader:
            return
        copied = await self.server().update_weights.remote(state_dict, kwargs.get("global_steps"))
        logger.debug("hf_cpu replica %d: %d tensors pushed", self.replica_rank, copied)
