"""The pipeline stages behind the CLI: each reads local files only and writes resumable outputs.

1. ``hotpotqa_process``: training/dev rows of 200 documents -> ``hotpotqa_{split}_process.parquet``.
2. ``hotpotqa_filter``: drop questions answered without context -> ``hotpotqa_train_32k.parquet`` (the name the
   training launchers read) and ``hotpotqa_dev.parquet``.
3. ``hotpotqa_eval``: the dev questions at 50 ... 25600 documents -> ``eval_{N}.jsonl``.
4. ``ruler``: the 13 RULER tasks at any lengths -> ``eval_{task}_{length}.jsonl``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from recurrent.models import file_sha256 as full_sha256
from taskutils.data_root import TRAIN_FILE
from taskutils.memory_data import hotpotqa
from taskutils.memory_data.output import ResumableJsonl, register
from taskutils.memory_data.sources import SourceError, read_hotpotqa


def filtered_file(split: str) -> str:
    """The name of the filter stage's output for ``split``: the files the training launchers read."""
    return TRAIN_FILE if split == "train" else f"hotpotqa_{split}.parquet"


def file_sha256(path: Path) -> str:
    """The first 16 hex digits of the file's SHA-256: what the manifest records of a source file."""
    return full_sha256(path)[:16]


# -- HotpotQA ---------------------------------------------------------------------------------------------

HOTPOTQA_SHARED = ("seed", "per_sample_shuffle", "generator", "train_source", "dev_source", "questions")


@dataclass
class StageReport:
    output: Path
    samples: int
    skipped: bool  # already complete
    seconds: float


def hotpotqa_process(
    out: Path,
    split: str,
    source: Path,
    num_samples: int,
    num_docs: int = 200,
    seed: int = 42,
    per_sample_shuffle: bool = False,
    workers: int = 1,
) -> StageReport:
    """Rows of the first ``num_samples`` questions of ``source`` with ``num_docs`` documents each."""
    start = time.perf_counter()
    data = read_hotpotqa(source)
    questions = data.questions[:num_samples]
    _check_num_docs(source, questions, num_docs)
    cfg = hotpotqa.SynthesisConfig(split, num_docs, seed, per_sample_shuffle)
    config = {
        "stage": "hotpotqa",
        "kind": "process",
        **asdict(cfg),
        "generator": hotpotqa.__name__,
        f"{split}_source": file_sha256(source),
    }
    writer = ResumableJsonl(
        out, f"hotpotqa_{split}_process.parquet", config, HOTPOTQA_SHARED, len(questions), hotpotqa.parquet_schema()
    )
    bar = {"desc": f"hotpotqa {split}", "unit": "row"}
    skipped = _write_hotpotqa(writer, data, questions, cfg, "train", workers, bar)
    return StageReport(writer.final, len(questions), skipped, _since(start))


def _check_num_docs(source: Path, questions: list, num_docs: int) -> None:
    """Refuse a document count below a question's own documents before anything is written (each sample holds
    its question's own paragraphs, then distractors)."""
    own = max(questions, key=lambda q: len(q.doc_ids), default=None)
    if own is not None and num_docs < len(own.doc_ids):
        raise hotpotqa.TooFewDocumentsError(
            f"{num_docs} documents per sample: question {own.index} of {source} has {len(own.doc_ids)} documents "
            f"of its own; use at least {len(own.doc_ids)}"
        )


def _write_hotpotqa(writer: ResumableJsonl, data, questions: list, cfg, kind: str, workers: int, bar: dict) -> bool:
    """Write the HotpotQA records ``writer`` still lacks (``bar``: tqdm's desc and unit); True if it was already
    complete."""
    if writer.done:
        return True
    with writer, tqdm(total=len(questions), initial=writer.start, **bar) as progress:
        for record in hotpotqa.iter_records(questions, data.docs, cfg, kind, writer.start, workers):
            writer.write(record)
            progress.update()
    return False


def hotpotqa_eval(
    out: Path,
    dev_source: Path,
    question_indices: list[int],
    doc_counts: Iterable[int] = hotpotqa.EVAL_DOC_COUNTS,
    seed: int = 42,
    per_sample_shuffle: bool = False,
    workers: int = 1,
) -> list[StageReport]:
    """``eval_{N}.jsonl`` for every N: the same questions, one sample in memory per worker at a time."""
    data = read_hotpotqa(dev_source)
    bad = [i for i in question_indices if not 0 <= i < len(data.questions)]
    if bad:
        raise SourceError(
            f"{dev_source} has {len(data.questions)} questions; indices {bad[:5]} are out of range (with --first N: "
            f"N at most {len(data.questions)})"
        )
    questions = [data.questions[i] for i in question_indices]
    doc_counts = list(doc_counts)
    for num_docs in doc_counts:
        _check_num_docs(dev_source, questions, num_docs)
    source_hash = file_sha256(dev_source)
    questions_hash = hashlib.sha256(repr(question_indices).encode()).hexdigest()[:16]
    reports = []
    for num_docs in doc_counts:
        if num_docs > len(data.docs):
            raise hotpotqa.TooFewDocumentsError(
                f"eval_{num_docs}: {dev_source} has only {len(data.docs)} unique documents"
            )
        start = time.perf_counter()
        cfg = hotpotqa.SynthesisConfig("dev", num_docs, seed, per_sample_shuffle)
        config = {
            "stage": "hotpotqa",
            "kind": "eval",
            **asdict(cfg),
            "generator": hotpotqa.__name__,
            "dev_source": source_hash,
            "questions": questions_hash,
        }
        writer = ResumableJsonl(out, f"eval_{num_docs}.jsonl", config, HOTPOTQA_SHARED, len(questions))
        bar = {"desc": f"eval_{num_docs}", "unit": "q"}
        skipped = _write_hotpotqa(writer, data, questions, cfg, "eval", workers, bar)
        reports.append(StageReport(writer.final, len(questions), skipped, _since(start)))
    return reports


