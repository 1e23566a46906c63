"""Drop questions a model answers without the context (the paper's training-data filter), through any
OpenAI-compatible endpoint.

Each model is asked the bare question plus ``Your final answer in \\boxed{}.``, ``samples`` times (the paper:
2 samples, temperature 1.0, top_p 0.7, 512 new tokens). A question is removed if any sample of any model
passes the strict boxed verifier or contains a ground truth as a case-insensitive substring. Responses are
appended to ``filter_{split}.responses.jsonl`` as they arrive, so an interrupted run resumes where it was.
The kept rows (the first ``keep`` survivors, in file order) are copied from the process parquet in row
groups, contexts included, without loading the whole file.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from recurrent.atomic import atomic_path
from recurrent.flags import flag
from recurrent.options import positive_int
from recurrent.resume import iter_jsonl, repair_jsonl
from recurrent.sampling import argument as sampling_argument
from taskutils.verifiers import strict_score

FILTER_TEMPLATE = "{prompt}\nYour final answer in \\boxed{{}}.\n"
DEFAULT_MODELS = (
    ("http://localhost:8000/v1", "Qwen2.5-7B"),
    ("http://localhost:8001/v1", "Qwen2.5-7B-Instruct"),
)


@dataclass(frozen=True)
class FilterSettings:
    """How each model is asked (the paper's values are the defaults); also the flags of ``hotpotqa-filter``."""

    samples: int = flag(2, "samples per model and question (paper: %(default)s)", type=positive_int)
    temperature: float = flag(1.0, "sampling temperature (paper: %(default)s)", type=sampling_argument("temperature"))
    top_p: float = flag(0.7, "nucleus sampling (paper: %(default)s)", type=sampling_argument("top_p"))
    max_tokens: int = flag(512, "new tokens of an answer (paper: %(default)s)", type=positive_int)
    concurrency: int = flag(256, "requests in flight per model (default: %(default)s)", type=positive_int)


def answered_without_context(responses: list[str], ground_truths: list[str]) -> dict[str, bool]:
    """The two signals of the original filter for one model's responses."""
    boxed = any(strict_score(r, ground_truths) > 0 for r in responses)
    contains = any(gt.lower() in r.lower() for r in responses for gt in ground_truths)
    return {"boxed": boxed, "contains": contains}


def read_questions(process_parquet: Path) -> list[dict]:
    """``{index, question, ground_truth}`` of every row, without reading the contexts."""
    import pyarrow.parquet as pq

    if not Path(process_parquet).is_file():
        raise FileNotFoundError(f"{process_parquet} does not exist (run hotpotqa-process first)")
    table = pq.read_table(process_parquet, columns=["prompt", "reward_model", "extra_info"])
    rows = []
    for prompt, reward, extra in zip(
        table.column("prompt").to_pylist(),
        table.column("reward_model").to_pylist(),
        table.column("extra_info").to_pylist(),
        strict=True,
    ):
        rows.append({"index": extra["index"], "question": prompt[0]["content"], "ground_truth": reward["ground_truth"]})
    return rows


def load_cache(path: Path) -> dict[tuple[int, str], list[str]]:
    """The responses already collected; a line cut by a kill is removed, so that question is asked again."""
    if not path.is_file():
        return {}
    repair_jsonl(path)
    return {(rec["index"], rec["model"]): rec["responses"] for rec in iter_jsonl(path)}


async def _collect(
    rows: list[dict],
    models: list[tuple[str, str]],
    settings: FilterSettings,
    cache_path: Path,
    api_key: str | None,
    progress: Callable[[], None] | None,
) -> dict[tuple[int, str], list[str]]:
    from recurrent.client import OpenAIChatClient

    cache = load_cache(cache_path)
    clients = {
        model: OpenAIChatClient(url, model, api_key=api_key, max_concurrency=settings.concurrency)
        for url, model in models
    }
    todo = [(row, model) for row in rows for _, model in models if (row["index"], model) not in cache]

    with open(cache_path, "a", encoding="utf-8") as out:

        async def ask(row: dict, model: str) -> None:
            messages = [{"role": "user", "content": FILTER_TEMPLATE.format(prompt=row["question"])}]
            replies = await asyncio.gather(
                *(
                    clients[model].chat(
                        messages, settings.max_tokens, temperature=settings.temperature, top_p=settings.top_p
                    )
                    for _ in range(settings.samples)
                )
            )
            responses = [r.text for r in replies]
            cache[(row["index"], model)] = responses
            out.write(json.dumps({"index": row["index"], "model": model, "responses": responses}) + "\n")
            out.flush()
            if progress:
                progress()

        try:
            await asyncio.gather(*(ask(row, model) for row, model in todo))
        finally:
            for client in clients.values():
                await client.aclose()
    return cache


def collect_responses(
    rows: list[dict],
    models: list[tuple[str, str]],
    settings: FilterSettings,
    cache_path: Path,
    api_key: str | None = None,
    progress: Callable[[], None] | None = None,
) -> dict[tuple[int, str], list[str]]:
    """Responses of every model to every question, from the cache file or the endpoints (resumable)."""
    return asyncio.run(_collect(rows, models, settings, cache_path, api_key, progress))


def decide(rows: list[dict], models: list[tuple[str, str]], responses: dict) -> tuple[list[int], dict[str, int]]:
    """Indices of the surviving questions (file order) and how many each signal removed."""
    kept, counts = [], {"total": len(rows), "removed": 0}
    for row in rows:
        removed = False
        for _, model in models:
            signals = answered_without_context(responses[(row["index"], model)], row["ground_truth"])
            for name, fired in signals.items():
                if fired:
                    counts[f"{model}/{name}"] = counts.get(f"{model}/{name}", 0) + 1
                    removed = True
        if removed:
            counts["removed"] += 1
        else:
            kept.append(row["index"])
    return kept, counts


def copy_rows(src: Path, dest: Path, keep_indices: list[int], limit: int) -> int:
    """Copy the rows of ``src`` whose ``extra_info.index`` is in ``keep_indices`` (first ``limit``) to ``dest``,
    row group by row group. Written to a temporary name and renamed, so ``dest`` is never partial."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    wanted = set(keep_indices)
    source = pq.ParquetFile(src)
    written = 0
    with atomic_path(dest) as tmp, pq.ParquetWriter(tmp, source.schema_arrow) as writer:
        for group in range(source.num_row_groups):
            if written >= limit:
                break
            table = source.read_row_group(group)
            index = [e["index"] for e in table.column("extra_info").to_pylist()]
            mask = [i in wanted for i in index]
            selected = table.filter(pa.array(mask))
            selected = selected.slice(0, limit - written)
            if selected.num_rows:
                writer.write_table(selected)
                written += selected.num_rows
    return written
