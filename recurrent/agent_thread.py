"""Where an agent's code runs: its own event loop in a worker thread, so that a deadline holds whatever it does.

An agent is plain code (recurrent/interface.py): it may compute without awaiting, call ``time.sleep``, wait on a
lock, or raise ``SystemExit``. On the caller's event loop any of these would stop the loop itself, and with it every
asyncio deadline, every other sample and an endpoint's ``/health``. Here the episode's coroutine runs on a loop of
its own in a daemon thread; each model call it makes is sent back to the caller's loop, where the client lives, and
its reply handed back (``run_coroutine_threadsafe`` / ``wrap_future``). The deadline is kept on the caller's side,
which never runs agent code: when it passes, the episode fails with an :class:`AgentDeadlineError` naming what ran
out, the key that sets it and the line the agent was at (its thread's current frame); the agent's task is cancelled
and an exception is injected into its thread (``PyThreadState_SetAsyncExc``), so code that spins stops at its next
bytecode, and the thread is abandoned (a ``time.sleep`` or a blocking wait in C ends first). ``SystemExit`` raised
by agent code ends its episode (:class:`AgentExitError`), never the process.

Calls made at once (``asyncio.gather``) still reach a lockstep barrier together: a client with ``send_turn`` (the
barrier's, recurrent/generation_manager.py) gets the calls an agent makes in one pass of its own loop in one
batch, by the barrier's own rule, a pass of the loop that adds no call.

Costs (measured on 2 cores, docs/architecture.md, "Where an agent's code runs"): a thread and an event loop per
episode (two file descriptors, its wake-up pipe) and a thread hop per call.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import contextvars
import ctypes
import math
import os
import sys
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from recurrent.failures import shown, thread_frame
from recurrent.interface import ChatClient, Episode, Reply, Turn

MIN_DEADLINE_S = 0.1  # below it a deadline would fail every episode before its first reply could come
# The default deadline of one evaluation item or served document (the harness's --item-timeout, the endpoint's
# --document-timeout): the paper's longest document, 3.5M tokens, is 701 model calls at its 5,000-token chunks;
# 4 h gives each 20 s, a 1,024-token memory update at 50 tokens/s (docs/architecture.md, "Where an agent's code runs").
DOCUMENT_DEADLINE_S = 14_400.0


class AgentDeadlineError(TimeoutError):
    """An episode whose agent did not finish within its deadline (the message names the key that sets it)."""


class AgentExitError(RuntimeError):
    """Agent code raised ``SystemExit`` (``sys.exit``) or ``KeyboardInterrupt``: its episode fails, the process
    goes on."""


class _AgentStopped(BaseException):  # a BaseException: an agent's ``except Exception`` does not swallow it
    """Injected into an agent's thread once its episode has been failed."""


@dataclass(frozen=True)
class Deadline:
    """How long an episode's agent may run, and how its failure is named: ``key``, the option that sets it
    (``--item-timeout``, ``recurrent.trajectory_timeout_s``); ``what``, the run it bounds ("its trajectory");
    ``cancel_calls``: whether it may end the episode while a model call is in progress (False in sync mode: a call
    waits at the lockstep barrier with the others of its round, and runs to its end; a call asked for past the
    deadline is refused); ``error``: the class raised."""

    seconds: float
    key: str
    what: str = ""
    cancel_calls: bool = True
    error: type[AgentDeadlineError] = AgentDeadlineError


def deadline_seconds(value: Any, key: str, off: float | None = None) -> float | None:
    """``value`` as a deadline in seconds, checked where it is read: a finite number >= :data:`MIN_DEADLINE_S`
    (a bool is not seconds; a string must read as a number). None, or ``off`` where given (a flag's 0), means no
    deadline. A ValueError names ``key``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{key} is a number of seconds, got {value!r} (a boolean)")
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} is a number of seconds, got {value!r}") from None
    if off is not None and seconds == off:
        return None
    if not math.isfinite(seconds) or seconds < MIN_DEADLINE_S:
        no_limit = "null" if off is None else f"{off:g}"
        raise ValueError(
            f"{key} must be a finite number of seconds >= {MIN_DEADLINE_S:g} ({no_limit}: no limit), got {value!r}"
        )
    return seconds


def deadline_argument(text: str) -> float:
    """A command line's deadline (``--item-timeout``, ``--document-timeout``): 0 for no limit, else a finite
    number of seconds >= :data:`MIN_DEADLINE_S` (argparse names the flag)."""
    try:
        seconds = deadline_seconds(text, "it", off=0)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("it ")) from None
    return 0.0 if seconds is None else seconds


_HERE = os.path.realpath(__file__)


def agent_frame(thread: threading.Thread) -> tuple[str, int, str] | None:
    """Where the agent's ``thread`` runs now (recurrent/failures.py, :func:`~recurrent.failures.thread_frame`), this
    module's frames skipped: None when it only waits in its event loop."""
    return thread_frame(thread, skip=_HERE)


