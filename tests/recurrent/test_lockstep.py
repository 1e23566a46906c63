"""The lockstep driver of sync mode (recurrent/lockstep.py), against hand-worked schedules.

The sessions here are toys and the model is a coroutine that answers by rule, so every expectation below is
written out by hand: which session calls in which round, with which budget, seeing which previous reply.
"""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from recurrent.agents.memory import MemoryConfig, MemoryWorkflow
from recurrent.interface import Reply, Session, Turn, TurnRecord
from recurrent.lockstep import run_lockstep

MEMORY_TOKENS, FINAL_TOKENS = 6, 4
NON_FINAL_TURNS = [2, 1, 3, 1]  # s0 2 memory turns, s1 1, s2 3, s3 1, then every session's answer
EXPECTED_ROUNDS = [[0, 1, 2, 3], [0, 2], [2], [0, 1, 2, 3]]  # max(memory turns) + 1 rounds, answers last


class ToySession(Session):
    """``turns`` memory turns, then one final turn; each prompt names the sample, the step and the last reply."""

    def __init__(self, index: int, turns: int) -> None:
        self.index, self.turns = index, turns
        self._history: list[TurnRecord] = []
        self._turn: Turn | None = None

    def next_turn(self) -> Turn | None:
        step = len(self._history)
        if step > self.turns:
            return None
        final = step == self.turns
        memory = self._history[-1].reply.text if self._history else "none"
        self._turn = Turn(
            messages=[{"role": "user", "content": f"sample {self.index} step {step} memory {memory}"}],
            max_tokens=FINAL_TOKENS if final else MEMORY_TOKENS,
            final=final,
            meta={"sample": self.index, "step": step},
        )
        return self._turn

    def record(self, reply: Reply) -> None:
        self._history.append(TurnRecord(self._turn, reply))

    @property
    def history(self) -> list[TurnRecord]:
        return self._history


