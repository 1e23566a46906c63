"""Per-item results: ``<results>/<task>_<length>/<model>__<method>.jsonl``, one JSON line per item, keyed by
the item's index (``id``), appended and flushed as each item finishes (through :class:`recurrent.trace.TraceWriter`,
which cuts a half-written last line left by a killed run).

A rerun skips the ids already there, so a killed run resumes with no duplicate and no lost item. Failed items
are recorded with ``"error"`` and count as 0; ``retry_failed`` drops their lines first and redoes them. The
settings of a file (checkpoint, method, budgets, sampling) are kept next to it in ``<model>__<method>.meta.json``;
resuming with different settings is refused, so one file never mixes two configurations.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from recurrent.atomic import write_atomic
from recurrent.failures import describe_failure
from recurrent.interface import Episode
from recurrent.resume import SettingsMismatchError, check_settings, read_jsonl  # noqa: F401 (the run catches it)
from recurrent.sampling import call_sampling

FORMAT_VERSION = 1
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


class ResultsBusyError(RuntimeError):
    """Another run is writing into the same results folder."""


LOCK_FILE = ".lock"


@contextmanager
def locked(results_dir: Path) -> Iterator[None]:
    """Hold the results folder for this run: a second run into it would redo every item the first one has in
    flight and append duplicate lines. An OS lock (``flock``), so a run killed with SIGKILL leaves no stale lock;
    a run that ends, well or not, removes the lock file (and the folder, when it made it and left it empty)."""
    import fcntl

    made = not results_dir.exists()
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / LOCK_FILE
    while True:
        handle = path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "unknown"
            handle.close()
            raise ResultsBusyError(
                f"{results_dir} is in use by another run (pid {owner}); wait for it to finish, or pass another "
                "--results-dir"
            ) from None
        try:  # the file we locked is still the folder's (a run ending removes it, holding the lock)
            same = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        handle.close()
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield
    finally:
        path.unlink(missing_ok=True)  # before the lock goes: a run that opened it meanwhile sees it gone, retries
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
        if made:
            with suppress(OSError):  # not empty: the run wrote something
                results_dir.rmdir()


def safe_name(name: str) -> str:
    """A model name usable in a file name (``org/model`` -> ``org_model``)."""
    return _UNSAFE.sub("_", name).strip("_") or "model"


def results_path(results_dir: str | Path, task: str, length: int, model: str, method: str) -> Path:
    return Path(results_dir) / f"{task}_{length}" / f"{safe_name(model)}__{method}.jsonl"


def meta_path(path: Path) -> Path:
    return path.with_name(path.name[: -len(".jsonl")] + ".meta.json")


def read_meta(path: Path) -> dict[str, Any]:
    """The sidecar of a results file ({} if there is none). A corrupt one raises ``ValueError`` naming it."""
    meta = meta_path(path)
    if not meta.is_file():
        return {}
    remedy = "delete it, or pass --overwrite to start its results file afresh"
    try:
        data = json.loads(meta.read_bytes())
    except json.JSONDecodeError as err:
        raise ValueError(f"{meta}:{err.lineno}:{err.colno}: not valid JSON ({err.msg}); {remedy}") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{meta}: not valid UTF-8 (at byte {err.start}); {remedy}") from None
    if not isinstance(data, dict) or not isinstance(data.get("settings", {}), dict):
        raise ValueError(f"{meta}: expected a JSON object with a 'settings' object, got {data!r:.80}; {remedy}")
    return data


def prepare(
    path: Path,
    settings: dict[str, Any],
    info: dict[str, Any] | None = None,
    retry_failed: bool = False,
    overwrite: bool = False,
) -> set[Any]:
    """Get ``path`` ready for appending and return the ids to skip.

    ``settings`` must equal the stored ones (else :class:`SettingsMismatchError`); ``info`` (the expected item
    count, the data file) is stored beside them without being compared; ``overwrite`` starts afresh.
    Duplicate ids (which this harness never writes) are collapsed to their last line; with ``retry_failed``
    failed lines are dropped so that their items run again.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = meta_path(path)
    if overwrite:
        path.unlink(missing_ok=True)
        meta.unlink(missing_ok=True)
    if meta.is_file() and path.exists():
        stored = read_meta(path).get("settings") or {}
        remedy = "use another --results-dir, or --overwrite to start this file afresh"
        check_settings(path, stored, settings, remedy)
    payload = {"version": FORMAT_VERSION, "settings": settings, **(info or {})}
    write_atomic(meta, json.dumps(payload, indent=2, sort_keys=True) + "\n")
    if not path.exists():
        return set()
    records = read_jsonl(path)  # ignores a half-written last line; TraceWriter cuts it when reopening
    last = {r["id"]: r for r in records}
    keep = [r for r in last.values() if not (retry_failed and r.get("error"))]
    if len(keep) != len(records):
        write_atomic(path, b"".join((json.dumps(r, ensure_ascii=False) + "\n").encode() for r in keep))
    return {r["id"] for r in keep}


