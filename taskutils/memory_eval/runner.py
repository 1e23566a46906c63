"""Run the items of one eval file concurrently and write each result line as soon as the item finishes.

Each item is an :class:`~recurrent.interface.Episode` of a registered agent (the memory agent, the direct baseline,
any other) driven by
:func:`recurrent.async_manager.run_session`, the same per-sample driver the async manager uses. Unlike
:class:`~recurrent.async_manager.AsyncGenerationManager`, which takes every session up front, sessions are built
lazily here, at most ``concurrency`` at a time: a 3.5M-token item holds ~14 MB of token ids, and an eval file
holds 128 of them. Tokenizing a long document runs in a worker thread so the event loop keeps serving the other
items' requests; a short one is tokenized in place (a thread hop costs more than a few milliseconds of work).

An endpoint that stops answering stops the run: after ``FailureStreak.limit`` items in a row whose requests
could not connect (their retries spent), :class:`EndpointDownError` is raised and the items in flight are
cancelled, instead of every remaining item spending its retries against a closed port. The failed items of
that streak are not written either, so the same command resumes all of them; finished items are on disk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import openai
from tqdm import tqdm

from recurrent.agent_thread import AgentDeadlineError, Deadline
from recurrent.async_manager import cancel_and_wait, check_finished, run_session
from recurrent.interface import ChatClient, Episode
from recurrent.local_server import ServerError
from recurrent.trace import TraceWriter

log = logging.getLogger(__name__)

INLINE_CHARS = 20_000  # contexts up to this size (~5K tokens, a few ms to tokenize) skip the worker thread


class ItemTimeoutError(AgentDeadlineError):
    """An item whose agent did not finish within the harness's ``--item-timeout``."""


class EndpointDownError(ServerError):
    """The endpoint does not answer: it failed the check before the first item, or items in a row could not
    connect to it."""


def is_connection_failure(error: BaseException | None) -> bool:
    """Whether an item failed because its requests could not reach the server (refused, reset, closed without a
    reply, or no connection in time), as opposed to an answer that was an error or came too late."""
    while error is not None:
        if isinstance(error, openai.APIConnectionError):  # APITimeoutError too: only the connect has a timeout
            return True
        error = error.__cause__
    return False


@dataclass
class FailureStreak:
    """Items in a row (in the order they finish) that could not connect, counted over the files of one model. At
    ``limit`` (0: never) the run stops. ``held``: the result lines of the streak's items in the current file,
    written when the streak breaks or the file ends, dropped when the run stops."""

    limit: int
    count: int = 0
    held: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class FileOutcome:
    """What one eval file's run did (this run only; items skipped on resume are not counted)."""

    done: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    first_error: str | None = None


