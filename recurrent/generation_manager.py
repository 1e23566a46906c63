"""Sync mode: the agents of a batch advance in lockstep rounds of model calls.

Any agent runs here, as plain code: each episode runs as its own coroutine against a barrier client. A call
(``client.chat``) registers as pending and waits; once every live agent is either waiting on a call or finished,
the round's calls go out together (concurrently) and each agent is resumed with its replies, to run on to its next
calls or its end. A round holds every pending call of every agent that is not flagged final, all the calls an
agent has made at once included (``asyncio.gather`` of three drafts: three calls of one round); calls flagged
final (``final=True``: the answer, known before it is made) wait until no agent has any other call left, and then
all go in one last round. Agents with 2, 1, 3 and 1 memory calls before their answers run four rounds,
``max(memory calls) + 1``::

    round 1: s0 s1 s2 s3    round 2: s0 s2    round 3: s2    round 4 (answers): s0 s1 s2 s3

This is the schedule of the released MemAgent training runs (``recurrent.mode=sync``, docs/fidelity.md). The next
round starts only when all of a round's calls have returned. How a call is generated is the caller's business:
``generate(i, turn)`` returns agent ``i``'s reply to ``turn``, sampled with the call's own ``turn.sampling`` over the
run's (:mod:`verl_ext.sync_rollout` sends it to verl's token server). An agent whose call or own code raises leaves
the lockstep with its error; the others go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from recurrent.agent_thread import Deadline, run_isolated
from recurrent.async_manager import cancel_and_wait, check_finished
from recurrent.interface import Episode, Reply, Turn

Generate = Callable[[int, Turn], Awaitable[Reply]]


@dataclass
class LockstepRun:
    """What a lockstep run did: the episodes themselves hold the calls and replies."""

    errors: list[Exception | None]  # per episode: the error that ended it early, None when it finished
    rounds: list[list[int]]  # per round, the episodes that had a call in it (ascending)
    calls: list[int] = field(default_factory=list)  # per round, how many calls it sent

    @property
    def num_failed(self) -> int:
        return sum(error is not None for error in self.errors)


Pending = tuple[Turn, "asyncio.Future[Reply]"]


class _Barrier:
    """The pending calls of a batch, and when a round can go: every live episode waits on a call or has ended."""

    def __init__(self, size: int) -> None:
        self.live = set(range(size))
        self.pending: dict[int, list[Pending]] = {}  # per episode, its calls in the order they were made
        self.changed = asyncio.Event()

    async def call(self, i: int, turn: Turn) -> Reply:
        if i not in self.live:
            raise RuntimeError("a call made after its agent returned has no place in a round")
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.pending.setdefault(i, []).append((turn, future))
        self.changed.set()
        return await future

    def end(self, i: int) -> None:
        self.live.discard(i)
        for _, future in self.pending.pop(i, []):  # calls it left running: its episode has failed (functions.py)
            future.cancel()
        self.changed.set()

    def count(self) -> int:
        return sum(len(calls) for calls in self.pending.values())

    async def settled(self) -> None:
        """Wait until every live episode waits on a call (or none is left), then until a pass of the event loop adds
        no call: the other calls an agent starts at once (``asyncio.gather``) join the round."""
        while any(i not in self.pending for i in self.live):
            self.changed.clear()
            await self.changed.wait()
        before = -1
        while before != self.count():
            before = self.count()
            await asyncio.sleep(0)

    def take_round(self) -> tuple[list[int], list[tuple[int, Pending]]]:
        """The round's calls, by episode then call order: every pending call not flagged final, or, once no episode
        has any other, every final one."""
        calls = [(i, call) for i in sorted(self.pending) for call in self.pending[i]]
        active = [(i, call) for i, call in calls if not call[0].final] or calls  # answers once all else is done
        for i, call in active:
            self.pending[i].remove(call)
            if not self.pending[i]:
                del self.pending[i]
        return sorted({i for i, _ in active}), active


class _BarrierClient:
    """Episode ``i``'s client: its calls wait at the barrier (a :class:`~recurrent.interface.TurnClient`)."""

    def __init__(self, barrier: _Barrier, i: int) -> None:
        self._barrier, self._i = barrier, i

    async def send_turn(self, turn: Turn, **sampling: Any) -> Reply:
        turn.sampling = {**turn.sampling, **sampling}  # generate() samples the call with it
        return await self._barrier.call(self._i, turn)

    async def chat(
        self, messages: list[dict[str, str]], max_tokens: int, *, prompt_ids: list[int] | None = None, **sampling: Any
    ) -> Reply:
        return await self.send_turn(Turn(messages, max_tokens, prompt_ids), **sampling)


async def run_lockstep(
    episodes: list[Episode], generate: Generate, deadline: Deadline | list[Deadline | None] | None = None
) -> LockstepRun:
    """Run every episode to its end in lockstep rounds (see the module docstring). With a ``deadline`` (training's:
    verl_ext/trajectory_deadline.py; one for all, or one per episode), each agent's code runs on its own loop in a
    worker thread, within it (recurrent/agent_thread.py: the calls it makes at once still reach the barrier
    together)."""
    deadlines = deadline if isinstance(deadline, list) else [deadline] * len(episodes)
    barrier = _Barrier(len(episodes))
    errors: list[Exception | None] = [None] * len(episodes)

    async def run_one(i: int) -> None:
        try:
            if deadlines[i] is None:
                await episodes[i].run(_BarrierClient(barrier, i))
            else:
                await run_isolated(episodes[i], _BarrierClient(barrier, i), deadline=deadlines[i])
            check_finished(episodes[i])  # the reward row must be the episode's last call
        except Exception as err:  # this episode's failure, not the batch's
            errors[i] = err
        finally:
            barrier.end(i)

    tasks = [asyncio.create_task(run_one(i)) for i in range(len(episodes))]
    run = LockstepRun(errors, [])
    try:
        while True:
            await barrier.settled()
            if not barrier.live:
                break
            episodes_in_round, calls = barrier.take_round()
            run.rounds.append(episodes_in_round)
            run.calls.append(len(calls))
            replies = await asyncio.gather(*(generate(i, turn) for i, (turn, _) in calls), return_exceptions=True)
            for reply in replies:  # cancellation and the like stop the whole batch
                if isinstance(reply, BaseException) and not isinstance(reply, Exception):
                    raise reply
            for (_, (_, future)), reply in zip(calls, replies, strict=True):
                if future.done():  # its episode ended meanwhile (barrier.end)
                    continue
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        await asyncio.gather(*tasks)
    finally:
        await cancel_and_wait(tasks)
    return run
