"""Evaluate models x tasks x lengths, as in the paper, through OpenAI-compatible servers.

For every selected model: start its server (``vllm serve`` on GPU machines, ``transformers serve`` on CPU) or
use the given URL, run every (task, length) eval file with its method(s), write one JSON line per item as it
finishes, stop the server. A killed run resumes where it stopped. Failed requests are retried with backoff;
an item that still fails is recorded with its error and counts as wrong (never dropped, unlike the original). At the end
the token totals are printed and the summary (``summary.md``, ``summary.csv``, one plot per metric) is
written into the results folder (``python -m taskutils.memory_eval.report RESULTS_DIR`` redoes it).

Examples:
    # the paper's full evaluation (14 configurations, HotpotQA 50..6400 docs, 11 RULER tasks 8K..512K)
    python -m taskutils.memory_eval.run --data-dir data
    # one model, HotpotQA only, two lengths, first 16 items, against a server you started yourself
    python -m taskutils.memory_eval.run --models MemoryAgent-14B-5k-1k-infty --tasks hotpotqa \\
        --lengths 50,800 --limit 16 --url http://localhost:8000/v1
    # CPU: the tiny offline model, both methods
    python -m taskutils.memory_eval.run --models tiny --method memory,direct --tasks hotpotqa --lengths 50
    # CPU: the replication's readers on the needle task (table from python -m experiments.needle.eval_models)
    python -m taskutils.memory_eval.run --table readers.yaml --tasks needle --data-dir DATA/eval/test \\
        --method memory-boxed,direct-boxed --temperature 0
    # CPU, 2 cores: two readers at a time, each with its own one-thread server
    OMP_NUM_THREADS=1 python -m taskutils.memory_eval.run --table readers.yaml --tasks needle ... --parallel-models 2
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tqdm import tqdm

from recurrent.async_manager import cancel_and_wait
from recurrent.atomic import os_error_remedy, os_error_text
from recurrent.client import OpenAIChatClient
from recurrent.impls.memory import MemoryConfig
from recurrent.interface import Episode, is_agent_file, load_register
from recurrent.local_server import log_tail
from recurrent.models import ModelNotAvailableError, load_tokenizer
from recurrent.options import non_negative_int, parse_with_config, positive_int, positive_seconds, seconds
from recurrent.sampling import argument as sampling_argument
from recurrent.trace import TraceWriter
from taskutils.memory_eval import config as cfg
from taskutils.memory_eval import evalsets, results, scoring
from taskutils.memory_eval.model_servers import Endpoint, ServerError, endpoint, endpoint_problem

from .runner import EndpointDownError, FailureStreak, FileOutcome, run_items

log = logging.getLogger("memory_eval")

T = TypeVar("T")
RESUMES = "the items finished are saved whole, and the same command resumes after them"


@dataclass
class Job:
    """One results file: a model, a method, a (task, length) eval set."""

    task: str
    length: int
    method: str
    data: Path
    out: Path
    ids: list[Any]  # the selected items
    pending: list[Any]  # ids still to run
    questions: dict[Any, tuple[str, str]] = field(default_factory=dict)  # id -> (file:line, question)

    @property
    def expected(self) -> int:
        return len(self.ids)


def parse_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_lengths(text: str) -> list[int]:
    return [positive_int(part) for part in parse_list(text)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m taskutils.memory_eval.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sel = parser.add_argument_group("what to run")
    sel.add_argument("--config", type=Path, help="YAML file of defaults for these options (keys as the long flags)")
    sel.add_argument("--table", type=Path, help=f"model table (default: {cfg.TABLE_PATH.name} next to this file)")
    sel.add_argument(
        "--models",
        type=parse_list,
        help="comma list of table names or groups (paper, ablation, cpu); an unknown name is taken as a "
        "checkpoint (local folder or cached hub id) run with the memory method. Default: paper,ablation (of a "
        "--table without those groups: all its entries)",
    )
    sel.add_argument(
        "--tasks",
        type=parse_list,
        help="comma list: hotpotqa, RULER task names, needle (the CPU replication's), or groups ruler/all (default: "
        "all, without needle)",
    )
    sel.add_argument(
        "--lengths",
        type=parse_lengths,
        help="comma list applied to every task: documents for hotpotqa, tokens for RULER, 64-token chunks for needle "
        "(default: the paper's; needle 1,2,4,...,64)",
    )
    sel.add_argument(
        "--method",
        type=parse_list,
        help=f"comma list of {', '.join(cfg.known_methods())} (any registered agent by name) or paths to agent "
        "files (path/to/agent.py, relative to the working directory; results are named after the file's stem); "
        "memory/direct use the paper's 'the answer is' prompt and the -boxed variants the training format "
        "(default: each model's method in the table)",
    )
    sel.add_argument("--limit", type=positive_int, help="only the first N items of every eval set")
    io = parser.add_argument_group("data and results")
    io.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("MEMAGENT_DATA_DIR", "data")),
        help="eval sets: eval_{N}.jsonl, eval_{task}_{L}.jsonl, or the released .json arrays (default: "
        "$MEMAGENT_DATA_DIR or ./data, where python -m taskutils.memory_data writes them)",
    )
    io.add_argument(
        "--hotpotqa-dev",
        type=Path,
        help=f"the document pool of released sets whose contexts are document indices (default: "
        f"<data-dir>/{evalsets.POOL_FILE} or <data-dir>/sources/{evalsets.POOL_FILE})",
    )
    io.add_argument("--results-dir", type=Path, default=Path("results"), help="output folder (default: results)")
    io.add_argument("--trace", action="store_true", help="store every item's memory after each chunk and its turns")
    io.add_argument("--retry-failed", action="store_true", help="redo items recorded as failed")
    io.add_argument("--overwrite", action="store_true", help="discard existing results of the selected files")
    io.add_argument("--no-report", action="store_true", help="do not write the summary at the end")
    srv = parser.add_argument_group("serving and client")
    srv.add_argument("--url", help="an existing OpenAI-compatible endpoint for every selected model (env API_KEY)")
    srv.add_argument("--served-model", help="with --url: the model name requests use (default: the checkpoint)")
    srv.add_argument(
        "--tokenizer",
        help="tokenizer for chunking and truncation, for every selected model (default: the table's, else the "
        "checkpoint; needed for hosted models that are not available offline)",
    )
    srv.add_argument(
        "--serve", choices=("auto", "vllm", "transformers"), default="auto", help="server to start without a URL"
    )
    srv.add_argument("--replicas", type=positive_int, help="vLLM data-parallel replicas (default: GPUs // tp)")
    srv.add_argument("--ready-timeout", type=float, default=1800.0, help="seconds to wait for a server to be ready")
    srv.add_argument("--log-dir", type=Path, help="server logs (default: <results-dir>/logs)")
    srv.add_argument("--concurrency", type=positive_int, help="requests in flight per model (default: the table's)")
    srv.add_argument(
        "--parallel-models",
        type=positive_int,
        default=1,
        help="models evaluated side by side, each with its own server (default 1: one after another). On CPU, N "
        "servers share the cores: run with OMP_NUM_THREADS=cores/N. GPU servers take every GPU: keep 1 there",
    )
    srv.add_argument(
        "--timeout",
        type=positive_seconds,
        default=300.0,
        help="seconds per request attempt, plus --timeout-per-token for every prompt and new token (default 300)",
    )
    srv.add_argument(
        "--timeout-per-token",
        type=seconds,
        default=0.1,
        help="seconds added to an attempt's timeout per token of its prompt (estimated) and of its max_tokens "
        "(default 0.1: a 5000-token chunk with a 1024-token memory gets ~15 minutes)",
    )
    srv.add_argument(
        "--max-retries", type=non_negative_int, default=3, help="retries of a failed request (with backoff)"
    )
    srv.add_argument(
        "--max-connection-failures",
        type=non_negative_int,
        default=3,
        help="stop a model when this many items in a row could not connect to its endpoint (their retries spent); "
        "those and the items in flight are not recorded, so the same command resumes them (default 3; 0: never)",
    )
    srv.add_argument("--backoff", type=float, default=1.0, help="first backoff in seconds (doubles each retry)")
    srv.add_argument(
        "--temperature", type=sampling_argument("temperature"), default=0.7, help="sampling temperature (paper: 0.7)"
    )
    srv.add_argument("--top-p", type=sampling_argument("top_p"), default=0.95, help="nucleus sampling (paper: 0.95)")
    srv.add_argument(
        "--seed", type=sampling_argument("seed"), help="per-request sampling seed, if the server supports it"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parse_with_config(parser, argv)  # a config file sets defaults; flags on the command line still win
    known = cfg.known_methods()
    unknown = [m for m in args.method or [] if m not in known and not is_agent_file(m)]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; choose from {', '.join(known)}, or give the path of an agent file")
    if args.method:
        try:
            args.method = [cfg.resolve_method(m) for m in args.method]
        except ValueError as err:
            parser.error(str(err))
        names = [cfg.method_name(m) for m in args.method]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            parser.error(f"two methods would write the same results files (named {', '.join(twice)})")
    return args


def agent_options(entry: cfg.ModelEntry, method: str) -> dict[str, Any]:
    """The inference settings of a method's agent: the model table's section named after the agent (``memory``,
    ``direct``: its budgets), and the method's final prompt; an agent without a section runs on its defaults."""
    agent, final_prompt = cfg.method_agent(method)
    section = None if is_agent_file(agent) else getattr(entry, agent, None)
    options = asdict(section) if section is not None else {}
    if final_prompt is not None:
        options["final_prompt"] = final_prompt
    return options