class RuleModel:
    """Answers ``reply <sample>.<step>`` and logs every call as (sample, step, max_tokens), in call order."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []

    async def __call__(self, i: int, turn: Turn) -> Reply:
        self.calls.append((i, turn.meta["step"], turn.max_tokens))
        await asyncio.sleep(0)
        return Reply(text=f"reply {i}.{turn.meta['step']}", finish_reason="stop")


def toy_sessions(turns: list[int] = NON_FINAL_TURNS, cls: type[ToySession] = ToySession) -> list[ToySession]:
    return [cls(i, k) for i, k in enumerate(turns)]


# --- the lockstep order ----------------------------------------------------------------------------------


async def test_rounds_are_turn_major_with_all_answers_last():
    sessions, model = toy_sessions(), RuleModel()
    run = await run_lockstep(sessions, model)
    assert run.rounds == EXPECTED_ROUNDS
    assert run.errors == [None] * 4 and run.num_failed == 0
    # Every call, in order, with the turn's own budget: memory turns 6 tokens, answers 4.
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
    assert [len(s.history) for s in sessions] == [3, 2, 4, 2]
    assert [[r.turn.final for r in s.history] for s in sessions] == [
        [False, False, True],
        [False, True],
        [False, False, False, True],
        [False, True],
    ]


async def test_each_reply_goes_to_its_own_session_and_turn():
    sessions = toy_sessions()
    await run_lockstep(sessions, RuleModel())
    # Sample 2 reads three chunks: each prompt holds its own previous reply, the answer turn the last memory.
    assert [r.turn.messages[0]["content"] for r in sessions[2].history] == [
        "sample 2 step 0 memory none",
        "sample 2 step 1 memory reply 2.0",
        "sample 2 step 2 memory reply 2.1",
        "sample 2 step 3 memory reply 2.2",
    ]
    assert [r.reply.text for r in sessions[1].history] == ["reply 1.0", "reply 1.1"]


async def test_a_round_waits_for_all_its_calls():
    events: list[str] = []

    async def slow_first(i: int, turn: Turn) -> Reply:
        events.append(f"S{i}")
        # Session 0 is the slowest of a round, session 3 the fastest: 3 - i passes of the event loop (a count of
        # scheduler turns, not a duration, so the order holds on a busy machine too).
        for _ in range(3 - i):
            await asyncio.sleep(0)
        events.append(f"E{i}")
        return Reply(text="m", finish_reason="stop")

    await run_lockstep(toy_sessions(), slow_first)
    every_session = ["S0", "S1", "S2", "S3", "E3", "E2", "E1", "E0"]  # all start, then the fastest ends first
    # round 1 (nobody starts turn 2 before s0 is back), rounds 2 and 3 (sessions 0 and 2, then 2), the answers
    assert events == every_session + ["S0", "S2", "E2", "E0"] + ["S2", "E2"] + every_session


async def test_no_sessions_no_rounds():
    run = await run_lockstep([], RuleModel())
    assert run.rounds == [] and run.errors == []


# --- failures --------------------------------------------------------------------------------------------


class FailingSession(ToySession):
    """Session 2 fails at its second turn, in ``next_turn`` or in ``record``."""

    where = ""

    def next_turn(self) -> Turn | None:
        if self.where == "next_turn" and self.index == 2 and len(self._history) == 1:
            raise ValueError("injected next_turn failure")
        return super().next_turn()

    def record(self, reply: Reply) -> None:
        if self.where == "record" and self.index == 2 and self._turn.meta["step"] == 1:
            raise ValueError("injected record failure")
        super().record(reply)


@pytest.mark.parametrize("where", ["generate", "record", "next_turn"])
async def test_a_failed_session_leaves_the_lockstep_and_the_others_finish(where):
    FailingSession.where = where
    sessions = toy_sessions(cls=FailingSession)
    model = RuleModel()

    async def generate(i: int, turn: Turn) -> Reply:
        if where == "generate" and i == 2 and turn.meta["step"] == 1:
            raise ConnectionError("injected call failure")
        return await model(i, turn)

    run = await run_lockstep(sessions, generate)
    # Session 2 ends after its first turn; its remaining memory turn never runs, so the answers come one round
    # earlier, without it.
    if where == "next_turn":  # it fails before its second call: round 2 holds session 0 only
        assert run.rounds == [[0, 1, 2, 3], [0], [0, 1, 3]]
    else:
        assert run.rounds == [[0, 1, 2, 3], [0, 2], [0, 1, 3]]
    assert [error is not None for error in run.errors] == [False, False, True, False] and run.num_failed == 1
    assert "injected" in str(run.errors[2])
    assert len(sessions[2].history) == 1
    assert [len(s.history) for i, s in enumerate(sessions) if i != 2] == [3, 2, 2]


async def test_cancellation_stops_the_whole_batch():
    async def cancelled(i: int, turn: Turn) -> Reply:
        if i == 1:
            raise asyncio.CancelledError
        return Reply(text="m", finish_reason="stop")

    with pytest.raises(asyncio.CancelledError):
        await run_lockstep(toy_sessions(), cancelled)


class EarlyFinalSession(ToySession):
    """Flags its first turn final, then asks more turns: the reward row would not be its last."""

    def next_turn(self) -> Turn | None:
        turn = super().next_turn()
        if turn is not None and not self._history:
            turn.final = True
        return turn


async def test_a_turn_flagged_final_must_be_the_last():
    run = await run_lockstep(toy_sessions([1, 1], cls=EarlyFinalSession), RuleModel())
    assert run.rounds == [[0, 1], [0, 1]]
    assert len(run.errors) == 2  # one per session
    for error in run.errors:
        assert isinstance(error, RuntimeError) and "flagged final at [0, 1]" in str(error)


class OddBudgetSession(ToySession):
    def next_turn(self) -> Turn | None:
        turn = super().next_turn()
        if turn is not None and self.index == 1:
            turn.max_tokens = 3
        return turn


async def test_each_call_gets_its_turns_own_budget():
    model = RuleModel()
    await run_lockstep(toy_sessions([1, 1], cls=OddBudgetSession), model)
    assert model.calls == [(0, 0, 6), (1, 0, 3), (0, 1, 4), (1, 1, 3)]


# --- the memory agent through the driver -----------------------------------------------------------------


async def test_the_memory_is_the_reply_without_any_eos_or_pad(tiny_model_dir):
    # The generated ids become the next prompt's memory with every eos and pad removed, inside the reply too,
    # not only at its end.
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    assert eos != pad
    workflow = MemoryWorkflow(MemoryConfig(chunk_size=64), tok)
    sessions = [workflow.session({"prompt": "Q?", "context": "one two three"}) for _ in range(2)]  # one chunk each

    async def generate(i: int, turn: Turn) -> Reply:
        ids = [pad, 100 + i, eos, 200 + i, pad, eos] if not turn.final else [300, eos]
        return Reply(text="m", finish_reason="stop", token_ids=ids)

    run = await run_lockstep(sessions, generate)
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
    for i, session in enumerate(sessions):
        final = session.history[-1].turn
        assert final.final
        assert final.prompt_ids == head + [100 + i, 200 + i] + tail
