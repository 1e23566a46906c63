"""The async driver: one coroutine per sample, each running its episode (an agent function's run) through a
:class:`ChatClient`; the sync driver is :mod:`recurrent.generation_manager`.

Samples finish independently (no batch barrier): a sample with a short document is done while another is still
reading. The client bounds in-flight requests; the manager may also bound how many samples run at once. A failing
sample records its error and the others carry on (unless ``fail_fast``): errors are counted, never turned into empty
answers (a failed sample scores 0, it is not dropped).

:class:`AsyncRollout` lists the turns of the successful samples as rows, sample-major (each sample's turns in order,
samples in input order, as the original async manager concatenated them): ``sample_index`` says which sample a row
belongs to and ``final_mask`` marks each sample's last turn (its answer). Training does not read these rows: verl's
agent loop builds its own, one per call (verl_ext/rollout.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from recurrent.agent_thread import Deadline, run_isolated
from recurrent.functions import check_answer
from recurrent.interface import ChatClient, Episode, Reply, Turn, TurnRecord
from recurrent.trace import TraceWriter

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


async def run_session(
    session: Episode,
    client: ChatClient,
    sampling: dict[str, Any] | None = None,
    on_turn: Callable[[Turn, Reply], None] | None = None,
    final_sampling: dict[str, Any] | None = None,
    deadline: Deadline | None = None,
) -> Episode:
    """Run one episode to its end and return it: the one per-sample driver of every asynchronous caller
    (training, the harness, the endpoint, the quickstart). The agent's code runs on its own loop in a worker
    thread, within ``deadline`` when given, whatever it does (recurrent/agent_thread.py). ``on_turn`` is told of
    every finished model call (the quickstart prints there). ``final_sampling`` is merged over ``sampling`` for
    calls flagged final (the server's client-given stop strings shape the answer, not the memory)."""
    await run_isolated(session, client, sampling, final_sampling, on_turn, deadline)
    return session


async def cancel_and_wait(tasks: Iterable[asyncio.Future]) -> None:
    """Cancel whatever of ``tasks`` still runs and wait until all have ended (their errors are theirs: not
    raised here). Samples stopped this way write no line, so a resumed run redoes them."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


def reduce_timings(timings: Sequence[dict[str, float]]) -> dict[str, float]:
    """Merge per-sample timings: keys ending in ``_mean`` are averaged over the samples that have them
    (per-sample latencies, which overlap in time), all others are summed (work totals)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for timing in timings:
        for key, value in timing.items():
            sums[key] = sums.get(key, 0.0) + value
            counts[key] = counts.get(key, 0) + 1
    return {key: total / counts[key] if key.endswith("_mean") else total for key, total in sums.items()}


def check_finished(session: Episode) -> None:
    """A finished episode has at least one call, no call flagged final before its last one (its last call is the
    row the reward is computed on, flagged in advance or not), and its answer is that call's reply
    (:func:`recurrent.functions.check_answer`). Training, the evaluation harness and the endpoint call it once an
    episode has run."""
    flagged = [i for i, rec in enumerate(session.history) if rec.turn.final]
    if not session.history or any(i != len(session.history) - 1 for i in flagged):
        raise RuntimeError(
            f"session finished with {len(session.history)} turns and turns flagged final at {flagged}; "
            "expected at least one turn and only the last one flagged final"
        )
    check_answer(session)


@dataclass
class AsyncRollout:
    """The outcome of a batch of sessions, in input order."""

    sessions: list[Episode]
    seconds: list[float]  # wall time of each sample (queueing for a session slot excluded)
    errors: list[BaseException | None]  # the error of each failed sample, None for the others
    records: list[TurnRecord]  # the rows: every turn of every successful sample, sample-major
    sample_index: torch.Tensor  # LongTensor [rows]: the sample each row belongs to
    final_mask: torch.Tensor  # BoolTensor [rows]: True on each sample's last turn (its answer)
    prompt_tokens: int  # over every reply, failed samples' partial turns included (they were paid for)
    completion_tokens: int
    timing: dict[str, float] = field(
        default_factory=dict
    )  # sample_seconds_mean (mean per sample), model_seconds_total, wall_seconds

    @property
    def ok(self) -> list[bool]:
        return [error is None for error in self.errors]

    @property
    def num_failed(self) -> int:
        return sum(error is not None for error in self.errors)


def _collect(sessions: list[Episode], seconds: list[float], errors: list[BaseException | None]) -> AsyncRollout:
    import torch  # here, not at import: clients that only chat (the eval harness, the quickstart) never load it

    records: list[TurnRecord] = []
    sample_index: list[int] = []
    final_mask: list[bool] = []
    for i, (session, error) in enumerate(zip(sessions, errors, strict=True)):
        if error is None:  # a failed sample has no final turn and no reward: its turns are not training rows
            records.extend(session.history)
            sample_index.extend([i] * len(session.history))
            final_mask.extend([False] * (len(session.history) - 1) + [True])  # a session's last turn is final
    replies = [rec.reply for session in sessions for rec in session.history]
    timings = [
        {"sample_seconds_mean": s, "model_seconds_total": sum(rec.reply.seconds for rec in session.history)}
        for session, s in zip(sessions, seconds, strict=True)
    ]
    return AsyncRollout(
        sessions=sessions,
        seconds=seconds,
        errors=errors,
        records=records,
        sample_index=torch.tensor(sample_index, dtype=torch.long),
        final_mask=torch.tensor(final_mask, dtype=torch.bool),
        prompt_tokens=sum(r.prompt_tokens for r in replies),
        completion_tokens=sum(r.completion_tokens for r in replies),
        timing=reduce_timings(timings),
    )


class AsyncGenerationManager:
    """Run many sessions concurrently against one client.

    ``max_concurrency`` bounds how many samples run at once (``None``: all; the client still bounds requests).
    With ``trace_path``, one JSON line per finished sample is appended there as it finishes
    (:mod:`recurrent.trace`). ``progress`` shows a tqdm bar over finished samples.
    """

    def __init__(
        self,
        client: ChatClient,
        max_concurrency: int | None = None,
        trace_path: str | Path | None = None,
        progress: bool = True,
    ) -> None:
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 or None, got {max_concurrency}")
        self.client = client
        self.max_concurrency = max_concurrency
        self.trace_path = trace_path
        self.progress = progress

    async def run(
        self,
        sessions: list[Episode],
        sampling: dict[str, Any] | None = None,
        ids: list[Any] | None = None,
        *,
        fail_fast: bool = False,
    ) -> AsyncRollout:
        """Run every session to its end. A failed sample keeps its error in ``errors[i]`` (and its partial
        history in its session); with ``fail_fast`` the first error cancels the others and is raised."""
        n = len(sessions)
        ids = list(range(n)) if ids is None else list(ids)
        if len(ids) != n:
            raise ValueError(f"{len(ids)} ids for {n} sessions")
        seconds = [0.0] * n
        errors: list[BaseException | None] = [None] * n
        slots = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None
        writer = TraceWriter(self.trace_path) if self.trace_path else None
        bar = tqdm(total=n, desc="sessions", disable=not self.progress)

        async def run_one_sample(i: int) -> None:
            if slots is not None:
                await slots.acquire()
            start = time.perf_counter()
            try:
                await run_session(sessions[i], self.client, sampling)
                check_finished(sessions[i])
            except Exception as err:  # the sample's failure, not the batch's (cancellation passes through)
                errors[i] = err
                log.warning("sample %s failed: %s: %s", ids[i], type(err).__name__, err)
            finally:
                if slots is not None:
                    slots.release()
            seconds[i] = time.perf_counter() - start
            if writer is not None:
                writer.write_sample(ids[i], sessions[i], errors[i], seconds[i])
            bar.update(1)
            if fail_fast and errors[i] is not None:
                raise errors[i]

        start = time.perf_counter()
        tasks = [asyncio.create_task(run_one_sample(i)) for i in range(n)]
        try:
            await asyncio.gather(*tasks)
        finally:
            await cancel_and_wait(tasks)  # on fail_fast, or if we are cancelled: stop the samples still running
            bar.close()
            if writer is not None:
                writer.close()
        rollout = _collect(sessions, seconds, errors)
        rollout.timing["wall_seconds"] = time.perf_counter() - start
        return rollout


def run_sessions(
    sessions: list[Episode],
    client: ChatClient,
    sampling: dict[str, Any] | None = None,
    ids: list[Any] | None = None,
    *,
    max_concurrency: int | None = None,
    trace_path: str | Path | None = None,
    progress: bool = True,
    fail_fast: bool = False,
) -> AsyncRollout:
    """The synchronous entry for scripts: ``asyncio.run`` over :meth:`AsyncGenerationManager.run`. The client's
    connections belong to this run's event loop and are closed at its end (the client reopens them if reused)."""
    manager = AsyncGenerationManager(client, max_concurrency, trace_path, progress)

    async def main() -> AsyncRollout:
        try:
            return await manager.run(sessions, sampling, ids, fail_fast=fail_fast)
        finally:
            aclose = getattr(client, "aclose", None)
            if aclose is not None:
                await aclose()

    return asyncio.run(main())
