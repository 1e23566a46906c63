"""The harness's command line: its options as settings dataclasses (what to run, data and results, serving), the
client and sampling options every command shares (:mod:`recurrent.flags`), the parser built from them, and the
checks of ``--method`` after parsing. ``--config FILE`` sets the defaults of every flag (keys as the long flags)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from recurrent.agent_thread import DOCUMENT_DEADLINE_S, deadline_argument
from recurrent.flags import ClientOptions, SamplingOptions, add_flags, flag
from recurrent.interface import is_agent_file, load_register
from recurrent.options import (
    ConfigError,
    agent_config,
    non_negative_int,
    parse_with_config,
    positive_int,
    positive_seconds,
)
from recurrent.sampling import argument as sampling_argument
from taskutils import original_names
from taskutils.data_root import data_dir
from taskutils.memory_eval import config as cfg
from taskutils.memory_eval import evalsets

PROG = "python -m taskutils.memory_eval.run"  # also `python run.py` in this folder, the original's command
DESCRIPTION = """Evaluate models x tasks x lengths, as in the paper, through OpenAI-compatible servers.

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


def parse_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_lengths(text: str) -> list[int]:
    return [non_negative_int(part) for part in parse_list(text)]  # 0: BABILong's 0k, LongBench as published


def _methods_help() -> str:  # the registered agents, as they are when the parser is built
    return (
        f"comma list of {', '.join(cfg.known_methods())} (any registered agent by name) or paths to agent files "
        "(path/to/agent.py, relative to the working directory; results are named after the file's stem); "
        "memory/direct use the paper's 'the answer is' prompt and the -boxed variants the training format "
        "(default: each model's method in the table)"
    )


@dataclass(frozen=True)
class Selection:
    """What to run: models x tasks x lengths, with which methods."""

    config: Path | None = flag(None, "YAML file of defaults for these options (keys as the long flags)", type=Path)
    table: Path | None = flag(None, f"model table (default: {cfg.TABLE_PATH.name} next to this file)", type=Path)
    models: list[str] | None = flag(
        None,
        "comma list of table names or groups (paper, ablation, cpu); an unknown name is taken as a checkpoint (local "
        "folder or cached hub id) run with the memory method. Default: paper,ablation (of a --table without those "
        "groups: all its entries)",
        type=parse_list,
    )
    tasks: list[str] | None = flag(
        None,
        "comma list: hotpotqa, RULER task names, needle (the CPU replication's), or groups ruler/all (default: all, "
        "without needle)",
        type=parse_list,
    )
    lengths: list[int] | None = flag(
        None,
        "comma list applied to every task: documents for hotpotqa, tokens for RULER, 64-token chunks for needle, "
        "thousands of tokens for BABILong (0 ... 512, 1000: its configs 0k ... 1M), 0 for LongBench (as published) "
        "(default: the paper's; needle 1,2,4,...,64; BABILong every config)",
        type=parse_lengths,
    )
    method: list[str] | None = flag(None, _methods_help, type=parse_list)
    agent_config: Path | None = flag(
        None,
        "YAML or JSON file of the fields of the --method agents' config class, set over their defaults and the model "
        "table's settings (as the endpoint's --agent-config); checked against each agent before anything starts",
        type=Path,
        metavar="FILE",
    )
    limit: int | None = flag(None, "only the first N items of every eval set", type=positive_int)


@dataclass(frozen=True)
class Storage:
    """Where the eval sets are read and the results written."""

    data_dir: Path = flag(
        help="eval sets: eval_{N}.jsonl, eval_{task}_{L}.jsonl, or the released .json arrays (default: where "
        "python -m taskutils.memory_data writes them: $MEMAGENT_DATA_DIR, $DATAROOT, $DATASET_ROOT/hotpotqa, else "
        "the repository's data/hotpotqa, from any working directory)",
        factory=data_dir,
        type=Path,
    )
    hotpotqa_dev: Path | None = flag(
        None,
        f"the document pool of released sets whose contexts are document indices (default: "
        f"<data-dir>/{evalsets.POOL_FILE} or <data-dir>/sources/{evalsets.POOL_FILE})",
        type=Path,
    )
    results_dir: Path = flag(Path("results"), "output folder (default: %(default)s)", type=Path)
    trace: bool = flag(False, "store every item's memory after each chunk and its turns")
    retry_failed: bool = flag(False, "redo items recorded as failed")
    overwrite: bool = flag(False, "discard existing results of the selected files")
    no_report: bool = flag(False, "do not write the summary at the end")