def make_workflow(entry: cfg.ModelEntry, method: str, tokenizer: Any) -> Callable[[dict[str, Any]], Episode]:
    """The episode factory of one method: its agent from the registry, by name or file."""
    agent, _ = cfg.method_agent(method)
    workflow = load_register(agent).for_inference(tokenizer, **agent_options(entry, method))

    def make_episode(item: dict[str, Any]) -> Episode:
        return workflow.episode(agent_sample(item))

    return make_episode


def agent_sample(item: dict[str, Any]) -> dict[str, Any]:
    """What an agent sees of an eval item: its fields without the gold answers, the question stripped (``input``;
    also as ``prompt``, the column training reads it from) and the document (``context``, empty when absent)."""
    question = str(item.get("input", "")).strip()
    sample = {key: value for key, value in item.items() if key not in scoring.GOLD_FIELDS}
    return {**sample, "input": question, "prompt": question, "context": item.get("context") or ""}


def settings_of(entry: cfg.ModelEntry, method: str, sampling: dict[str, Any]) -> dict[str, Any]:
    """What decides a file's results: resuming with other settings is refused."""
    options = agent_options(entry, method)
    final_prompt = options.pop("final_prompt", None)
    settings = {
        "checkpoint": entry.checkpoint,
        "tokenizer": entry.tokenizer or entry.checkpoint,
        "method": cfg.method_name(method),
        "final_prompt": final_prompt,
        "budget": options,
        "sampling": sampling,
    }
    if is_agent_file(method):  # another file of the same name is another method: its results are not resumed
        settings["agent_file"] = method
    return settings