def _copy_outcome(task: asyncio.Future[Any], future: concurrent.futures.Future[Any]) -> None:
    """A caller-side call's outcome into the future the agent's loop waits on (asyncio's own chaining, which
    keeps the future pending until then, so that the agent cancelling its call cancels the caller's task)."""
    if task.cancelled():
        future.cancel()
    elif future.set_running_or_notify_cancel():
        error = task.exception()
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(task.result())


class _Bridge:
    """The client the agent's code gets in its thread: each call runs on the caller's loop, through ``forward``
    (the run's count of calls in progress and its deadline's refusal of late calls)."""

    def __init__(self, client: ChatClient, run: _IsolatedRun) -> None:
        self._client, self._run = client, run
        self._batch: list[tuple[Callable[[], Coroutine[Any, Any, Any]], concurrent.futures.Future[Any]]] = []
        send_turn = getattr(client, "send_turn", None)
        if send_turn is not None:  # a lockstep barrier: calls made at once go in one batch

            async def batched_send_turn(turn: Turn, **sampling: Any) -> Reply:
                return await self._batched(lambda: send_turn(turn, **sampling))

            self.send_turn = batched_send_turn

    async def chat(self, messages: list[dict[str, str]], max_tokens: int, **options: Any) -> Reply:
        (future,) = self._run.submit([lambda: self._client.chat(messages, max_tokens, **options)])
        return await asyncio.wrap_future(future)

    async def _batched(self, make: Callable[[], Coroutine[Any, Any, Reply]]) -> Reply:
        future: concurrent.futures.Future[Reply] = concurrent.futures.Future()
        self._batch.append((make, future))
        if len(self._batch) == 1:
            asyncio.get_running_loop().create_task(self._flush())
        return await asyncio.wrap_future(future)

    async def _flush(self) -> None:
        """Once a pass of the agent's loop adds no call, send the batch (the barrier's rule, on the agent's loop)."""
        before = -1
        while before != len(self._batch):
            before = len(self._batch)
            await asyncio.sleep(0)
        batch, self._batch = self._batch, []
        self._run.submit([make for make, _ in batch], [future for _, future in batch])


