"""The lockstep driver of sync mode (recurrent/generation_manager.py), against hand-worked schedules.

The agents here are toy agent functions and the model is a coroutine that answers by rule, so every expectation
below is written out by hand: which agent calls in which round, with which budget, seeing which previous reply.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from transformers import AutoTokenizer

from recurrent.functions import FunctionEpisode
from recurrent.generation_manager import run_lockstep
from recurrent.impls.memory import MemoryConfig, MemoryWorkflow
from recurrent.interface import Reply, Turn, WorkflowConfig

MEMORY_TOKENS, FINAL_TOKENS = 6, 4
NON_FINAL_TURNS = [2, 1, 3, 1]  # s0 2 memory calls, s1 1, s2 3, s3 1, then every agent's answer
EXPECTED_ROUNDS = [[0, 1, 2, 3], [0, 2], [2], [0, 1, 2, 3]]  # max(memory calls) + 1 rounds, answers last


@dataclass
class ToyConfig(WorkflowConfig):
    fail: str = ""  # where agent 2 fails at its second call: "generate" (the model), "reply", "before_call"
    early_final: bool = False  # flag the first call final too (a bug: the reward row would not be the last)
    odd_budget: bool = False  # agent 1 asks 3 tokens a call
    pause: bool = False  # await something other than the model between calls


async def toy(sample: dict, client, config: ToyConfig) -> str:
    """``turns`` memory calls, then the answer flagged final; each prompt names the sample, the step and the last
    reply."""
    index, turns, memory = sample["index"], sample["turns"], "none"
    for step in range(turns + 1):
        if config.fail == "before_call" and index == 2 and step == 1:
            raise ValueError("injected failure before a call")
        final = step == turns or (config.early_final and step == 0)
        budget = 3 if config.odd_budget and index == 1 else FINAL_TOKENS if step == turns else MEMORY_TOKENS
        content = f"sample {index} step {step} memory {memory}"
        reply = await client.chat([{"role": "user", "content": content}], budget, final=final, meta={"step": step})
        if config.fail == "reply" and index == 2 and step == 1:
            raise ValueError("injected failure on a reply")
        if config.pause:
            for _ in range(index):  # a tool's await: the round waits until this agent is back at a call
                await asyncio.sleep(0)
        memory = reply.text
    return reply.text


def toy_episodes(turns: list[int] = NON_FINAL_TURNS, **config) -> list[FunctionEpisode]:
    return [FunctionEpisode(toy, {"index": i, "turns": k}, ToyConfig(**config), "toy") for i, k in enumerate(turns)]


class RuleModel:
    """Answers ``reply <sample>.<step>`` and logs every call as (sample, step, max_tokens), in call order."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []

    async def __call__(self, i: int, turn: Turn) -> Reply:
        self.calls.append((i, turn.meta["step"], turn.max_tokens))
        await asyncio.sleep(0)
        return Reply(text=f"reply {i}.{turn.meta['step']}", finish_reason="stop")


# --- the lockstep order ----------------------------------------------------------------------------------


@pytest.mark.parametrize("pause", [False, True])
async def test_rounds_are_turn_major_with_all_answers_last(pause):
    episodes, model = toy_episodes(pause=pause), RuleModel()
    run = await run_lockstep(episodes, model)
    assert run.rounds == EXPECTED_ROUNDS
    assert run.errors == [None] * 4 and run.num_failed == 0
    # Every call, in order, with the call's own budget: memory calls 6 tokens, answers 4.
    assert model.calls == [
        (0, 0, 6),
        (1, 0, 6),
        (2, 0, 6),
        (3, 0, 6),
        (0, 1, 6),
        (2, 1, 6),
        (2, 2, 6),
        (0, 2, 4),
        (1, 1, 4),
        (2, 3, 4),
        (3, 1, 4),
    ]
    assert [len(e.history) for e in episodes] == [3, 2, 4, 2]
    assert [[r.turn.final for r in e.history] for e in episodes] == [
        [False, False, True],
        [False, True],
        [False, False, False, True],
        [False, True],
    ]
    assert [e.answer for e in episodes] == ["reply 0.2", "reply 1.1", "reply 2.3", "reply 3.1"]


async def test_each_reply_goes_to_its_own_agent_and_call():
    episodes = toy_episodes()
    await run_lockstep(episodes, RuleModel())
    # Sample 2 reads three chunks: each prompt holds its own previous reply, the answer call the last memory.
    assert [r.turn.messages[0]["content"] for r in episodes[2].history] == [
        "sample 2 step 0 memory none",
        "sample 2 step 1 memory reply 2.0",
        "sample 2 step 2 memory reply 2.1",
        "sample 2 step 3 memory reply 2.2",
    ]
    assert [r.reply.text for r in episodes[1].history] == ["reply 1.0", "reply 1.1"]