def unfinished(path: Path, ids: list[Any]) -> tuple[int, int, str | None]:
    """Of the selected ``ids``: how many have a failed result, how many none, and the first error."""
    records = {r["id"]: r for r in read_jsonl(path)} if path.exists() else {}
    errors = [records[i]["error"] for i in ids if i in records and records[i].get("error")]
    not_run = sum(i not in records for i in ids)
    return len(errors), not_run, errors[0] if errors else None


def item_record(
    *,
    item: dict[str, Any],
    task: str,
    length: int,
    model: str,
    method: str,
    session: Episode | None,
    error: BaseException | None,
    seconds: float,
    scores: dict[str, Any],
    gold: list[str],
    keep_trace: bool = False,
    run_sampling: dict[str, Any] | None = None,
    source: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    """The result line of one item (the context is never stored). ``run_sampling``: the run's, of which
    ``sampling`` records what the item's calls were sent with (:func:`sampling_used`). ``source``: the agent's
    function: a failure raised at a line of its file names that line in ``error``, as the preflight and training
    do."""
    history = session.history if session is not None else []
    answer = session.answer if session is not None and error is None else None
    record: dict[str, Any] = {
        "id": item["index"],
        "task": task,
        "length": length,
        "model": model,
        "method": method,
        "question": item.get("input"),
        "gold": gold,
        "response": answer,
        **scores,
        "error": None if error is None else describe_failure(error, source, at_def=False),
        "turns": len(history),
        "prompt_tokens": sum(r.reply.prompt_tokens for r in history),  # a failed item's turns too: paid for
        "completion_tokens": sum(r.reply.completion_tokens for r in history),
        "truncated_turns": sum(r.reply.finish_reason == "length" for r in history),
        "seconds": round(seconds, 4),
        "sampling": sampling_used(history, run_sampling or {}),
    }
    if session is not None:
        trace = session.trace()
        for key in ("context_tokens", "num_chunks", "prompt_tokens_full", "truncated"):
            if key in trace:
                record[key] = trace[key]
        if keep_trace:
            record["memories"] = trace.get("memories")
            record["trace"] = trace.get("turns")
    return record


def sampling_used(history: list[Any], run_sampling: dict[str, Any]) -> list[dict[str, Any]]:
    """The sampling the calls of an item were sent with, by the one rule of recurrent/sampling.py (the run's
    values under each call's own): each distinct set once, with how many calls used it, in the order first used.
    A paper agent's item reads ``[{"temperature": 0.7, "top_p": 0.95, "calls": N}]``."""
    used: dict[str, dict[str, Any]] = {}
    for record in history:
        values = call_sampling(run_sampling, record.turn.sampling)
        key = json.dumps(values, sort_keys=True)
        used.setdefault(key, {**values, "calls": 0})["calls"] += 1
    return list(used.values())
