"""Resumable, incremental outputs: JSON lines written to ``<name>.partial``, renamed when complete.

Every output file is registered in the folder's manifest (``memory_data_manifest.json``) with the
configuration that produced it. A run whose configuration differs from what the folder holds is refused,
so one folder never mixes data sets. A killed run resumes: complete lines are kept, a torn last line is
dropped (:mod:`recurrent.resume`), and generation continues at the next index; since every sample depends
only on (seed, index), the result is byte-identical to an uninterrupted run.

Parquet outputs (training rows) go through the same JSON-lines partial file and are converted at the end,
in batches, so memory stays bounded.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from recurrent.atomic import atomic_path, write_atomic
from recurrent.resume import SettingsMismatchError, check_settings, iter_jsonl, repair_jsonl

MANIFEST_NAME = "memory_data_manifest.json"
PARTIAL_SUFFIX = ".partial"


class ConfigMismatchError(SettingsMismatchError):
    """The output folder holds data made with a different configuration."""


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked_manifest(folder: Path) -> Iterator[dict]:
    """Read-modify-write the manifest under an exclusive lock (several generators may share a folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MANIFEST_NAME
    with open(folder / (MANIFEST_NAME + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(path.read_text()) if path.is_file() else {"version": 1, "files": {}}
        yield data
        write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def register(folder: Path, name: str, config: dict, shared_keys: tuple[str, ...]) -> dict:
    """Record ``name`` with ``config`` in the folder's manifest, or refuse if it conflicts.

    Conflicts: the same file made with another configuration, or any file of the same ``stage`` whose
    ``shared_keys`` (e.g. seed, tokenizer, source files) differ. Returns the manifest entry.
    """
    with _locked_manifest(folder) as data:
        files = data["files"]
        for other, entry in files.items():
            theirs = entry["config"]
            if other == name:
                remedy = "use another output folder or delete the old file and its manifest entry"
                check_settings(folder / name, theirs, config, remedy, error=ConfigMismatchError)
            if theirs.get("stage") == config.get("stage"):
                # A key absent on either side (e.g. the essay hash of a task without essays) is not compared.
                keys = [k for k in shared_keys if theirs.get(k) is not None and config.get(k) is not None]
                remedy = "refusing to mix data sets in one folder; use another --out folder"
                check_settings(folder / other, theirs, config, remedy, keys, ConfigMismatchError)
        entry = files.setdefault(name, {"config": config, "hash": config_hash(config), "status": "partial"})
        return dict(entry)


def mark_complete(folder: Path, name: str, count: int) -> None:
    with _locked_manifest(folder) as data:
        data["files"][name].update(status="complete", count=count)


class ResumableJsonl:
    """Append JSON lines for indices ``start .. total-1``, resuming a previous partial run.

    Usage::

        out = ResumableJsonl(folder, "eval_vt_8192.jsonl", config, shared_keys=("seed", "tokenizer"), total=128)
        if not out.done:
            with out:
                for i in range(out.start, out.total):
                    out.write(make(i))
    """

    def __init__(
        self,
        folder: Path,
        name: str,
        config: dict,
        shared_keys: tuple[str, ...],
        total: int,
        parquet_schema=None,
    ):
        self.folder, self.name, self.total = Path(folder), name, total
        self.parquet_schema = parquet_schema  # set: the final file is parquet, converted from the partial
        self.final = self.folder / name
        self.partial = self.folder / (name + PARTIAL_SUFFIX)
        self.config = {**config, "num_samples": total}
        entry = register(self.folder, name, self.config, shared_keys)
        self.done = entry["status"] == "complete" and self.final.is_file()
        if entry["status"] == "complete" and not self.final.is_file():
            raise ConfigMismatchError(f"manifest says {self.final} is complete but the file is missing")
        self.start = 0
        if not self.done and self.partial.is_file():
            self.start = repair_jsonl(self.partial)
            if self.start > total:
                raise ConfigMismatchError(f"{self.partial} has {self.start} lines, more than the {total} expected")
        self._file = None
        self.written = self.start

    def __enter__(self) -> ResumableJsonl:
        self._file = open(self.partial, "a", encoding="utf-8")
        return self

    def write(self, record: dict[str, Any]) -> None:
        # One line per sample, flushed, so a kill loses at most the line being written.
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()
        self.written += 1

    def __exit__(self, exc_type, exc, tb) -> None:
        self._file.close()
        if exc_type is None:
            self.finish()

    def finish(self) -> None:
        if self.written != self.total:
            raise RuntimeError(f"{self.partial}: wrote {self.written} of {self.total} samples")
        if self.parquet_schema is not None:
            with atomic_path(self.final) as tmp:
                jsonl_to_parquet(self.partial, tmp, self.parquet_schema)
            self.partial.unlink()
        else:
            os.replace(self.partial, self.final)
        mark_complete(self.folder, self.name, self.total)
        self.done = True


def jsonl_to_parquet(src: Path, dest: Path, schema, batch_rows: int = 256) -> None:
    """Convert JSON lines to parquet (see :func:`write_parquet`)."""
    write_parquet(iter_jsonl(src), dest, schema, batch_rows)


def write_parquet(records: Iterable[dict], dest: Path, schema, batch_rows: int = 256) -> None:
    """Write ``records`` to parquet in row groups of ``batch_rows``, never holding more than one batch."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pq.ParquetWriter(dest, schema) as writer:
        batch: list[dict] = []
        for record in records:
            batch.append(record)
            if len(batch) == batch_rows:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                batch = []
        if batch:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