async def test_a_round_waits_for_all_its_calls():
    events: list[str] = []

    async def slow_first(i: int, turn: Turn) -> Reply:
        events.append(f"S{i}")
        # Agent 0 is the slowest of a round, agent 3 the fastest: 3 - i passes of the event loop (a count of
        # scheduler turns, not a duration, so the order holds on a busy machine too).
        for _ in range(3 - i):
            await asyncio.sleep(0)
        events.append(f"E{i}")
        return Reply(text="m", finish_reason="stop")

    await run_lockstep(toy_episodes(), slow_first)
    every_agent = ["S0", "S1", "S2", "S3", "E3", "E2", "E1", "E0"]  # all start, then the fastest ends first
    # round 1 (nobody starts call 2 before s0 is back), rounds 2 and 3 (agents 0 and 2, then 2), the answers
    assert events == every_agent + ["S0", "S2", "E2", "E0"] + ["S2", "E2"] + every_agent


async def test_no_episodes_no_rounds():
    run = await run_lockstep([], RuleModel())
    assert run.rounds == [] and run.errors == []


async def test_calls_not_flagged_final_go_in_whichever_round_they_are_made():
    # An agent that does not know its last call in advance (a tool agent): each round holds every agent's call.
    async def unflagged(sample, client, config) -> str:
        for step in range(sample["turns"] + 1):
            reply = await client.chat([{"role": "user", "content": "x"}], 4, meta={"step": step})
        return reply.text

    episodes = [FunctionEpisode(unflagged, {"turns": k}, ToyConfig(), "u") for k in NON_FINAL_TURNS]
    run = await run_lockstep(episodes, RuleModel())
    assert run.rounds == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 2], [2]] and run.num_failed == 0


# --- failures --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["generate", "reply", "before_call"])
async def test_a_failed_agent_leaves_the_lockstep_and_the_others_finish(where):
    episodes = toy_episodes(fail=where)
    model = RuleModel()

    async def generate(i: int, turn: Turn) -> Reply:
        if where == "generate" and i == 2 and turn.meta["step"] == 1:
            raise ConnectionError("injected call failure")
        return await model(i, turn)

    run = await run_lockstep(episodes, generate)
    # Agent 2 ends at its second call; its remaining memory call never runs, so the answers come one round
    # earlier, without it.
    if where == "before_call":  # it fails before its second call: round 2 holds agent 0 only
        assert run.rounds == [[0, 1, 2, 3], [0], [0, 1, 3]]
    else:
        assert run.rounds == [[0, 1, 2, 3], [0, 2], [0, 1, 3]]
    assert [error is not None for error in run.errors] == [False, False, True, False] and run.num_failed == 1
    assert "injected" in str(run.errors[2])
    # A reply the agent failed on was received: it is recorded (it was paid for); a failed call is not.
    assert len(episodes[2].history) == (2 if where == "reply" else 1)
    assert [len(e.history) for i, e in enumerate(episodes) if i != 2] == [3, 2, 2]


async def test_cancellation_stops_the_whole_batch():
    async def cancelled(i: int, turn: Turn) -> Reply:
        if i == 1:
            raise asyncio.CancelledError
        return Reply(text="m", finish_reason="stop")

    episodes = toy_episodes()
    with pytest.raises(asyncio.CancelledError):
        await run_lockstep(episodes, cancelled)


async def test_a_call_flagged_final_must_be_the_last():
    run = await run_lockstep(toy_episodes([1, 1], early_final=True), RuleModel())
    assert run.rounds == [[0, 1], [0, 1]]
    assert len(run.errors) == 2  # one per agent
    for error in run.errors:
        assert isinstance(error, RuntimeError) and "flagged final at [0, 1]" in str(error)


async def test_each_call_gets_its_own_budget():
    model = RuleModel()
    await run_lockstep(toy_episodes([1, 1], odd_budget=True), model)
    assert model.calls == [(0, 0, 6), (1, 0, 3), (0, 1, 4), (1, 1, 3)]


async def self_consistency(sample: dict, client, config) -> str:
    """Three drafts at once (``asyncio.gather``), hot, then a cold vote that reads them."""
    i = sample["index"]
    drafts = await asyncio.gather(
        *(
            client.chat([{"role": "user", "content": f"s{i} draft"}], 4, temperature=1.0, meta={"step": d})
            for d in range(3)
        )
    )
    seen = " | ".join(d.text for d in drafts)
    vote = await client.chat([{"role": "user", "content": seen}], 2, temperature=0.2, meta={"step": 3})
    return vote.text


