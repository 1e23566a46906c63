"""The one turn loop, ``run_session``, with a scripted client: every turn's reply goes to the session, then to
``on_turn`` in order (the quickstart prints there)."""

import asyncio
from typing import Any

from recurrent.async_manager import cancel_and_wait, run_session
from recurrent.interface import Reply, Session, Turn, TurnRecord


class TwoTurns(Session):
    """A memory turn then a final turn; each prompt names its step."""

    def __init__(self) -> None:
        self._history: list[TurnRecord] = []
        self._pending: Turn | None = None

    def next_turn(self) -> Turn | None:
        step = len(self._history)
        if step == 2:
            return None
        self._pending = Turn([{"role": "user", "content": f"step {step}"}], 4, final=step == 1)
        return self._pending

    def record(self, reply: Reply) -> None:
        self._history.append(TurnRecord(self._pending, reply))

    @property
    def history(self) -> list[TurnRecord]:
        return self._history


class EchoClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, dict[str, Any]]] = []

    async def chat(self, messages: list[dict[str, str]], max_tokens: int, **sampling: Any) -> Reply:
        self.calls.append((messages[-1]["content"], max_tokens, sampling))
        return Reply(f"echo {messages[-1]['content']}", "stop")


def test_on_turn_sees_each_turn_after_the_session_recorded_it():
    session, client, seen = TwoTurns(), EchoClient(), []

    def on_turn(turn: Turn, reply: Reply) -> None:
        seen.append((turn.messages[-1]["content"], turn.final, reply.text, len(session.history)))

    assert asyncio.run(run_session(session, client, {"temperature": 0.0}, on_turn=on_turn)) is session
    assert client.calls == [("step 0", 4, {"temperature": 0.0}), ("step 1", 4, {"temperature": 0.0})]
    assert seen == [("step 0", False, "echo step 0", 1), ("step 1", True, "echo step 1", 2)]


def test_cancel_and_wait_stops_running_tasks_and_keeps_finished_results():
    async def main() -> tuple[bool, int]:
        done = asyncio.ensure_future(asyncio.sleep(0, result=7))
        await done
        sleeper = asyncio.ensure_future(asyncio.sleep(60))
        await cancel_and_wait([done, sleeper])
        return sleeper.cancelled(), done.result()

    assert asyncio.run(main()) == (True, 7)
