"""Memory traces as JSON lines: one line per finished sample, appended and flushed as samples finish.

A long evaluation killed half-way keeps every sample finished before the kill, so a rerun can skip them
(:func:`finished_ids`). A kill can leave a half-written last line; reopening the file for writing cuts it off,
and reading ignores it (the rule of :mod:`recurrent.resume`), so appending across runs never glues a new record
onto a broken one.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from recurrent.interface import Episode
from recurrent.resume import read_jsonl, repair_jsonl

read_trace = read_jsonl  # a trace is JSON lines under the resume rule: torn last line dropped, corruption raises


def sample_record(
    sample_id: Any, session: Episode, error: BaseException | str | None = None, seconds: float = 0.0
) -> dict[str, Any]:
    """The trace line of one sample: its id, the episode's own trace, the error if it failed, its wall time and
    its token totals (every reply counted, a failed sample's partial turns too: they were paid for)."""
    history = session.history
    if isinstance(error, BaseException):
        error = f"{type(error).__name__}: {error}"
    return {
        "id": sample_id,
        **session.trace(),
        "error": error,
        "seconds": round(seconds, 6),
        "prompt_tokens": sum(rec.reply.prompt_tokens for rec in history),
        "completion_tokens": sum(rec.reply.completion_tokens for rec in history),
    }


class TraceWriter:
    """Append JSON lines to ``path`` (created with its folders), one ``write`` per line, flushed at once."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            repair_jsonl(self.path)
        self._file = self.path.open("ab", buffering=0)  # unbuffered: each line is one system write

    def write(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        view = memoryview(data)
        start = self._file.seek(0, os.SEEK_END)
        try:
            while view:  # a raw write may be partial for very large lines
                view = view[self._file.write(view) :]
        except OSError as err:  # a full disk: cut the part of the line written, so the file holds whole lines
            with contextlib.suppress(OSError):
                self._file.truncate(start)
            if err.filename is None:  # a write to an open file names none: say which
                raise OSError(err.errno, err.strerror or str(err), str(self.path)) from err
            raise

    def write_sample(
        self, sample_id: Any, session: Episode, error: BaseException | str | None = None, seconds: float = 0.0
    ) -> None:
        self.write(sample_record(sample_id, session, error, seconds))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def finished_ids(path: str | Path, include_errors: bool = False) -> set[Any]:
    """Ids of the samples a trace already holds, to skip on resume. Failed samples are not finished unless
    ``include_errors`` (by default a rerun retries them). Ids are compared after a JSON round trip."""
    if not Path(path).exists():
        return set()
    return {r["id"] for r in read_trace(path) if include_errors or r.get("error") is None}
