"""Run an episode against a model that answers each call by rule and sees each call whole (its ``final`` flag,
``meta`` and prompt ids: a :class:`recurrent.interface.TurnClient`), as the lockstep barrier does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from recurrent.async_manager import run_session
from recurrent.interface import Episode, Reply, Turn


class ScriptedTurns:
    """Answers the ``n``-th call (from 0) with ``answer(n, turn)``; keeps every call as sent."""

    def __init__(self, answer: Callable[[int, Turn], Reply]) -> None:
        self.answer = answer
        self.turns: list[Turn] = []

    async def send_turn(self, turn: Turn, **_: object) -> Reply:
        self.turns.append(turn)
        return self.answer(len(self.turns) - 1, turn)


def run_scripted(episode: Episode, answer: Callable[[int, Turn], Reply]) -> list[Turn]:
    """Run ``episode`` to its end against :class:`ScriptedTurns`; returns its calls as sent (prompts included, even
    where the episode's records keep none)."""
    model = ScriptedTurns(answer)
    asyncio.run(run_session(episode, model))
    return model.turns
