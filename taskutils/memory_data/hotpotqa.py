"""HotpotQA long-context synthesis: training/dev rows of 200 documents and eval sets by document count.

A sample for question ``q`` with ``N`` documents holds ``q``'s own 10 paragraphs (2 gold + 8 HotpotQA
distractors) plus ``N - 10`` distinct random paragraphs of the file's pool, shuffled, formatted
``"Document i:\\n{doc}"`` and joined by blank lines, as the original does. The random draw comes from an RNG derived
from (seed, split, question index, N) only, so the data are identical for any worker count (the original
drew from a global RNG inside worker processes, so its output depended on scheduling).

The shuffle is, by default, the original's: ``random.Random(4)`` re-created for every sample. Its
permutation depends only on N, so a question's own paragraphs sit at the same N-dependent positions in
every sample; ``per_sample_shuffle`` draws the permutation from the sample's RNG instead.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from taskutils.memory_data.sources import Question

DOCUMENT_PROMPT = "Document {i}:\n{document}"
ORIGINAL_SHUFFLE_SEED = 4
EVAL_DOC_COUNTS = (50, 100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600)


class TooFewDocumentsError(ValueError):
    """The pool cannot supply the requested number of documents."""


@dataclass(frozen=True)
class SynthesisConfig:
    split: str  # "train" or "dev": part of the RNG key, so the two splits draw independently
    num_docs: int
    seed: int = 42
    per_sample_shuffle: bool = False


def sample_rng(seed: int, split: str, index: int, num_docs: int) -> random.Random:
    # Seeding with a string hashes it (SHA-512): stable across runs, platforms and worker processes.
    return random.Random(f"hotpotqa/{split}/{seed}/{index}/{num_docs}")


def pick_documents(question: Question, pool_size: int, cfg: SynthesisConfig) -> list[int]:
    """Pool indices of the sample's documents, in context order."""
    own = list(question.doc_ids)
    if cfg.num_docs > pool_size:
        raise TooFewDocumentsError(
            f"{cfg.num_docs} documents requested but the pool has only {pool_size} unique documents"
        )
    if cfg.num_docs < len(own):
        raise ValueError(f"{cfg.num_docs} documents requested but question {question.index} has {len(own)} own")
    rng = sample_rng(cfg.seed, cfg.split, question.index, cfg.num_docs)
    extra = cfg.num_docs - len(own)
    exclude = set(own)
    # Over-draw by the own documents' count, then drop them: exact, O(N), and no pool-sized list per sample.
    draw = rng.sample(range(pool_size), min(pool_size, extra + len(exclude)))
    docs = own + [d for d in draw if d not in exclude][:extra]
    if len(docs) < cfg.num_docs:
        raise TooFewDocumentsError(f"the pool of {pool_size} documents cannot supply {cfg.num_docs} distinct ones")
    shuffler = rng if cfg.per_sample_shuffle else random.Random(ORIGINAL_SHUFFLE_SEED)
    shuffler.shuffle(docs)
    return docs


def render_context(doc_ids: list[int], docs: list[str]) -> str:
    return "\n\n".join(DOCUMENT_PROMPT.format(i=i + 1, document=docs[d]) for i, d in enumerate(doc_ids))


def training_row(question: Question, docs: list[str], cfg: SynthesisConfig) -> dict:
    """One row of the training/dev parquet, in the columns verl's dataset and our reward read."""
    context = render_context(pick_documents(question, len(docs), cfg), docs)
    return memory_row(question.question, question.answers, context, question.index, cfg.num_docs)


def eval_record(question: Question, docs: list[str], cfg: SynthesisConfig) -> dict:
    """One line of ``eval_{N}.jsonl``: the evaluation harness's HotpotQA format."""
    context = render_context(pick_documents(question, len(docs), cfg), docs)
    return eval_item(question.question, question.answers, context, question.index, cfg.num_docs)


def memory_row(
    question: str, answers: list[str], context: str, index: int, num_docs: int | None, data_source: str = "hotpotqa"
) -> dict:
    """A training/dev parquet row (``parquet_schema``): the layout every data set of this package writes."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question}],
        "context": context,
        "ability": "memory",
        "reward_model": {"style": "rule", "ground_truth": list(answers)},
        "extra_info": {"index": index, "question": question, "num_docs": num_docs},
    }


def eval_item(question: str, answers: list[str], context: str, index: int, num_docs: int | None) -> dict:
    """An eval-set line as the harness reads it (``num_docs`` left out when the context is not made of documents)."""
    item = {"index": index, "input": question, "context": context, "answers": list(answers)}
    if num_docs is not None:
        item["num_docs"] = num_docs
    return item


def parquet_schema():
    """Explicit schema of the training parquet (stable across row groups, readable by ``datasets``)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("context", pa.string()),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.list_(pa.string()))])),
            ("extra_info", pa.struct([("index", pa.int64()), ("question", pa.string()), ("num_docs", pa.int64())])),
        ]
    )


def question_indices_from_parquet(path: Path) -> list[int]:
    """``extra_info.index`` of every row (reads that column only, not the contexts)."""
    import pyarrow.parquet as pq

    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} does not exist (run hotpotqa-process and hotpotqa-filter first)")
    table = pq.read_table(path, columns=["extra_info"])
    return [row["index"] for row in table.column("extra_info").to_pylist()]


# -- worker state: the pool and questions, set once per process -------------------------------------------

_STATE: dict = {}


def init_worker(questions: list[Question], docs: list[str], cfg: SynthesisConfig, kind: str) -> None:
    _STATE.update(questions=questions, docs=docs, cfg=cfg, kind=kind)


def make_one(position: int) -> dict:
    """Build the record of ``questions[position]`` from the worker state."""
    build = training_row if _STATE["kind"] == "train" else eval_record
    return build(_STATE["questions"][position], _STATE["docs"], _STATE["cfg"])


def iter_records(
    questions: list[Question], docs: list[str], cfg: SynthesisConfig, kind: str, start: int = 0, workers: int = 1
) -> Iterator[dict]:
    """Records for ``questions[start:]``, in order, built on ``workers`` processes."""
    from taskutils.memory_data.parallel import ordered_map

    positions = list(range(start, len(questions)))
    yield from ordered_map(make_one, positions, workers, init_worker, (questions, docs, cfg, kind))