def sampling_note(entry: cfg.ModelEntry, args: argparse.Namespace) -> str:
    """Whether the recorded sampling is known to be applied: by a server the harness starts, yes (vLLM applies
    it; ``transformers serve`` gets a model view with sampling switched on); by an external endpoint, unknown."""
    if args.url or entry.url:
        return "not verified: an external endpoint (--url) decides whether it applies temperature and top_p"
    return "yes: applied by the server the harness starts"


def plan_jobs(
    entry: cfg.ModelEntry,
    args: argparse.Namespace,
    sampling: dict[str, Any],
    scanned: dict[Path, tuple[list[Any], dict[Any, tuple[str, str]]]],
) -> list[Job]:
    """Every results file of one model, with the items still to run. Eval sets are checked once per file
    (``scanned`` caches their ids); a (task, length) without data is left out (see :func:`check_data`)."""
    jobs = []
    pool = evalsets.pool_file(args.data_dir, args.hotpotqa_dev)
    for method in args.method or [entry.method]:
        for task, length in cfg.plan(entry, cfg.expand_tasks(args.tasks, args.lengths), args.lengths):
            data = evalsets.data_file(args.data_dir, task, length)
            if data is None:
                continue
            if data not in scanned:
                questions: dict[Any, tuple[str, str]] = {}
                scanned[data] = (evalsets.scan(data, args.limit, pool, questions), questions)
            ids, questions = scanned[data]
            out = results.results_path(args.results_dir, task, length, entry.name, cfg.method_name(method))
            info = {
                "expected": len(ids),
                "data_file": str(data),
                "model": entry.name,
                "task": task,
                "length": length,
                "sampling_applied": sampling_note(entry, args),
            }
            done = results.prepare(out, settings_of(entry, method, sampling), info, args.retry_failed, args.overwrite)
            pending = [i for i in ids if i not in done]
            jobs.append(Job(task, length, method, data, out, ids, pending, {i: questions[i] for i in pending}))
    return jobs


