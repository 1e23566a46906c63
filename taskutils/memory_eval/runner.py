"""Run the items of one eval file concurrently and write each result line as soon as the item finishes.

Each item is a :class:`~recurrent.interface.Session` (the memory agent or the direct baseline) driven by
:func:`recurrent.async_manager.run_session`, the same per-sample driver the async manager uses. Unlike
:class:`~recurrent.async_manager.AsyncGenerationManager`, which takes every session up front, sessions are built
lazily here, at most ``concurrency`` at a time: a 3.5M-token item holds ~14 MB of token ids, and an eval file
holds 128 of them. Tokenizing a long document runs in a worker thread so the event loop keeps serving the other
items' requests; a short one is tokenized in place (a thread hop costs more than a few milliseconds of work).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from recurrent.async_manager import cancel_and_wait, check_finished, run_session
from recurrent.interface import ChatClient, Session
from recurrent.trace import TraceWriter

log = logging.getLogger(__name__)

INLINE_CHARS = 20_000  # contexts up to this size (~5K tokens, a few ms to tokenize) skip the worker thread


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
    make_session: Callable[[dict[str, Any]], Session],
    make_record: Callable[[dict[str, Any], Session | None, BaseException | None, float], dict[str, Any]],
    client: ChatClient,
    writer: TraceWriter,
    concurrency: int,
    sampling: dict[str, Any] | None = None,
    bar: tqdm | None = None,
) -> FileOutcome:
    """Drive every item to a result line. An item whose session cannot be built or whose requests fail for good
    is written with its error (it counts as failed, never as skipped); a cancelled run (Ctrl-C, SIGTERM) writes
    nothing for the items in flight, so a resumed run redoes them."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    outcome = FileOutcome()
    slots = asyncio.Semaphore(concurrency)
    start = time.perf_counter()

    async def run_one_item(item: dict[str, Any]) -> None:
        session: Session | None = None
        error: BaseException | None = None
        began = time.perf_counter()
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
        finally:
            slots.release()
        record = make_record(item, session, error, time.perf_counter() - began)
        writer.write(record)
        outcome.done += 1
        outcome.prompt_tokens += record.get("prompt_tokens", 0)
        outcome.completion_tokens += record.get("completion_tokens", 0)
        if error is not None:
            outcome.failed += 1
            if outcome.first_error is None:
                outcome.first_error = record.get("error")
                log.warning("item %s failed: %s", item.get("index"), outcome.first_error)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(failed=outcome.failed, refresh=False)

    tasks: set[asyncio.Task] = set()
    try:
        for item in items:
            await slots.acquire()  # backpressure: the next item is read only when a slot is free
            task = asyncio.create_task(run_one_item(item))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        await cancel_and_wait(tasks)
    outcome.seconds = time.perf_counter() - start
    return outcome
