"""The memory agent loop through verl's own client stack on a real local Ray: verl's ``LLMServerClient`` and
``GlobalRequestLoadBalancer`` in front of the tiny-model token server running as a Ray actor (as verl's
rollout servers do), the way ``AgentLoopWorkerTQ`` hands ``server_manager`` to agent loops."""

from __future__ import annotations

import pytest
import ray
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.router import GlobalRequestLoadBalancer
from vx_helpers import memory_agent_loop

from verl_ext.cpu.hf_server import HFTokenServer


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


async def test_agent_loop_through_verls_llm_server_client(local_ray, tiny_config, tiny_tokenizer, tiny_model_dir):
    server = ray.remote(HFTokenServer).options(num_cpus=0).remote(tiny_model_dir)
    balancer = ray.remote(GlobalRequestLoadBalancer).options(num_cpus=0).remote(servers={"hf_cpu_server_0": server})
    client = LLMServerClient(tiny_config, load_balancer_handle=balancer)
    loop = memory_agent_loop(tiny_config, tiny_tokenizer, client)
    chat = [{"role": "user", "content": "What is the magic number?"}]
    context = "The river city was born in the year of the film. " * 3 + "The magic number is 42."
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    outputs = await loop.run(sampling, uid="uidR", session_id=0, prompt=chat, raw_prompt=chat, context=context)

    assert [o.extra_fields["turn_kind"] for o in outputs][-1] == "final" and len(outputs) >= 3
    for output in outputs:
        assert 1 <= len(output.response_ids) <= output.extra_fields["max_tokens"]
        assert len(output.response_logprobs) == len(output.response_ids)
        # verl's client tags the weight version of every call; the row carries the trajectory's range.
        assert (output.extra_fields["min_global_steps"], output.extra_fields["max_global_steps"]) == (0, 0)
    assert ray.get(server.__ray_call__.remote(lambda self: self.requests)) == len(outputs)
