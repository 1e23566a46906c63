"""The plan of a run: one :class:`Job` per results file (a model, a method, a (task, length) eval set) with the items
still to run, the settings that decide a file's results (resuming with others is refused), the check that the
selected eval sets exist, the questions longer than the memory agent was trained with, and the files left unfinished
at the end."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recurrent.impls.memory import MemoryConfig
from recurrent.interface import is_agent_file
from recurrent.sampling import describe_rule
from taskutils.memory_eval import config as cfg
from taskutils.memory_eval import evalsets, results
from taskutils.memory_eval.agents import agent_options, reads_context

log = logging.getLogger("memory_eval")


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


def settings_of(
    entry: cfg.ModelEntry, method: str, sampling: dict[str, Any], agent_values: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What decides a file's results: resuming with other settings is refused."""
    options = agent_options(entry, method, agent_values)
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
    scanned: dict[tuple[Path, bool], tuple[list[Any], dict[Any, tuple[str, str]]]],
) -> list[Job]:
    """Every results file of one model, with the items still to run. Eval sets are checked once per file and
    whether the method's agent reads documents (``scanned`` caches their ids); a (task, length) without data is left
    out (see :func:`check_data`)."""
    jobs = []
    pool = evalsets.pool_file(args.data_dir, args.hotpotqa_dev)
    agent_values = getattr(args, "agent_values", None)
    for method in args.method or [entry.method]:
        needs_context = reads_context(method, agent_values)
        for task, length in cfg.plan(entry, cfg.expand_tasks(args.tasks, args.lengths), args.lengths):
            data = evalsets.data_file(args.data_dir, task, length)
            if data is None:
                continue
            if (data, needs_context) not in scanned:
                questions: dict[Any, tuple[str, str]] = {}
                ids = evalsets.scan(data, args.limit, pool, questions, needs_context)
                scanned[(data, needs_context)] = (ids, questions)
            ids, questions = scanned[(data, needs_context)]
            out = results.results_path(args.results_dir, task, length, entry.name, cfg.method_name(method))
            info = {
                "expected": len(ids),
                "data_file": str(data),
                "model": entry.name,
                "task": task,
                "length": length,
                "sampling_applied": sampling_note(entry, args),
                # settings' sampling is what a call that sets neither value uses; each line records what was used
                "sampling_rule": describe_rule(sampling, "--temperature, --top-p"),
            }
            settings = settings_of(entry, method, sampling, agent_values)
            done = results.prepare(out, settings, info, args.retry_failed, args.overwrite)
            pending = [i for i in ids if i not in done]
            jobs.append(Job(task, length, method, data, out, ids, pending, {i: questions[i] for i in pending}))
    return jobs


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
            "(python -m taskutils.memory_data, which writes where the harness reads by default; needle: python -m "
            "experiments.needle.data), point at their folder (--data-dir DIR, or $MEMAGENT_DATA_DIR or the "
            "original's $DATAROOT) or select what exists with --tasks / --lengths"
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
