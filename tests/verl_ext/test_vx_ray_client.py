"""The memory agent loop through verl's own client stack on a real local Ray: verl's ``LLMServerClient`` and
``GlobalRequestLoadBalancer`` in front of the tiny-model token server running as a Ray actor (as verl's
rollout servers do), the way ``AgentLoopWorkerTQ`` hands ``server_manager`` to agent loops."""

from __future__ import annotations

import pytest
import ray
from process_helpers import in_a_fresh_process
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.router import GlobalRequestLoadBalancer
from vx_helpers import recurrent_agent_loop

from verl_ext.cpu.hf_server import HFTokenServer


def agent_loop_through_ray(tiny_config, tiny_tokenizer, tiny_model_dir: str) -> dict:
    """In a fresh process (process_helpers.in_a_fresh_process): a local Ray, the server and verl's balancer as
    actors, one memory-agent trajectory through verl's client; what the test checks comes back."""
    import asyncio

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        server = ray.remote(HFTokenServer).options(num_cpus=0).remote(tiny_model_dir)
        balancer = ray.remote(GlobalRequestLoadBalancer).options(num_cpus=0).remote(servers={"hf_cpu_server_0": server})
        client = LLMServerClient(tiny_config, load_balancer_handle=balancer)
        loop = recurrent_agent_loop(tiny_config, tiny_tokenizer, client)
        chat = [{"role": "user", "content": "What is the magic number?"}]
        context = "The river city was born in the year of the film. " * 3 + "The magic number is 42."
        sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
        run = loop.run(sampling, uid="uidR", session_id=0, prompt=chat, raw_prompt=chat, context=context)
        outputs = asyncio.run(run)
        turns = [
            {
                "kind": o.extra_fields["turn_kind"],
                "tokens": len(o.response_ids),
                "log_probs": len(o.response_logprobs),
                "max_tokens": o.extra_fields["max_tokens"],
                "steps": (o.extra_fields["min_global_steps"], o.extra_fields["max_global_steps"]),
            }
            for o in outputs
        ]
        return {"turns": turns, "requests": ray.get(server.__ray_call__.remote(lambda self: self.requests))}
    finally:
        ray.shutdown()


@pytest.mark.slow(seconds=50)
def test_agent_loop_through_verls_llm_server_client(tiny_config, tiny_tokenizer, tiny_model_dir):
    seen = in_a_fresh_process(agent_loop_through_ray, tiny_config, tiny_tokenizer, tiny_model_dir)
    turns = seen["turns"]
    assert turns[-1]["kind"] == "final" and len(turns) >= 3
    for turn in turns:
        assert 1 <= turn["tokens"] <= turn["max_tokens"]
        assert turn["log_probs"] == turn["tokens"]
        # verl's client tags the weight version of every call; the row carries the trajectory's range.
        assert turn["steps"] == (0, 0)
    assert seen["requests"] == len(turns)
