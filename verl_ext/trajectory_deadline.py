"""A deadline for every trajectory in training (``recurrent.trajectory_timeout_s``): an agent that never returns
fails its own trajectory, counted with the step's failed ones, and the step goes on (docs/fidelity.md, "Sync mode
and failed rollouts").

In async mode the deadline cancels the agent wherever it waits, its model call included. In sync mode a call waits
at the lockstep barrier with every other agent's, and a call cancelled there would leave the round holding it: the
deadline stops the agent anywhere but inside a call, and a call made past it is refused before it is sent. A call
in progress then ends with its round (the rollout server's own limits bound it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from recurrent.interface import ChatClient, Episode, Reply, Turn, TurnRecord


class TrajectoryTimeoutError(TimeoutError):
    """A trajectory whose agent did not finish within ``recurrent.trajectory_timeout_s``."""


class TimedEpisode(Episode):
    """``episode`` run within ``seconds``; ``cancel_calls``: whether the deadline may cancel a model call too (async
    mode) or only the agent's own code (sync mode). Everything else is the episode's."""

    def __init__(self, episode: Episode, seconds: float, cancel_calls: bool) -> None:
        self.episode, self.seconds, self.cancel_calls = episode, seconds, cancel_calls

    def __getattr__(self, name: str) -> Any:  # the agent's own attributes (its name, its memory, ...)
        return getattr(self.episode, name)

    @property
    def history(self) -> list[TurnRecord]:
        return self.episode.history

    @property
    def finished(self) -> bool:
        return self.episode.finished

    @property
    def answer(self) -> str | None:
        return self.episode.answer

    def trace(self) -> dict[str, Any]:
        return self.episode.trace()

    def expired_error(self) -> TrajectoryTimeoutError:
        calls = len(self.episode.history)
        return TrajectoryTimeoutError(
            f"the agent did not finish its trajectory within {self.seconds:g} s (recurrent.trajectory_timeout_s), "
            f"after {calls} model call{'s' * (calls != 1)}"
        )

    async def run(
        self,
        client: ChatClient,
        sampling: dict[str, Any] | None = None,
        final_sampling: dict[str, Any] | None = None,
        on_turn: Callable[[Turn, Reply], None] | None = None,
    ) -> None:
        deadline = asyncio.timeout(self.seconds)
        guarded = client if self.cancel_calls else _CallsRunToTheirEnd(client, deadline, self)
        try:
            async with deadline:
                await self.episode.run(guarded, sampling, final_sampling, on_turn)
        except TrajectoryTimeoutError:
            raise
        except TimeoutError:
            if not deadline.expired():  # the agent's own
                raise
            raise self.expired_error() from None


class _CallsRunToTheirEnd:
    """A client whose calls the deadline does not cancel: it is lifted while a call runs and set again after; a call
    asked for once it has passed is refused (:class:`TrajectoryTimeoutError`) before it reaches the barrier."""

    def __init__(self, client: ChatClient, deadline: asyncio.Timeout, episode: TimedEpisode) -> None:
        self._client, self._deadline, self._episode = client, deadline, episode
        if hasattr(client, "send_turn"):  # the lockstep barrier's client takes turns (recurrent/functions.py)
            self.send_turn = self._guard(client.send_turn)

    async def chat(self, messages: list[dict[str, str]], max_tokens: int, **options: Any) -> Reply:
        return await self._guard(self._client.chat)(messages, max_tokens, **options)

    def _guard(self, call: Callable[..., Any]) -> Callable[..., Any]:
        async def guarded(*args: Any, **kwargs: Any) -> Any:
            when = self._deadline.when()
            if self._deadline.expired() or (when is not None and asyncio.get_running_loop().time() >= when):
                raise self._episode.expired_error()
            self._deadline.reschedule(None)
            try:
                return await call(*args, **kwargs)
            finally:
                self._deadline.reschedule(when)

        return guarded