def hotpotqa_filter(
    out: Path,
    split: str,
    models: list[tuple[str, str]],
    keep: int,
    settings=None,
    api_key: str | None = None,
) -> dict:
    """Filter ``hotpotqa_{split}_process.parquet`` into :func:`filtered_file` (first ``keep`` survivors)."""
    from taskutils.memory_data import filtering

    settings = settings or filtering.FilterSettings()
    src = out / f"hotpotqa_{split}_process.parquet"
    rows = filtering.read_questions(src)
    config = {
        "stage": "hotpotqa-filter",
        "split": split,
        "keep": keep,
        "models": [m for _, m in models],
        "source": file_sha256(src),
        **{k: v for k, v in asdict(settings).items() if k != "concurrency"},
    }
    output = out / filtered_file(split)
    register(out, output.name, config, ())
    cache = out / f"filter_{split}.responses.jsonl"
    with tqdm(total=len(rows) * len(models), desc=f"filter {split}", unit="q") as bar:
        done = filtering.load_cache(cache)
        bar.update(sum(1 for r in rows for _, m in models if (r["index"], m) in done))
        responses = filtering.collect_responses(rows, models, settings, cache, api_key, progress=bar.update)
    kept, counts = filtering.decide(rows, models, responses)
    written = filtering.copy_rows(src, output, kept, keep)
    if written < keep:
        print(f"warning: only {written} {split} questions survive the filter ({keep} requested)")
    return {**counts, "kept": written, "output": str(output)}


# -- RULER ------------------------------------------------------------------------------------------------

RULER_SHARED = ("seed", "tokenizer", "generator", "essay_source", "squad_source", "hotpotqa_dev_source")

_RULER_STATE: dict = {}


def _init_ruler_worker(task_obj) -> None:
    _RULER_STATE["task"] = task_obj


def _ruler_one(index: int) -> dict:
    from taskutils.memory_data.ruler import to_record

    sample, tokens = _RULER_STATE["task"].generate(index)
    return to_record(index, sample, tokens)


def ruler(
    out: Path,
    task: str,
    length: int,
    tokenizer,
    tokenizer_name: str,
    num_samples: int = 128,
    seed: int = 42,
    sources=None,
    workers: int = 1,
    progress: bool = True,
) -> StageReport:
    """``eval_{task}_{length}.jsonl``: ``num_samples`` samples of ``task`` calibrated to ``length`` tokens."""
    from taskutils.memory_data.parallel import ordered_map
    from taskutils.memory_data.ruler import GENERATOR_VERSION, Sources, make_task, source_kind
    from taskutils.memory_data.tokenizer import tokenizer_fingerprint

    start = time.perf_counter()
    sources = sources or Sources()
    kind = source_kind(task)
    config = {
        "stage": "ruler",
        "task": task,
        "length": length,
        "seed": seed,
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "tokenizer_name": tokenizer_name,
        "generator": GENERATOR_VERSION,
    }
    task_obj = make_task(task, length, seed, tokenizer, sources)  # validates sources before any output
    if kind:
        config[f"{kind}_source"] = file_sha256(getattr(sources, kind))
    writer = ResumableJsonl(out, f"eval_{task}_{length}.jsonl", config, RULER_SHARED, num_samples)
    skipped = writer.done
    if not writer.done:
        indices = list(range(writer.start, num_samples))
        bar = tqdm(
            total=num_samples, initial=writer.start, desc=f"{task} {length}", unit="sample", disable=not progress
        )
        tokens = 0
        with writer, bar:
            for record in ordered_map(_ruler_one, indices, workers, _init_ruler_worker, (task_obj,)):
                writer.write(record)
                tokens += record["length"]
                bar.update()
                bar.set_postfix(tok_s=f"{tokens / max(_since(start), 1e-9):,.0f}")
    return StageReport(writer.final, num_samples, skipped, _since(start))


def _since(start: float) -> float:
    return time.perf_counter() - start
