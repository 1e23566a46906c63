"""The ``hf_cpu`` rollout replica: launches one :class:`~verl_ext.cpu.rollout.server.HFCPUServer` per replica.

Registered with the public ``RolloutReplicaRegistry.register("hf_cpu", loader)``
(``workers/rollout/replica.py:312-327``), which ``LLMServerManager`` consults through
``get_rollout_replica_class(rollout.name)`` (``replica.py:393``, ``llm_server.py:393``). Without it:
``ValueError: Unknown rollout mode: hf_cpu. Available: ['vllm', 'sglang', 'trtllm']``.

In hybrid mode (the sync trainer: FSDP workers and rollout colocated) each replica covers
``tensor_model_parallel_size * data_parallel_size * pipeline_model_parallel_size`` FSDP ranks; the server
runs in its own process (a Ray actor with ``num_cpus=0``, pinned to the node of the replica's first
worker), and the adapter on the replica's first rank pushes weights into it.
"""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.workers.rollout.replica import RolloutReplica

from verl_ext.cpu.rollout import SERVER_ADDRESS_SCHEME, server_actor_name


def _node_id(_worker_self) -> str:
    return ray.get_runtime_context().get_node_id()


class HFCPUReplica(RolloutReplica):
    """One transformers server per replica; no GPUs (``rollout_worker_use_gpu`` is False)."""

    def rollout_worker_use_gpu(self) -> bool:
        return False

    def _server_kind(self) -> str:
        if self.is_reward_model:
            return "reward"
        if self.is_teacher_model:
            return "teacher"
        return ""

    async def launch_servers(self) -> None:
        from verl_ext.cpu.rollout.server import HFCPUServer

        name = server_actor_name(self.replica_rank, self._server_kind(), self.name_suffix)
        options = {"name": name, "num_cpus": 0, "max_concurrency": self.max_concurrency}
        if self.workers:
            node_id = await self.workers[0].__ray_call__.remote(_node_id)
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        server = (
            ray.remote(HFCPUServer)
            .options(**options)
            .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"{SERVER_ADDRESS_SCHEME}{name}"


def load_replica_class() -> type[RolloutReplica]:
    return HFCPUReplica