class EchoSampling:
    """Answers each call with its episode, step and temperature; logs (episode, step, temperature) in call order."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, float]] = []

    async def __call__(self, i: int, turn: Turn) -> Reply:
        self.calls.append((i, turn.meta["step"], turn.sampling["temperature"]))
        await asyncio.sleep(0)
        return Reply(text=f"{i}.{turn.meta['step']}@{turn.sampling['temperature']}", finish_reason="stop")


async def test_the_calls_an_agent_makes_at_once_share_a_round_with_their_own_sampling():
    # Two self-consistency agents and a toy agent of one memory call: round 1 sends all six drafts and the toy's
    # memory call, round 2 the two votes, round 3 the toy's answer (flagged final: after every other call).
    episodes = [FunctionEpisode(self_consistency, {"index": i}, ToyConfig(), "sc") for i in range(2)]
    episodes.append(FunctionEpisode(toy, {"index": 2, "turns": 1}, ToyConfig(), "toy"))
    model, toy_model = EchoSampling(), RuleModel()

    async def generate(i: int, turn: Turn) -> Reply:
        return await (toy_model(i, turn) if i == 2 else model(i, turn))

    run = await run_lockstep(episodes, generate)
    assert run.errors == [None, None, None]
    assert run.rounds == [[0, 1, 2], [0, 1], [2]] and run.calls == [7, 2, 1]
    assert model.calls == [(0, 0, 1.0), (0, 1, 1.0), (0, 2, 1.0), (1, 0, 1.0), (1, 1, 1.0), (1, 2, 1.0)] + [
        (0, 3, 0.2),
        (1, 3, 0.2),
    ]
    # The vote read the three drafts; every call's record keeps the sampling it asked for.
    assert episodes[0].history[-1].turn.messages[0]["content"] == "0.0@1.0 | 0.1@1.0 | 0.2@1.0"
    assert episodes[1].answer == "1.3@0.2"
    own = [{"temperature": 1.0, "top_p": 1.0}] * 3 + [{"temperature": 0.2, "top_p": 1.0}]  # top_p: the rule's 1.0
    assert [rec.turn.sampling for rec in episodes[0].history] == own


async def test_a_call_left_running_when_the_agent_returns_fails_its_episode_only():
    async def fire_and_forget(sample, client, config) -> str:
        reply = await client.chat([{"role": "user", "content": "x"}], 4, meta={"step": 0})
        asyncio.ensure_future(client.chat([{"role": "user", "content": "late"}], 4, meta={"step": 1}))
        return reply.text

    episodes = [FunctionEpisode(fire_and_forget, {}, ToyConfig(), "dangling")]
    episodes.append(FunctionEpisode(toy, {"index": 1, "turns": 1}, ToyConfig(), "toy"))
    run = await run_lockstep(episodes, RuleModel())
    assert "returned with 1 model call(s) still running" in str(run.errors[0])
    assert run.errors[1] is None and episodes[1].answer == "reply 1.1"


# --- the memory agent through the driver -----------------------------------------------------------------


async def test_the_memory_is_the_reply_without_any_eos_or_pad(tiny_model_dir):
    # The generated ids become the next prompt's memory with every eos and pad removed, inside the reply too,
    # not only at its end.
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    assert eos != pad
    workflow = MemoryWorkflow(MemoryConfig(chunk_size=64), tok)
    episodes = [workflow.episode({"prompt": "Q?", "context": "one two three"}) for _ in range(2)]  # one chunk each

    async def generate(i: int, turn: Turn) -> Reply:
        ids = [pad, 100 + i, eos, 200 + i, pad, eos] if not turn.final else [300, eos]
        return Reply(text="m", finish_reason="stop", token_ids=ids)

    run = await run_lockstep(episodes, generate)
    assert run.rounds == [[0, 1], [0, 1]] and run.errors == [None, None]
    # The final prompt by hand: the fork's final message in the tiny model's ChatML, each literal piece encoded on
    # its own, the question ids and the memory [100 + i, 200 + i] in between.
    encode = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    head = (
        encode(
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nYou are presented with a "
            "problem and a previous memory. Please answer the problem based on the previous memory and put the answer "
            "in \\boxed{}.\n\n<problem> \n"
        )
        + encode("Q?")
        + encode("\n</problem>\n\n<memory>\n")
    )
    tail = encode("\n</memory>\n\nYour answer:\n<|im_end|>\n<|im_start|>assistant\n")
    for i, episode in enumerate(episodes):
        final = episode.history[-1].turn
        assert final.final
        assert final.prompt_ids == head + [100 + i, 200 + i] + tail


async def staggered_drafts(sample, client, config) -> str:
    """Four drafts made at once (``asyncio.gather``), the k-th reaching the client after k awaits of its own (a
    helper that awaits before it calls), then a vote that reads them."""

    async def draft(k: int):
        for _ in range(k):
            await asyncio.sleep(0)
        return await client.chat([{"role": "user", "content": f"draft {k}"}], 4, meta={"step": k})

    drafts = await asyncio.gather(*(draft(k) for k in range(4)))
    vote = await client.chat([{"role": "user", "content": " | ".join(d.text for d in drafts)}], 2, meta={"step": 4})
    return vote.text


@pytest.mark.timeout(10)
async def test_calls_made_at_once_share_a_round_whatever_awaits_each_makes_before_the_client():
    # two agents: round 1 all eight drafts (each arrives one pass of the loop after the one before), round 2 the votes
    episodes = [FunctionEpisode(staggered_drafts, {"index": i}, ToyConfig(), "staggered") for i in range(2)]
    model = RuleModel()
    run = await run_lockstep(episodes, model)
    assert run.errors == [None, None]
    assert run.rounds == [[0, 1], [0, 1]] and run.calls == [8, 2]
    assert episodes[0].history[-1].turn.messages[0]["content"] == "reply 0.0 | reply 0.1 | reply 0.2 | reply 0.3"