@dataclass(frozen=True)
class Serving:
    """The servers of the models: an endpoint given, or one started per model."""

    url: str | None = flag(None, "an existing OpenAI-compatible endpoint for every selected model (env API_KEY)")
    served_model: str | None = flag(None, "with --url: the model name requests use (default: the checkpoint)")
    tokenizer: str | None = flag(
        None,
        "tokenizer for chunking and truncation, for every selected model (default: the table's, else the checkpoint; "
        "needed for hosted models that are not available offline)",
    )
    serve: str = flag(
        "auto", "server to start without a URL (default: %(default)s)", choices=("auto", "vllm", "transformers")
    )
    replicas: int | None = flag(None, "vLLM data-parallel replicas (default: GPUs // tp)", type=positive_int)
    ready_timeout: float = flag(
        1800.0,
        "seconds to wait for a server to be ready; a finite number > 0 (default %(default)s)",
        type=positive_seconds,
    )
    log_dir: Path | None = flag(None, "server logs (default: <results-dir>/logs)", type=Path)
    concurrency: int | None = flag(None, "requests in flight per model (default: the table's)", type=positive_int)
    parallel_models: int = flag(
        1,
        "models evaluated side by side, each with its own server (default 1: one after another). On CPU, N servers "
        "share the cores: run with OMP_NUM_THREADS=cores/N. GPU servers take every GPU: keep 1 there",
        type=positive_int,
    )
    max_connection_failures: int = flag(
        3,
        "stop a model when this many items in a row could not connect to its endpoint (their retries spent); those "
        "and the items in flight are not recorded, so the same command resumes them (default %(default)s; 0: never)",
        type=non_negative_int,
    )
    item_timeout: float = flag(
        DOCUMENT_DEADLINE_S,
        "seconds an item's agent may run, its calls and its own code, whatever it does (any agent, one given by path "
        "too); past it the item is recorded as failed, saying so (default %(default)g: the longest paper document "
        "at 20 s a call; 0: no limit; --timeout bounds each request)",
        type=deadline_argument,
    )
    seed: int | None = flag(
        None, "per-request sampling seed, if the server supports it", type=sampling_argument("seed")
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_flags(parser.add_argument_group("what to run"), Selection)
    add_flags(parser.add_argument_group("data and results"), Storage)
    serving = parser.add_argument_group("serving and client")
    add_flags(serving, Serving, skip=["seed"])
    add_flags(serving, ClientOptions)
    add_flags(serving, SamplingOptions)
    add_flags(serving, Serving, only=["seed"])
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The harness's options: flags over a ``--config`` file over the defaults; an unknown method, an agent file
    that registers nothing, or two methods that would write the same files stop with exit 2."""
    parser = build_parser()
    args = parse_with_config(parser, argv)  # a config file sets defaults; flags on the command line still win
    refused = original_names.env_problem(original_names.EVAL_ENV) or next(
        filter(None, map(original_names.model_problem, args.models or [])), None
    )
    known = cfg.known_methods()
    unknown = [m for m in args.method or [] if m not in known and not is_agent_file(m)]
    refused = refused or next(filter(None, map(original_names.method_problem, unknown)), None)
    if refused:  # one line, without the usage: the line says what to type instead
        parser.exit(2, f"{parser.prog}: error: {refused}\n")
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
    args.agent_values = agent_values(parser, args)
    return args


def agent_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """The fields of ``--agent-config``, read and checked against every ``--method`` agent's config class with the
    endpoint's reader (:func:`recurrent.options.agent_config`); a problem stops with exit 2."""
    if args.agent_config is None:
        return {}
    if not args.method:
        parser.error("--agent-config sets the fields of the --method agents: give --method")
    values: dict = {}
    for method in args.method:
        try:
            values = agent_config(load_register(cfg.method_agent(method)[0]), args.agent_config)
        except (ConfigError, OSError) as err:
            parser.error(f"--agent-config {err}" if isinstance(err, ConfigError) else f"--agent-config: {err}")
    return values
