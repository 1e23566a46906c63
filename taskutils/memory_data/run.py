"""The data stages' command: ``python -m taskutils.memory_data STAGE ...`` and, in this folder, ``python run.py
STAGE ...`` (the original's place) are the same run. The options are :mod:`.arguments`'s; each stage is one function
here, over the stage functions of :mod:`.stages` (see README.md beside this file for the stages in order).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # `python run.py` in this folder: the module, as `-m` runs it
    import sys
    from pathlib import Path

    # The repository root, to import taskutils; run_as_module takes this folder, whose files would shadow
    # modules of the same name, off sys.path.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from taskutils.file_run import run_as_module

    run_as_module(__file__, "taskutils.memory_data.run")

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from recurrent.flags import from_args
from taskutils.data_root import data_dir
from taskutils.memory_data import stages
from taskutils.memory_data.arguments import build_parser

# Worker processes are forked; a tokenizer that already used its thread pool would warn and deadlock-guard.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _sources_dir(args: argparse.Namespace) -> Path:
    return args.sources or data_dir(args.out) / "sources"


def _timing(report: stages.StageReport) -> str:
    return "already complete" if report.skipped else f"{report.seconds:.1f} s"


def download(args: argparse.Namespace) -> int:
    from taskutils.memory_data.download import download as fetch

    fetch(_sources_dir(args), args.only, args.force, args.essay_urls, babilong_configs=args.babilong_configs)
    return 0


def hotpotqa_process(args: argparse.Namespace) -> int:
    out = data_dir(args.out)
    for split in args.splits:
        n = args.train_samples if split == "train" else args.dev_samples
        src = _sources_dir(args) / f"hotpotqa_{split}.json"
        report = stages.hotpotqa_process(
            out, split, src, n, args.num_docs, args.seed, args.per_sample_shuffle, args.workers
        )
        print(f"{report.output}: {report.samples} rows ({_timing(report)})")
    return 0


def hotpotqa_filter(args: argparse.Namespace) -> int:
    from taskutils.memory_data.filtering import DEFAULT_MODELS, FilterSettings

    out = data_dir(args.out)
    models = [tuple(m) for m in args.model] if args.model else list(DEFAULT_MODELS)
    settings = from_args(FilterSettings, args)
    for split in args.splits:
        keep = args.train_keep if split == "train" else args.dev_keep
        summary = stages.hotpotqa_filter(out, split, models, keep, settings, args.api_key)
        print(" ".join(f"{k}={v}" for k, v in summary.items()))
    return 0


def hotpotqa_eval(args: argparse.Namespace) -> int:
    from taskutils.memory_data.hotpotqa import question_indices_from_parquet

    out = data_dir(args.out)
    if args.first is not None:
        indices = list(range(args.first))
    else:
        indices = question_indices_from_parquet(args.questions or out / "hotpotqa_dev.parquet")
    src = _sources_dir(args) / "hotpotqa_dev.json"
    for report in stages.hotpotqa_eval(
        out, src, indices, args.num_docs, args.seed, args.per_sample_shuffle, args.workers
    ):
        print(f"{report.output}: {report.samples} questions ({_timing(report)})")
    return 0


def ruler(args: argparse.Namespace) -> int:
    from taskutils.memory_data.ruler import TASKS, Sources
    from taskutils.memory_data.tokenizer import load_tokenizer

    tasks = list(TASKS) if args.tasks == ["all"] else args.tasks
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        print(f"error: unknown tasks {unknown}; known: {', '.join(TASKS)}", file=sys.stderr)
        return 2
    out = data_dir(args.out)
    src = _sources_dir(args)
    sources = Sources(
        essay=args.essay_file or src / "PaulGrahamEssays.json",
        squad=args.squad_file or src / "squad.json",
        hotpotqa_dev=args.hotpotqa_dev_file or src / "hotpotqa_dev.json",
    )
    tokenizer = load_tokenizer(args.tokenizer)
    for length in args.lengths:
        for task in tasks:
            report = stages.ruler(
                out, task, length, tokenizer, args.tokenizer, args.num_samples, args.seed, sources, args.workers
            )
            print(f"{report.output}: {report.samples} samples ({_timing(report)})")
    return 0


def qwen_tokenizer(args: argparse.Namespace) -> int:
    from taskutils.memory_data.tokenizer import load_tokenizer, materialize_qwen_tokenizer

    folder = materialize_qwen_tokenizer(args.root)
    tokenizer = load_tokenizer(str(folder))
    sample = "Hello, world!"
    print(f"{folder}\n{sample!r} -> {tokenizer.encode(sample, add_special_tokens=False)}")
    return 0


def custom_data(args: argparse.Namespace) -> int:
    from recurrent.impls.memory import MemoryConfig
    from taskutils.memory_data import custom
    from taskutils.memory_data.tokenizer import load_tokenizer

    budgets = MemoryConfig()  # the paper's budgets, which the training configs keep
    fields = custom.Fields(
        question=args.question_field,
        answers=args.answers_field,
        context=None if args.documents_field else args.context_field or "context",
        documents=args.documents_field,
        id=args.id_field,
    )
    outputs = custom.Outputs(train=args.train_out, val=args.val_out, eval=args.eval_out)
    sources = custom.prepare(args.inputs, outputs, args.eval_fraction, args.split)  # before a tokenizer loads
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    report = custom.build(
        sources,
        fields,
        outputs,
        eval_fraction=args.eval_fraction,
        seed=args.seed,
        data_source=args.data_source,
        tokenizer=tokenizer,
        max_question_tokens=args.max_question_tokens or budgets.max_prompt_length,
        duplicates=args.duplicates,
        answer_lists=args.answer_lists,
    )
    print(custom.summary(report, budgets.max_context_tokens))
    return 0


def longbench(args: argparse.Namespace) -> int:
    from taskutils.memory_data.benchmark_stages import run_longbench

    return run_longbench(args, data_dir(args.out), _sources_dir(args))


def babilong(args: argparse.Namespace) -> int:
    from taskutils.memory_data.benchmark_stages import run_babilong

    return run_babilong(args, data_dir(args.out), _sources_dir(args))


STAGES: dict[str, Callable[[argparse.Namespace], int]] = {
    "download": download,
    "hotpotqa-process": hotpotqa_process,
    "hotpotqa-filter": hotpotqa_filter,
    "hotpotqa-eval": hotpotqa_eval,
    "ruler": ruler,
    "qwen-tokenizer": qwen_tokenizer,
    "custom": custom_data,
    "longbench": longbench,
    "babilong": babilong,
}


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 when the stage ran; 2 on bad input (a source, a setting, an option: one line names it, no
    traceback); 1 when the machine fails it (a folder it cannot write, a full disk)."""
    from recurrent.atomic import os_error_remedy, os_error_text
    from taskutils.memory_data.custom import CustomDataError
    from taskutils.memory_data.hotpotqa import TooFewDocumentsError
    from taskutils.memory_data.output import ConfigMismatchError
    from taskutils.memory_data.ruler.calibrate import CalibrationError
    from taskutils.memory_data.sources import SourceError
    from taskutils.memory_data.tokenizer import TokenizerUnavailableError

    args = build_parser().parse_args(argv)
    try:
        return STAGES[args.command](args)
    except (
        SourceError,
        ConfigMismatchError,
        TooFewDocumentsError,
        TokenizerUnavailableError,
        CalibrationError,
        FileNotFoundError,
        CustomDataError,
    ) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the machine's own fault (a folder it cannot write, a full disk): one line, exit 1
        print(
            f"error: cannot go on: {os_error_text(err)}; {os_error_remedy(err, 'choose other output paths')}: no "
            "output is left half-written under its own name",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
