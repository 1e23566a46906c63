"""The inputs of ``python -m taskutils.memory_data custom`` (taskutils/memory_data/custom.py), read: JSON lines,
parquet, or a folder written by ``datasets``' ``save_to_disk``, each record named by where it is (``FILE:LINE``, or
``FILE: row K``). Nothing here judges a record: :mod:`taskutils.memory_data.custom_records` does."""

from __future__ import annotations

import errno
import json
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


class CustomDataError(ValueError):
    """The input or the options cannot make a data set; the message lists every problem found."""


@dataclass(frozen=True)
class Source:
    path: Path
    kind: str  # "jsonl" | "parquet" | "datasets"
    split: str | None = None  # the split of a DatasetDict folder


def open_sources(paths: list[Path], split: str | None = None) -> tuple[list[Source], list[str]]:
    """What each input is, and the problems: a missing path, an unknown kind, a folder ``datasets`` did not
    write, or a ``datasets`` folder of several splits without ``split``. Nothing is read yet."""
    sources, problems = [], []
    for path in map(Path, paths):
        kind = _file_kind(path)
        if kind == "folder":
            try:
                sources.append(Source(path, "datasets", _dataset_split(path, split)))
            except CustomDataError as err:
                problems.append(str(err))
        elif kind != "file":
            problems.append(f"{path}: {kind}")
        elif path.suffix == ".parquet":
            problem = _parquet_problem(path)
            if problem is None:
                sources.append(Source(path, "parquet"))
            else:
                problems.append(problem)
        elif path.suffix in JSONL_SUFFIXES:
            sources.append(Source(path, "jsonl"))
        else:
            problems.append(
                f"{path}: unknown input kind {path.suffix!r}: JSON lines ({', '.join(JSONL_SUFFIXES)}), "
                "parquet (.parquet) or a datasets save_to_disk folder"
            )
    return sources, problems


def _file_kind(path: Path) -> str:
    """ "file", "folder", or what is wrong with the path: missing, a loop of symbolic links, not a regular file (a
    FIFO would block the read forever), not readable."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "no such file or folder"
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "a loop of symbolic links (it names itself through them)"
        return f"cannot be read ({err.strerror or err})"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISREG(mode):
        return "file"
    what = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
    return f"not a regular file ({what}); give a file or a datasets folder"


def _parquet_problem(path: Path) -> str | None:
    """Why a parquet file cannot be read (its footer: a corrupt, truncated or sparse file), or None."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pq.ParquetFile(path).close()
    except (pa.ArrowException, OSError) as err:
        return f"{path}: not a readable parquet file ({type(err).__name__}: {str(err).splitlines()[0]})"
    return None


def _dataset_split(path: Path, split: str | None) -> str | None:
    """The split to read of a ``save_to_disk`` folder (None for a single Dataset)."""
    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        if split is None and len(splits) == 1:
            return splits[0]
        if split not in splits:
            asked = "no --split given" if split is None else f"--split {split!r} is not one of them"
            raise CustomDataError(f"{path}: a datasets folder with splits {', '.join(splits)}; {asked}")
        return split
    if not (path / "state.json").is_file():
        raise CustomDataError(
            f"{path}: a folder, but not one written by datasets' save_to_disk (no state.json or dataset_dict.json)"
        )
    return None


class Unreadable(str):
    """A record that could not be read at all (a JSON line that does not parse): the message."""


def iter_raw(source: Source) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` per record, where ``where`` names the file and the line or row."""
    if source.kind == "jsonl":
        yield from _iter_jsonl(source.path)
    elif source.kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        row = 0
        try:
            for batch in pq.ParquetFile(source.path).iter_batches(batch_size=256):
                for record in batch.to_pylist():
                    yield f"{source.path}: row {row}", record
                    row += 1
        except (pa.ArrowException, OSError) as err:  # a corrupt page: the rows before it were read
            reason = f"{type(err).__name__}: {str(err).splitlines()[0]}"
            yield f"{source.path}: row {row}", Unreadable(f"the parquet file cannot be read from here on ({reason})")
    else:
        from datasets import load_from_disk

        data = load_from_disk(str(source.path))
        name = str(source.path)
        if source.split is not None:
            data, name = data[source.split], f"{source.path} [{source.split}]"
        for row, record in enumerate(data):
            yield f"{name}: row {row}", record


def _iter_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open("rb") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            if line_no == 1 and line.lstrip().startswith(b"["):
                yield (
                    where,
                    Unreadable(
                        "a JSON array; this command reads JSON lines, one object per line (convert: jq -c '.[]')"
                    ),
                )
                return
            try:
                record = json.loads(line)
            except ValueError as err:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not UTF-8
                record = Unreadable(f"not valid JSON ({err})")
            except RecursionError:  # arrays or objects nested past Python's recursion limit
                record = Unreadable(f"JSON nested too deep to read ({_depth(line):,} levels at its deepest)")
            yield where, record


def _depth(line: bytes) -> int:
    """How deep a JSON line's arrays and objects nest (brackets in strings counted too: a measure for a message)."""
    depth = deepest = 0
    for byte in line:
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest
