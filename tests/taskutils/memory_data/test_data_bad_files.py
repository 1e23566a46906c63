"""Inputs of the converter (``python -m taskutils.memory_data custom``) that are not what they claim to be (issue
47): a corrupt or sparse parquet file, a parquet file whose pages are damaged, a loop of symbolic links and a FIFO
are each one line naming the path and what is wrong, exit 2, and nothing written. Before, each was a traceback (the
FIFO: "no such file")."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from taskutils.memory_data.run import main

RECORDS = [{"question": f"Who did it {i}?", "answers": ["A"], "documents": [f"A did it {i}. " * 40]} for i in range(60)]


def run(tmp_path: Path, source: Path, capsys) -> tuple[int, list[str]]:
    code = main(
        ["custom", str(source), "--documents-field", "documents", "--eval-out", str(tmp_path / "out" / "eval_1.jsonl")]
    )
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()  # nothing written
    return code, err.splitlines()


def bad_input(tmp_path: Path, kind: str) -> Path:
    if kind == "corrupt parquet":
        path = tmp_path / "corrupt.parquet"
        path.write_bytes(os.urandom(5000))
    elif kind == "sparse parquet":
        path = tmp_path / "sparse.parquet"
        with path.open("wb") as f:
            f.truncate(10 << 20)  # 10 MiB of holes, no byte written
    elif kind == "symlink loop":
        path = tmp_path / "a.jsonl"
        path.symlink_to(tmp_path / "b.jsonl")
        (tmp_path / "b.jsonl").symlink_to(path)
    else:
        path = tmp_path / "pipe.jsonl"
        os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("corrupt parquet", "not a readable parquet file (ArrowInvalid: Parquet magic bytes not found in footer."),
        ("sparse parquet", "not a readable parquet file (ArrowInvalid: Parquet magic bytes not found in footer."),
        ("symlink loop", "a loop of symbolic links (it names itself through them)"),
        ("fifo", "not a regular file (a FIFO); give a file or a datasets folder"),
    ],
)
def test_an_input_that_is_not_what_it_claims_is_one_line(tmp_path, capsys, kind, said):
    path = bad_input(tmp_path, kind)
    code, lines = run(tmp_path, path, capsys)
    assert code == 2 and lines[0] == "error: cannot start (nothing was read or written):" and len(lines) == 2
    assert lines[1].startswith(f"  {path}: {said}")


def test_a_parquet_file_whose_pages_are_damaged_is_named_at_the_row_where_reading_stopped(tmp_path, capsys):
    path = tmp_path / "damaged.parquet"
    pq.write_table(pa.Table.from_pylist(RECORDS), path, compression="snappy")
    data = bytearray(path.read_bytes())
    footer = struct.unpack("<I", data[-8:-4])[0]  # the footer (read first) stays whole: the pages before it do not
    for k in range(4, len(data) - 8 - footer):
        data[k] = 0xAB
    path.write_bytes(data)
    code, lines = run(tmp_path, path, capsys)
    assert code == 2 and lines[0].startswith("error: 1 problem(s)")
    assert lines[1].startswith(f"  {path}: row 0: the parquet file cannot be read from here on (")
