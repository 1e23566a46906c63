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

from recurrent.async_manager import cancel_and_wait, check_finished, run_session
from recurrent.interface import ChatClient, Episode
from recurrent.local_server import ServerError
from recurrent.trace import TraceWriter

log = logging.getLogger(__name__)

INLINE_CHARS = 20_000  # contexts up to this size (~5K tokens, a few ms to tokenize) skip the worker thread


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
) -> FileOutcome:
    """Drive every item to a result line. An item whose session cannot be built or whose requests fail for good
    is written with its error (it counts as failed, never as skipped); a cancelled run (Ctrl-C, SIGTERM) writes
    nothing for the items in flight, so a resumed run redoes them. ``streak`` (default: none kept) stops the run
    with :class:`EndpointDownError` when the endpoint stops answering (see the module docstring)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    streak = streak if streak is not None else FailureStreak(limit=0)
    outcome = FileOutcome()
    slots = asyncio.Semaphore(concurrency)
    stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    start = time.perf_counter()

    def write(record: dict[str, Any], failed: bool) -> None:
        writer.write(record)
        outcome.done += 1
        outcome.prompt_tokens += record.get("prompt_tokens", 0)
        outcome.completion_tokens += record.get("completion_tokens", 0)
        if failed:
            outcome.failed += 1
            if outcome.first_error is None:
                outcome.first_error = record.get("error")
                log.warning("item %s failed: %s", record.get("id"), outcome.first_error)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(failed=outcome.failed, refresh=False)

    def finish(record: dict[str, Any], error: BaseException | None) -> None:
        if streak.limit and is_connection_failure(error):
            streak.count += 1
            streak.held.append(record)
            if streak.count >= streak.limit:
                stop.set_exception(
                    EndpointDownError(
                        f"{streak.count} items in a row could not connect to the endpoint (last: "
                        f"{record.get('error')}); stopped: those of this file and the items in flight were not "
                        "recorded (run the same command again to resume once the endpoint answers)"
                    )
                )
            return
        streak.count = 0
        for held in streak.held:  # the endpoint answers again: those failures were their own
            write(held, failed=True)
        streak.held.clear()
        write(record, failed=error is not None)

    async def run_one_item(item: dict[str, Any]) -> None:
        session: Episode | None = None
        error: BaseException | None = None
        began = time.perf_counter()
        try:
            try:
                if len(item.get("context") or "") <= INLINE_CHARS:
                    session = make_session(item)
                else:
                    session = await asyncio.to_thread(make_session, item)
                item.pop("context", None)  # the session holds the tokens; megabytes of text need not wait with it
                await run_session(session, client, sampling)
                check_finished(session)
            except Exception as err:  # this item's failure; cancellation (BaseException) passes through
                error = err
            if not stop.done():
                finish(make_record(item, session, error, time.perf_counter() - began), error)
        finally:
            slots.release()  # only once the stop is decided: a stopped run starts no further item

    tasks: set[asyncio.Task] = set()

    async def feed() -> None:
        for item in items:
            await slots.acquire()  # backpressure: the next item is read only when a slot is free
            if stop.done():
                return
            task = asyncio.create_task(run_one_item(item))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    feeder = asyncio.ensure_future(feed())
    try:
        await asyncio.wait({feeder, stop}, return_when=asyncio.FIRST_COMPLETED)
        if stop.done():
            stop.result()  # raises EndpointDownError
        feeder.result()  # raises what reading an item or writing its record raised
    finally:
        await cancel_and_wait([feeder, *tasks, stop])
    for held in streak.held:  # this file is done: its failures so far are recorded; the count goes on
        write(held, failed=True)
    streak.held.clear()
    outcome.seconds = time.perf_counter() - start
    return outcome
