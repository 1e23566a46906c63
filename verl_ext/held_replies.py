"""The trial episode's model holds a reply until the agent awaits its call (verl_ext/agent_probe.py).

A scripted model answers at once, so a call the agent left running (``asyncio.ensure_future(client.chat(...))``,
never awaited) has usually finished by the time the agent returns, and only a real model's latency shows it, in
training. Here a call the agent awaits where it made it gets its reply at once; a call handed to a task gets it only
once the episode's task waits on that task: directly (``await task``), through ``asyncio.gather``, through tasks that
wait on it, or through a future one of its callbacks completes (``asyncio.wait``, ``wait_for``, a ``TaskGroup``). A
call no one awaits is then still running when the agent returns, whatever the timing, and the episode fails naming
the line that made it (recurrent/functions.py, ``CallLeftRunningError``).

Which future a task waits on is asyncio's own bookkeeping (``Task._fut_waiter``, ``gather``'s ``_children``, a
future's ``_callbacks``): CPython 3.11's, which has no public call graph. Nothing here sleeps: a check runs again
when the episode's task has stepped (``call_soon``) or when the future it waits on is done.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any


def _references(callback: Any) -> set[int]:
    """The ids of the objects a done-callback holds: a closure's cells, a bound method's object and its attributes,
    a partial's arguments (how ``asyncio.wait``, ``wait_for`` and ``TaskGroup`` tie a task to the future they set)."""
    held: list[Any] = []
    if isinstance(callback, functools.partial):
        held += [*callback.args, *callback.keywords.values()]
        callback = callback.func
    owner = getattr(callback, "__self__", None)
    if owner is not None:
        held += [owner, *getattr(owner, "__dict__", {}).values()]
    held += [cell.cell_contents for cell in getattr(callback, "__closure__", None) or () if _filled(cell)]
    return {id(item) for item in held}


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True


class ReplyGate:
    """``recurrent.functions.REPLY_GATE`` of a trial episode: ``await gate(episode_task)`` in the call's task."""

    def __init__(self) -> None:
        self.held: list[tuple[asyncio.Task[Any], asyncio.Task[Any], asyncio.Future[None]]] = []
        self._watched: list[asyncio.Future[Any]] = []  # futures whose completion already triggers a check
        self._soon = False  # a check is due at the loop's next pass

    async def __call__(self, episode_task: asyncio.Task[Any] | None) -> None:
        call_task = asyncio.current_task()
        if episode_task is None or call_task is None or call_task is episode_task:
            return  # the agent awaits this call where it made it
        release = asyncio.get_running_loop().create_future()
        self.held.append((call_task, episode_task, release))
        self._check()
        await release

    def _check(self, *_: Any) -> None:
        self._soon = False
        self.held = [(call, episode, release) for call, episode, release in self.held if not release.done()]
        for call, episode, release in self.held:
            if episode.done():
                continue  # the episode ended with this call running: its error names the call
            waiter = getattr(episode, "_fut_waiter", None)
            if waiter is None or waiter.done():
                if not self._soon:  # the episode's task runs: look again once it has stepped
                    self._soon = True
                    asyncio.get_running_loop().call_soon(self._check)
            elif self._awaits(waiter, call):
                release.set_result(None)
            elif all(waiter is not watched for watched in self._watched):
                self._watched.append(waiter)
                waiter.add_done_callback(self._check)

    def _awaits(self, waiter: asyncio.Future[Any], call: asyncio.Task[Any]) -> bool:
        """Whether a task waiting on ``waiter`` waits, through it, on ``call``."""
        futures, seen = [waiter], set()
        while futures:
            future = futures.pop()
            if id(future) in seen:
                continue
            seen.add(id(future))
            if future is call:
                return True
            if isinstance(future, asyncio.Task):
                inner = getattr(future, "_fut_waiter", None)
                futures += [inner] if inner is not None else []
            futures += list(getattr(future, "_children", None) or ())  # asyncio.gather
        refs = {ref for callback, _ in getattr(call, "_callbacks", None) or () for ref in _references(callback)}
        return bool(refs & seen)  # asyncio.wait / wait_for / TaskGroup: a callback of the call completes the waiter
