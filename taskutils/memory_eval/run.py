"""The evaluation harness's command: models x tasks x lengths, as in the paper, through OpenAI-compatible servers
(``--help``: what it does, with examples). ``python -m taskutils.memory_eval.run ...`` and, in this folder,
``python run.py ...`` (the original's command) are the same run.

The run in order: the options (:mod:`.arguments`), the plan of results files and their pending items
(:mod:`.planning`), each model's server and items (:mod:`.supervise`, :mod:`.runner`, the agents of
:mod:`.agents`), then the token totals, the summary (:mod:`.report`) and the exit status (:func:`main`).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # `python run.py` in this folder: the module, as `-m` runs it
    import sys
    from pathlib import Path

    # The repository root, to import taskutils; run_as_module takes this folder, whose files would shadow
    # modules of the same name, off sys.path.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from taskutils.file_run import run_as_module

    run_as_module(__file__, "taskutils.memory_eval.run")

import argparse
import logging
import signal
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from recurrent.atomic import os_error_remedy, os_error_text
from recurrent.flags import SamplingOptions, from_args
from recurrent.sampling import describe_rule
from taskutils.memory_eval import config as cfg
from taskutils.memory_eval import evalsets, results
from taskutils.memory_eval.arguments import parse_args
from taskutils.memory_eval.planning import Job, check_data, plan_jobs, unfinished
from taskutils.memory_eval.runner import FileOutcome
from taskutils.memory_eval.supervise import run_models

log = logging.getLogger("memory_eval")

RESUMES = "the items finished are saved whole, and the same command resumes after them"


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
    sampling: dict[str, Any] = asdict(from_args(SamplingOptions, args))
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
        scanned: dict[tuple[Path, bool], tuple[list[Any], dict[Any, tuple[str, str]]]] = {}
        plans = [(entry, plan_jobs(entry, args, sampling, scanned)) for entry in entries]
        log.info(describe_rule(sampling, "--temperature, --top-p: the paper's evaluation by default"))
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
        from taskutils.memory_eval.report import write_report  # matplotlib: only when a summary is written

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
