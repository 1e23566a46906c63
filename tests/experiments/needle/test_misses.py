"""How the policies miss, on hand-written results files: each kind by hand, the groups, the copy-error share."""

import json
from pathlib import Path

import pytest

from experiments.needle.misses import common_in_order, main, miss_kind, repeats_a_digit, tally, tally_by_digits


@pytest.mark.parametrize(
    ("pred", "gold", "right", "kind"),
    [
        ("3551", "3551", True, "right"),
        (None, "3551", False, "no number"),
        ("three", "3551", False, "no number"),
        ("3561", "3551", False, "one digit off"),  # position 3 miscopied
        ("3516", "3551", False, "near copy"),  # 3-5-1 kept in order, shifted: not one digit off (2 differ)
        ("355", "3551", False, "near copy"),  # a digit dropped
        ("35510", "3551", False, "near copy"),  # a digit added
        ("1553", "3551", False, "other number"),  # 5-5 in order only
        ("7204", "3551", False, "other number"),
    ],
)
def test_each_kind(pred, gold, right, kind):
    assert miss_kind(pred, gold, right) == kind


def test_common_in_order():
    assert common_in_order("3516", "3551") == 3  # 3, 5, 1
    assert common_in_order("", "3551") == 0
    assert common_in_order("1553", "3551") == 2


def write(root: Path, length: int, model: str, items: list[tuple[str | None, str, int]], method: str = "memory-boxed"):
    folder = root / f"needle_{length}"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [{"id": i, "pred": p, "gold": [g], "strict": s} for i, (p, g, s) in enumerate(items)]
    (folder / f"{model}__{method}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_the_table_counts_by_model_and_length_group(tmp_path, capsys):
    write(tmp_path, 1, "rl-seed0", [("1234", "1234", 1), ("1235", "1234", 0)])
    write(tmp_path, 4, "rl-seed0", [("124", "1234", 0), ("9999", "1234", 0)])
    write(tmp_path, 64, "rl-seed0", [("1234", "1234", 1)])
    write(tmp_path, 1, "rl-seed0", [("9999", "1234", 0)], method="direct-boxed")  # another method: not counted
    counts = tally(tmp_path)
    assert set(counts) == {("rl-seed0", "1-4 chunks"), ("rl-seed0", "8+ chunks")}
    short = counts[("rl-seed0", "1-4 chunks")]
    assert (short["right"], short["one digit off"], short["near copy"], short["other number"]) == (1, 1, 1, 1)
    assert main([str(tmp_path)]) == 0
    table = capsys.readouterr().out
    # 3 misses at 1-4 chunks, 2 of them copy errors: 67 %; none at 64 chunks
    assert "| rl-seed0 | 1-4 chunks | 4 | 1 | 0 | 1 | 1 | 1 | 67 |" in table
    assert "| rl-seed0 | 8+ chunks | 1 | 1 | 0 | 0 | 0 | 0 | – |" in table


def test_repeats_a_digit():
    assert repeats_a_digit("7445") and repeats_a_digit("2663") and repeats_a_digit("6616") and repeats_a_digit("1231")
    assert not repeats_a_digit("7451") and not repeats_a_digit("1234")


def test_the_second_table_splits_by_whether_the_needle_repeats_a_digit(tmp_path, capsys):
    # distinct digits: 1234 right, 5678 one digit off; a repeat: 7445 -> 7451 (near copy), 2663 right, 9779 -> 1111
    write(tmp_path, 2, "rl", [("1234", "1234", 1), ("5679", "5678", 0), ("7451", "7445", 0), ("2663", "2663", 1)])
    write(tmp_path, 16, "rl", [("1111", "9779", 0)])
    counts = tally_by_digits(tmp_path)
    assert counts[("rl", "1-4 chunks", False)] == {"items": 2, "right": 1, "copy errors": 1}
    assert counts[("rl", "1-4 chunks", True)] == {"items": 2, "right": 1, "copy errors": 1}
    assert counts[("rl", "8+ chunks", True)] == {"items": 1, "right": 0, "copy errors": 0}
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| rl | 1-4 chunks | 2 / 1 / 1 | 2 / 1 / 1 |" in out
    assert "| rl | 8+ chunks | 0 / 0 / 0 | 1 / 0 / 0 |" in out


def test_no_results_is_an_error(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "no needle_<N>/<model>__memory-boxed.jsonl" in capsys.readouterr().err
