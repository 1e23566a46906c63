"""Process supervision of a run: each model in a thread with its own server and event loop (``--parallel-models``
at a time), its items driven by :func:`~taskutils.memory_eval.runner.run_items`, the server it started watched (a
server that dies stops its model at once), and Ctrl-C / SIGTERM unwinding every model (servers stopped, finished
items saved)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any, TypeVar

from tqdm import tqdm

from recurrent.async_manager import cancel_and_wait
from recurrent.client import OpenAIChatClient
from recurrent.flags import ClientOptions, from_args
from recurrent.interface import is_agent_file, load_register
from recurrent.local_server import log_tail
from recurrent.models import ModelNotAvailableError, load_tokenizer
from recurrent.trace import TraceWriter
from taskutils.memory_eval import config as cfg
from taskutils.memory_eval import evalsets, results, scoring
from taskutils.memory_eval.agents import make_workflow
from taskutils.memory_eval.model_servers import Endpoint, ServerError, endpoint, endpoint_problem
from taskutils.memory_eval.planning import Job, report_long_questions
from taskutils.memory_eval.runner import EndpointDownError, FailureStreak, FileOutcome, run_items

log = logging.getLogger("memory_eval")

T = TypeVar("T")


def item_record(
    entry: cfg.ModelEntry,
    job: Job,
    keep_trace: bool,
    sampling: dict[str, Any],
    item: dict[str, Any],
    session: Any,
    error: Any,
    seconds: float,
) -> dict[str, Any]:
    """The results line of one finished item of ``job``: scored by the task's rule (a failed item counts 0);
    ``sampling``: the run's (the line records what each call used of it and of its own)."""
    gold = scoring.golds(item)
    if error is None:
        final_prompt = cfg.method_agent(job.method)[1] or cfg.AGENT_ANSWER_FORMAT
        scores = scoring.score(job.task, final_prompt, session.answer, gold)
    else:
        scores = scoring.failed(job.task)
    return results.item_record(
        # a user's agent file: its failures name their line (the built-in agents' lines are not the user's)
        source=load_register(cfg.method_agent(job.method)[0]).source if is_agent_file(job.method) else None,
        item=item,
        task=job.task,
        length=job.length,
        model=entry.name,
        method=cfg.method_name(job.method),
        session=session,
        error=error,
        seconds=seconds,
        scores=scores,
        gold=gold,
        keep_trace=keep_trace,
        run_sampling=sampling,
    )


async def run_model(
    entry: cfg.ModelEntry,
    jobs: list[Job],
    tokenizer: Any,
    client: OpenAIChatClient,
    args: argparse.Namespace,
    sampling: dict[str, Any],
) -> list[tuple[Job, FileOutcome]]:
    """The results files of one model, one after another, each with its items concurrent; the client is closed at
    the end."""
    agent_values = getattr(args, "agent_values", None)
    workflows = {
        method: make_workflow(entry, method, tokenizer, agent_values) for method in {job.method for job in jobs}
    }
    pool = evalsets.pool_file(args.data_dir, args.hotpotqa_dev)
    streak = FailureStreak(args.max_connection_failures)  # over all files of the model: one endpoint
    outcomes = []
    try:
        for job in jobs:
            desc = f"{entry.name} {cfg.method_name(job.method)} {job.task}_{job.length}"
            bar = tqdm(total=job.expected, initial=job.expected - len(job.pending), desc=desc, disable=args.quiet)
            with TraceWriter(job.out) as writer:
                try:
                    outcome = await run_items(
                        evalsets.iter_items(job.data, args.limit, set(job.pending), pool),
                        workflows[job.method],
                        functools.partial(item_record, entry, job, args.trace, sampling),
                        client,
                        writer,
                        entry.concurrency,
                        sampling,
                        bar,
                        streak,
                        args.item_timeout or None,
                    )
                finally:
                    bar.close()
            outcomes.append((job, outcome))
            if outcome.failed:
                log.warning(
                    "%s: %d of %d items failed (first: %s)", desc, outcome.failed, outcome.done, outcome.first_error
                )
    finally:
        await client.aclose()
    return outcomes


SERVER_POLL = 0.5  # seconds between checks that a server we started is still alive


async def watched(work: Coroutine[Any, Any, T], ep: Endpoint) -> T:
    """Await ``work``; if the server we started exits meanwhile, stop it and raise :class:`ServerError` at once,
    instead of letting every remaining item go through its retries against a closed port. Items in flight are
    cancelled, so they leave no line and a resumed run redoes them."""
    task = asyncio.ensure_future(work)
    if ep.process is None:  # an endpoint we did not start: nothing to watch
        return await task
    process = ep.process

    async def watch() -> None:
        while process.poll() is None:
            await asyncio.sleep(SERVER_POLL)

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait((task, watcher))
    if not task.cancelled():  # the work ended on its own (even just as the server stopped): its outcome stands
        return task.result()
    tail = log_tail(ep.log_path, 2000)
    raise ServerError(
        f"the {ep.kind} server (pid {process.pid}) exited with code {process.returncode} while items were running; "
        f"the items in flight were not recorded (run the same command again to resume). Its log, {ep.log_path}, "
        f"ends with:\n{tail}"
    )


_IMPORT_LOCK = threading.Lock()


