"""The quickstart's inputs are checked before any work, each refused in one line (exit 2): a ``--context-file``
over its bound (a regular file by its size, a device such as ``/dev/zero`` by a capped read) or not UTF-8 text,
and a ``--trace`` path it cannot write."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from recurrent.bounded_read import read_text

REPO = Path(__file__).resolve().parents[3]


def _quickstart_module():
    spec = importlib.util.spec_from_file_location("quickstart_inputs", REPO / "quickstart.py")
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)
    return quickstart


def _refused(capsys, quickstart, *argv: str) -> str:
    """The one stderr line of a run refused with exit 2 before any server started (none is reachable: a server
    start would print its 'starting' line to stdout, checked empty)."""
    assert quickstart.main(["--model", "tiny", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    (line,) = err.strip().splitlines()
    return line


@pytest.mark.timeout(60)
def test_a_device_that_never_ends_is_refused_at_the_bound(capsys):
    # /dev/zero was read without a bound: 19 GB in 60 s, then the kernel's OOM killer.
    quickstart = _quickstart_module()
    line = _refused(capsys, quickstart, "--context-file", "/dev/zero")
    assert line == (
        "error: --context-file /dev/zero: over the quickstart's limit of 67,108,864 bytes (it went on past "
        "67,108,864 bytes: the rest was not read)"
    )


@pytest.mark.timeout(60)
def test_a_regular_file_over_the_bound_is_refused_by_its_size_unread(capsys, tmp_path, monkeypatch):
    quickstart = _quickstart_module()
    big = tmp_path / "big.txt"
    with big.open("wb") as file:
        file.truncate((64 << 20) + 1)  # sparse: no disk, and never read (the refusal comes from its size)
    reads: list[int] = []
    real_open = Path.open

    def counting_open(self, mode="r", *args, **kwargs):
        handle = real_open(self, mode, *args, **kwargs)
        if self == big:
            real_read = handle.read
            handle.read = lambda n=-1: reads.append(n) or real_read(n)
        return handle

    monkeypatch.setattr(Path, "open", counting_open)
    line = _refused(capsys, quickstart, "--context-file", str(big))
    assert line == f"error: --context-file {big}: over the quickstart's limit of 67,108,864 bytes (67,108,865 bytes)"
    assert reads == []
    # At the bound exactly it is read and taken (NUL characters are text): the next check, the trace's, refuses.
    with big.open("r+b") as file:
        file.truncate(64 << 20)
    line = _refused(capsys, quickstart, "--context-file", str(big), "--trace", str(tmp_path))
    assert line.startswith(f"error: --trace {tmp_path}: ") and reads == [(64 << 20) + 1]


@pytest.mark.timeout(60)
def test_a_binary_document_is_named_with_its_first_bad_byte(capsys, tmp_path):
    quickstart = _quickstart_module()
    binary = tmp_path / "image.bin"
    binary.write_bytes("héllo, ".encode() + b"\x89PNG\r\n")  # 'é' is two bytes: the bad one is at offset 8
    line = _refused(capsys, quickstart, "--context-file", str(binary))
    assert line == f"error: --context-file {binary}: not UTF-8 text: byte 0x89 at offset 8 (invalid start byte)"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["a folder", "under a file"])
def test_a_trace_it_cannot_write_is_refused_before_any_work(capsys, tmp_path, where):
    # Such a --trace failed only after the whole run, its work lost.
    quickstart = _quickstart_module()
    (tmp_path / "file").write_text("x")
    trace = tmp_path if where == "a folder" else tmp_path / "file" / "trace.jsonl"
    line = _refused(capsys, quickstart, "--trace", str(trace))
    reason = "Is a directory" if where == "a folder" else f"File exists ({tmp_path / 'file'})"  # its folder is a file
    assert line == f"error: --trace {trace}: cannot be written: {reason}"


def test_a_document_reads_as_read_text_reads_it(tmp_path):
    document = tmp_path / "doc.txt"
    document.write_bytes("one\r\ntwo\rthree\nfour é".encode())
    expected = document.read_text(encoding="utf-8")
    assert read_text(document, 100, "--context-file", "the limit") == expected == "one\ntwo\nthree\nfour é"
