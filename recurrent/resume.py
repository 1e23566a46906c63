"""Reading back what a killed run left, to resume it: JSON-lines files and the settings they were made with.

One rule for every JSON-lines file this project appends to (traces, evaluation results, generated data, the
filter's response cache): its writers append one whole line per record, so a kill can only tear the LAST line
(no trailing newline, or not parseable). That line is dropped by readers and cut off by :func:`repair_jsonl`
before a writer appends again. A broken line anywhere else is corruption and raises, naming ``file:line``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any


class SettingsMismatchError(RuntimeError):
    """A file exists that was made with other settings than this run's."""


def _scan(path: Path) -> Iterator[tuple[Any, int]]:
    """``(record, end offset of its line)`` for every good line; applies the torn-last-line rule."""
    broken: tuple[int, ValueError] | None = None  # a bad line is an error only if another line follows it
    offset = 0
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            offset += len(line)
            if not line.strip():
                continue
            if broken is not None:
                raise ValueError(f"{path}:{broken[0]}: not a JSON line ({broken[1]})") from broken[1]
            if not line.endswith(b"\n"):  # only the last line can lack it: a torn write
                return
            try:
                record = json.loads(line)
            except ValueError as err:
                broken = (number, err)
                continue
            yield record, offset


def iter_jsonl(path: str | Path) -> Iterator[Any]:
    """The records of a JSON-lines file, one at a time (torn last line dropped, corruption raises)."""
    for record, _ in _scan(Path(path)):
        yield record


def read_jsonl(path: str | Path) -> list[Any]:
    """Every record of a JSON-lines file, in file order (torn last line dropped, corruption raises)."""
    return list(iter_jsonl(path))


def repair_jsonl(path: str | Path) -> int:
    """Cut a torn last line off ``path`` so that appending starts on a clean line; returns the records kept.
    Raises like :func:`read_jsonl` on a broken line before the last one (nothing is cut then)."""
    path = Path(path)
    count, keep = 0, 0
    for _, end in _scan(path):
        count, keep = count + 1, end
    if path.stat().st_size > keep:
        with path.open("rb+") as f:
            f.truncate(keep)
    return count


def check_settings(
    subject: str | Path,
    stored: Mapping[str, Any],
    wanted: Mapping[str, Any],
    remedy: str,
    keys: Sequence[str] | None = None,
    error: type[SettingsMismatchError] = SettingsMismatchError,
) -> None:
    """Refuse to resume ``subject`` with other settings: ``error`` naming each key of ``keys`` (default: all)
    whose stored value differs from this run's, with both values."""
    keys = sorted(set(stored) | set(wanted)) if keys is None else keys
    changed = [k for k in keys if stored.get(k) != wanted.get(k)]
    if changed:
        theirs = ", ".join(f"{k}={stored.get(k)!r}" for k in changed)
        ours = ", ".join(f"{k}={wanted.get(k)!r}" for k in changed)
        raise error(f"{subject} was made with {theirs} but this run has {ours}; {remedy}")
