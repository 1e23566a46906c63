"""The memory agent loop against a real token server (the tiny model): the rows of documents of 0, 1 and
several chunks, in async mode (one verl agent loop per trajectory) and sync mode (lockstep rounds)."""

from __future__ import annotations

import pytest
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from vx_helpers import recurrent_agent_loop

from recurrent.impls.memory import NO_MEMORY
from recurrent.tokens import encode_long, num_chunks
from verl_ext.rollout import AgentRollout
from verl_ext.sync_rollout import Trajectory, run_trajectories

QUESTION = "What is the magic number of the river city?"
# Greedy decoding: the tiny random model is deterministic, so async and sync rows can be compared exactly.
SAMPLING = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
DOCUMENTS = {
    "empty": "",
    "short": "The magic number is 42.",
    "long": "The river city was born in the year of the film. " * 6 + "The magic number is 42.",
}


class RecordingServer:
    """Forwards to the real server and records (request id, prompt length, max_tokens) per call, in order."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[tuple[str, int, int]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.calls.append((request_id, len(prompt_ids), sampling_params["max_tokens"]))
        return await self.inner.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)


def sample(uid: str, context: str) -> dict:
    """A dataset row as verl's worker hands it to an agent loop (every column, plus uid and session id)."""
    chat = [{"role": "user", "content": QUESTION}]
    return {
        "uid": uid,
        "session_id": 0,
        "global_steps": 1,
        "index": 0,
        "prompt": chat,
        "raw_prompt": chat,
        "context": context,
        "data_source": "hotpotqa",
        "reward_model": {"ground_truth": "42"},
        "extra_info": {},
    }


def expected_prompt_ids(rollout: AgentRollout, tokenizer, context: str, responses: list[list[int]]) -> list[list[int]]:
    """Every turn's prompt rebuilt from recurrent's templates: memory turn k sees chunk k and the previous
    response with eos/pad dropped ("No previous memory" first); the final turn sees the last memory."""
    workflow, cfg = rollout.agent, rollout.agent.config
    question = tokenizer.encode(QUESTION, add_special_tokens=False)
    ids = encode_long(context, tokenizer)
    no_memory = tokenizer.encode(NO_MEMORY, add_special_tokens=False)
    memory = no_memory
    prompts = []
    for k in range(num_chunks(len(ids), cfg.chunk_size)):
        chunk = ids[k * cfg.chunk_size : (k + 1) * cfg.chunk_size]
        prompts.append(workflow.memory_ids_template.format(prompt=question, memory=memory, chunk=chunk))
        memory = [t for t in responses[k] if t not in (tokenizer.eos_token_id, tokenizer.pad_token_id)] or no_memory
    prompts.append(workflow.final_ids_template.format(prompt=question, memory=memory))
    return prompts


def check_rows(outputs, rollout: AgentRollout, tokenizer, context: str) -> None:
    cfg = rollout.agent.config
    chunks = num_chunks(len(encode_long(context, tokenizer)), cfg.chunk_size)
    assert len(outputs) == chunks + 1  # one row per memory update, then the answer
    kinds = [o.extra_fields["turn_kind"] for o in outputs]
    assert kinds == ["memory"] * chunks + ["final"]
    assert [o.extra_fields["chunk"] for o in outputs] == [*range(chunks), -1]
    assert [o.extra_fields["turn_index"] for o in outputs] == list(range(chunks + 1))
    responses = [o.response_ids for o in outputs]
    assert [o.prompt_ids for o in outputs] == expected_prompt_ids(rollout, tokenizer, context, responses)
    for output, kind in zip(outputs, kinds, strict=True):
        cap = cfg.max_memorization_length if kind == "memory" else cfg.max_final_response_length
        assert output.extra_fields["max_tokens"] == cap
        assert 1 <= len(output.response_ids) <= cap <= rollout.budgets.response_length
        assert len(output.prompt_ids) <= rollout.budgets.prompt_length
        assert output.response_mask == [1] * len(output.response_ids)  # every generated token is trained on
        assert len(output.response_logprobs) == len(output.response_ids)
        stopped = output.response_ids[-1] in (tokenizer.eos_token_id, tokenizer.pad_token_id)
        assert output.extra_fields["finish_reason"] == (
            "length" if len(output.response_ids) == cap and not stopped else "stop"
        )
        assert output.num_turns == chunks + 1
        assert output.extra_fields["global_steps"] == 0 == output.extra_fields["min_global_steps"]


def test_memory_agent_is_registered():
    assert _agent_loop_registry["recurrent_agent"] == {"_target_": "verl_ext.agent_loop.RecurrentAgentLoop"}


@pytest.fixture(scope="module")
def documents(tiny_tokenizer) -> dict[str, str]:
    chunks = {name: num_chunks(len(encode_long(text, tiny_tokenizer)), 16) for name, text in DOCUMENTS.items()}
    assert chunks["empty"] == 0 and chunks["short"] == 1 and chunks["long"] >= 3, chunks
    return DOCUMENTS


async def test_async_agent_loop_rows(tiny_config, tiny_tokenizer, tiny_server, documents):
    server = RecordingServer(tiny_server)
    loop = recurrent_agent_loop(tiny_config, tiny_tokenizer, server)
    rollout = AgentRollout.get(tiny_config, tiny_tokenizer)
    for name, context in documents.items():
        server.calls.clear()
        outputs = await loop.run(dict(SAMPLING), **sample(f"uid{name}", context))
        check_rows(outputs, rollout, tiny_tokenizer, context)
        # Each call carried its turn's own cap, and all turns of a prompt share one request id (sticky routing).
        assert [c[2] for c in server.calls] == [o.extra_fields["max_tokens"] for o in outputs]
        assert {c[0] for c in server.calls} == {f"uid{name}"}


async def test_sync_mode_runs_turns_in_lockstep_with_the_same_rows(tiny_config, tiny_tokenizer, tiny_server, documents):
    rollout = AgentRollout.get(tiny_config, tiny_tokenizer)
    names = list(documents)  # empty (0 chunks), short (1), long (several); two rollouts each
    trajectories = [
        Trajectory({**sample(f"uid{name}", documents[name]), "session_id": s}, s, dict(SAMPLING))
        for name in names
        for s in range(2)
    ]
    server = RecordingServer(tiny_server)
    results = await run_trajectories(rollout, server, trajectories)

    chunks = [num_chunks(len(encode_long(t.sample["context"], tiny_tokenizer)), 16) for t in trajectories]
    for outputs, trajectory in zip(results, trajectories, strict=True):
        check_rows(outputs, rollout, tiny_tokenizer, trajectory.sample["context"])
    # Round r holds the r-th memory turn of every session still reading; all answers come last, together.
    expected = []
    for r in range(max(chunks)):
        expected += [(t.sample["uid"], 8) for t, c in zip(trajectories, chunks, strict=True) if c > r]
    expected += [(t.sample["uid"], 6) for t in trajectories]
    assert [(uid, cap) for uid, _, cap in server.calls] == expected

    # Same sessions, same greedy server: lockstep changes the schedule, not the rows.
    loop = recurrent_agent_loop(tiny_config, tiny_tokenizer, tiny_server)
    for outputs, trajectory in zip(results, trajectories, strict=True):
        alone = await loop.run(dict(SAMPLING), **trajectory.sample)
        assert [(o.prompt_ids, o.response_ids) for o in alone] == [(o.prompt_ids, o.response_ids) for o in outputs]