class _IsolatedRun:
    """One episode in its thread, seen from the caller's loop (:func:`run_isolated`)."""

    def __init__(self, episode: Episode, deadline: Deadline | None) -> None:
        self.episode, self.deadline = episode, deadline
        self.caller = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = self.caller.create_future()
        self.in_flight = 0  # calls in progress on the caller's side
        self.calls: set[asyncio.Task[Any]] = set()  # their tasks: a failed episode's are cancelled
        self.stopped = False  # stop() has run
        self.expired = False  # the deadline has passed (sync mode: the episode fails once no call is in progress)
        self.thread: threading.Thread | None = None
        self.agent_loop: asyncio.AbstractEventLoop | None = None
        self.agent_task: asyncio.Task[Any] | None = None
        self.lock = threading.Lock()  # the agent's loop and task, set in its thread, read by the caller's

    # ---- the caller's side ----

    def submit(
        self,
        calls: list[Callable[[], Coroutine[Any, Any, Any]]],
        futures: list[concurrent.futures.Future[Any]] | None = None,
    ) -> list[concurrent.futures.Future[Any]]:
        """Start ``calls`` on the caller's loop, all in one callback (they reach a barrier in one pass)."""
        futures = futures or [concurrent.futures.Future() for _ in calls]

        def start() -> None:
            for make, future in zip(calls, futures, strict=True):
                if future.cancelled():
                    continue
                task = asyncio.ensure_future(self.forward(make))
                self.calls.add(task)
                task.add_done_callback(self.calls.discard)
                task.add_done_callback(lambda done, future=future: _copy_outcome(done, future))
                future.add_done_callback(
                    lambda f, task=task: f.cancelled() and self.caller.call_soon_threadsafe(task.cancel)
                )

        self.caller.call_soon_threadsafe(start)
        return futures

    async def forward(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        if self.done.done():
            raise RuntimeError("a model call made after its episode had ended")
        if self.expired:  # sync mode: a call asked for past the deadline never reaches the barrier
            raise self.deadline_error()
        self.in_flight += 1
        try:
            return await make()
        finally:
            self.in_flight -= 1
            if self.expired and not self.in_flight:
                self.fail(self.deadline_error())

    def on_expiry(self) -> None:
        self.expired = True
        if self.deadline is not None and (self.deadline.cancel_calls or not self.in_flight):
            self.fail(self.deadline_error())

    def deadline_error(self) -> AgentDeadlineError:
        assert self.deadline is not None
        calls = len(self.episode.history)
        frame = agent_frame(self.thread) if self.thread is not None and not self.in_flight else None
        if self.in_flight:
            at = "; it was waiting on a model call"
        elif frame is not None:
            at = f"; it was at {shown(frame[0])}:{frame[1]} (in {frame[2]}), its thread left to stop on its own"
        else:
            at = ""
        what = f" {self.deadline.what}" if self.deadline.what else ""
        error = self.deadline.error(
            f"the agent did not finish{what} within {self.deadline.seconds:g} s ({self.deadline.key}), "
            f"after {calls} model call{'s' * (calls != 1)}{at}"
        )
        if frame is not None:  # a one-line failure is named at the agent's line (recurrent/failures.py, location)
            error.call_sites = [[frame[:2]]]  # type: ignore[attr-defined]
        return error

    def fail(self, error: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(error)
        self.stop()

    def finish(self, outcome: BaseException | None) -> None:
        if self.done.done():
            return
        if outcome is None:
            self.done.set_result(None)
        else:
            self.done.set_exception(outcome)

    def stop(self) -> None:
        """Cancel the agent's calls and its task where it waits, and stop its thread where it spins; the thread
        is left. Once: a second exception could land in the thread's own clean-up."""
        if self.stopped:
            return
        self.stopped = True
        for task in list(self.calls):
            task.cancel()
        with self.lock:
            loop, task = self.agent_loop, self.agent_task
        if loop is not None and task is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile: the thread has ended
                loop.call_soon_threadsafe(task.cancel)
        thread = self.thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_AgentStopped))

    # ---- the agent's thread ----

    def main(self, coroutine: Coroutine[Any, Any, None], context: contextvars.Context, depth: int) -> None:
        outcome: BaseException | None = None
        try:
            sys.set_coroutine_origin_tracking_depth(depth)  # per thread: the caller's (the preflight sets one)
            loop = asyncio.new_event_loop()
            try:
                with self.lock:
                    self.agent_loop = loop
                    self.agent_task = loop.create_task(coroutine, context=context)
                loop.run_until_complete(self.agent_task)
            except (SystemExit, KeyboardInterrupt) as err:
                name = "sys.exit" if isinstance(err, SystemExit) else "KeyboardInterrupt"
                outcome = AgentExitError(f"the agent raised {type(err).__name__}({err}) ({name}): its episode ends")
                outcome.__cause__ = err
            except BaseException as err:  # noqa: BLE001 (the episode's own failure, delivered to the caller)
                outcome = err
            finally:
                _close(loop)
            with contextlib.suppress(RuntimeError):  # the caller's loop has closed: no one waits for it any more
                self.caller.call_soon_threadsafe(self.finish, outcome)
        except _AgentStopped:  # stopped after the caller had failed it: nothing to deliver
            pass


def _close(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what the agent left running on its loop, and close it."""
    try:
        left = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    except BaseException:  # noqa: BLE001 (an agent stuck in its clean-up: its thread is abandoned anyway)
        pass
    finally:
        with contextlib.suppress(BaseException):  # stopped while closing: nothing is left to deliver
            loop.close()


async def run_isolated(
    episode: Episode,
    client: ChatClient,
    sampling: dict[str, Any] | None = None,
    final_sampling: dict[str, Any] | None = None,
    on_turn: Callable[[Turn, Reply], None] | None = None,
    deadline: Deadline | None = None,
) -> None:
    """Run ``episode`` to its end against ``client``, its agent's code on a loop of its own in a worker thread
    (see the module docstring); within ``deadline`` when given. ``on_turn`` runs on the caller's loop, after each
    call, in order. Cancelling the caller stops the agent the same way a deadline does."""
    run = _IsolatedRun(episode, deadline)
    bridge = _Bridge(client, run)
    turn_hook = None
    if on_turn is not None:

        def on_caller(turn: Turn, reply: Reply) -> None:
            try:
                on_turn(turn, reply)
            except Exception as err:  # the hook's failure fails the episode, as it would in the agent's own loop
                run.fail(err)

        def turn_hook(turn: Turn, reply: Reply) -> None:
            run.caller.call_soon_threadsafe(on_caller, turn, reply)

    coroutine = episode.run(bridge, sampling, final_sampling, turn_hook)
    name = f"recurrent-agent-{getattr(episode, 'name', type(episode).__name__)}"
    args = (coroutine, contextvars.copy_context(), sys.get_coroutine_origin_tracking_depth())
    run.thread = threading.Thread(target=run.main, args=args, name=name, daemon=True)
    timer = run.caller.call_later(deadline.seconds, run.on_expiry) if deadline is not None else None
    run.thread.start()
    try:
        await run.done
    except asyncio.CancelledError:
        run.stop()
        raise
    finally:
        if timer is not None:
            timer.cancel()
