"""Sync mode: every session of a batch advances one turn at a time, in lockstep rounds.

Each round holds the pending turn of every session that still has a turn not flagged final; turns flagged final
wait until no session has any other turn left, and then all go in one last round. Sessions with 2, 1, 3 and 1
memory turns run four rounds, ``max(memory turns) + 1``::

    round 1: s0 s1 s2 s3    round 2: s0 s2    round 3: s2    round 4 (answers): s0 s1 s2 s3

This is the schedule of the released MemAgent training runs (``recurrent.mode=sync``, docs/fidelity.md).
A round's calls run concurrently and the next round starts only when all of them have returned. How a turn is
generated is the caller's business: ``generate(i, turn)`` returns session ``i``'s reply to ``turn``
(:mod:`verl_ext.lockstep` sends it to verl's token server). A session whose call, ``record`` or ``next_turn``
raises leaves the lockstep with its error; the other sessions go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from recurrent.async_manager import check_finished
from recurrent.interface import Reply, Session, Turn

Generate = Callable[[int, Turn], Awaitable[Reply]]


@dataclass
class LockstepRun:
    """What a lockstep run did: the sessions themselves hold the turns and replies."""

    errors: list[Exception | None]  # per session: the error that ended it early, None when it finished
    rounds: list[list[int]]  # per round, the sessions that had a turn in it (ascending)

    @property
    def num_failed(self) -> int:
        return sum(error is not None for error in self.errors)


async def run_lockstep(sessions: list[Session], generate: Generate) -> LockstepRun:
    """Run every session to its end in lockstep rounds (see the module docstring)."""
    errors: list[Exception | None] = [None] * len(sessions)
    pending: list[Turn | None] = [None] * len(sessions)

    def fail(i: int, error: Exception) -> None:
        errors[i], pending[i] = error, None

    def advance(i: int) -> None:
        try:
            pending[i] = sessions[i].next_turn()
        except Exception as err:  # this session's failure, not the batch's
            fail(i, err)

    for i in range(len(sessions)):
        advance(i)
    rounds: list[list[int]] = []
    while waiting := [i for i, turn in enumerate(pending) if turn is not None]:
        active = [i for i in waiting if not pending[i].final] or waiting  # answers only once all memory is done
        rounds.append(active)
        replies = await asyncio.gather(*(generate(i, pending[i]) for i in active), return_exceptions=True)
        for reply in replies:  # cancellation and the like stop the whole batch
            if isinstance(reply, BaseException) and not isinstance(reply, Exception):
                raise reply
        for i, reply in zip(active, replies, strict=True):
            if isinstance(reply, Exception):
                fail(i, reply)
                continue
            try:
                sessions[i].record(reply)
            except Exception as err:
                fail(i, err)
                continue
            advance(i)
    for i, session in enumerate(sessions):
        if errors[i] is None:
            try:
                check_finished(session)  # the reward row must be the session's last turn
            except RuntimeError as err:
                errors[i] = err
    return LockstepRun(errors, rounds)
