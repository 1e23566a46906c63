"""The one write-then-rename helper: the target is replaced whole on success and untouched on error, with no
temporary file or folder left either way."""

import pytest

from recurrent.atomic import atomic_path, write_atomic


def test_a_file_is_replaced_whole_and_nothing_is_left_beside_it(tmp_path):
    path = tmp_path / "sub" / "a.json"  # folders are created
    write_atomic(path, "one\n")
    write_atomic(path, b"two\n")
    assert path.read_bytes() == b"two\n"
    assert [p.name for p in path.parent.iterdir()] == ["a.json"]


def test_an_error_keeps_the_old_file_and_removes_the_temporary_one(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("old\n")
    with pytest.raises(KeyError), atomic_path(path) as tmp:
        tmp.write_text("half")
        raise KeyError("killed")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_a_folder_replaces_the_old_folder(tmp_path):
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "stale.bin").write_text("x")
    with atomic_path(dest, folder=True) as tmp:
        (tmp / "weights.bin").write_text("w")
    assert [p.name for p in dest.iterdir()] == ["weights.bin"]
    assert dest.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
