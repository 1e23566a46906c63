"""Capture the memory agent's training rows under a scripted server, as JSON: the fixture of
``test_vx_rows_unchanged.py``, which reruns :func:`capture` and compares.

``data/memory_rows.json`` was written by this script at the commit before the framework was made generic over
agents (verl's agent loop then called ``MemoryRollout`` directly); the names below are today's:

    PYTHONPATH=tests/verl_ext python tests/verl_ext/capture_memory_rows.py tests/verl_ext/data/memory_rows.json
"""

from __future__ import annotations

import asyncio
import json
import sys

from scripted_server import ScriptedTokenServer, ordinary_vocab
from vx_helpers import TINY_BUDGETS, compose_config, recurrent_agent_loop

from recurrent.models import TINY, materialize

QUESTION = "What is the magic number of the river city?"
DOCUMENTS = {
    "empty": "",
    "short": "The magic number is 42.",
    "long": "The river city was born in the year of the film. " * 6 + "The magic number is 42.",
    "longer": ("A team of the year met at the river. " * 9) + "The magic number is 7301. " + "Film key value. " * 5,
}
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


def sample(uid: str, context: str, session: int) -> dict:
    chat = [{"role": "user", "content": QUESTION}]
    return {
        "uid": uid,
        "session_id": session,
        "global_steps": 1,
        "index": 0,
        "prompt": chat,
        "raw_prompt": chat,
        "context": context,
        "data_source": "hotpotqa",
        "reward_model": {"ground_truth": "42"},
        "extra_info": {},
    }


def row(output) -> dict:
    return {
        "prompt_ids": list(output.prompt_ids),
        "response_ids": list(output.response_ids),
        "response_mask": list(output.response_mask),
        "response_logprobs": list(output.response_logprobs),
        "num_turns": output.num_turns,
        "extra_fields": {k: output.extra_fields[k] for k in sorted(output.extra_fields)},
    }


async def capture() -> dict:
    from transformers import AutoTokenizer

    model_dir = str(materialize(TINY))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = compose_config("tiny_cpu", [*TINY_BUDGETS, f"actor_rollout_ref.model.path={model_dir}"])
    server = ScriptedTokenServer(tokenizer.eos_token_id, ordinary_vocab(tokenizer))
    loop = recurrent_agent_loop(config, tokenizer, server)
    trajectories = {}
    for name, context in DOCUMENTS.items():
        for session in range(2):
            outputs = await loop.run(dict(SAMPLING), **sample(f"uid-{name}", context, session))
            trajectories[f"{name}/{session}"] = [row(o) for o in outputs]
    # Sync mode: the same trajectories in lockstep rounds.
    from verl_ext.rollout import AgentRollout
    from verl_ext.sync_rollout import Trajectory, run_trajectories

    batch = [
        Trajectory(sample(f"uid-{name}", context, session), session, dict(SAMPLING))
        for name, context in DOCUMENTS.items()
        for session in range(2)
    ]
    results = await run_trajectories(AgentRollout.get(config, tokenizer), server, batch)
    lockstep = {
        f"{name}/{t.session_id}": [row(o) for o in r]
        for t, r, name in zip(batch, results, [n for n in DOCUMENTS for _ in range(2)], strict=True)
    }
    return {
        "budgets": TINY_BUDGETS,
        "question": QUESTION,
        "documents": DOCUMENTS,
        "trajectories": trajectories,
        "lockstep": lockstep,
    }


if __name__ == "__main__":
    result = asyncio.run(capture())
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print({k: len(v) for k, v in result["trajectories"].items()})