class Stopper:
    """Stops the models of :func:`run_models`, each in its own thread and event loop: on Ctrl-C / SIGTERM (which
    only the main thread receives) their running evaluations are cancelled (items in flight leave no line; their
    servers are stopped as the threads unwind), and models not started yet are not started."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[asyncio.Task, asyncio.AbstractEventLoop] = {}
        self.stopped = False  # no further model starts
        self.cancelled = False  # running models are cancelled too

    def attach(self, task: asyncio.Task) -> None:
        """Register the running evaluation of one model (called in its own event loop)."""
        with self._lock:
            if self.cancelled:
                task.cancel()
            else:
                self._running[task] = asyncio.get_running_loop()

    def detach(self, task: asyncio.Task) -> None:
        with self._lock:
            self._running.pop(task, None)

    def stop(self, cancel: bool) -> None:
        """No model starts after this; with ``cancel``, the running ones are cancelled as well."""
        with self._lock:
            self.stopped = True
            if cancel:
                self.cancelled = True
                for task, loop in self._running.items():
                    loop.call_soon_threadsafe(task.cancel)


def run_entry(
    entry: cfg.ModelEntry,
    jobs: list[Job],
    args: argparse.Namespace,
    sampling: dict[str, Any],
    stopper: Stopper,
) -> list[tuple[Job, FileOutcome]]:
    """One model, in a thread of :func:`run_models`: its tokenizer, its endpoint for the duration of its files,
    then the server is stopped; ``stopper`` cancels the evaluation from the main thread."""
    with _IMPORT_LOCK:  # transformers' lazy first import fails when two threads race (models side by side)
        tokenizer = load_tokenizer(entry.tokenizer or entry.checkpoint)  # before a server starts: fail fast
    report_long_questions(entry, jobs, tokenizer)
    log_dir = args.log_dir or args.results_dir / "logs"
    with endpoint(entry, args.url, args.serve, args.replicas, log_dir, args.ready_timeout) as ep:
        log.info("%s: endpoint %s (%s), model %r", entry.name, ep.base_url, ep.kind, ep.model)
        problem = endpoint_problem(ep.base_url) if ep.kind == "url" else None  # ours: ready already
        if problem:
            raise EndpointDownError(
                f"the endpoint {ep.base_url} does not answer ({problem}); nothing was sent to it: check the URL "
                "(--url or the table's url) and that its server is up"
            )
        options = asdict(from_args(ClientOptions, args))
        client = OpenAIChatClient(ep.base_url, ep.model, max_concurrency=entry.concurrency, **options)
        work = watched(run_model(entry, jobs, tokenizer, client, args, sampling), ep)
        return asyncio.run(_stoppable(work, stopper))


async def _stoppable(work: Coroutine[Any, Any, T], stopper: Stopper) -> T:
    task = asyncio.current_task()
    assert task is not None
    stopper.attach(task)
    try:
        return await work
    finally:
        stopper.detach(task)


def run_models(
    plans: list[tuple[cfg.ModelEntry, list[Job]]],
    args: argparse.Namespace,
    sampling: dict[str, Any],
    rows: list[tuple[str, Job, FileOutcome]],
    skipped_models: list[str],
) -> None:
    """The models of ``plans``, ``args.parallel_models`` at a time (each in a thread with its own server and
    event loop), in table order as slots free up; one at a time (``--parallel-models 1``, the default) is this
    schedule with one slot. Results rows in table order, a model that cannot be served skipped and named (with
    ``--url``, an endpoint that does not answer starts no further model), bad input re-raised, Ctrl-C / SIGTERM
    re-raised as :class:`KeyboardInterrupt` once every started model has unwound (its server stopped, its finished
    items saved). With more slots, only when things happen differs: a model may start while another still runs."""
    stopper = Stopper()

    def work(entry: cfg.ModelEntry, jobs: list[Job]) -> tuple[str, Any]:
        if stopper.stopped:
            return "not run", None
        try:
            return "done", run_entry(entry, jobs, args, sampling, stopper)
        except (ModelNotAvailableError, ServerError) as err:
            log.error("%s: skipped: %s", entry.name, err)
            if args.url and isinstance(err, EndpointDownError):
                stopper.stop(cancel=False)  # every model goes to that one endpoint: start no more
            return "skipped", err
        except asyncio.CancelledError:
            return "cancelled", None
        except BaseException as err:  # bad input and the like: stop everything, then raise it in the main thread
            stopper.stop(cancel=True)
            return "error", err

    todo = []
    for entry, jobs in plans:
        pending = [job for job in jobs if job.pending]
        if pending:
            log.info(
                "%s: %d file(s), %d item(s) to run", entry.name, len(pending), sum(len(j.pending) for j in pending)
            )
            todo.append((entry, pending))
        else:
            log.info("%s: nothing to run (all items done)", entry.name)
    interrupted = False
    with ThreadPoolExecutor(max_workers=args.parallel_models, thread_name_prefix="model") as pool:
        futures = [pool.submit(work, entry, jobs) for entry, jobs in todo]
        for future in futures:
            while True:
                try:
                    future.result(timeout=1.0)  # a bounded wait: the main thread must take Ctrl-C / SIGTERM
                    break
                except TimeoutError:
                    continue
                except KeyboardInterrupt:
                    interrupted = True
                    stopper.stop(cancel=True)  # the pool's exit waits for the started models to unwind
    errors, not_run = [], []
    for (entry, _), future in zip(todo, futures, strict=True):
        kind, value = future.result()
        if kind == "done":
            rows.extend((entry.name, job, outcome) for job, outcome in value)
        elif kind == "error":
            errors.append(value)
        elif kind in ("skipped", "not run"):
            skipped_models.append(entry.name)
            if kind == "not run":
                not_run.append(entry.name)
    if errors:
        raise errors[0]
    if interrupted:
        raise KeyboardInterrupt
    if not_run:  # only the --url endpoint that does not answer stops further models without an error
        log.error("stopping: --url %s serves every selected model; not run: %s", args.url, not_run)
