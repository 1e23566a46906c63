"""The one resume rule for JSON-lines files, on hand-written files: a torn last line is dropped and cut off, a
broken line before the last is an error naming file:line; and the one settings-mismatch message."""

import pytest

from recurrent.resume import SettingsMismatchError, check_settings, read_jsonl, repair_jsonl


def test_a_last_line_without_its_newline_is_dropped_and_cut(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"id": 0}\n{"id": 1}\n{"id": 2, "tu')
    assert read_jsonl(path) == [{"id": 0}, {"id": 1}]
    assert path.read_bytes().endswith(b'"tu')  # reading alone leaves the file as it is
    assert repair_jsonl(path) == 2
    assert path.read_bytes() == b'{"id": 0}\n{"id": 1}\n'  # 20 bytes: the two whole lines


def test_an_unparseable_last_line_with_its_newline_is_dropped_too(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"id": 0}\n{"id": 1, "cut\n\n')  # a trailing blank line changes nothing
    assert read_jsonl(path) == [{"id": 0}]
    assert repair_jsonl(path) == 1
    assert path.read_bytes() == b'{"id": 0}\n'


def test_a_clean_file_is_left_alone(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"id": 0}\n\n{"id": 1}\n')  # blank lines are skipped, not errors
    assert repair_jsonl(path) == 2
    assert path.read_bytes() == b'{"id": 0}\n\n{"id": 1}\n'
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert read_jsonl(empty) == [] and repair_jsonl(empty) == 0


def test_a_broken_line_in_the_middle_names_file_and_line(tmp_path):
    path = tmp_path / "r.jsonl"
    original = b'{"id": 0}\n{"id": 1}\n{oops\n{"id": 3}\n'
    path.write_bytes(original)
    with pytest.raises(ValueError, match=r"r\.jsonl:3: not a JSON line"):
        read_jsonl(path)
    with pytest.raises(ValueError, match=r"r\.jsonl:3: not a JSON line"):
        repair_jsonl(path)
    assert path.read_bytes() == original  # nothing is cut from a corrupt file


def test_settings_mismatch_names_each_changed_key_with_both_values():
    check_settings("out/a.jsonl", {"seed": 1, "n": 2}, {"n": 2, "seed": 1}, "start afresh")  # equal: no error
    with pytest.raises(SettingsMismatchError) as err:
        check_settings("out/a.jsonl", {"seed": 1, "n": 2, "old": True}, {"seed": 7, "n": 2}, "start afresh")
    assert str(err.value) == (
        "out/a.jsonl was made with old=True, seed=1 but this run has old=None, seed=7; start afresh"
    )
    # Only the keys asked for are compared.
    check_settings("out/a.jsonl", {"seed": 1, "n": 2}, {"seed": 1, "n": 3}, "x", keys=["seed"])


def test_a_last_line_that_parses_but_lacks_its_newline_is_torn_and_never_joined(tmp_path):
    # A kill between a record's "}" and its "\n" leaves a line that parses. It is still torn: kept, the next
    # appended record would be written onto the same line and both would be lost.
    from recurrent.trace import TraceWriter

    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"id": 0}\n{"id": 1}\n{"id": 2}')
    assert read_jsonl(path) == [{"id": 0}, {"id": 1}]  # the run redoes sample 2
    with TraceWriter(path) as writer:  # reopening for appending cuts the torn line (repair_jsonl)
        writer.write({"id": 2})
        writer.write({"id": 3})
    assert path.read_bytes() == b'{"id": 0}\n{"id": 1}\n{"id": 2}\n{"id": 3}\n'
    assert read_jsonl(path) == [{"id": 0}, {"id": 1}, {"id": 2}, {"id": 3}]