async def run_items(
    items: Iterable[dict[str, Any]],
    make_session: Callable[[dict[str, Any]], Episode],
    make_record: Callable[[dict[str, Any], Episode | None, BaseException | None, float], dict[str, Any]],
    client: ChatClient,
    writer: TraceWriter,
    concurrency: int,
    sampling: dict[str, Any] | None = None,
    bar: tqdm | None = None,
    streak: FailureStreak | None = None,
    item_timeout: float | None = None,
) -> FileOutcome:
    """Drive every item to a result line. An item whose session cannot be built or whose requests fail for good
    is written with its error (it counts as failed, never as skipped); a cancelled run (Ctrl-C, SIGTERM) writes
    nothing for the items in flight, so a resumed run redoes them. ``streak`` (default: none kept) stops the run
    with :class:`EndpointDownError` when the endpoint stops answering (see the module docstring). ``item_timeout``:
    seconds an item's agent may run (None: no limit); past it the item fails with :class:`ItemTimeoutError`, its
    agent stopped wherever it is, whatever it does (it runs in a thread of its own: recurrent/agent_thread.py)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    streak = streak if streak is not None else FailureStreak(limit=0)
    run = _FileRun(make_session, make_record, client, writer, concurrency, sampling, bar, streak)
    run.item_timeout = item_timeout
    return await run.run(items)


class _FileRun:
    """One call of :func:`run_items`: at most ``concurrency`` items in flight, each result line written (or held
    by the failure streak) as its item finishes, and ``stop`` set when the streak stops the run."""

    def __init__(
        self,
        make_session: Callable[[dict[str, Any]], Episode],
        make_record: Callable[[dict[str, Any], Episode | None, BaseException | None, float], dict[str, Any]],
        client: ChatClient,
        writer: TraceWriter,
        concurrency: int,
        sampling: dict[str, Any] | None,
        bar: tqdm | None,
        streak: FailureStreak,
    ) -> None:
        self.make_session, self.make_record = make_session, make_record
        self.client, self.writer, self.sampling, self.bar, self.streak = client, writer, sampling, bar, streak
        self.outcome = FileOutcome()
        self.slots = asyncio.Semaphore(concurrency)
        self.stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.tasks: set[asyncio.Task] = set()
        self.item_timeout: float | None = None

    async def run(self, items: Iterable[dict[str, Any]]) -> FileOutcome:
        start = time.perf_counter()
        feeder = asyncio.ensure_future(self.feed(items))
        try:
            await asyncio.wait({feeder, self.stop}, return_when=asyncio.FIRST_COMPLETED)
            if self.stop.done():
                self.stop.result()  # raises EndpointDownError, or what writing a record raised
            feeder.result()  # raises what reading an item or writing its record raised
        finally:
            await cancel_and_wait([feeder, *self.tasks, self.stop])
        for held in self.streak.held:  # this file is done: its failures so far are recorded; the count goes on
            self.write(held, failed=True)
        self.streak.held.clear()
        self.outcome.seconds = time.perf_counter() - start
        return self.outcome

    async def feed(self, items: Iterable[dict[str, Any]]) -> None:
        for item in items:
            await self.slots.acquire()  # backpressure: the next item is read only when a slot is free
            if self.stop.done():
                return
            task = asyncio.create_task(self.run_one_item(item))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        if self.tasks:
            await asyncio.gather(*self.tasks)

    async def run_one_item(self, item: dict[str, Any]) -> None:
        session: Episode | None = None
        error: BaseException | None = None
        began = time.perf_counter()
        try:
            try:
                if len(item.get("context") or "") <= INLINE_CHARS:
                    session = self.make_session(item)
                else:
                    session = await asyncio.to_thread(self.make_session, item)
                item.pop("context", None)  # the session holds the tokens; megabytes of text need not wait with it
                deadline = None
                if self.item_timeout is not None:
                    deadline = Deadline(self.item_timeout, "--item-timeout", error=ItemTimeoutError)
                await run_session(session, self.client, self.sampling, deadline=deadline)
                check_finished(session)
            except Exception as err:  # this item's failure; cancellation (BaseException) passes through
                error = err
            if not self.stop.done():
                try:
                    self.finish(self.make_record(item, session, error, time.perf_counter() - began), error)
                except Exception as err:  # the run's failure (a full disk): it stops now, the error raised once
                    if not self.stop.done():
                        self.stop.set_exception(err)
        finally:
            self.slots.release()  # only once the stop is decided: a stopped run starts no further item

    def finish(self, record: dict[str, Any], error: BaseException | None) -> None:
        streak = self.streak
        if streak.limit and is_connection_failure(error):
            streak.count += 1
            streak.held.append(record)
            if streak.count >= streak.limit:
                self.stop.set_exception(
                    EndpointDownError(
                        f"{streak.count} items in a row could not connect to the endpoint (last: "
                        f"{record.get('error')}); stopped: those of this file and the items in flight were not "
                        "recorded (run the same command again to resume once the endpoint answers)"
                    )
                )
            return
        streak.count = 0
        for held in streak.held:  # the endpoint answers again: those failures were their own
            self.write(held, failed=True)
        streak.held.clear()
        self.write(record, failed=error is not None)

    def write(self, record: dict[str, Any], failed: bool) -> None:
        outcome = self.outcome
        self.writer.write(record)
        outcome.done += 1
        outcome.prompt_tokens += record.get("prompt_tokens", 0)
        outcome.completion_tokens += record.get("completion_tokens", 0)
        if failed:
            outcome.failed += 1
            if outcome.first_error is None:
                outcome.first_error = record.get("error")
                log.warning("item %s failed: %s", record.get("id"), outcome.first_error)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(failed=outcome.failed, refresh=False)