async def run_model(
    entry: cfg.ModelEntry,
    jobs: list[Job],
    tokenizer: Any,
    client: OpenAIChatClient,
    args: argparse.Namespace,
    sampling: dict[str, Any],
) -> list[tuple[Job, FileOutcome]]:
    workflows = {method: make_workflow(entry, method, tokenizer) for method in {job.method for job in jobs}}
    pool = evalsets.pool_file(args.data_dir, args.hotpotqa_dev)
    streak = FailureStreak(args.max_connection_failures)  # over all files of the model: one endpoint
    outcomes = []
    try:
        for job in jobs:
            desc = f"{entry.name} {cfg.method_name(job.method)} {job.task}_{job.length}"
            bar = tqdm(total=job.expected, initial=job.expected - len(job.pending), desc=desc, disable=args.quiet)

            def make_record(item, session, error, seconds, job=job):
                gold = scoring.golds(item)
                if error is None:
                    final_prompt = cfg.method_agent(job.method)[1] or cfg.AGENT_ANSWER_FORMAT
                    scores = scoring.score(job.task, final_prompt, session.answer, gold)
                else:
                    scores = scoring.failed(job.task)
                return results.item_record(
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
                    keep_trace=args.trace,
                )

            with TraceWriter(job.out) as writer:
                try:
                    outcome = await run_items(
                        evalsets.iter_items(job.data, args.limit, set(job.pending), pool),
                        workflows[job.method],
                        make_record,
                        client,
                        writer,
                        entry.concurrency,
                        sampling,
                        bar,
                        streak,
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


def report_long_questions(entry: cfg.ModelEntry, jobs: list[Job], tokenizer: Any) -> list[str]:
    """Warn, before any item runs, about questions longer than the question budget the memory agent was trained
    with: the evaluation keeps a question whole (as the paper's), so every prompt of that item is longer than
    any prompt seen in training, and may exceed a server's context window."""
    budget = MemoryConfig.max_prompt_length
    lines = []
    for job in jobs:
        if cfg.method_agent(job.method)[0] != "memory":  # the memory agent's trained question budget
            continue
        for where, question in job.questions.values():
            tokens = len(tokenizer.encode(question.strip(), add_special_tokens=False))
            if tokens > budget:
                lines.append(
                    f"{where}: the question has {tokens} tokens, over the {budget}-token question budget of "
                    f"training; it is kept whole, so each of its prompts is {tokens - budget} tokens longer than any "
                    f"in training ({entry.name})"
                )
    for line in lines:
        log.warning("%s", line)
    return lines


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
        client = OpenAIChatClient(
            ep.base_url,
            ep.model,
            max_concurrency=entry.concurrency,
            timeout=args.timeout,
            timeout_per_token=args.timeout_per_token,
            max_retries=args.max_retries,
            backoff=args.backoff,
        )
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


class _Terminate:
    """The SIGTERM handler of a run: SIGTERM (a scheduler stopping the job) unwinds like Ctrl-C, so the servers we
    started are stopped, and is remembered, so that the run exits 143 (128 + SIGTERM, the shells' convention)
    rather than Ctrl-C's 130 (the KeyboardInterrupt may be re-raised from another thread without its cause)."""

    def __init__(self) -> None:
        self.received = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.received = True
        raise KeyboardInterrupt(f"signal {signum}")


def print_totals(rows: list[tuple[str, Job, FileOutcome]]) -> None:
    if not rows:
        return
    print("\nToken totals of this run:", file=sys.stderr)
    print(
        f"{'model':32} {'method':13} {'file':28} {'items':>6} {'failed':>6} {'prompt':>12} {'completion':>11}",
        file=sys.stderr,
    )
    for model, job, out in rows:
        print(
            f"{model[:32]:32} {cfg.method_name(job.method):13} {f'{job.task}_{job.length}'[:28]:28} {out.done:6d} "
            f"{out.failed:6d} {out.prompt_tokens:12,d} {out.completion_tokens:11,d}",
            file=sys.stderr,
        )
    prompt = sum(o.prompt_tokens for _, _, o in rows)
    completion = sum(o.completion_tokens for _, _, o in rows)
    done = sum(o.done for _, _, o in rows)
    failed = sum(o.failed for _, _, o in rows)
    print(f"{'total':75} {done:6d} {failed:6d} {prompt:12,d} {completion:11,d}", file=sys.stderr)


def check_data(entries: list[cfg.ModelEntry], args: argparse.Namespace) -> list[str]:
    """Raise :class:`evalsets.EvalDataError` when a selected task, or a selected length, has no eval set at all;
    return the (task, length) pairs that are absent while their task and length exist elsewhere (``--lengths``
    applies to every task, so HotpotQA document counts and RULER token counts meet in one list)."""
    pairs = {
        pair for entry in entries for pair in cfg.plan(entry, cfg.expand_tasks(args.tasks, args.lengths), args.lengths)
    }
    absent = {pair for pair in pairs if evalsets.data_file(args.data_dir, *pair) is None}
    tasks = sorted({t for t, _ in pairs if all((t, n) in absent for t2, n in pairs if t2 == t)})
    lengths = sorted({n for _, n in pairs if all((t, n) in absent for t, n2 in pairs if n2 == n)})
    if tasks or (args.lengths and lengths):
        names = [f"{args.data_dir}/{evalsets.expected_names(t, n)}" for t, n in sorted(absent)]
        what = f"task(s) {', '.join(tasks)}" if tasks else f"length(s) {', '.join(map(str, lengths))}"
        raise evalsets.EvalDataError(
            f"no eval set for the selected {what}: looked for {', '.join(names)}; generate them "
            "(python -m taskutils.memory_data; needle: python -m experiments.needle.data) or select what "
            "exists with --tasks / --lengths"
        )
    return [f"{t}_{n}" for t, n in sorted(absent)]


def unfinished(plans: list[tuple[cfg.ModelEntry, list[Job]]]) -> list[str]:
    """One line per results file where a selected item has no result or only a failed one."""
    lines = []
    for entry, jobs in plans:
        for job in jobs:
            failed, not_run, first = results.unfinished(job.out, job.ids)
            if failed or not_run:
                name = cfg.method_name(job.method)
                line = f"{entry.name} {name} {job.task}_{job.length}: {failed} failed, {not_run} not run"
                lines.append(line + (f" (first error: {first})" if first else ""))
    return lines


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


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 when every selected item has a result; 1 when an item failed or did not run (an endpoint
    that does not answer included); 2 on bad input (nothing is sent to a model then) or a results folder in use by
    another run; 1 too when the machine fails it (a folder it cannot write, a full disk: one line names the file
    and the cause); 130 when interrupted (Ctrl-C), 143 when stopped by SIGTERM."""
    args = parse_args(argv)
    try:
        with results.locked(args.results_dir):
            return evaluate(args)
    except results.ResultsBusyError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the machine's own fault (a read-only folder, a full disk): one line, no traceback
        remedy = os_error_remedy(err, "pass another --results-dir")
        print(f"error: cannot go on: {os_error_text(err)}; {remedy}: {RESUMES}", file=sys.stderr)
        return 1


def evaluate(args: argparse.Namespace) -> int:
    """The run of :func:`main`, with the results folder held."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("httpx", "httpx2", "openai", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    sampling = {"temperature": args.temperature, "top_p": args.top_p}
    if args.seed is not None:
        sampling["seed"] = args.seed
    try:
        table = cfg.load_table(args.table)
        entries = [
            cfg.with_overrides(e, concurrency=args.concurrency, served_name=args.served_model, tokenizer=args.tokenizer)
            for e in cfg.select_models(table, args.models)
        ]
        absent = check_data(entries, args)
        if absent:
            log.warning("no eval set for %d (task, length) pair(s), not run: %s", len(absent), ", ".join(absent))
        scanned: dict[Path, tuple[list[Any], dict[Any, tuple[str, str]]]] = {}
        plans = [(entry, plan_jobs(entry, args, sampling, scanned)) for entry in entries]
    except (evalsets.EvalDataError, results.SettingsMismatchError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    terminate = _Terminate()
    previous = signal.signal(signal.SIGTERM, terminate)
    rows: list[tuple[str, Job, FileOutcome]] = []
    skipped_models: list[str] = []
    try:
        run_models(plans, args, sampling, rows, skipped_models)
    except KeyboardInterrupt:
        print("\ninterrupted: finished items are saved; run the same command again to resume", file=sys.stderr)
        print_totals(rows)
        return 128 + signal.SIGTERM if terminate.received else 130
    except (evalsets.EvalDataError, results.SettingsMismatchError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
    print_totals(rows)
    if not args.no_report and args.results_dir.is_dir():
        from .report import write_report

        written = write_report(args.results_dir, data_dir=args.data_dir)
        print(f"summary: {', '.join(str(p) for p in written)}", file=sys.stderr)
    problems = unfinished(plans)
    if skipped_models:
        print(f"error: model(s) not evaluated: {', '.join(skipped_models)} (see the log above)", file=sys.stderr)
    if problems:
        print(f"error: {len(problems)} results file(s) incomplete:", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        print("failed items count as 0 in the summary; --retry-failed redoes them", file=sys.stderr)
    return 1 if problems or skipped_models else 0


if __name__ == "__main__":
    sys.exit(main())
